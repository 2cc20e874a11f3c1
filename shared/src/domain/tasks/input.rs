//! What is checked on a task's input before it is stored: its schema, the
//! uploads it names, and the hash that makes idempotent retries comparable.

use serde_json::Value;

use crate::domain::catalog::TaskSpec;
use crate::domain::ids::Id;

/// At most this many schema violations are listed in one answer.
pub const MAX_VIOLATIONS: usize = 10;

/// At most this many distinct uploads per task: each is a database look-up
/// (and maybe an S3 HEAD) on the request path.
pub const MAX_UPLOADS: usize = 100;

/// One way an input fails its task's schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// JSON pointer into the input; `""` is the input itself.
    pub pointer: String,
    pub message: String,
}

/// Every violation (the first [`MAX_VIOLATIONS`]) and how many there were.
/// Messages mask the offending values: the client knows what it sent, and
/// echoing a 60 KiB string back helps nobody.
#[cfg(feature = "input-schemas")]
pub fn violations(spec: &TaskSpec, input: &Value) -> (Vec<Violation>, usize) {
    let mut listed = Vec::new();
    let mut total = 0;
    // The functions that validate inputs load their catalog compiled
    // (`startup::compiled_catalog_file`); a process that did not has no business
    // here, and letting its inputs through unchecked is not an option.
    let validator = spec
        .input_validator
        .as_deref()
        .expect("inputs are validated against a catalog loaded with Catalog::load_compiled_for");
    for violation in validator.violations(input) {
        total += 1;
        if listed.len() < MAX_VIOLATIONS {
            listed.push(Violation { pointer: violation.pointer, message: violation.message });
        }
    }
    (listed, total)
}

/// The message of a `422 invalid_input`: each violation with its pointer.
pub fn describe_violations(listed: &[Violation], total: usize) -> String {
    let mut parts: Vec<String> = listed
        .iter()
        .map(|v| {
            let at = if v.pointer.is_empty() { "(root)" } else { v.pointer.as_str() };
            format!("{at}: {}", v.message)
        })
        .collect();
    if total > listed.len() {
        parts.push(format!("and {} more", total - listed.len()));
    }
    format!("input does not match the task's input_schema (see GET /v1/catalog): {}", parts.join("; "))
}

/// The JSON pointer of the first string (a value or an object key) holding
/// a NUL character, which Postgres cannot store in `jsonb` or `text`:
/// `None` when there is none. Such an input is the client's error, found
/// before anything is looked up or paid.
pub fn nul_pointer(input: &Value) -> Option<String> {
    fn walk(value: &Value, pointer: &mut String) -> bool {
        let len = pointer.len();
        match value {
            Value::String(s) => s.contains('\0'),
            Value::Object(map) => map.iter().any(|(key, child)| {
                push_segment(pointer, key);
                let found = key.contains('\0') || walk(child, pointer);
                if !found {
                    pointer.truncate(len);
                }
                found
            }),
            Value::Array(items) => items.iter().enumerate().any(|(i, item)| {
                pointer.push('/');
                pointer.push_str(&i.to_string());
                let found = walk(item, pointer);
                if !found {
                    pointer.truncate(len);
                }
                found
            }),
            _ => false,
        }
    }
    let mut pointer = String::new();
    walk(input, &mut pointer).then_some(pointer)
}

/// Whether `text` (a query filter, a header) can reach SQL as it is.
pub fn has_nul(text: &str) -> bool {
    text.contains('\0')
}

/// An upload an input refers to, with where it was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UploadRef {
    /// JSON pointer of the string, e.g. `/files/0/upload_ids/2`.
    pub pointer: String,
    /// `None` when the value there is not a well-formed id: such an upload
    /// cannot exist, so it is reported like an unknown one.
    pub id: Option<Id>,
}

/// Every value in fields named `upload_id` (a string) or `upload_ids` (an
/// array of strings), at any depth, in document order. A value of another
/// shape in such a field is returned with `id: None`.
pub fn upload_refs(input: &Value) -> Vec<UploadRef> {
    let mut refs = Vec::new();
    walk(input, &mut String::new(), &mut refs);
    refs
}

fn walk(value: &Value, pointer: &mut String, refs: &mut Vec<UploadRef>) {
    let len = pointer.len();
    match value {
        Value::Object(map) => {
            for (key, child) in map {
                push_segment(pointer, key);
                match (key.as_str(), child) {
                    ("upload_id", _) => refs.push(one_ref(pointer, child)),
                    ("upload_ids", Value::Array(items)) => {
                        for (i, item) in items.iter().enumerate() {
                            let at = pointer.len();
                            pointer.push('/');
                            pointer.push_str(&i.to_string());
                            refs.push(one_ref(pointer, item));
                            pointer.truncate(at);
                        }
                    }
                    // Not an array: malformed, and not searched further.
                    ("upload_ids", _) => refs.push(UploadRef { pointer: pointer.clone(), id: None }),
                    _ => walk(child, pointer, refs),
                }
                pointer.truncate(len);
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                pointer.push('/');
                pointer.push_str(&i.to_string());
                walk(item, pointer, refs);
                pointer.truncate(len);
            }
        }
        _ => {}
    }
}

fn one_ref(pointer: &str, value: &Value) -> UploadRef {
    UploadRef { pointer: pointer.to_owned(), id: value.as_str().and_then(|s| s.parse().ok()) }
}

/// Appends `/key` with JSON pointer escaping (`~` → `~0`, `/` → `~1`).
fn push_segment(pointer: &mut String, key: &str) {
    pointer.push('/');
    for c in key.chars() {
        match c {
            '~' => pointer.push_str("~0"),
            '/' => pointer.push_str("~1"),
            c => pointer.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn upload_refs_are_found_at_any_depth_with_their_pointers() {
        let a = Id::new();
        let b = Id::new();
        let c = Id::new();
        let input = json!({
            "upload_id": a.to_string(),
            "nested": {"list": [{"upload_ids": [b.to_string(), "nope", 7]}]},
            "x/y": {"upload_id": c.to_string()},
            "other": "01ARZ3NDEKTSV4RRFFQ69G5FAV"
        });
        let refs = upload_refs(&input);
        let got: Vec<(&str, Option<Id>)> = refs.iter().map(|r| (r.pointer.as_str(), r.id)).collect();
        // serde_json's map iterates in key order.
        assert_eq!(
            got,
            [
                ("/nested/list/0/upload_ids/0", Some(b)),
                ("/nested/list/0/upload_ids/1", None),
                ("/nested/list/0/upload_ids/2", None),
                ("/upload_id", Some(a)),
                ("/x~1y/upload_id", Some(c)),
            ]
        );
    }

    #[test]
    fn a_nul_anywhere_is_found_with_its_pointer() {
        let cases = [
            (json!({"text": "a\u{0}b"}), Some("/text")),
            (json!({"a": {"b": ["ok", {"c/d": "x\u{0}"}]}}), Some("/a/b/1/c~1d")),
            (json!({"k\u{0}ey": 1}), Some("/k\u{0}ey")),
            (json!({"a": ["x", "y"], "b": {"c": 1}}), None),
        ];
        for (input, want) in cases {
            assert_eq!(nul_pointer(&input).as_deref(), want, "{input}");
        }
        assert!(has_nul("fe\u{0}tch") && !has_nul("fetch"));
    }

    #[test]
    fn malformed_upload_fields_are_refs_without_an_id() {
        let refs = upload_refs(&json!({"upload_id": 5, "upload_ids": "01ARZ3NDEKTSV4RRFFQ69G5FAV"}));
        assert_eq!(refs.len(), 2);
        assert!(refs.iter().all(|r| r.id.is_none()));
        assert!(upload_refs(&json!({"file": "x"})).is_empty());
        // Lower case is not one of our ids.
        let lower = Id::new().to_string().to_lowercase();
        assert_eq!(upload_refs(&json!({"upload_id": lower}))[0].id, None);
    }
}
