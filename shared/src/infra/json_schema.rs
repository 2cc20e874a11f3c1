//! JSON Schema, compiled once and checked per request: task inputs
//! (the catalog's `input_schema`) and MCP tool arguments.
//!
//! `boon` compiles and validates; the messages are ours. Its own quote the
//! failing value (a `pattern` or `format` message repeats the string), and an
//! input may carry a secret or 60 KiB of text that a `422` must not echo back:
//! a message here names the rule and where it failed, never the value.

use std::fmt::{self, Write as _};

use boon::{CompileError, Compiler, ErrorKind, SchemaIndex, Schemas, ValidationError};
use serde_json::Value;

/// The name the schema is compiled under. A `$ref` resolves inside it only:
/// no other resource is loaded, from the network or the disk.
const HOME: &str = "urn:reeve:schema";

/// The `format`s that are checked ([`JsonSchema::compile`] refuses any
/// other, which would otherwise pass anything).
const FORMATS: [&str; 20] = [
    "date",
    "date-time",
    "duration",
    "email",
    "hostname",
    "idn-email",
    "idn-hostname",
    "ipv4",
    "ipv6",
    "iri",
    "iri-reference",
    "json-pointer",
    "period",
    "regex",
    "relative-json-pointer",
    "time",
    "uri",
    "uri-reference",
    "uri-template",
    "uuid",
];

/// A compiled schema.
pub struct JsonSchema {
    schemas: Schemas,
    root: SchemaIndex,
}

impl fmt::Debug for JsonSchema {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("JsonSchema")
    }
}

/// One way a value fails its schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// JSON pointer into the value; `""` is the value itself.
    pub pointer: String,
    pub message: String,
}

impl JsonSchema {
    /// Compiles `schema` (draft 2020-12 unless it names another in
    /// `$schema`), which checks it against its meta-schema: for a schema an
    /// operator wrote (the catalog's).
    ///
    /// Formats are asserted because draft 2020-12 treats `format` as a mere
    /// annotation, and a schema that says `format = "uri"` means it to be
    /// enforced; for the same reason an unknown format (say `"url"`) is an
    /// error rather than silently accepting anything.
    pub fn compile(schema: &Value) -> Result<JsonSchema, String> {
        if let Some((pointer, format)) = unknown_format(schema, &mut String::new()) {
            return Err(format!("invalid JSON Schema at {pointer}: unknown format {format:?}"));
        }
        Self::compile_generated(schema)
    }

    /// [`compile`](Self::compile) for a schema generated from Rust types
    /// (the MCP tools'), whose OpenAPI formats (`int32`, `uint64`) say how
    /// a number is stored: an unknown format is an annotation.
    pub fn compile_generated(schema: &Value) -> Result<JsonSchema, String> {
        let mut compiler = Compiler::new();
        compiler.enable_format_assertions();
        // No scheme at all: the meta-schemas are built in, and nothing else
        // is fetched.
        compiler.use_loader(Box::new(boon::SchemeUrlLoader::new()));
        let mut schemas = Schemas::new();
        compiler.add_resource(HOME, schema.clone()).map_err(|error| compile_error(&error))?;
        let root = compiler.compile(HOME, &mut schemas).map_err(|error| compile_error(&error))?;
        Ok(JsonSchema { schemas, root })
    }

    pub fn is_valid(&self, value: &Value) -> bool {
        self.schemas.validate(value, self.root).is_ok()
    }

    /// Every violation: an object's properties (by name) before its own.
    pub fn violations(&self, value: &Value) -> Vec<Violation> {
        let Err(error) = self.schemas.validate(value, self.root) else { return Vec::new() };
        let mut found = Vec::new();
        leaves(&error, &mut found);
        found
            .into_iter()
            .map(|leaf| Violation { pointer: leaf.instance_location.to_string(), message: masked(&leaf.kind) })
            .collect()
    }
}

/// The errors that say what is wrong, without the groups that only hold
/// them. `anyOf` and `oneOf` are one violation each: listing every branch's
/// complaint would tell the client to satisfy all of them.
fn leaves<'e, 's, 'v>(error: &'e ValidationError<'s, 'v>, found: &mut Vec<&'e ValidationError<'s, 'v>>) {
    let holds_others = matches!(
        error.kind,
        ErrorKind::Group | ErrorKind::Schema { .. } | ErrorKind::Reference { .. } | ErrorKind::AllOf
    );
    if holds_others && !error.causes.is_empty() {
        for cause in &error.causes {
            leaves(cause, found);
        }
        return;
    }
    found.push(error);
}

/// What a rule asks for, in words, never quoting the value that failed it.
/// Property names are shown: a client needs them to find its mistake.
fn masked(kind: &ErrorKind) -> String {
    let list = |items: &mut dyn Iterator<Item = String>| items.collect::<Vec<_>>().join(", ");
    let quoted = |names: &[&str]| list(&mut names.iter().map(|n| format!("{n:?}")));
    match kind {
        ErrorKind::Type { got, want } => {
            let want: Vec<String> = want.iter().map(|t| t.to_string()).collect();
            format!("must be of type {}, not {got}", want.join(" or "))
        }
        ErrorKind::Enum { want } => format!("must be one of {}", list(&mut want.iter().map(Value::to_string))),
        ErrorKind::Const { want } => format!("must be {want}"),
        ErrorKind::Format { want, .. } => format!("is not a valid {want}"),
        ErrorKind::Pattern { want, .. } => format!("does not match the pattern {want:?}"),
        ErrorKind::MinLength { got, want } => format!("is {got} characters long; at least {want} are required"),
        ErrorKind::MaxLength { got, want } => format!("is {got} characters long; at most {want} are allowed"),
        ErrorKind::Minimum { want, .. } => format!("must be at least {want}"),
        ErrorKind::Maximum { want, .. } => format!("must be at most {want}"),
        ErrorKind::ExclusiveMinimum { want, .. } => format!("must be greater than {want}"),
        ErrorKind::ExclusiveMaximum { want, .. } => format!("must be less than {want}"),
        ErrorKind::MultipleOf { want, .. } => format!("must be a multiple of {want}"),
        ErrorKind::Required { want } => format!("is missing required properties: {}", quoted(want)),
        ErrorKind::AdditionalProperties { got } => {
            format!("has properties that are not allowed: {}", list(&mut got.iter().map(|n| format!("{n:?}"))))
        }
        ErrorKind::Dependency { prop, missing } | ErrorKind::DependentRequired { prop, missing } => {
            format!("has {prop:?}, which requires {}", quoted(missing))
        }
        ErrorKind::PropertyName { prop } => format!("has a property name that is not allowed: {prop:?}"),
        ErrorKind::MinProperties { got, want } => format!("has {got} properties; at least {want} are required"),
        ErrorKind::MaxProperties { got, want } => format!("has {got} properties; at most {want} are allowed"),
        ErrorKind::MinItems { got, want } => format!("has {got} items; at least {want} are required"),
        ErrorKind::MaxItems { got, want } => format!("has {got} items; at most {want} are allowed"),
        ErrorKind::AdditionalItems { got } => format!("has {got} more items than allowed"),
        ErrorKind::UniqueItems { got: [a, b] } => format!("items {a} and {b} are equal; items must be unique"),
        ErrorKind::Contains => "contains no item that matches".to_owned(),
        ErrorKind::MinContains { got, want } => {
            format!("contains {} matching items; at least {want} are required", got.len())
        }
        ErrorKind::MaxContains { got, want } => {
            format!("contains {} matching items; at most {want} are allowed", got.len())
        }
        ErrorKind::ContentEncoding { want, .. } => format!("is not valid {want}"),
        ErrorKind::ContentMediaType { want, .. } => format!("is not valid {want}"),
        ErrorKind::ContentSchema => "has content that does not match its schema".to_owned(),
        ErrorKind::Not => "matches a schema it must not match".to_owned(),
        ErrorKind::AnyOf => "matches none of the allowed schemas (anyOf)".to_owned(),
        ErrorKind::OneOf(None) => "matches none of the allowed schemas (oneOf)".to_owned(),
        ErrorKind::OneOf(Some((a, b))) => format!("matches more than one schema of oneOf ({a} and {b})"),
        ErrorKind::FalseSchema => "is not allowed here".to_owned(),
        // Groups with no cause, and the compile-time cycle: nothing more to say.
        ErrorKind::Group
        | ErrorKind::Schema { .. }
        | ErrorKind::Reference { .. }
        | ErrorKind::AllOf
        | ErrorKind::RefCycle { .. } => "does not match the schema".to_owned(),
    }
}

/// A compile error as an operator reads it: where in their schema, and what.
fn compile_error(error: &CompileError) -> String {
    if let CompileError::ValidationError { src, .. } = error {
        // The schema fails its meta-schema: the first rule it breaks, at its
        // place in the schema, in boon's words (a schema is public: they may
        // quote it).
        let mut found = Vec::new();
        leaves(src, &mut found);
        if let Some(first) = found.first() {
            // On one line: a regex error draws a caret under the pattern.
            let words = first.kind.to_string().split_whitespace().collect::<Vec<_>>().join(" ");
            return format!("invalid JSON Schema{}: {words}", at(&first.instance_location.to_string()));
        }
    }
    // Other errors name locations as `<HOME>#<pointer>`: keep the pointer.
    let message = error.to_string().replace(&format!("{HOME}#"), "").replace(HOME, "the schema");
    format!("invalid JSON Schema: {message}")
}

fn at(pointer: &str) -> String {
    if pointer.is_empty() { String::new() } else { format!(" at {pointer}") }
}

/// The pointer and name of the first `format` that is not one of
/// [`FORMATS`]. Values that are data, not schemas (`enum`, `const`,
/// `default`, `examples`), are not looked into; a property of that name
/// is.
fn unknown_format<'a>(schema: &'a Value, pointer: &mut String) -> Option<(String, &'a str)> {
    walk(schema, pointer, false)
}

/// `named`: `schema` maps names to schemas (`properties`, `$defs`), so
/// none of its keys is a keyword.
fn walk<'a>(schema: &'a Value, pointer: &mut String, named: bool) -> Option<(String, &'a str)> {
    let len = pointer.len();
    let found = match schema {
        Value::Object(map) => map.iter().find_map(|(key, value)| {
            if !named && matches!(key.as_str(), "enum" | "const" | "default" | "examples") {
                return None;
            }
            pointer.truncate(len);
            let _ = write!(pointer, "/{}", key.replace('~', "~0").replace('/', "~1"));
            match (key.as_str(), value) {
                ("format", Value::String(format)) if !named && !FORMATS.contains(&format.as_str()) => {
                    Some((pointer.clone(), format.as_str()))
                }
                _ => {
                    let names = !named
                        && matches!(
                            key.as_str(),
                            "properties" | "patternProperties" | "$defs" | "definitions" | "dependentSchemas"
                        );
                    walk(value, pointer, names)
                }
            }
        }),
        Value::Array(items) => items.iter().enumerate().find_map(|(i, item)| {
            pointer.truncate(len);
            let _ = write!(pointer, "/{i}");
            walk(item, pointer, false)
        }),
        _ => None,
    };
    pointer.truncate(len);
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn messages(schema: &JsonSchema, value: &Value) -> Vec<String> {
        schema.violations(value).into_iter().map(|v| format!("{}: {}", v.pointer, v.message)).collect()
    }

    #[test]
    fn violations_name_the_place_and_the_rule_and_never_the_value() {
        let schema = JsonSchema::compile(&json!({
            "type": "object",
            "required": ["id"],
            "additionalProperties": false,
            "properties": {
                "id": { "type": "string", "pattern": "^[0-9A-Z]{26}$" },
                "url": { "type": "string", "format": "uri" },
                "n": { "type": "integer", "maximum": 10 },
                "tags": { "type": "array", "items": { "type": "string" } },
            },
        }))
        .unwrap();
        assert!(schema.is_valid(&json!({ "id": "01ARZ3NDEKTSV4RRFFQ69G5FAV", "n": 3 })));
        let secret = "sk_live_do_not_echo";
        let bad = json!({ "id": secret, "url": format!("not a uri {secret}"), "n": 11, "tags": [1], "more": 1 });
        let found = messages(&schema, &bad);
        assert_eq!(
            found,
            [
                "/id: does not match the pattern \"^[0-9A-Z]{26}$\"",
                "/n: must be at most 10",
                "/tags/0: must be of type string, not number",
                "/url: is not a valid uri",
                ": has properties that are not allowed: \"more\"",
            ],
            "{found:#?}"
        );
        assert_eq!(messages(&schema, &json!({})), [": is missing required properties: \"id\""]);
        assert!(!found.concat().contains(secret), "{found:?}");
    }

    #[test]
    fn one_of_is_one_violation_and_refs_resolve_inside_the_schema() {
        let schema = JsonSchema::compile(&json!({
            "$defs": { "positive": { "type": "integer", "minimum": 1 } },
            "type": "object",
            "properties": {
                "size": { "$ref": "#/$defs/positive" },
                "shape": { "oneOf": [{ "const": "square" }, { "const": "round" }] },
            },
        }))
        .unwrap();
        assert_eq!(
            messages(&schema, &json!({ "size": 0, "shape": "star" })),
            ["/shape: matches none of the allowed schemas (oneOf)", "/size: must be at least 1"]
        );
    }

    #[test]
    fn a_bad_schema_is_refused_with_its_place() {
        let refused = |schema: Value| JsonSchema::compile(&schema).unwrap_err();
        let wrong = refused(json!({ "type": "object", "properties": { "n": { "minimum": "ten" } } }));
        assert!(wrong.starts_with("invalid JSON Schema at /properties/n/minimum: "), "{wrong}");
        let unknown = refused(json!({ "properties": { "u": { "type": "string", "format": "url" } } }));
        assert_eq!(unknown, "invalid JSON Schema at /properties/u/format: unknown format \"url\"");
        // A format named inside data is data; a property named like a
        // keyword is a schema.
        JsonSchema::compile(&json!({ "enum": [{ "format": "url" }] })).unwrap();
        let named = refused(json!({ "properties": { "enum": { "format": "url" } } }));
        assert_eq!(named, "invalid JSON Schema at /properties/enum/format: unknown format \"url\"");
        for elsewhere in ["file:///etc/passwd", "https://example.com/schema.json"] {
            let message = refused(json!({ "$ref": elsewhere }));
            assert!(message.starts_with("invalid JSON Schema: "), "{message}");
            assert!(!message.contains(HOME), "{message}");
        }
        let pattern = refused(json!({ "pattern": "(" }));
        assert!(pattern.contains("/pattern"), "{pattern}");
    }
}
