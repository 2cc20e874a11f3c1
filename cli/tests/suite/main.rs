//! Every integration test of this crate, one module per concern, linked
//! into one binary (one link instead of one per file). Run one module
//! with `cargo test -p <crate> --test suite <module>::`.

#[path = "../common/mod.rs"]
mod common;

mod cli;
mod client;
mod kill;
mod mcp;
mod metrics;
mod migrate;
mod payments;
mod receipt;
mod startup;
mod sweep;
mod tasks;
