//! The x402 v2 `upto` scheme, signed as `@x402/evm`'s upto client signs it:
//! a Permit2 `PermitWitnessTransferFrom` of the requirement's amount (the
//! ceiling) to x402's upto proxy, whose witness names `payTo` and the one
//! facilitator allowed to settle it. The seller later settles what the task
//! used, up to the ceiling.
//!
//! Permit2 can move the payer's token only once the token lets it. A payer
//! that approved Permit2 once (`approve(Permit2, max)`) needs nothing more;
//! for one that did not, a 402 that offers `eip2612GasSponsoring` lets the
//! payer sign the token's EIP-2612 permit for Permit2 as well, which the
//! facilitator applies when it settles, so the payer never sends a
//! transaction nor holds gas. Whether that permit is needed, and its nonce,
//! are read from the chain ([`standing`]).

use std::borrow::Cow;

use alloy_primitives::{Address, U256, address};
use alloy_signer::SignerSync;
use alloy_signer_local::PrivateKeySigner;
use alloy_sol_types::{Eip712Domain, SolCall, SolStruct, sol};
use reeve_shared::payments::{self, PaymentRequired, PaymentRequirements, Permit2Authorization, UptoWitness};
use serde_json::{Value, json};

use super::PayError;

/// Permit2, at its canonical address on every chain.
pub const PERMIT2: Address = address!("0x000000000022D473030F116dDEE9F6B43aC78BA3");
/// x402's upto proxy (`x402UptoPermit2ProxyAddress`): the spender a payer
/// signs for, which settles only for the facilitator its witness names.
pub const UPTO_PROXY: Address = address!("0x4020A4f3b7b90ccA423B9fabCc0CE57C6C240002");
/// The 402 extension through which a payer without Permit2 approval signs
/// the token's permit instead.
pub const EIP2612_GAS_SPONSORING: &str = "eip2612GasSponsoring";

/// How long one JSON-RPC read may take.
const RPC_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

sol! {
    /// Permit2's signed message for a transfer with a witness, with x402's
    /// upto witness. EIP-712 lists the referenced types after the primary
    /// one in name order (`TokenPermissions`, `Witness`), which is also the
    /// witness type string Permit2 and the proxy hash.
    struct PermitWitnessTransferFrom {
        TokenPermissions permitted;
        address spender;
        uint256 nonce;
        uint256 deadline;
        Witness witness;
    }

    struct TokenPermissions {
        address token;
        uint256 amount;
    }

    struct Witness {
        address to;
        address facilitator;
        uint256 validAfter;
    }

    /// EIP-2612's signed approval, as the token defines it.
    struct Permit {
        address owner;
        address spender;
        uint256 value;
        uint256 nonce;
        uint256 deadline;
    }

    function allowance(address owner, address spender) external view returns (uint256);
    function nonces(address owner) external view returns (uint256);
}

/// What the chain says of the payer's token: how much Permit2 may move, and
/// the token's next EIP-2612 nonce for the payer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Standing {
    pub permit2_allowance: U256,
    pub permit_nonce: U256,
}

/// The signed `upto` payment: its `payload`, and the `extensions` to send
/// with it (the token's permit, when one was signed).
pub struct Signed {
    pub authorization: Permit2Authorization,
    pub signature: String,
    pub extensions: Option<serde_json::Map<String, Value>>,
}

/// An `upto` requirement's terms, parsed: a malformed one is refused
/// before anything is read or signed.
#[derive(Debug, Clone, Copy)]
pub struct Terms {
    pub chain_id: u64,
    pub token: Address,
    pub pay_to: Address,
    pub facilitator: Address,
    pub ceiling: U256,
}

impl Terms {
    pub fn of(req: &PaymentRequirements) -> Result<Terms, PayError> {
        let facilitator = req
            .extra
            .facilitator_address
            .as_deref()
            .ok_or(PayError::NoFacilitator)?
            .parse()
            .map_err(|_| PayError::BadRequirement("extra.facilitatorAddress"))?;
        if req.max_timeout_seconds == 0 {
            return Err(PayError::BadRequirement("maxTimeoutSeconds"));
        }
        Ok(Terms {
            chain_id: super::chain_id(req)?,
            token: req.asset.parse().map_err(|_| PayError::BadRequirement("asset"))?,
            pay_to: req.pay_to.parse().map_err(|_| PayError::BadRequirement("payTo"))?,
            facilitator,
            ceiling: req.amount.parse().map_err(|_| PayError::BadRequirement("amount"))?,
        })
    }
}

/// Signs `req` (an `upto` requirement of `challenge`) with `signer`: the
/// Permit2 authorization of its ceiling, valid until `now` plus its
/// `maxTimeoutSeconds`, and the token's permit for Permit2 when the 402
/// offers gas sponsoring and `standing` shows an allowance below the
/// ceiling. `nonce` is Permit2's (random: its nonces are unordered).
pub fn sign(
    challenge: &PaymentRequired,
    req: &PaymentRequirements,
    signer: &PrivateKeySigner,
    now: u64,
    standing: Option<Standing>,
    nonce: U256,
) -> Result<Signed, PayError> {
    let Terms { chain_id, token, pay_to, facilitator, ceiling } = Terms::of(req)?;
    let deadline = U256::from(now + u64::from(req.max_timeout_seconds));

    let message = PermitWitnessTransferFrom {
        permitted: TokenPermissions { token, amount: ceiling },
        spender: UPTO_PROXY,
        nonce,
        deadline,
        witness: Witness { to: pay_to, facilitator, validAfter: U256::ZERO },
    };
    let domain =
        Eip712Domain::new(Some(Cow::Borrowed("Permit2")), None, Some(U256::from(chain_id)), Some(PERMIT2), None);
    let signature = sign_hash(signer, message.eip712_signing_hash(&domain))?;

    let owner = signer.address();
    let sponsored = challenge.extensions.contains_key(EIP2612_GAS_SPONSORING);
    let extensions = match standing {
        Some(standing) if sponsored && standing.permit2_allowance < ceiling => {
            let permit = Permit { owner, spender: PERMIT2, value: ceiling, nonce: standing.permit_nonce, deadline };
            let domain = Eip712Domain::new(
                Some(Cow::Owned(req.extra.name.clone())),
                Some(Cow::Owned(req.extra.version.clone())),
                Some(U256::from(chain_id)),
                Some(token),
                None,
            );
            let permit_signature = sign_hash(signer, permit.eip712_signing_hash(&domain))?;
            // `@x402/evm`'s `signEip2612Permit`, field for field.
            let info = json!({
                "from": owner.to_checksum(None),
                "asset": token.to_checksum(None),
                "spender": PERMIT2.to_checksum(None),
                "amount": ceiling.to_string(),
                "nonce": standing.permit_nonce.to_string(),
                "deadline": deadline.to_string(),
                "signature": permit_signature,
                "version": "1",
            });
            let mut map = serde_json::Map::new();
            map.insert(EIP2612_GAS_SPONSORING.to_owned(), json!({ "info": info }));
            Some(map)
        }
        _ => None,
    };

    Ok(Signed {
        authorization: Permit2Authorization {
            from: owner.to_checksum(None),
            // As the requirement spells it: the facilitator compares it
            // with the requirement's.
            permitted: payments::TokenPermissions { token: token.to_checksum(None), amount: req.amount.clone() },
            spender: UPTO_PROXY.to_checksum(None),
            nonce: nonce.to_string(),
            deadline: deadline.to_string(),
            witness: UptoWitness {
                to: pay_to.to_checksum(None),
                facilitator: facilitator.to_checksum(None),
                valid_after: "0".to_owned(),
            },
        },
        signature,
        extensions,
    })
}

fn sign_hash(signer: &PrivateKeySigner, hash: alloy_primitives::B256) -> Result<String, PayError> {
    let signature = signer.sign_hash_sync(&hash).map_err(|e| PayError::Sign(e.to_string()))?;
    Ok(format!("0x{}", hex::encode(signature.as_bytes())))
}

/// The endpoint for `network` in a `--chain-rpc` value: a bare URL (for
/// any network), or `network=url` pairs separated by commas, as
/// `REEVE_CHAIN_RPC_URLS` spells them. A pair for the network wins over a
/// bare URL.
pub fn endpoint_for(value: &str, network: &str) -> Option<String> {
    let mut bare = None;
    for entry in value.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        match entry.split_once('=') {
            Some((name, url)) if !name.contains("://") => {
                if name.trim() == network {
                    return Some(url.trim().to_owned());
                }
            }
            _ => bare = bare.or_else(|| Some(entry.to_owned())),
        }
    }
    bare
}

/// The payer's [`Standing`] with `token`, read at `url`'s latest block.
pub async fn standing(url: &str, token: Address, owner: Address) -> Result<Standing, PayError> {
    let http = reqwest::Client::builder()
        .timeout(RPC_TIMEOUT)
        .build()
        .map_err(|e| PayError::Chain(format!("{}: {e}", shown(url))))?;
    let allowance = call(&http, url, token, allowanceCall { owner, spender: PERMIT2 }.abi_encode()).await?;
    let permit2_allowance = allowanceCall::abi_decode_returns(&allowance)
        .map_err(|e| PayError::Chain(format!("{}: allowance: {e}", shown(url))))?;
    let nonce = call(&http, url, token, noncesCall { owner }.abi_encode()).await?;
    let permit_nonce = noncesCall::abi_decode_returns(&nonce)
        .map_err(|e| PayError::Chain(format!("{}: nonces (the token has no EIP-2612 permit?): {e}", shown(url))))?;
    Ok(Standing { permit2_allowance, permit_nonce })
}

/// One `eth_call` to `to`.
async fn call(http: &reqwest::Client, url: &str, to: Address, data: Vec<u8>) -> Result<Vec<u8>, PayError> {
    let failed = |why: String| PayError::Chain(format!("{}: eth_call: {why}", shown(url)));
    let body = json!({
        "jsonrpc": "2.0", "id": 1, "method": "eth_call",
        "params": [{"to": to.to_checksum(None), "data": format!("0x{}", hex::encode(data))}, "latest"],
    });
    let answer = http
        .post(url)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        // reqwest's error names the URL, whose path may hold an API key.
        .map_err(|e| failed(e.without_url().to_string()))?;
    let status = answer.status();
    let bytes = answer.bytes().await.map_err(|e| failed(e.without_url().to_string()))?;
    let answer: Value = serde_json::from_slice(&bytes).map_err(|_| failed(format!("HTTP {status}, not JSON-RPC")))?;
    if let Some(error) = answer.get("error") {
        return Err(failed(error["message"].as_str().unwrap_or("an error").to_owned()));
    }
    let result = answer["result"].as_str().ok_or_else(|| failed("no result".to_owned()))?;
    hex::decode(result.trim_start_matches("0x")).map_err(|_| failed("the result is not hex".to_owned()))
}

/// Scheme and host only: a hosted endpoint's path often holds its API key.
pub fn shown(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(parsed) => format!("{}://{}", parsed.scheme(), parsed.host_str().unwrap_or_default()),
        Err(_) => "the JSON-RPC endpoint (not a URL)".to_owned(),
    }
}
