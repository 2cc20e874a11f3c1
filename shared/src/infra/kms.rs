//! A secp256k1 signing key held in AWS KMS (`ECC_SECG_P256K1`,
//! `SIGN_VERIFY`): the seller's key for signed offers and receipts where
//! the operator keeps it out of every process (`REEVE_RECEIPT_KMS_KEY_ID`).
//! KMS signs with `ECDSA_SHA_256`; the private key never leaves it.
//!
//! KMS's ECDSA is not deterministic (RFC 6979), and it returns `s` as it
//! comes, high or low. Verifiers of Ethereum-style keys (noble, which the
//! `@x402/*` packages use) accept only the low `s`, so every signature is
//! normalised to it, which keeps it valid.

use alloy_signer::k256::ecdsa::{Signature, VerifyingKey};
use aws_sdk_kms::error::{DisplayErrorContext, ProvideErrorMetadata};
use aws_sdk_kms::primitives::Blob;
use aws_sdk_kms::types::{KeySpec, KeyUsageType, MessageType, SigningAlgorithmSpec};
use sha2::Digest;

/// The DER of a secp256k1 key's `SubjectPublicKeyInfo` (RFC 5480) up to
/// its point: `id-ecPublicKey`, `secp256k1`, a 66-byte BIT STRING. KMS
/// answers `GetPublicKey` for an `ECC_SECG_P256K1` key with exactly this,
/// then the uncompressed point.
const SPKI_PREFIX: [u8; 23] = [
    0x30, 0x56, 0x30, 0x10, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x05, 0x2b, 0x81, 0x04, 0x00,
    0x0a, 0x03, 0x42, 0x00,
];
/// The largest message KMS signs whole (`MessageType::Raw`); a longer one
/// is sent as its SHA-256 (`Digest`).
const RAW_LIMIT: usize = 4096;

/// A KMS key by id, ARN or alias, and the client that asks for it.
#[derive(Clone, Debug)]
pub struct KmsKey {
    client: aws_sdk_kms::Client,
    key_id: String,
}

/// Why KMS did not give a key or a signature. Messages name the key's id
/// (configuration, not a secret) and KMS's own error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KmsError {
    #[error("cannot use the KMS key {key_id}: {why}")]
    Unreachable { key_id: String, why: String },
    #[error(
        "the KMS key {key_id} is not a secp256k1 signing key (want KeySpec ECC_SECG_P256K1, KeyUsage SIGN_VERIFY): {why}"
    )]
    NotSecp256k1 { key_id: String, why: String },
    #[error("the KMS key {key_id} answered a signature that is not an ECDSA signature")]
    BadSignature { key_id: String },
}

impl KmsKey {
    pub fn new(config: &aws_config::SdkConfig, key_id: &str) -> KmsKey {
        KmsKey::with_client(aws_sdk_kms::Client::new(config), key_id)
    }

    /// On a client of the caller's (a test's, reaching KMS through a proxy
    /// it cuts).
    pub fn with_client(client: aws_sdk_kms::Client, key_id: &str) -> KmsKey {
        KmsKey { client, key_id: key_id.trim().to_owned() }
    }

    pub fn id(&self) -> &str {
        &self.key_id
    }

    /// The key's public half, once it is shown to be a secp256k1 key that
    /// signs with ECDSA over SHA-256.
    pub async fn public_key(&self) -> Result<VerifyingKey, KmsError> {
        let answer = self.client.get_public_key().key_id(&self.key_id).send().await.map_err(|e| self.unreachable(e))?;
        let wrong = |why: String| KmsError::NotSecp256k1 { key_id: self.key_id.clone(), why };
        // KMS answers both names of the spec; the older one alone is
        // what some emulators (moto) send.
        #[allow(deprecated)]
        let spec = answer.key_spec().map(KeySpec::as_str).or(answer.customer_master_key_spec().map(|s| s.as_str()));
        if spec != Some(KeySpec::EccSecgP256K1.as_str()) {
            return Err(wrong(format!("its KeySpec is {}", spec.unwrap_or("unknown"))));
        }
        if answer.key_usage() != Some(&KeyUsageType::SignVerify) {
            return Err(wrong(format!("its KeyUsage is {}", answer.key_usage().map_or("unknown", |u| u.as_str()))));
        }
        if !answer.signing_algorithms().contains(&SigningAlgorithmSpec::EcdsaSha256) {
            return Err(wrong("it does not sign with ECDSA_SHA_256".to_owned()));
        }
        let der = answer.public_key().map(Blob::as_ref).unwrap_or_default();
        der.strip_prefix(&SPKI_PREFIX[..])
            .and_then(|point| VerifyingKey::from_sec1_bytes(point).ok())
            .ok_or_else(|| wrong("its public key is not a secp256k1 point".to_owned()))
    }

    /// `message` signed with ECDSA over its SHA-256, `s` low.
    pub async fn sign(&self, message: &[u8]) -> Result<Signature, KmsError> {
        let request = self.client.sign().key_id(&self.key_id).signing_algorithm(SigningAlgorithmSpec::EcdsaSha256);
        let request = if message.len() <= RAW_LIMIT {
            request.message(Blob::new(message)).message_type(MessageType::Raw)
        } else {
            request.message(Blob::new(sha2::Sha256::digest(message).to_vec())).message_type(MessageType::Digest)
        };
        let answer = request.send().await.map_err(|e| self.unreachable(e))?;
        let der = answer.signature().map(Blob::as_ref).unwrap_or_default();
        let signature = Signature::from_der(der).map_err(|_| KmsError::BadSignature { key_id: self.key_id.clone() })?;
        Ok(signature.normalize_s().unwrap_or(signature))
    }

    /// KMS's own code and message ("NotFoundException: …",
    /// "AccessDeniedException: …"), or why it could not be asked.
    fn unreachable<E, R>(&self, e: aws_sdk_kms::error::SdkError<E, R>) -> KmsError
    where
        E: ProvideErrorMetadata + std::error::Error + 'static,
        R: std::fmt::Debug,
    {
        let why = match e.as_service_error() {
            Some(service) => format!("{}: {}", service.code().unwrap_or("error"), service.message().unwrap_or("")),
            None => DisplayErrorContext(&e).to_string(),
        };
        KmsError::Unreachable { key_id: self.key_id.clone(), why }
    }
}
