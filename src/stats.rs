//! What a journal and its home hold, gathered once: `journal-tools inspect stats` (and, for a
//! fleet's database, `--from URL inspect stats`). The same value is the `--json` document and
//! the source of the table's lines.
//!
//! Invariant: gathering only reads; a part that cannot be read without a home (the reserve,
//! blocked writers, the home's bytes, its file system, shipping) is `None`, never a guess.

use std::io;

use serde::Serialize;
use serde_json::{Map, Value};

use crate::capacity;
use crate::duration::format_time_s;
use crate::home::Home;
use crate::journal::{CorruptError, ReadError, Retention, StorageFailure, View};
use crate::json::{BlockedDoc, FleetJournalDoc, FleetSummary, PolicyDoc, blocked_docs};
use crate::launch::queue::QueueUsageReport;
use crate::retention::HomeBytes;
#[cfg(feature = "ship")]
use crate::ship::ShipError;
#[cfg(feature = "ship")]
use crate::ship::fleet::Fleet;
use crate::ship::state::{self as ship_state, Lag, ShipState};
use crate::show::{Cell, Origin, Tone};
use crate::source::JournalSource;
use crate::state::RunStatus;
use crate::text::format_bytes;

/// The statistics of a journal (and of its home, when there is one).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Stats {
    pub journal: String,
    pub format_version: u16,
    pub journal_id: String,
    pub created_at_ms: u64,
    pub file_bytes: u64,
    /// Every run, damaged snapshots included.
    pub runs: u64,
    /// Runs by state, in lifecycle order.
    pub runs_by_state: Map<String, Value>,
    pub damaged_snapshots: usize,
    pub active_runs: usize,
    pub records: u64,
    pub global_head: u64,
    pub has_reserve: Option<bool>,
    pub blocked_since_ms: Option<u64>,
    pub blocked_pids: Option<Vec<u32>>,
    pub blocked: Option<Vec<BlockedDoc>>,
    pub retention: PolicyDoc,
    /// Every queue with a limit: its use.
    pub queues: Vec<QueueUsageReport>,
    pub pruned_runs: u64,
    pub pruned_records: u64,
    pub bytes: Option<HomeBytesDoc>,
    pub file_system: Option<FileSystemDoc>,
    pub shipping: Option<ShippingDoc>,
    /// The snapshots that did not decode (each is noted, and the command's status says so).
    #[serde(skip)]
    pub damaged: Vec<CorruptError>,
    #[serde(skip)]
    by_state: Vec<(RunStatus, u64)>,
    #[serde(skip)]
    queue_usages: Vec<crate::journal::QueueUsage>,
    #[serde(skip)]
    capacity: Option<capacity::CapacityStatus>,
    #[serde(skip)]
    policy_lines: String,
    #[serde(skip)]
    ship: Option<Shipping>,
}

/// Shipping as the journal's mark and the shipper's report show it.
#[derive(Debug)]
struct Shipping {
    report: Option<ShipState>,
    /// The journal's mark: the global seq proven shipped.
    through: u64,
    lag: Option<Lag>,
}

impl Shipping {
    /// `None` when the home does not ship. The report file needs a home; the mark is the
    /// journal's own.
    fn gather(home: Option<&Home>, view: &View) -> Result<Option<Shipping>, ReadError> {
        let through = match home {
            Some(home) => ship_state::shipped_through(home, view)?,
            None => view.shipped_through()?,
        };
        Ok(through.map(|through| Shipping {
            report: home.and_then(ship_state::read),
            through,
            // The lag is a report: when it cannot be read, there is no line rather than a
            // failed command.
            lag: home.and_then(|home| ship_state::lag(home, view).ok().flatten()),
        }))
    }

    fn doc(&self, global_head: u64) -> ShippingDoc {
        let report = self.report.as_ref();
        ShippingDoc {
            target: report
                .map(|report| report.target.clone())
                .unwrap_or_default(),
            shipped_through: report.map_or(0, |report| report.shipped_through),
            proven_shipped_through: self.through,
            records_behind: global_head.saturating_sub(self.through),
            failing_since_ms: report.and_then(|report| report.failing_since_ms),
            last_error: report.and_then(|report| report.last_error.clone()),
            lag: self.lag.as_ref().map(Lag::line),
        }
    }
}

/// The bytes of a home, by part.
#[derive(Debug, Clone, Copy, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HomeBytesDoc {
    pub journal: u64,
    pub runs: u64,
    pub results: u64,
    pub reserve: u64,
}

/// The file system that holds the home.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FileSystemDoc {
    pub mount_point: String,
    pub total_bytes: u64,
    pub available_bytes: u64,
    /// What the retention policy keeps free of it, when it has a floor.
    pub keep_free_bytes: Option<u64>,
}

/// How far shipping got: present when the home ships (the journal's mark says so).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ShippingDoc {
    /// The server, as the shipper's report names it; empty without a report.
    pub target: String,
    /// The server's cursor as the shipper last reported it (0 without a report).
    pub shipped_through: u64,
    /// The journal's own mark: every record at or below it is proven shipped, and retention
    /// keeps every record above it.
    pub proven_shipped_through: u64,
    /// The journal's log head minus its mark.
    pub records_behind: u64,
    pub failing_since_ms: Option<u64>,
    pub last_error: Option<String>,
    /// The lag's line, when it is worth one.
    pub lag: Option<String>,
}

/// Each run's status counted from its snapshot (one read of `runs`), in the order of
/// [`RunStatus::ALL`], and the snapshots that neither decode nor re-derive.
#[allow(clippy::type_complexity)]
fn count_by_state(view: &View) -> Result<(Vec<(RunStatus, u64)>, Vec<CorruptError>), StatsError> {
    let mut by_state: Vec<(RunStatus, u64)> =
        RunStatus::ALL.iter().map(|status| (*status, 0)).collect();
    let mut damaged = Vec::new();
    view.scan_snapshots(|_, snapshot| {
        match snapshot {
            Ok(state) => {
                if let Some((_, count)) = by_state
                    .iter_mut()
                    .find(|(status, _)| *status == state.status)
                {
                    *count += 1;
                }
            }
            Err(error) => damaged.push(error),
        }
        true
    })?;
    Ok((by_state, damaged))
}

impl HomeBytesDoc {
    fn of(bytes: HomeBytes) -> HomeBytesDoc {
        HomeBytesDoc {
            journal: bytes.journal,
            runs: bytes.runs,
            results: bytes.results,
            reserve: bytes.reserve,
        }
    }
}

impl FileSystemDoc {
    /// The file system of `home`, and what `policy` keeps free of it; `None` when it cannot be
    /// read (a report, not a failure).
    fn of(home: &Home, policy: &Retention) -> Option<FileSystemDoc> {
        let space = crate::platform::space::space_of(home.root()).ok()?;
        Some(FileSystemDoc {
            mount_point: space.mount_point.display().to_string(),
            total_bytes: space.total_bytes,
            available_bytes: space.available_bytes,
            keep_free_bytes: policy
                .keep_free
                .map(|keep_free| keep_free.bytes_of(space.total_bytes)),
        })
    }
}

impl Stats {
    /// Reads the journal (one view) and the home's files.
    pub fn gather(source: &JournalSource) -> Result<Stats, StatsError> {
        let view = source.view()?;
        let meta = view.meta()?;
        let (by_state, damaged) = count_by_state(&view)?;
        let runs = by_state.iter().map(|(_, count)| count).sum::<u64>() + damaged.len() as u64;
        let active_runs = view.active_runs()?.len();
        let records = view.record_count()?;
        let global_head = view.global_head()?;
        let policy = view.retention()?;
        let is_default = view.retention_set()?.is_none();
        let pruned_runs = view.tombstone_count()?;
        let pruned_records = view.pruned_records()?;
        let queues = view.queues()?;
        let home = source.home();
        let ship = Shipping::gather(home, &view)?;
        drop(view);
        let journal_path = source.journal_path();
        let file_bytes = std::fs::metadata(journal_path)
            .map_err(|source| StatsError::Io {
                what: format!("reading the size of {}", journal_path.display()),
                source,
            })?
            .len();
        let capacity = match home {
            Some(home) => Some(
                capacity::read_status(home).map_err(|source| StatsError::Io {
                    what: format!("reading the capacity state of {}", home.root().display()),
                    source,
                })?,
            ),
            None => None,
        };
        let bytes = home.map(|home| HomeBytesDoc::of(crate::retention::home_bytes(home)));
        let file_system = home.and_then(|home| FileSystemDoc::of(home, &policy));
        let shipping = ship.as_ref().map(|ship| ship.doc(global_head));
        let policy_lines = crate::retention::policy_lines(&policy)
            .into_iter()
            .map(|(bound, value)| format!("{bound} {value}"))
            .collect::<Vec<_>>()
            .join(", ")
            + if is_default { " (the defaults)" } else { "" };
        Ok(Stats {
            journal: journal_path.display().to_string(),
            format_version: meta.format_version,
            journal_id: crate::ship::journal_id_text(&meta.journal_id),
            created_at_ms: meta.created_at_ms,
            file_bytes,
            runs,
            runs_by_state: by_state
                .iter()
                .map(|(status, count)| (status.as_str().to_string(), Value::from(*count)))
                .collect(),
            damaged_snapshots: damaged.len(),
            active_runs,
            records,
            global_head,
            has_reserve: capacity.as_ref().map(|capacity| capacity.has_reserve),
            blocked_since_ms: capacity
                .as_ref()
                .and_then(capacity::CapacityStatus::blocked_since_ms),
            blocked_pids: capacity.as_ref().map(|capacity| {
                capacity
                    .blocked
                    .iter()
                    .map(|blocked| blocked.writer.pid)
                    .collect()
            }),
            blocked: capacity.as_ref().map(blocked_docs),
            retention: PolicyDoc::of(&policy, is_default),
            queues: queues.iter().map(QueueUsageReport::of).collect(),
            queue_usages: queues,
            pruned_runs,
            pruned_records,
            bytes,
            file_system,
            shipping,
            damaged,
            by_state,
            capacity,
            policy_lines,
            ship,
        })
    }

    /// The reserve's and the blocked writers' rows of [`Stats::lines`].
    fn capacity_texts(&self) -> (String, String) {
        match &self.capacity {
            None => (
                "unknown (no home: --journal without --home)".to_string(),
                "unknown (no home)".to_string(),
            ),
            Some(capacity) => (
                if capacity.has_reserve {
                    "in place"
                } else {
                    "missing (released on a full disk, or never made)"
                }
                .to_string(),
                if capacity.blocked.is_empty() {
                    "no".to_string()
                } else {
                    capacity
                        .blocked
                        .iter()
                        .map(|blocked| {
                            format!(
                                "pid {} on {} since {}",
                                blocked.writer.pid,
                                blocked.cause.describe(),
                                format_time_s(blocked.since_ms)
                            )
                        })
                        .collect::<Vec<_>>()
                        .join("; ")
                },
            ),
        }
    }

    fn home_bytes_text(&self) -> String {
        self.bytes.map_or_else(
            || "unknown (no home)".to_string(),
            |bytes| {
                format!(
                    "journal {}, run directories {}, results {}, reserve {}",
                    format_bytes(bytes.journal),
                    format_bytes(bytes.runs),
                    format_bytes(bytes.results),
                    format_bytes(bytes.reserve)
                )
            },
        )
    }

    fn file_system_text(&self) -> String {
        self.file_system.as_ref().map_or_else(
            || "unknown".to_string(),
            |space| {
                let mut text = format!(
                    "{} free of {} at {}",
                    format_bytes(space.available_bytes),
                    format_bytes(space.total_bytes),
                    space.mount_point
                );
                if let Some(floor) = space.keep_free_bytes {
                    text.push_str(&format!(", {} kept free", format_bytes(floor)));
                }
                text
            },
        )
    }

    /// The table of `inspect stats`: a label and a value per row.
    pub fn lines(&self) -> Vec<(&'static str, String)> {
        let states = self
            .by_state
            .iter()
            .map(|(status, count)| format!("{status} {count}"))
            .collect::<Vec<_>>()
            .join(", ");
        let (reserve, blocked) = self.capacity_texts();
        let home_bytes = self.home_bytes_text();
        let file_system = self.file_system_text();
        let mut lines = vec![
            ("journal", self.journal.clone()),
            ("format", format!("version {}", self.format_version)),
            ("journal id", self.journal_id.clone()),
            ("created", format_time_s(self.created_at_ms)),
            (
                "file size",
                format!(
                    "{} bytes ({})",
                    self.file_bytes,
                    format_bytes(self.file_bytes)
                ),
            ),
            ("runs", format!("{} ({states})", self.runs)),
            ("active runs", self.active_runs.to_string()),
            (
                "records",
                format!("{} (global head {})", self.records, self.global_head),
            ),
            ("reserve", reserve),
            ("blocked", blocked),
            ("retention", self.policy_lines.clone()),
            (
                "pruned",
                format!(
                    "{} tombstone(s) kept; {} record(s) pruned in all",
                    self.pruned_runs, self.pruned_records
                ),
            ),
            ("home bytes", home_bytes),
            ("file system", file_system),
            (
                "shipping",
                crate::show::shipping_text(
                    self.ship.as_ref().and_then(|ship| ship.report.as_ref()),
                    self.ship.as_ref().map(|ship| ship.through),
                    self.ship.as_ref().and_then(|ship| ship.lag.as_ref()),
                    self.global_head,
                ),
            ),
        ];
        // A home without queues shows no line for them.
        if !self.queue_usages.is_empty() {
            let queues = self
                .queue_usages
                .iter()
                .map(|usage| format!("{} {}", usage.name, crate::launch::queue::usage_text(usage)))
                .collect::<Vec<_>>()
                .join("; ");
            lines.push(("queues", queues));
        }
        lines
    }
}

/// Why the statistics could not be gathered.
#[derive(Debug, thiserror::Error)]
pub enum StatsError {
    #[error("reading the journal: {0}")]
    Read(#[from] ReadError),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
}

impl From<StorageFailure> for StatsError {
    fn from(failure: StorageFailure) -> StatsError {
        StatsError::Read(ReadError::Storage(failure))
    }
}

/// What a fleet's PostgreSQL database holds (`journal-tools --from URL inspect stats`): each
/// journal shipped there, and the whole.
#[derive(Debug)]
pub struct FleetStats {
    pub journals: Vec<FleetJournalDoc>,
    pub summary: FleetSummary,
    /// Runs of the whole fleet by state, in lifecycle order.
    by_state: Vec<(RunStatus, u64)>,
}

/// Runs by state, in lifecycle order, of one journal or (`None`) of the whole fleet.
#[cfg(feature = "ship")]
fn fleet_by_state(
    counts: &[(String, RunStatus, u64)],
    journal: Option<&str>,
) -> Vec<(RunStatus, u64)> {
    RunStatus::ALL
        .iter()
        .map(|status| {
            let count = counts
                .iter()
                .filter(|(id, state, _)| {
                    state == status && journal.is_none_or(|journal| journal == id)
                })
                .map(|(_, _, count)| count)
                .sum();
            (*status, count)
        })
        .collect()
}

impl FleetStats {
    /// Reads the fleet; a journal whose last heartbeat is more than `silent_after_ms` old (by
    /// the server's clock) is silent.
    #[cfg(feature = "ship")]
    pub fn gather(fleet: &mut Fleet, silent_after_ms: u64) -> Result<FleetStats, ShipError> {
        let server_now = fleet.server_now_ms()?;
        let journals = fleet.journals()?;
        let counts = fleet.state_counts()?;
        let docs: Vec<FleetJournalDoc> = journals
            .iter()
            .map(|journal| FleetJournalDoc {
                host: journal.host_name.clone(),
                journal_id: journal.journal_id.clone(),
                home: journal.home.clone(),
                journal_created_at_ms: journal.journal_created_at_ms,
                runs: journal.runs,
                runs_open: journal.runs_open,
                runs_by_state: fleet_by_state(&counts, Some(&journal.journal_id))
                    .iter()
                    .map(|(status, count)| (status.as_str().to_string(), Value::from(*count)))
                    .collect(),
                records: journal.records,
                shipped_through: journal.shipped_through,
                shipped_at_ms: journal.shipped_at_ms,
                heartbeat_at_ms: journal.heartbeat_at_ms,
                silent_since_ms: journal.silent_since(server_now, silent_after_ms),
            })
            .collect();
        let summary = FleetSummary {
            server: Some(fleet.target().to_string()),
            journals: docs.len(),
            silent_journals: Some(
                docs.iter()
                    .filter(|journal| journal.silent_since_ms.is_some())
                    .count(),
            ),
            runs: docs.iter().map(|journal| journal.runs).sum(),
            records: Some(docs.iter().map(|journal| journal.records).sum()),
        };
        Ok(FleetStats {
            journals: docs,
            summary,
            by_state: fleet_by_state(&counts, None),
        })
    }

    /// The summary's table: a label and a value per row.
    pub fn lines(&self) -> Vec<(&'static str, String)> {
        let states = self
            .by_state
            .iter()
            .map(|(status, count)| format!("{status} {count}"))
            .collect::<Vec<_>>()
            .join(", ");
        vec![
            ("server", self.summary.server.clone().unwrap_or_default()),
            ("journals", self.summary.journals.to_string()),
            ("runs", format!("{} ({states})", self.summary.runs)),
            (
                "records",
                self.summary.records.unwrap_or_default().to_string(),
            ),
        ]
    }

    /// The table of journals, a header first; a silent host's heartbeat in the warning tone.
    pub fn journal_rows(&self) -> Vec<Vec<Cell>> {
        let mut rows = vec![crate::show::header(&[
            "HOST",
            "JOURNAL",
            "RUNS",
            "OPEN",
            "RECORDS",
            "SHIPPED",
            "LAST SHIPPED",
            "HEARTBEAT",
        ])];
        for journal in &self.journals {
            let origin = Origin {
                host_name: journal.host.clone(),
                journal_id: journal.journal_id.clone(),
            };
            let heartbeat = match journal.silent_since_ms {
                Some(since) => Cell::toned(
                    format!("silent since {}", format_time_s(since)),
                    Some(Tone::Warning),
                ),
                None => Cell::plain(format_time_s(journal.heartbeat_at_ms)),
            };
            rows.push(vec![
                Cell::plain(journal.host.clone()),
                Cell::plain(origin.short_journal()),
                Cell::plain(journal.runs.to_string()),
                Cell::plain(journal.runs_open.to_string()),
                Cell::plain(journal.records.to_string()),
                Cell::plain(format!("through {}", journal.shipped_through)),
                Cell::plain(crate::show::time_or_dash(journal.shipped_at_ms)),
                heartbeat,
            ]);
        }
        rows
    }
}
