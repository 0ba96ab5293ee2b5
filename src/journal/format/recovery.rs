//! What a journal rebuilt from the runs' projections (`journal-tools recover
//! --from-projections`) chose where the projections were silent, and what it could not recover:
//! kept in the journal's meta under [`META_RECOVERY`](super::tables::META_RECOVERY) as JSON, so
//! anyone looking at the journal later learns that its queues' limits were chosen, not kept,
//! and which facts of which runs were lost with the old file.
//!
//! A journal-only fact is one no projection holds: today a queue's limit, the retention policy,
//! pruned runs' tombstones, a resume link to a run that was not rebuilt; later, whatever a run
//! keeps only in the journal (its environment, completion hooks, retry attempts, dependencies,
//! due times). Each that a rebuild cannot restore is a [`LostFact`], for the home or for one
//! run, with the reason; a rebuild never refuses the home for one.

use serde::{Deserialize, Serialize};

use crate::event::UnixMs;

/// The largest note kept: the lists are cut to fit, the last entry saying how many were left
/// out.
pub const MAX_RECOVERY_NOTE_BYTES: usize = 256 << 10;

/// The note a rebuild leaves in the journal (the module docs).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RecoveryNote {
    /// When the journal was rebuilt.
    pub at_ms: UnixMs,
    /// What the lost file was found to be ("missing", "damaged (...)").
    pub found: String,
    /// Each queue the rebuilt runs name, with the limit the rebuild gave it and why.
    pub queues: Vec<QueueLimitChoice>,
    /// The facts the rebuild could not recover, the home's first, then each run's in run id
    /// order.
    pub facts_not_recovered: Vec<LostFact>,
}

/// A queue's limit as a rebuild chose it: the old limit was kept only in the journal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct QueueLimitChoice {
    pub name: String,
    pub max_active: u64,
    /// Why this limit, in words.
    pub basis: String,
}

/// A journal-only fact a rebuild could not recover.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LostFact {
    /// The run it belongs to (its printed id); `None` for a fact of the home.
    pub run: Option<String>,
    /// What was lost ("the retention policy", "the resume link to run 01J...").
    pub fact: String,
    /// Why it cannot be recovered, and what holds instead.
    pub reason: String,
}

impl RecoveryNote {
    /// The note as stored: JSON within `MAX_RECOVERY_NOTE_BYTES`, facts dropped from the end
    /// (and counted in a last one) when it would not fit.
    pub fn encode(&self) -> Vec<u8> {
        let total = self.facts_not_recovered.len();
        let mut kept = total;
        loop {
            let mut note = RecoveryNote {
                facts_not_recovered: self.facts_not_recovered[..kept].to_vec(),
                ..self.clone()
            };
            if kept < total {
                note.facts_not_recovered.push(LostFact {
                    run: None,
                    fact: format!("{} more facts", total - kept),
                    reason: "left out of this note to keep it small; recover printed them"
                        .to_string(),
                });
            }
            let bytes = serde_json::to_vec(&note).unwrap_or_default();
            if bytes.len() <= MAX_RECOVERY_NOTE_BYTES || kept == 0 {
                return bytes;
            }
            kept /= 2;
        }
    }

    /// The note from its stored bytes; `None` when they are not one (read as input: bounded,
    /// and only ever shown).
    pub fn decode(bytes: &[u8]) -> Option<RecoveryNote> {
        if bytes.len() > MAX_RECOVERY_NOTE_BYTES {
            return None;
        }
        serde_json::from_slice(bytes).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fact(index: usize) -> LostFact {
        LostFact {
            run: Some(format!("run-{index}")),
            fact: "x".repeat(1000),
            reason: "a reason".to_string(),
        }
    }

    #[test]
    fn a_note_round_trips() {
        let note = RecoveryNote {
            at_ms: 5,
            found: "missing".to_string(),
            queues: vec![QueueLimitChoice {
                name: "q1".to_string(),
                max_active: 2,
                basis: "seen".to_string(),
            }],
            facts_not_recovered: vec![fact(0)],
        };
        assert_eq!(RecoveryNote::decode(&note.encode()), Some(note));
        assert_eq!(RecoveryNote::decode(b"not json"), None);
    }

    #[test]
    fn a_note_too_large_keeps_its_first_facts_and_counts_the_rest() {
        let note = RecoveryNote {
            facts_not_recovered: (0..1000).map(fact).collect(),
            ..RecoveryNote::default()
        };
        let bytes = note.encode();
        assert!(bytes.len() <= MAX_RECOVERY_NOTE_BYTES);
        let kept = RecoveryNote::decode(&bytes).expect("a note");
        let last = kept.facts_not_recovered.last().expect("facts");
        assert!(last.fact.ends_with("more facts"), "{last:?}");
        assert_eq!(kept.facts_not_recovered[0], fact(0));
        let more: usize = last
            .fact
            .split(' ')
            .next()
            .and_then(|n| n.parse().ok())
            .expect("a count");
        assert_eq!(more + kept.facts_not_recovered.len() - 1, 1000);
    }
}
