//! The test kit: what the unit tests, the integration tests of both packages (`tests/it`,
//! `journal-tools/tests/it`) and the benchmarks share, written once. Built for this crate's own
//! unit tests, and behind the cargo feature `testkit`, which the dev-dependencies on this
//! package turn on; never in an ordinary build.
//!
//! * `build`: builders of specs and events (re-exported here);
//! * `identity`: made-up process identities, and one of an exited process (re-exported here);
//! * `lifecycle`: the standard lifecycle of a chain run;
//! * `damage`: the ways a journal file is found lost, and a picture of a directory;
//! * `pg_cluster`: a throwaway PostgreSQL cluster;
//! * `other_user`: what a test acting as another user may hand that user (a copy of a program,
//!   a directory) wherever the build tree is;
//! * `skip`: how a test that cannot run here says so, and fails instead where every test must
//!   run (CI);
//! * `hooks`: the journal's test hooks — the snapshot codec, a commit of batches as they are,
//!   a tombstone (re-exported here).
//!
//! Like a test, the kit panics on what it cannot do: it runs only under tests and
//! benchmarks.

mod build;
pub mod damage;
mod hooks;
mod identity;
pub mod lifecycle;
pub mod other_user;
pub mod pg_cluster;
pub mod skip;

pub use build::*;
pub use hooks::*;
pub use identity::*;
