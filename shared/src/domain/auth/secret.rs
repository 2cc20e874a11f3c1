use std::fmt;

use zeroize::Zeroize;

use super::AuthError;

/// The shortest pepper or token key we accept: 256 bits, the HMAC-SHA256
/// output size, so the key is never the weak link.
pub(crate) const MIN_SECRET_LEN: usize = 32;

/// Every secret a process holds: `REEVE_PEPPER` (space index),
/// `REEVE_TOKEN_KEY` (session tokens), `DATABASE_URL` (it carries the
/// password). `Debug` and `Display` show only the name, never the bytes,
/// and the bytes are overwritten with zeros when the value is dropped, so a
/// secret is neither logged by accident nor left behind in freed memory.
#[derive(Clone)]
pub struct Secret {
    name: &'static str,
    bytes: Vec<u8>,
}

impl Secret {
    /// Key material. `name` is what the operator knows the secret by (e.g.
    /// `"REEVE_PEPPER"`); it appears in error messages and `Debug`, the bytes
    /// never do.
    pub fn new(name: &'static str, bytes: Vec<u8>) -> Result<Self, AuthError> {
        if bytes.len() < MIN_SECRET_LEN {
            let len = bytes.len();
            Secret { name, bytes }.zeroize();
            return Err(AuthError::SecretTooShort { name, len });
        }
        Ok(Self { name, bytes })
    }

    /// A secret that is not a key (a URL with a password in it): no length
    /// rule.
    pub fn text(name: &'static str, value: String) -> Self {
        Secret { name, bytes: value.into_bytes() }
    }

    /// A key for a process that was not given this secret: 32 fresh random
    /// bytes, never written anywhere. Whatever it is used for fails closed:
    /// every token it checks is refused and nothing it derives matches a
    /// real space.
    pub fn withheld(name: &'static str) -> Self {
        let mut bytes = vec![0u8; MIN_SECRET_LEN];
        getrandom::fill(&mut bytes).expect("the OS random number generator works");
        Secret { name, bytes }
    }

    pub fn name(&self) -> &'static str {
        self.name
    }

    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The value as text, for the one call that needs it (connecting to
    /// Postgres). Empty if the bytes are not UTF-8.
    pub fn expose_str(&self) -> &str {
        std::str::from_utf8(&self.bytes).unwrap_or_default()
    }
}

impl Zeroize for Secret {
    fn zeroize(&mut self) {
        // Zeroes the whole allocation, spare capacity included, then empties.
        self.bytes.zeroize();
    }
}

impl Drop for Secret {
    fn drop(&mut self) {
        self.zeroize();
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secret({}, redacted)", self.name)
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "<{} redacted>", self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_secret_is_rejected_with_its_name() {
        let err = Secret::new("REEVE_PEPPER", b"twelve bytes".to_vec()).unwrap_err();
        assert!(matches!(err, AuthError::SecretTooShort { name: "REEVE_PEPPER", len: 12 }));
        assert_eq!(err.to_string(), "REEVE_PEPPER must be at least 32 bytes (got 12)");
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
        let dbg = format!("{s:?} {s:#?} {s} {s:>40}");
        assert!(!dbg.contains(value), "{dbg}");
        assert!(!dbg.contains("super"), "{dbg}");
        // Nor as a byte list, which a derived Debug would print.
        assert!(!dbg.contains("115"), "{dbg}");
        assert!(dbg.contains("REEVE_PEPPER"));
    }

    #[test]
    fn zeroize_wipes_the_bytes_and_text_secrets_redact_too() {
        let url = "postgres://reeve:hunter2-password@db:5432/reeve";
        let mut s = Secret::text("DATABASE_URL", url.to_owned());
        assert_eq!(s.expose_str(), url);
        let shown = format!("{s} {s:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert_eq!(shown, "<DATABASE_URL redacted> Secret(DATABASE_URL, redacted)");
        // What Drop runs: afterwards nothing of the value is left to read.
        s.zeroize();
        assert_eq!(s.expose_str(), "");
        assert!(s.as_bytes().is_empty());
    }

    #[test]
    fn withheld_keys_are_random_and_differ() {
        let a = Secret::withheld("REEVE_PEPPER");
        let b = Secret::withheld("REEVE_PEPPER");
        assert_eq!(a.as_bytes().len(), MIN_SECRET_LEN);
        assert_ne!(a.as_bytes(), b.as_bytes());
    }
}
