use std::fmt;

use super::AuthError;

/// The shortest pepper or token key we accept: 256 bits, the HMAC-SHA256
/// output size, so the key is never the weak link.
pub(crate) const MIN_SECRET_LEN: usize = 32;

/// Key material: `REEVE_PEPPER` (space index) or `REEVE_TOKEN_KEY` (session
/// tokens). `Debug` shows only the name, never the bytes.
#[derive(Clone)]
pub struct Secret {
    name: &'static str,
    bytes: Vec<u8>,
}

impl Secret {
    /// `name` is what the operator knows the secret by (e.g. `"REEVE_PEPPER"`);
    /// it appears in error messages and `Debug`, the bytes never do.
    pub fn new(name: &'static str, bytes: Vec<u8>) -> Result<Self, AuthError> {
        if bytes.len() < MIN_SECRET_LEN {
            return Err(AuthError::SecretTooShort {
                name,
                len: bytes.len(),
            });
        }
        Ok(Self { name, bytes })
    }

    pub fn name(&self) -> &'static str {
        self.name
    }

    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secret({}, redacted)", self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_secret_is_rejected_with_its_name() {
        let err = Secret::new("REEVE_PEPPER", b"twelve bytes".to_vec()).unwrap_err();
        assert!(matches!(
            err,
            AuthError::SecretTooShort {
                name: "REEVE_PEPPER",
                len: 12
            }
        ));
        assert_eq!(
            err.to_string(),
            "REEVE_PEPPER must be at least 32 bytes (got 12)"
        );
        assert!(Secret::new("REEVE_TOKEN_KEY", vec![7; 31]).is_err());
        assert!(Secret::new("REEVE_TOKEN_KEY", Vec::new()).is_err());
    }

    #[test]
    fn secret_of_32_bytes_is_accepted() {
        let s = Secret::new("REEVE_TOKEN_KEY", vec![7; 32]).unwrap();
        assert_eq!(s.name(), "REEVE_TOKEN_KEY");
        assert_eq!(s.as_bytes(), &[7; 32]);
    }

    #[test]
    fn debug_does_not_show_the_bytes() {
        let value = "super-secret-value-0123456789-abcdef";
        let s = Secret::new("REEVE_PEPPER", value.as_bytes().to_vec()).unwrap();
        let dbg = format!("{s:?} {s:#?}");
        assert!(!dbg.contains(value), "{dbg}");
        assert!(!dbg.contains("super"), "{dbg}");
        // Nor as a byte list, which a derived Debug would print.
        assert!(!dbg.contains("115"), "{dbg}");
        assert!(dbg.contains("REEVE_PEPPER"));
    }
}
