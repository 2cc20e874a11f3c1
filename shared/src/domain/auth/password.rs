use std::sync::LazyLock;

use argon2::password_hash::phc::PasswordHash;
use argon2::{ARGON2ID_IDENT, Algorithm, Argon2, Params, PasswordHasher, PasswordVerifier, Version};

use super::{AuthError, SpaceId};

/// Argon2id at the OWASP floor: m=19456 KiB, t=2, p=1 (docs/architecture.md#auth). The
/// parameters are written into each PHC string and verification reads them
/// from there, so raising these later keeps old hashes valid.
const PARAMS: Params = match Params::new(19_456, 2, 1, None) {
    Ok(params) => params,
    Err(_) => panic!("invalid Argon2 parameters"),
};

fn argon2() -> Argon2<'static> {
    Argon2::new(Algorithm::Argon2id, Version::V0x13, PARAMS)
}

/// A real hash, with `PARAMS`, of a password no Space ID can equal (it is not
/// 20 digits). An unknown Space ID is verified against it so that it costs the
/// same Argon2 work as a wrong one. It is a literal rather than computed at
/// start-up so the first unknown ID on a cold instance is not slower than the
/// rest; a test recomputes it, and fails with the new value if `PARAMS` change.
const DUMMY_PHC_STR: &str =
    "$argon2id$v=19$m=19456,t=2,p=1$cmVldmUtZHVtbXktc2FsdA$OS3b18+QVwo7VoSBKtkBnpfXp3dKOJXpUUN4bD+8Y8U";
#[cfg(test)]
const DUMMY_PASSWORD: &[u8] = b"reeve: no space has this id";
#[cfg(test)]
const DUMMY_SALT: &[u8] = b"reeve-dummy-salt";

static DUMMY_PHC: LazyLock<PasswordHash> =
    LazyLock::new(|| PasswordHash::new(DUMMY_PHC_STR).expect("DUMMY_PHC_STR is a valid PHC string"));

/// Hashes a new Space ID for storage: Argon2id, `PARAMS`, a 16-byte salt from
/// the OS RNG. Returns the PHC string (`$argon2id$v=19$m=19456,t=2,p=1$…`).
/// CPU-heavy (tens of ms): call it from `spawn_blocking` in async code.
pub fn hash_space_id(id: &SpaceId) -> Result<String, AuthError> {
    let mut salt = [0u8; argon2::RECOMMENDED_SALT_LEN];
    getrandom::fill(&mut salt).map_err(AuthError::Rng)?;
    let phc = argon2().hash_password_with_salt(id.as_str().as_bytes(), &salt).map_err(AuthError::Hash)?;
    Ok(phc.to_string())
}

/// Checks `id` against the stored PHC string of the space its index found.
///
/// `None` (no such space) and a stored string that is not a complete Argon2id
/// hash both run a verify against [`DUMMY_PHC`] and return `false`, so
/// probing cannot tell an unknown ID from a wrong one by timing. CPU-heavy:
/// call it from `spawn_blocking` in async code.
pub fn verify_space_id(id: &SpaceId, stored_phc: Option<&str>) -> bool {
    match stored_phc.map(PasswordHash::new) {
        Some(Ok(phc)) if is_complete_argon2id(&phc) => argon2_verify(id.as_str().as_bytes(), &phc),
        _ => {
            argon2_verify(id.as_str().as_bytes(), &DUMMY_PHC);
            false
        }
    }
}

/// Without a salt and a hash the verifier returns early without doing any
/// Argon2 work, which would make such rows distinguishable by timing.
fn is_complete_argon2id(phc: &PasswordHash) -> bool {
    phc.algorithm == ARGON2ID_IDENT && phc.salt.is_some() && phc.hash.is_some()
}

/// The one place Argon2 verification runs. The comparison of outputs inside
/// `password_hash` is constant time (`phc::Output`'s `PartialEq` uses `subtle`).
fn argon2_verify(password: &[u8], phc: &PasswordHash) -> bool {
    #[cfg(test)]
    tests::ARGON2_VERIFIES.with(|n| n.set(n.get() + 1));
    argon2().verify_password(password, phc).is_ok()
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    thread_local! {
        /// Counts `argon2_verify` calls on this test's thread.
        pub(super) static ARGON2_VERIFIES: Cell<u32> = const { Cell::new(0) };
    }

    fn verifies_during(f: impl FnOnce()) -> u32 {
        let before = ARGON2_VERIFIES.with(Cell::get);
        f();
        ARGON2_VERIFIES.with(Cell::get) - before
    }

    const PREFIX: &str = "$argon2id$v=19$m=19456,t=2,p=1$";

    fn id(s: &str) -> SpaceId {
        SpaceId::parse(s).unwrap()
    }

    #[test]
    fn hash_then_verify_round_trips() {
        let right = id("12345678901234567890");
        let wrong = id("12345678901234567891");
        let phc = hash_space_id(&right).unwrap();
        assert!(phc.starts_with(PREFIX), "{phc}");
        assert!(!phc.contains(right.as_str()));
        assert_eq!(verifies_during(|| assert!(verify_space_id(&right, Some(&phc)))), 1);
        assert_eq!(verifies_during(|| assert!(!verify_space_id(&wrong, Some(&phc)))), 1);
    }

    #[test]
    fn each_hash_gets_a_fresh_salt() {
        let same = id("00000000000000000000");
        let a = hash_space_id(&same).unwrap();
        let b = hash_space_id(&same).unwrap();
        assert_ne!(a, b);
        let salt = |phc: &str| PasswordHash::new(phc).unwrap().salt.unwrap();
        assert_ne!(salt(&a), salt(&b));
        assert_eq!(salt(&a).len(), 16);
    }

    #[test]
    fn unknown_space_fails_after_real_argon2_work() {
        let n = verifies_during(|| assert!(!verify_space_id(&id("12345678901234567890"), None)));
        assert_eq!(n, 1);
    }

    #[test]
    fn malformed_stored_hash_fails_after_real_argon2_work() {
        let real = hash_space_id(&id("12345678901234567890")).unwrap();
        let bad = [
            "",
            "garbage",
            PREFIX,
            &real[..real.len() - 1],           // hash one character short
            &real[..real.rfind('$').unwrap()], // salt but no hash
            "$argon2i$v=19$m=19456,t=2,p=1$cmVldmUtZHVtbXktc2FsdA$OS3b18+QVwo7VoSBKtkBnpfXp3dKOJXpUUN4bD+8Y8U",
            "$scrypt$ln=16,r=8,p=1$aM15713r3Xsvxbi31lqr1Q$nFNh2CVHVjNldFVKDHDlm4CbdRSCdEBsjjJxD+iCs5E",
        ];
        for phc in bad {
            let n = verifies_during(|| assert!(!verify_space_id(&id("12345678901234567890"), Some(phc)), "{phc}"));
            assert_eq!(n, 1, "{phc}");
        }
    }

    /// The dummy path must cost what a real check costs: it must be a real,
    /// complete Argon2id hash with today's parameters.
    #[test]
    fn dummy_hash_is_a_real_hash_with_current_params() {
        let fresh = argon2().hash_password_with_salt(DUMMY_PASSWORD, DUMMY_SALT).unwrap().to_string();
        assert_eq!(DUMMY_PHC_STR, fresh, "update DUMMY_PHC_STR");
        assert!(DUMMY_PHC_STR.starts_with(PREFIX));
        assert!(is_complete_argon2id(&DUMMY_PHC));
        let params = Params::try_from(&*DUMMY_PHC).unwrap();
        assert_eq!((params.m_cost(), params.t_cost(), params.p_cost()), (19_456, 2, 1));
    }
}
