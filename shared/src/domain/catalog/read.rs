//! Reading a `toml::Table` one field at a time. Every read that fails records
//! a [`Problem`] at the field's path and yields `None`, so the caller carries
//! on and the walk finds the next mistake too.

use std::fmt;
use std::ops::RangeInclusive;

use toml::{Table, Value};

use super::Problem;

pub(crate) type Problems = Vec<Problem>;

/// A TOML path as an operator would write it: `tasks.fetch.accepts[0].asset`.
#[derive(Debug, Clone, Default)]
pub(crate) struct KeyPath(String);

impl KeyPath {
    pub fn key(&self, key: &str) -> KeyPath {
        let bare = !key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        let key = if bare { key.to_owned() } else { format!("{key:?}") };
        if self.0.is_empty() { KeyPath(key) } else { KeyPath(format!("{}.{key}", self.0)) }
    }

    pub fn index(&self, index: usize) -> KeyPath {
        KeyPath(format!("{}[{index}]", self.0))
    }

    pub fn report(&self, problems: &mut Problems, message: impl Into<String>) {
        problems.push(Problem { path: self.0.clone(), message: message.into() });
    }

    /// Passes a checked value through, or reports why the check failed.
    pub fn verify<T>(&self, checked: Result<T, String>, problems: &mut Problems) -> Option<T> {
        checked.map_err(|message| self.report(problems, message)).ok()
    }

    /// Reads the value found at this path as `T`, or reports its actual type.
    pub fn read<'a, T: FromToml<'a>>(&self, value: &'a Value, problems: &mut Problems) -> Option<T> {
        let read = T::from_toml(value);
        if read.is_none() {
            self.report(problems, format!("expected {}, found {}", T::EXPECTED, describe(value)));
        }
        read
    }
}

impl fmt::Display for KeyPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The TOML types a field can be read as.
pub(crate) trait FromToml<'a>: Sized {
    const EXPECTED: &'static str;
    fn from_toml(value: &'a Value) -> Option<Self>;
}

impl<'a> FromToml<'a> for &'a str {
    const EXPECTED: &'static str = "a string";
    fn from_toml(value: &'a Value) -> Option<Self> {
        value.as_str()
    }
}

impl FromToml<'_> for i64 {
    const EXPECTED: &'static str = "an integer";
    fn from_toml(value: &Value) -> Option<Self> {
        value.as_integer()
    }
}

impl FromToml<'_> for bool {
    const EXPECTED: &'static str = "a boolean";
    fn from_toml(value: &Value) -> Option<Self> {
        value.as_bool()
    }
}

impl<'a> FromToml<'a> for &'a Table {
    const EXPECTED: &'static str = "a table";
    fn from_toml(value: &'a Value) -> Option<Self> {
        value.as_table()
    }
}

impl<'a> FromToml<'a> for &'a [Value] {
    const EXPECTED: &'static str = "an array";
    fn from_toml(value: &'a Value) -> Option<Self> {
        value.as_array().map(Vec::as_slice)
    }
}

/// A TOML table together with where it sits in the file.
pub(crate) struct Fields<'a> {
    pub path: KeyPath,
    table: &'a Table,
}

impl<'a> Fields<'a> {
    pub fn new(path: KeyPath, table: &'a Table) -> Self {
        Fields { path, table }
    }

    /// Reads `value` (found at `path`) as a table, or reports its type.
    pub fn of(path: KeyPath, value: &'a Value, problems: &mut Problems) -> Option<Self> {
        let table = path.read(value, problems)?;
        Some(Fields::new(path, table))
    }

    pub fn has(&self, key: &str) -> bool {
        self.table.contains_key(key)
    }

    pub fn at(&self, key: &str) -> KeyPath {
        self.path.key(key)
    }

    /// Reports each key not in `known`: a misspelt optional key would
    /// otherwise fall back to its default without a word.
    pub fn deny_unknown(&self, known: &[&str], problems: &mut Problems) {
        for key in self.table.keys().filter(|key| !known.contains(&key.as_str())) {
            self.at(key).report(problems, format!("unknown key (expected one of: {})", known.join(", ")));
        }
    }

    pub fn optional<T: FromToml<'a>>(&self, key: &str, problems: &mut Problems) -> Option<T> {
        self.at(key).read(self.table.get(key)?, problems)
    }

    pub fn required<T: FromToml<'a>>(&self, key: &str, problems: &mut Problems) -> Option<T> {
        if !self.has(key) {
            self.at(key).report(problems, "missing required key");
        }
        self.optional(key, problems)
    }

    /// An optional integer, range-checked and narrowed to the field's type.
    pub fn int_in<T: TryFrom<i64>>(&self, key: &str, range: RangeInclusive<i64>, problems: &mut Problems) -> Option<T> {
        let n = self.optional(key, problems)?;
        self.verify(key, bounded(n, range), problems)
    }

    /// Passes a checked value through, or reports why the check failed at `key`.
    pub fn verify<T>(&self, key: &str, checked: Result<T, String>, problems: &mut Problems) -> Option<T> {
        self.at(key).verify(checked, problems)
    }

    /// An optional sub-table such as `[uploads]`.
    pub fn table(&self, key: &str, problems: &mut Problems) -> Option<Fields<'a>> {
        let table = self.optional(key, problems)?;
        Some(Fields::new(self.at(key), table))
    }

    /// The sub-tables of a map-like table such as `[assets]`, keyed by id.
    pub fn entries(&self, key: &str, problems: &mut Problems) -> Vec<(&'a str, Fields<'a>)> {
        let Some(map) = self.table(key, problems) else {
            return Vec::new();
        };
        map.table
            .iter()
            .filter_map(|(id, value)| Some((id.as_str(), Fields::of(map.at(id), value, problems)?)))
            .collect()
    }
}

/// Range-checks a TOML integer and narrows it to the field's Rust type.
pub fn bounded<T: TryFrom<i64>>(n: i64, range: RangeInclusive<i64>) -> Result<T, String> {
    let out_of_range = || format!("must be from {} to {}, got {n}", range.start(), range.end());
    if !range.contains(&n) {
        return Err(out_of_range());
    }
    T::try_from(n).map_err(|_| out_of_range())
}

fn describe(value: &Value) -> String {
    match value {
        Value::String(s) => format!("string {s:?}"),
        Value::Integer(n) => format!("integer {n}"),
        Value::Float(x) => format!("float {x}"),
        Value::Boolean(b) => format!("boolean {b}"),
        Value::Datetime(d) => format!("datetime {d}"),
        Value::Array(_) => "an array".to_owned(),
        Value::Table(_) => "a table".to_owned(),
    }
}
