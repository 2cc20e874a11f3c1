//! Ids are ULIDs: sortable by creation time, unguessable enough to show in
//! URLs. In Postgres they are the 16 raw bytes (`BYTEA`, checked to be 16
//! long), going through `uuid::Uuid` as docs/architecture.md#data-model asks; in JSON and URLs they
//! are the 26-character Crockford base32 string.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use sqlx::encode::IsNull;
use sqlx::error::BoxDynError;
use sqlx::postgres::{PgArgumentBuffer, PgTypeInfo, PgValueRef};
use sqlx::{Decode, Encode, Postgres, Type};
use ulid::Ulid;
use uuid::Uuid;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Id(Ulid);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("not a valid id: expected a 26-character ULID")]
pub struct InvalidId;

impl Id {
    pub fn new() -> Self {
        Id(Ulid::new())
    }

    pub fn ulid(self) -> Ulid {
        self.0
    }

    pub fn to_bytes(self) -> [u8; 16] {
        Uuid::from(self.0).into_bytes()
    }

    pub fn from_bytes(bytes: &[u8]) -> Result<Self, InvalidId> {
        let bytes: [u8; 16] = bytes.try_into().map_err(|_| InvalidId)?;
        Ok(Id(Uuid::from_bytes(bytes).into()))
    }
}

impl Default for Id {
    fn default() -> Self {
        Self::new()
    }
}

impl From<Ulid> for Id {
    fn from(ulid: Ulid) -> Self {
        Id(ulid)
    }
}

impl fmt::Display for Id {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl FromStr for Id {
    type Err = InvalidId;

    // ulid's own parser also takes lower case and ambiguous letters; ids we
    // hand out are canonical upper case, so anything else is not one of ours.
    fn from_str(s: &str) -> Result<Self, InvalidId> {
        let ulid = Ulid::from_string(s).map_err(|_| InvalidId)?;
        if ulid.to_string() != s {
            return Err(InvalidId);
        }
        Ok(Id(ulid))
    }
}

impl Serialize for Id {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Id {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Documented as its JSON form: the canonical upper-case ULID string.
impl utoipa::PartialSchema for Id {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{ObjectBuilder, Type};
        ObjectBuilder::new()
            .schema_type(Type::String)
            .description(Some("A ULID: 26 characters of upper-case Crockford base32, sortable by creation time."))
            .min_length(Some(26))
            .max_length(Some(26))
            .pattern(Some("^[0-7][0-9A-HJKMNP-TV-Z]{25}$"))
            .examples(["01HZX3Y4P5Q6R7S8T9V0W1X2Y3"])
            .into()
    }
}

impl utoipa::ToSchema for Id {}

impl Type<Postgres> for Id {
    fn type_info() -> PgTypeInfo {
        <[u8; 16] as Type<Postgres>>::type_info()
    }

    fn compatible(ty: &PgTypeInfo) -> bool {
        <[u8; 16] as Type<Postgres>>::compatible(ty)
    }
}

impl Encode<'_, Postgres> for Id {
    fn encode_by_ref(&self, buf: &mut PgArgumentBuffer) -> Result<IsNull, BoxDynError> {
        <[u8; 16] as Encode<Postgres>>::encode(self.to_bytes(), buf)
    }
}

impl Decode<'_, Postgres> for Id {
    fn decode(value: PgValueRef<'_>) -> Result<Self, BoxDynError> {
        let bytes = <[u8; 16] as Decode<Postgres>>::decode(value)?;
        Ok(Id::from_bytes(&bytes)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn string_form_round_trips_and_is_26_chars() {
        let id = Id::new();
        let s = id.to_string();
        assert_eq!(s.len(), 26);
        assert_eq!(s.parse::<Id>().unwrap(), id);
    }

    #[test]
    fn bytes_are_the_uuid_of_the_ulid() {
        let ulid = Ulid::new();
        let id = Id::from(ulid);
        assert_eq!(id.to_bytes(), Uuid::from(ulid).into_bytes());
        assert_eq!(Id::from_bytes(&id.to_bytes()).unwrap(), id);
        assert_eq!(Id::from_bytes(&[0u8; 15]), Err(InvalidId));
    }

    #[test]
    fn rejects_non_canonical_and_malformed_strings() {
        let canonical = Id::new().to_string();
        for bad in [
            "",
            "not-an-id",
            &canonical[..25],
            &format!("{canonical}0"),
            &canonical.to_lowercase(),
            "8ZZZZZZZZZZZZZZZZZZZZZZZZZ", // overflows 128 bits
            "01ARZ3NDEKTSV4RRFFQ69G5FAU", // 'U' is not in Crockford base32
        ] {
            assert_eq!(bad.parse::<Id>(), Err(InvalidId), "{bad:?} must be refused");
        }
    }

    #[test]
    fn json_is_the_string_form() {
        let id = Id::new();
        assert_eq!(serde_json::to_value(id).unwrap(), serde_json::json!(id.to_string()));
        let back: Id = serde_json::from_value(serde_json::json!(id.to_string())).unwrap();
        assert_eq!(back, id);
        assert!(serde_json::from_value::<Id>(serde_json::json!("nope")).is_err());
        assert!(serde_json::from_value::<Id>(serde_json::json!(42)).is_err());
    }
}
