use std::fmt;
use std::hash::{Hash, Hasher};
use std::str::FromStr;

use subtle::ConstantTimeEq;

use super::{AuthError, Secret, hmac_sha256};

/// A Space ID has exactly this many ASCII digits (~66 bits of entropy).
const LEN: usize = 20;

/// The credential that names a Space: 20 ASCII digits, leading zeros allowed
/// (it is a string, not a number). It is shown to the user once and never
/// stored, so `Debug` hides it and there is deliberately no `Display`.
#[derive(Clone)]
pub struct SpaceId(String);

impl SpaceId {
    /// Draws a fresh ID from the OS RNG, every digit independent and uniform.
    pub fn generate() -> Result<Self, AuthError> {
        let mut id = String::with_capacity(LEN);
        let mut buf = [0u8; 32];
        while id.len() < LEN {
            getrandom::fill(&mut buf).map_err(AuthError::Rng)?;
            // 250 is the largest multiple of 10 that fits in a byte. Rejecting
            // 250..=255 keeps the digits uniform; a plain `% 10` over 0..=255
            // would favour 0–5.
            for b in buf.iter().filter(|&&b| b < 250).take(LEN - id.len()) {
                id.push(char::from(b'0' + b % 10));
            }
        }
        Ok(Self(id))
    }

    /// Accepts exactly 20 ASCII digits. Nothing is trimmed or normalised: a
    /// client sending anything else has a bug worth surfacing.
    pub fn parse(s: &str) -> Result<Self, AuthError> {
        if s.len() == LEN && s.bytes().all(|b| b.is_ascii_digit()) {
            Ok(Self(s.to_owned()))
        } else {
            Err(AuthError::MalformedSpaceId)
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for SpaceId {
    type Err = AuthError;
    fn from_str(s: &str) -> Result<Self, AuthError> {
        Self::parse(s)
    }
}

impl fmt::Debug for SpaceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SpaceId(…)")
    }
}

/// The database key of a Space: `HMAC-SHA256(pepper, space_id)[..16]`.
/// Without the pepper it reveals nothing about the ID, so it may be logged and
/// used in S3 keys (as hex). Equality is constant time anyway, as docs/architecture.md#auth
/// asks for every MAC-derived value.
#[derive(Clone, Copy)]
pub struct SpaceIndex([u8; 16]);

impl SpaceIndex {
    pub const fn from_array(bytes: [u8; 16]) -> Self {
        Self(bytes)
    }

    pub fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }

    /// From a database `BYTEA`; `None` unless it is exactly 16 bytes.
    pub fn from_slice(bytes: &[u8]) -> Option<Self> {
        bytes.try_into().ok().map(Self)
    }

    /// Lower-case hex, 32 characters (used in S3 keys).
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }
}

impl PartialEq for SpaceIndex {
    fn eq(&self, other: &Self) -> bool {
        self.0.ct_eq(&other.0).into()
    }
}

impl Eq for SpaceIndex {}

// Written by hand because `PartialEq` is; it agrees with it (same bytes).
impl Hash for SpaceIndex {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.hash(state);
    }
}

impl fmt::Debug for SpaceIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SpaceIndex({})", self.to_hex())
    }
}

/// The fast lookup key for `id` (docs/architecture.md#auth, step 1).
pub fn space_index(pepper: &Secret, id: &SpaceId) -> SpaceIndex {
    let mac = hmac_sha256(pepper.as_bytes(), &[id.as_str().as_bytes()]);
    let mut idx = [0u8; 16];
    idx.copy_from_slice(&mac[..16]);
    SpaceIndex(idx)
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    fn is_space_id_format(s: &str) -> bool {
        s.len() == 20 && s.chars().all(|c| c.is_ascii_digit())
    }

    /// Pearson's chi-square statistic against a uniform distribution over 0–9.
    fn chi_square(counts: &[u64; 10]) -> f64 {
        let expected = counts.iter().sum::<u64>() as f64 / 10.0;
        counts.iter().map(|&c| (c as f64 - expected).powi(2) / expected).sum()
    }

    #[test]
    fn generated_ids_are_20_digits_and_distinct() {
        let mut seen = HashSet::new();
        for _ in 0..10_000 {
            let id = SpaceId::generate().unwrap();
            assert!(is_space_id_format(id.as_str()), "bad format: {}", id.as_str());
            assert!(seen.insert(id.as_str().to_owned()), "duplicate id");
        }
    }

    /// With 9 degrees of freedom the statistic averages 9; P(χ² > 100) is
    /// about 1e-17, so the bound never flakes. A constant digit gives 3.6e6
    /// overall, and even the small modulo bias of an unrejected `byte % 10`
    /// averages ~146.
    #[test]
    fn digits_are_roughly_uniform() {
        const BOUND: f64 = 100.0;
        let mut overall = [0u64; 10];
        let mut per_position = [[0u64; 10]; LEN];
        for _ in 0..20_000 {
            let id = SpaceId::generate().unwrap();
            for (pos, b) in id.as_str().bytes().enumerate() {
                let d = usize::from(b - b'0');
                overall[d] += 1;
                per_position[pos][d] += 1;
            }
        }
        let chi = chi_square(&overall);
        assert!(chi < BOUND, "overall χ² = {chi}, counts {overall:?}");
        for (pos, counts) in per_position.iter().enumerate() {
            let chi = chi_square(counts);
            assert!(chi < BOUND, "position {pos}: χ² = {chi}, counts {counts:?}");
        }
        // The statistic itself must be able to reject a skewed sample.
        assert!(chi_square(&[400_000, 0, 0, 0, 0, 0, 0, 0, 0, 0]) > BOUND);
        let modulo_biased = [40_625, 40_625, 40_625, 40_625, 40_625, 40_625, 39_063, 39_062, 39_063, 39_062];
        assert!(chi_square(&modulo_biased) > BOUND);
    }

    #[test]
    fn parse_accepts_exactly_20_ascii_digits() {
        assert_eq!(SpaceId::parse("01234567890123456789").unwrap().as_str(), "01234567890123456789");
        assert_eq!(SpaceId::parse("00000000000000000000").unwrap().as_str(), "00000000000000000000");
        let generated = SpaceId::generate().unwrap();
        assert_eq!(SpaceId::parse(generated.as_str()).unwrap().as_str(), generated.as_str());
        assert!("98765432109876543210".parse::<SpaceId>().is_ok());
    }

    #[test]
    fn parse_rejects_everything_else() {
        let arabic_20_bytes = format!("{}١", "0".repeat(18)); // ١ is 2 bytes
        let arabic_20_chars = format!("{}١", "0".repeat(19));
        let arabic_only = "١".repeat(10); // 20 bytes, all Unicode digits
        let bad = [
            arabic_20_bytes.as_str(),
            arabic_20_chars.as_str(),
            arabic_only.as_str(),
            "",
            "0123456789012345678",   // 19
            "012345678901234567890", // 21
            "0123456789012345678a",
            "a0123456789012345678",
            "0123456789 012345678",
            " 0123456789012345678",
            "0123456789012345678 ",
            " 01234567890123456789",
            "01234567890123456789\n",
            "-1234567890123456789",
            "+1234567890123456789",
            "０１２３４５６７８９０１２３４５６７８９", // full-width digits
        ];
        for s in bad {
            assert!(matches!(SpaceId::parse(s), Err(AuthError::MalformedSpaceId)), "accepted {s:?}");
        }
    }

    #[test]
    fn debug_hides_the_id() {
        let id = SpaceId::parse("31415926535897932384").unwrap();
        let dbg = format!("{id:?} {id:#?}");
        assert_eq!(format!("{id:?}"), "SpaceId(…)");
        assert!(!dbg.contains("31415"), "{dbg}");
    }

    #[test]
    fn space_index_is_deterministic_and_keyed() {
        let pepper = Secret::new("REEVE_PEPPER", vec![1; 32]).unwrap();
        let other_pepper = Secret::new("REEVE_PEPPER", vec![2; 32]).unwrap();
        let a = SpaceId::parse("00000000000000000001").unwrap();
        let b = SpaceId::parse("00000000000000000002").unwrap();

        let idx = space_index(&pepper, &a);
        assert_eq!(idx, space_index(&pepper, &a.clone()));
        assert_eq!(idx.as_bytes().len(), 16);
        assert_ne!(idx, space_index(&other_pepper, &a));
        assert_ne!(idx, space_index(&pepper, &b));

        // It is the first half of HMAC-SHA256(pepper, id).
        let mac = hmac_sha256(&[1; 32], &[b"00000000000000000001"]);
        assert_eq!(idx.as_bytes(), &mac[..16]);
    }

    #[test]
    fn space_index_round_trips_through_bytes_and_hex() {
        let idx = SpaceIndex::from_array([0xab; 16]);
        assert_eq!(idx.to_hex(), "ab".repeat(16));
        assert_eq!(SpaceIndex::from_slice(idx.as_bytes()), Some(idx));
        assert_eq!(SpaceIndex::from_slice(&[0xab; 15]), None);
        assert_eq!(SpaceIndex::from_slice(&[0xab; 17]), None);
        assert_ne!(SpaceIndex::from_array([0xab; 16]), SpaceIndex::from_array([0xac; 16]));
        let mut one_bit_off = [0xab; 16];
        one_bit_off[15] ^= 1;
        assert_ne!(idx, SpaceIndex::from_array(one_bit_off));
        assert_eq!(format!("{idx:?}"), format!("SpaceIndex({})", "ab".repeat(16)));
    }
}
