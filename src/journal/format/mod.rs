//! The journal's format: its tables and their keys, the encodings of what they hold (snapshots,
//! the retention policy, tombstones, a rebuild's note), and the errors of every journal
//! operation. Pure: nothing
//! here opens a file or a transaction of its own.

pub(crate) mod error;
pub(crate) mod recovery;
pub(crate) mod retention;
pub(crate) mod snapshot;
pub(crate) mod tables;
