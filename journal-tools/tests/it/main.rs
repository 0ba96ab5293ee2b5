//! The integration tests, one crate so they link once. Each module is one file of tests;
//! `common` holds the helpers they share, beside the library's `testkit`.

mod cli;
mod common;
mod crash;
mod damage;
mod fleet;
mod layout;
mod lost;
mod recover_reads;
mod strangers;
