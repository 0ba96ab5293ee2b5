//! The journal file: where its bytes live, opening it (format checks, an unfinished creation,
//! the safe-open rules under a home), examining a file before opening it, consistent copies,
//! compaction, waiting for redb's write lock, the storage backends redb is handed, bounding the
//! page pointers redb follows by the file's length (`pages`), and containing redb's panics on a damaged
//! file (`contain`).

pub(crate) mod backend;
pub mod compact;
pub(crate) mod contain;
pub(crate) mod copy;
pub mod examine;
#[doc(hidden)]
pub mod instrumented;
mod location;
pub mod lock_wait;
pub(crate) mod marker;
pub(crate) mod open;
pub(crate) mod pages;

pub use location::{BackendFactory, Location};
