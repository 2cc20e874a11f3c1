//! Every integration test of this crate, one module per concern, linked
//! into one binary (one link instead of one per file). Run one module
//! with `cargo test -p <crate> --test suite <module>::`.

#[path = "../common/mod.rs"]
mod common;

mod allow_lists;
mod batch;
mod batch_create;
mod batch_faults;
mod batch_refund;
mod bulk;
mod capture;
mod catalog;
mod cors;
mod environment;
mod executors;
mod fairness;
mod faults;
mod flow;
mod foundation;
mod fuzz;
mod lambda_events;
mod leases;
mod lifecycle;
mod limit;
mod load;
mod mcp;
mod metered;
mod openapi;
mod page;
mod pay_links;
mod payments;
mod quota;
mod receipts;
mod redis_tls;
mod relay;
mod rotation;
mod s3_objects;
mod service;
mod service_kinds;
mod share;
mod spaces;
mod ssrf;
mod startup;
mod storage_policy;
mod sweeper;
mod tasks;
mod template;
mod template_monitoring;
mod upload_guard;
mod uploads;
mod upto;
mod webhooks;
mod worker;
