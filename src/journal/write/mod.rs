//! Writing the journal: a batch judged and applied in a write transaction (`append`), the
//! in-process queue of appends (`queue`), the commit step that commits a group durably and
//! rides out a full disk and flaky storage (`commit`), a handle's options (`options`), pruning
//! (`prune`), rebuilding a journal from records (`rebuild`), and the shipping mark
//! (`ship_mark`).

pub(crate) mod append;
pub(crate) mod commit;
pub(crate) mod options;
pub mod prune;
pub(crate) mod queue;
pub mod rebuild;
pub(crate) mod ship_mark;
