//! Task input schemas: written in TOML, served and enforced as JSON Schema.

use serde_json::{Map, Number, Value as Json};
use toml::Value as Toml;

/// Converts the schema to JSON. Nothing here compiles it: the loads that
/// do ([`super::Catalog::load_compiled_for`]) compile each schema
/// themselves, so a binary that validates no input (task-status, the
/// worker, the sweeper) reaches no schema compiler from its catalog load
/// and links none, whichever features cargo unified into this crate (`sam
/// build` unifies every member's).
pub fn read(schema: &toml::Table) -> Result<Json, String> {
    Ok(Json::Object(table_to_json(schema)?))
}

/// Task create reads `upload_id`s and the executors read fields out of the
/// input, so the input must be an object, not any JSON value.
pub fn takes_an_object(json: &Json) -> Result<(), String> {
    match json.get("type") == Some(&Json::from("object")) {
        true => Ok(()),
        false => Err("the top level must have type = \"object\"".to_owned()),
    }
}

fn table_to_json(table: &toml::Table) -> Result<Map<String, Json>, String> {
    table.iter().map(|(key, value)| Ok((key.clone(), to_json(value)?))).collect()
}

fn to_json(value: &Toml) -> Result<Json, String> {
    Ok(match value {
        Toml::String(s) => Json::from(s.as_str()),
        Toml::Integer(n) => Json::from(*n),
        Toml::Float(x) => {
            Number::from_f64(*x).map(Json::Number).ok_or_else(|| format!("{x} has no JSON equivalent"))?
        }
        Toml::Boolean(b) => Json::from(*b),
        // JSON has no datetime type; silently stringifying one would change
        // what the operator wrote.
        Toml::Datetime(d) => return Err(format!("datetime {d} has no JSON equivalent; quote it")),
        Toml::Array(items) => Json::Array(items.iter().map(to_json).collect::<Result<_, _>>()?),
        Toml::Table(table) => Json::Object(table_to_json(table)?),
    })
}
