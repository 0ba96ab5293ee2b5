//! The integration tests, one crate so they link once. Each module is one file of tests;
//! `common` holds the helpers they share, beside the library's `testkit`.

// Tests are scenarios read top to bottom: the bound on a function's length is for the library.
#![allow(clippy::too_many_lines)]

mod cli;
mod common;
mod crash;
mod damage;
// The fleet needs the cargo feature `ship` (PostgreSQL).
#[cfg(feature = "ship")]
mod fleet;
mod layout;
mod lost;
mod recover_reads;
mod strangers;
