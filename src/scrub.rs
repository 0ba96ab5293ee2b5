//! The home's scrub: every page of the journal checked against its checksum, on a schedule
//! rather than at every open (docs/design.md, "Bit rot").
//!
//! A scrub copies the journal, as it stood at one commit, into a private directory of the
//! home ([`crate::journal::copy_consistent`]: no lock is held while it copies; a journal that
//! changed during each attempt is left for the next pass) and runs redb's integrity check on
//! the copy ([`crate::verify::check_integrity_of_copy`]): memory stays at a journal handle's
//! cache, whatever the journal's size, and the journal itself is never written by the check.
//! What it found is recorded in the journal (meta `scrub`, [`ScrubRecord`]); damage is also
//! written beside the journal ([`damage_marker_path`]), so that every later open of that file
//! refuses it as damage without looking again, and even when the damaged journal cannot take
//! the record.
//!
//! A scrub is due ([`is_due`]) once the interval the home sets has passed since the last one
//! ([`DEFAULT_EVERY`] unless `runjournal scrub --every` set another), once the host has been
//! restarted since (a power cut among the reasons), and [`RETRY_AFTER`] after one that could
//! not run. A home's first is due an interval after its journal was made. Every maintenance
//! pass ([`crate::runs::maintain`]) starts one, detached, when it is due; at most one runs per
//! home ([`crate::Home::scrub_lock_path`]).

use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::durable_fs::FileLock;
use crate::event::{UnixMs, now_ms};
use crate::home::Home;
pub use crate::journal::damage_marker_path;
use crate::journal::{AppendError, ReadError, View, mark_damaged};
use crate::store::Store;

/// How often a home's journal is scrubbed unless the home sets another interval.
pub const DEFAULT_EVERY: Duration = Duration::from_secs(24 * 60 * 60);

/// How soon a scrub that could not run (a journal that kept changing, a full disk) is tried
/// again.
pub const RETRY_AFTER: Duration = Duration::from_secs(10 * 60);

/// The subcommand a maintenance pass starts a scheduled scrub with (`program __scrub --home
/// HOME --layout LAYOUT`); a host's own program that runs runs takes it as it takes
/// [`crate::hooks::DELIVERER_SUBCOMMAND`].
pub const SCRUB_SUBCOMMAND: &str = "__scrub";

/// What the last scrub of a home found, as the journal keeps it (meta `scrub`, JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ScrubRecord {
    /// When it ended.
    pub at_ms: UnixMs,
    /// The boot it ran in: a scrub is due again after a restart of the host.
    pub boot_id: String,
    /// How long it took.
    pub took_ms: u64,
    /// What it covered: the bytes of the journal it checked, every page of them (0 when it
    /// could not run).
    pub bytes: u64,
    pub outcome: ScrubOutcome,
}

/// What a scrub found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "found", rename_all = "kebab-case")]
pub enum ScrubOutcome {
    /// Every page passed its checksum.
    Clean,
    /// Pages failed: the home's journal is damaged from now on, for every command.
    Damaged { problems: Vec<String> },
    /// The scrub could not check the journal, and is due again after [`RETRY_AFTER`].
    NotRun { reason: String },
}

impl std::fmt::Display for ScrubRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let at = crate::duration::format_time_s(self.at_ms);
        match &self.outcome {
            ScrubOutcome::Clean => write!(
                f,
                "scrubbed at {at}: every page of {} bytes passed its checksum ({} ms)",
                self.bytes, self.took_ms
            ),
            ScrubOutcome::Damaged { problems } => write!(
                f,
                "scrubbed at {at}: the journal is damaged ({})",
                problems.join("; ")
            ),
            ScrubOutcome::NotRun { reason } => {
                write!(f, "a scrub at {at} could not run: {reason}")
            }
        }
    }
}

/// Why a scrub did not end with a record.
#[derive(Debug, thiserror::Error)]
pub enum ScrubError {
    #[error("another scrub of this home is running (it holds {})", .0.display())]
    AlreadyRunning(PathBuf),
    #[error("the scrub's lock {path}: {source}")]
    Lock {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("reading when the home was last scrubbed: {0}")]
    Read(#[from] ReadError),
    #[error("recording the scrub in the journal: {0}")]
    Record(#[source] AppendError),
    #[error("marking the journal damaged ({}): {source}", path.display())]
    Mark {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("starting a scrub: {0}")]
    Start(#[source] io::Error),
}

/// The home's scrub interval, as the journal keeps it; [`DEFAULT_EVERY`] when none was set.
pub fn interval(view: &View) -> Result<Duration, ReadError> {
    Ok(view
        .scrub_every_ms()?
        .map_or(DEFAULT_EVERY, Duration::from_millis))
}

/// The last scrub's record; `None` before the first (or a record this build cannot read).
pub fn last(view: &View) -> Result<Option<ScrubRecord>, ReadError> {
    Ok(view
        .scrub_record()?
        .and_then(|bytes| serde_json::from_slice(&bytes).ok()))
}

/// When the next scrub is due, and why ([module docs](self)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Due {
    pub at_ms: UnixMs,
    pub why: &'static str,
}

/// When the home's next scrub is due: `boot_id` is this boot's.
pub fn next_due(view: &View, boot_id: &str) -> Result<Due, ReadError> {
    let every = u64::try_from(interval(view)?.as_millis()).unwrap_or(u64::MAX);
    let Some(last) = last(view)? else {
        let created = view.meta()?.created_at_ms;
        return Ok(Due {
            at_ms: created.saturating_add(every),
            why: "an interval after the journal was made",
        });
    };
    if last.boot_id != boot_id {
        return Ok(Due {
            at_ms: last.at_ms,
            why: "the host restarted since the last scrub",
        });
    }
    Ok(match last.outcome {
        ScrubOutcome::NotRun { .. } => Due {
            at_ms: last.at_ms.saturating_add(RETRY_AFTER.as_millis() as u64),
            why: "the last scrub could not run",
        },
        ScrubOutcome::Clean | ScrubOutcome::Damaged { .. } => Due {
            at_ms: last.at_ms.saturating_add(every),
            why: "an interval after the last scrub",
        },
    })
}

/// Whether a scrub is due now ([`next_due`]).
pub fn is_due(view: &View, now: UnixMs, boot_id: &str) -> Result<bool, ReadError> {
    Ok(next_due(view, boot_id)?.at_ms <= now)
}

/// The arguments of a scheduled scrub of `home` ([`SCRUB_SUBCOMMAND`]).
pub fn scrub_args(home: &Home) -> io::Result<Vec<OsString>> {
    crate::hooks::home_subcommand_args(SCRUB_SUBCOMMAND, home)
}

/// What a maintenance pass does for the scrub: when one is due and none runs, starts one
/// detached (`program __scrub`), never waiting for it; its pid.
pub fn start_if_due(store: &Store, program: &Path) -> Result<Option<u32>, ScrubError> {
    let boot_id = crate::platform::boot_id().unwrap_or_default();
    let view = store.journal().view()?;
    if !is_due(&view, now_ms(), &boot_id)? {
        return Ok(None);
    }
    drop(view);
    start(store.home(), program)
}

/// Starts a scrub of `home` detached (`program __scrub`), unless one runs (it holds the
/// home's scrub lock); its pid.
pub fn start(home: &Home, program: &Path) -> Result<Option<u32>, ScrubError> {
    let lock = home.scrub_lock_path();
    match FileLock::try_acquire(&lock) {
        Ok(Some(held)) => drop(held),
        Ok(None) => return Ok(None),
        Err(source) => return Err(ScrubError::Lock { path: lock, source }),
    }
    let args = scrub_args(home).map_err(ScrubError::Start)?;
    crate::hooks::start_detached(program, &args)
        .map(Some)
        .map_err(ScrubError::Start)
}

/// Scrubs the home's journal now ([module docs](self)): checks every page of a copy, records
/// what it found in the journal, and marks a damaged journal for every later open. Returns
/// the record, also when it says damage; an `Err` when another scrub runs, or the finding
/// could be neither recorded nor marked.
pub fn scrub(store: &Store) -> Result<ScrubRecord, ScrubError> {
    let home = store.home();
    let lock_path = home.scrub_lock_path();
    let lock = FileLock::try_acquire(&lock_path).map_err(|source| ScrubError::Lock {
        path: lock_path.clone(),
        source,
    })?;
    let Some(lock) = lock else {
        return Err(ScrubError::AlreadyRunning(lock_path));
    };
    let _ = lock.write_note(format!("{}\n", std::process::id()).as_bytes());
    let journal = home.journal_path();
    let identity = crate::durable_fs::file_identity(&journal);
    let started = Instant::now();
    let (bytes, outcome) = check(home, &journal);
    let record = ScrubRecord {
        at_ms: now_ms(),
        boot_id: crate::platform::boot_id().unwrap_or_default(),
        took_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        bytes,
        outcome,
    };
    let marker = damage_marker_path(&journal);
    if let ScrubOutcome::Damaged { problems } = &record.outcome {
        if let Some((dev, ino)) = identity {
            mark_damaged(&journal, dev, ino, record.at_ms, problems).map_err(|source| {
                ScrubError::Mark {
                    path: marker.clone(),
                    source,
                }
            })?;
        }
        // The journal may not take the record: the marker is what every open meets.
        let _ = record_in_journal(store, &record);
        return Ok(record);
    }
    // A marker left by a scrub of a journal since rebuilt names another file: it goes.
    let _ = crate::durable_fs::remove_if_present(&marker);
    record_in_journal(store, &record).map_err(ScrubError::Record)?;
    Ok(record)
}

/// Checks every page of a copy of `journal`, made in a private directory of `home` removed
/// afterwards: the bytes checked and what was found.
fn check(home: &Home, journal: &Path) -> (u64, ScrubOutcome) {
    let not_run = |reason: String| (0, ScrubOutcome::NotRun { reason });
    let scratch = match tempfile::Builder::new()
        .prefix(".scrub-")
        .tempdir_in(home.state_dir())
    {
        Ok(scratch) => scratch,
        Err(error) => return not_run(format!("a directory for its copy: {error}")),
    };
    let bytes = std::fs::metadata(journal).map_or(0, |metadata| metadata.len());
    match crate::verify::check_integrity_of_copy(journal, scratch.path()) {
        Ok(integrity) if integrity.problems.is_empty() => (bytes, ScrubOutcome::Clean),
        Ok(integrity) => (
            bytes,
            ScrubOutcome::Damaged {
                problems: integrity
                    .problems
                    .into_iter()
                    .map(|problem| problem.message)
                    .collect(),
            },
        ),
        Err(error) => not_run(error.to_string()),
    }
}

fn record_in_journal(store: &Store, record: &ScrubRecord) -> Result<(), AppendError> {
    let bytes = serde_json::to_vec(record).unwrap_or_default();
    store.journal().set_scrub_record(&bytes)
}

/// Sets the home's scrub interval, kept in the journal.
pub fn set_interval(store: &Store, every: Duration) -> Result<(), AppendError> {
    store
        .journal()
        .set_scrub_every_ms(u64::try_from(every.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::Journal;

    fn journal() -> (tempfile::TempDir, Journal) {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let journal = Journal::open(dir.path().join("journal.redb")).expect("a journal");
        (dir, journal)
    }

    fn record(at_ms: UnixMs, boot_id: &str, outcome: ScrubOutcome) -> Vec<u8> {
        serde_json::to_vec(&ScrubRecord {
            at_ms,
            boot_id: boot_id.to_string(),
            took_ms: 1,
            bytes: 4096,
            outcome,
        })
        .expect("a record encodes")
    }

    const DAY_MS: u64 = 24 * 60 * 60 * 1000;

    #[test]
    fn a_new_journal_is_first_scrubbed_a_day_after_it_was_made() {
        let (_dir, journal) = journal();
        let view = journal.view().expect("a view");
        let created = view.meta().expect("meta").created_at_ms;
        let due = next_due(&view, "boot").expect("due");
        assert_eq!(due.at_ms, created + DAY_MS);
        assert!(!is_due(&view, created + DAY_MS - 1, "boot").expect("due"));
        assert!(is_due(&view, created + DAY_MS, "boot").expect("due"));
    }

    #[test]
    fn a_scrub_is_due_an_interval_after_the_last_after_a_restart_and_soon_after_one_that_did_not_run()
     {
        let (_dir, journal) = journal();
        journal
            .set_scrub_record(&record(1_000, "boot", ScrubOutcome::Clean))
            .expect("recorded");
        let view = journal.view().expect("a view");
        assert_eq!(next_due(&view, "boot").expect("due").at_ms, 1_000 + DAY_MS);
        // Another boot: due at once.
        assert!(is_due(&view, 1_001, "another boot").expect("due"));
        drop(view);

        journal.set_scrub_every_ms(60_000).expect("set");
        let view = journal.view().expect("a view");
        assert_eq!(interval(&view).expect("read"), Duration::from_secs(60));
        assert_eq!(next_due(&view, "boot").expect("due").at_ms, 61_000);
        drop(view);

        let not_run = ScrubOutcome::NotRun {
            reason: "it kept changing".to_string(),
        };
        journal
            .set_scrub_record(&record(1_000, "boot", not_run))
            .expect("recorded");
        let view = journal.view().expect("a view");
        let due = next_due(&view, "boot").expect("due");
        assert_eq!(due.at_ms, 1_000 + RETRY_AFTER.as_millis() as u64);
        assert_eq!(due.why, "the last scrub could not run");
    }

    /// A record of a shape this build does not read counts as none, never as an error.
    #[test]
    fn an_unreadable_record_is_taken_as_never_scrubbed() {
        let (_dir, journal) = journal();
        journal.set_scrub_record(b"not json").expect("recorded");
        let view = journal.view().expect("a view");
        assert_eq!(last(&view).expect("read"), None);
    }
}
