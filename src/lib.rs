//! runjournal makes background runs crash-safe: every lifecycle transition of a run is appended
//! to an embedded redb journal, durable before anyone acts on it, and the files hosts read
//! (`status.json`, result files, `events.jsonl`) are projections rebuilt from that journal.

pub mod event;
pub mod journal;
pub mod state;
