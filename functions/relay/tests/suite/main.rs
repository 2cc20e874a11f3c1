//! Every integration test of this crate, one module per concern, linked
//! into one binary (one link instead of one per file). Run one module
//! with `cargo test -p <crate> --test suite <module>::`.

mod metrics;
mod startup;
