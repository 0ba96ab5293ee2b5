//! Reading the journal: a [`view::View`] is one read transaction; a
//! [`reader::JournalReader`] a journal opened read-only beside live writers.

pub(crate) mod reader;
pub(crate) mod view;
