//! Whether the server's cursor for a journal can be trusted, judged against the journal itself
//! (pure): the server must not be ahead of the journal's head, and its record at the cursor
//! must be the journal's record at that global seq. A server restored, hand-edited, or fed by
//! a copy of the journal that went its own way is refused, never shipped to and never taken
//! as proof that anything was shipped.

use super::rows::{self, RecordRow};

/// What the journal holds at the server's cursor.
#[derive(Debug, Clone, PartialEq)]
pub enum Local {
    /// The record at that global seq, as a row.
    Record(RecordRow),
    /// No record there: its run was pruned (or the seq was never issued).
    Gone,
}

/// Why the server's cursor is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The server claims more records than the journal holds.
    Ahead { journal_head: u64 },
    /// The server's record at its cursor is not the journal's: each described, one line.
    Diverged { server: String, journal: String },
}

/// Judges the server's cursor `server_through` (with its record there, if it sent one) against
/// the journal's head, its record there and its shipping mark. `Ok(true)`: the records up to
/// the cursor are proven shipped; `Ok(false)`: nothing to prove (the cursor is 0, or sits on a
/// record the journal pruned after it was proven shipped).
pub fn judge(
    server_through: u64,
    server_record: Option<&RecordRow>,
    journal_head: u64,
    local: &Local,
    mark: Option<u64>,
) -> Result<bool, Refusal> {
    if server_through == 0 {
        return Ok(false);
    }
    if server_through > journal_head {
        return Err(Refusal::Ahead { journal_head });
    }
    let server = server_record.map_or_else(|| "no record".to_string(), describe);
    match local {
        Local::Record(local) => match server_record {
            Some(shipped) if rows::record_differences(local, shipped).is_empty() => Ok(true),
            _ => Err(Refusal::Diverged {
                server,
                journal: describe(local),
            }),
        },
        // Pruned after the mark proved it shipped: the check was made when the mark rose.
        Local::Gone if mark.is_some_and(|mark| mark >= server_through) => Ok(false),
        Local::Gone => Err(Refusal::Diverged {
            server,
            journal: "a record it pruned before it was proven shipped".to_string(),
        }),
    }
}

/// `run R seq N (Type)`.
fn describe(row: &RecordRow) -> String {
    format!("run {} seq {} ({})", row.run_id, row.seq, row.event_type)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(run: &str, seq: i64) -> RecordRow {
        RecordRow {
            global_seq: 24,
            run_id: run.to_string(),
            seq,
            time_ms: 1_000,
            event_type: "Terminal".to_string(),
            event: serde_json::json!({"seq": seq, "runId": run, "type": "Terminal"}),
        }
    }

    #[test]
    fn a_server_at_the_journals_own_record_is_proven_and_a_new_one_needs_nothing() {
        let local = Local::Record(row("A", 3));
        assert_eq!(judge(24, Some(&row("A", 3)), 30, &local, None), Ok(true));
        assert_eq!(
            judge(24, Some(&row("A", 3)), 24, &local, Some(40)),
            Ok(true)
        );
        assert_eq!(judge(0, None, 0, &Local::Gone, None), Ok(false));
    }

    #[test]
    fn a_server_ahead_of_the_journal_is_refused_naming_the_head() {
        assert_eq!(
            judge(24, Some(&row("A", 3)), 18, &Local::Gone, Some(18)),
            Err(Refusal::Ahead { journal_head: 18 })
        );
    }

    #[test]
    fn another_record_or_none_at_the_cursor_is_a_divergence() {
        let local = Local::Record(row("B", 1));
        let refused = judge(24, Some(&row("A", 3)), 30, &local, None);
        assert_eq!(
            refused,
            Err(Refusal::Diverged {
                server: "run A seq 3 (Terminal)".to_string(),
                journal: "run B seq 1 (Terminal)".to_string(),
            })
        );
        let mut other_content = row("B", 1);
        other_content.time_ms += 1;
        assert!(judge(24, Some(&other_content), 30, &local, None).is_err());
        assert!(judge(24, None, 30, &local, None).is_err());
    }

    #[test]
    fn a_pruned_record_at_the_cursor_passes_only_below_the_mark() {
        assert_eq!(
            judge(24, Some(&row("A", 3)), 30, &Local::Gone, Some(24)),
            Ok(false)
        );
        assert!(matches!(
            judge(24, Some(&row("A", 3)), 30, &Local::Gone, Some(20)),
            Err(Refusal::Diverged { .. })
        ));
        assert!(judge(24, Some(&row("A", 3)), 30, &Local::Gone, None).is_err());
    }
}
