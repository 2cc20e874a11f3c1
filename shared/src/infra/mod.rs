//! The infrastructure floor: the stores and services the domain runs on,
//! each behind one small module. It knows no domain type.

#[cfg(feature = "aws")]
pub mod aws;
#[cfg(feature = "aws")]
pub mod aws_http;
pub mod canonical_json;
pub mod client_addr;
pub mod db;
#[cfg(feature = "input-schemas")]
pub mod json_schema;
#[cfg(feature = "receipts")]
pub mod kms;
pub mod metrics;
#[cfg(feature = "outbound")]
pub mod outbound;
pub mod redis_client;
#[cfg(feature = "s3-objects")]
pub mod s3_objects;
pub mod standard_webhooks;
pub mod storage_policy;
pub mod telemetry;
#[cfg(any(feature = "aws", feature = "outbound"))]
pub mod tls;
