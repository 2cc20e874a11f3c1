//! One canonical JSON text per value, for what is hashed: an idempotency
//! key's request and an x402 payment's identity. A hash of serde_json's own
//! output would change with key order.

use serde_json::Value;

/// A canonical serialisation: object keys sorted (by their UTF-8 bytes), no
/// insignificant whitespace, strings and numbers as serde_json writes them.
/// It does not depend on serde_json's `preserve_order` feature, which any
/// crate in the build could switch on.
pub fn canonical_json(value: &Value) -> String {
    let mut out = String::new();
    write_canonical(value, &mut out);
    out
}

fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            out.push('{');
            for (i, (key, child)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                write_canonical(child, out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

/// SHA-256 of the canonical form of `(kind, input)`: what an idempotency key
/// is bound to (the same key with another request is a conflict), and what
/// a payment attempt pays for. Tasks and payments both hash with it.
pub fn request_hash(kind: &str, input: &Value) -> [u8; 32] {
    use sha2::Digest;
    let canonical = canonical_json(&serde_json::json!({ "kind": kind, "input": input }));
    sha2::Sha256::digest(canonical.as_bytes()).into()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn canonical_json_sorts_keys_at_every_depth() {
        let a: Value = serde_json::from_str(r#"{"b":1,"a":{"y":[{"d":1,"c":2}],"x":"s"}}"#).unwrap();
        let b: Value = serde_json::from_str(r#"{ "a": {"x": "s", "y": [{"c": 2, "d": 1}]}, "b": 1 }"#).unwrap();
        assert_eq!(canonical_json(&a), r#"{"a":{"x":"s","y":[{"c":2,"d":1}]},"b":1}"#);
        assert_eq!(canonical_json(&a), canonical_json(&b));
        assert_eq!(request_hash("k", &a), request_hash("k", &b));
    }

    #[test]
    fn the_hash_covers_kind_and_input() {
        let input = json!({"a": 1});
        assert_ne!(request_hash("k", &input), request_hash("j", &input));
        assert_ne!(request_hash("k", &input), request_hash("k", &json!({"a": 2})));
        assert_ne!(request_hash("k", &json!({"a": "1"})), request_hash("k", &json!({"a": 1})));
        // Array order is significant.
        assert_ne!(request_hash("k", &json!([1, 2])), request_hash("k", &json!([2, 1])));
    }

    #[test]
    fn canonical_json_escapes_strings_and_keys() {
        let v = json!({"q\"uote": "line\nbreak", "é": "\u{1}"});
        let text = canonical_json(&v);
        assert_eq!(serde_json::from_str::<Value>(&text).unwrap(), v);
    }
}
