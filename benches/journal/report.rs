//! The Markdown report: the machine, then every figure as a ratio against its baseline, the
//! targets and whether they are met.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

/// Percentiles of a set of durations, in nanoseconds.
#[derive(Debug, Clone, Copy)]
pub struct Percentiles {
    pub count: usize,
    pub p50_ns: f64,
    pub p99_ns: f64,
}

impl Percentiles {
    pub fn of(mut times: Vec<Duration>) -> Percentiles {
        assert!(!times.is_empty(), "percentiles of no times");
        times.sort_unstable();
        let at = |quantile: f64| {
            let index = ((times.len() as f64 * quantile).ceil() as usize).clamp(1, times.len()) - 1;
            times[index].as_nanos() as f64
        };
        Percentiles {
            count: times.len(),
            p50_ns: at(0.50),
            p99_ns: at(0.99),
        }
    }
}

pub struct Latencies {
    pub baseline: Percentiles,
    pub one: Percentiles,
    pub many: Percentiles,
}

/// Averages per commit.
pub struct DiskPerCommit {
    /// What committed: runjournal with this many appenders, or redb alone.
    pub label: String,
    pub commits: f64,
    pub batches_per_commit: f64,
    pub syncs: f64,
    pub writes: f64,
    pub bytes: f64,
    pub set_lens: f64,
    /// Time inside `fdatasync`, inside `pwrite`, and in all, per commit.
    pub sync_ns: f64,
    pub write_ns: f64,
    pub wall_ns: f64,
    /// CPU of the whole process (user + system, every thread) per commit.
    pub cpu_ns: f64,
}

pub struct Disk {
    /// redb alone, one insert into one table per commit, as `redb-insert`.
    pub redb: DiskPerCommit,
    pub one: DiskPerCommit,
    pub many: DiskPerCommit,
}

/// The machine and the inputs, and what criterion cannot measure.
#[derive(Default)]
pub struct Facts {
    pub cpus: usize,
    pub cpu_model: String,
    pub memory: String,
    pub filesystem: String,
    pub kernel: String,
    pub rustc: String,
    pub date: String,
    pub load_before: String,
    pub load_after: String,
    pub record_bytes: usize,
    pub status_bytes: usize,
    pub latency: Option<Latencies>,
    pub disk: Option<Disk>,
    /// Appenders sharing one store in the projected-transition rows.
    pub projected_appenders: usize,
    /// CPU of every process per transition, per workload of the `processes` group.
    pub process_cpu: Vec<(String, f64)>,
    /// The steady-size workload of the `retention` group.
    pub retention: Option<crate::retention::Steady>,
    /// The homes of the `home-size` group, when it ran.
    pub home_size: Option<crate::home_size::Sizes>,
    /// The peak memory of the `commands` group, when it ran.
    pub commands: Option<crate::commands::Peaks>,
    /// The watcher at rest, when the `watcher` group ran.
    pub watcher: Option<crate::watcher::Watched>,
}

fn read_trimmed(path: &str) -> String {
    std::fs::read_to_string(path)
        .map(|text| text.trim().to_string())
        .unwrap_or_else(|_| "unknown".to_string())
}

fn load_average() -> String {
    read_trimmed("/proc/loadavg")
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// The type and options of the filesystem holding `dir`: the longest mount point above it.
fn filesystem_of(dir: &Path) -> String {
    let Ok(dir) = dir.canonicalize() else {
        return "unknown".to_string();
    };
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    mounts
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            match fields.as_slice() {
                [_, point, kind, options, ..] if dir.starts_with(point) => {
                    Some((point.len(), format!("{kind} ({options})")))
                }
                _ => None,
            }
        })
        .max_by_key(|(length, _)| *length)
        .map_or_else(|| "unknown".to_string(), |(_, kind)| kind)
}

/// Today in UTC, from the system clock (days since the epoch to a civil date).
fn utc_date() -> String {
    let seconds = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_secs());
    let days = (seconds / 86_400) as i64;
    // Howard Hinnant's days_from_civil, inverted.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z - era * 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 {
        month_index + 3
    } else {
        month_index - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    let minutes = (seconds % 86_400) / 60;
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02} UTC",
        minutes / 60,
        minutes % 60
    )
}

impl Facts {
    pub fn observe(bench_dir: &Path) -> Facts {
        let memory_kib: u64 = read_trimmed("/proc/meminfo")
            .lines()
            .find_map(|line| line.strip_prefix("MemTotal:"))
            .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
            .unwrap_or(0);
        let cpu_model = read_trimmed("/proc/cpuinfo")
            .lines()
            .find_map(|line| line.strip_prefix("model name"))
            .map(|rest| rest.trim_start_matches([' ', '\t', ':']).to_string())
            .unwrap_or_else(|| "unknown".to_string());
        let rustc = std::process::Command::new(std::env::var("RUSTC").unwrap_or("rustc".into()))
            .arg("--version")
            .output()
            .ok()
            .map(|output| String::from_utf8_lossy(&output.stdout).trim().to_string())
            .unwrap_or_else(|| "unknown".to_string());
        Facts {
            cpus: std::thread::available_parallelism().map_or(0, usize::from),
            cpu_model,
            memory: format!("{:.1} GiB", memory_kib as f64 / (1024.0 * 1024.0)),
            filesystem: filesystem_of(bench_dir),
            kernel: read_trimmed("/proc/sys/kernel/osrelease"),
            rustc,
            date: utc_date(),
            load_before: load_average(),
            ..Facts::default()
        }
    }

    pub fn observe_end(&mut self) {
        self.load_after = load_average();
    }
}

/// Rounds kept per group (a first, calibrating round is not).
const ROUNDS: usize = 9;

/// Times per iteration (ns), one per round, of every workload, by group and id.
pub struct Measured {
    groups: BTreeMap<String, BTreeMap<String, Vec<f64>>>,
    /// The same for the CPU time of the whole process (user + system), every thread.
    cpu: BTreeMap<String, BTreeMap<String, Vec<f64>>>,
    /// The time of every iteration of the workloads that keep them, by group and id.
    samples: BTreeMap<String, BTreeMap<String, Vec<Duration>>>,
    /// Each workload once, one iteration, no calibration (`--smoke`).
    pub is_smoke: bool,
}

impl Measured {
    pub fn new(is_smoke: bool) -> Measured {
        Measured {
            groups: BTreeMap::new(),
            cpu: BTreeMap::new(),
            samples: BTreeMap::new(),
            is_smoke,
        }
    }

    /// Keeps the time of every iteration of a workload (over all its rounds), for percentiles.
    pub fn set_samples(&mut self, group: &str, id: &str, times: Vec<Duration>) {
        self.samples
            .entry(group.to_string())
            .or_default()
            .insert(id.to_string(), times);
    }

    /// The percentiles of a workload's iterations, when it kept them.
    pub fn percentiles(&self, group: &str, id: &str) -> Option<Percentiles> {
        let times = self.samples.get(group)?.get(id)?;
        (!times.is_empty()).then(|| Percentiles::of(times.clone()))
    }

    /// Rounds kept per group.
    pub fn rounds_kept(&self) -> usize {
        if self.is_smoke { 1 } else { ROUNDS }
    }

    /// Records one round of a workload measured outside [`Measured::run_rounds`].
    pub fn push(&mut self, group: &str, id: &str, per_iteration_ns: f64, cpu_ns: Option<f64>) {
        let mut tables = vec![(&mut self.groups, per_iteration_ns)];
        if let Some(cpu_ns) = cpu_ns {
            tables.push((&mut self.cpu, cpu_ns));
        }
        for (table, value) in tables {
            table
                .entry(group.to_string())
                .or_default()
                .entry(id.to_string())
                .or_default()
                .push(value);
        }
    }

    /// The per-round times of a workload.
    pub fn per_round(&self, group: &str, id: &str) -> Option<&Vec<f64>> {
        self.groups.get(group)?.get(id)
    }

    /// The per-round CPU times of a workload.
    pub fn cpu_per_round(&self, group: &str, id: &str) -> Option<&Vec<f64>> {
        self.cpu.get(group)?.get(id)
    }
}

/// CPU time of this process so far (user + system, all threads), in nanoseconds.
pub fn process_cpu_ns() -> f64 {
    use nix::sys::resource::{UsageWho, getrusage};
    let usage = getrusage(UsageWho::RUSAGE_SELF).expect("getrusage of this process");
    let ns =
        |time: nix::sys::time::TimeVal| time.tv_sec() as f64 * 1e9 + time.tv_usec() as f64 * 1e3;
    ns(usage.user_time()) + ns(usage.system_time())
}

pub fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// The median of `values` (NaN for none).
pub fn median_of(values: Vec<f64>) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    median(values)
}

impl Measured {
    /// Runs every workload of a group once per round, for about `budget` each; the first
    /// round only sets how many iterations make `budget`.
    pub fn run_rounds(&mut self, group: &str, mut ways: Vec<crate::Way<'_>>, budget: Duration) {
        let mut counts = vec![1u64; ways.len()];
        // A smoke run skips the calibrating round and keeps one iteration of each.
        let first_round = usize::from(self.is_smoke);
        for round in first_round..=self.rounds_kept() {
            for ((id, run), count) in ways.iter_mut().zip(counts.iter_mut()) {
                let cpu_before = process_cpu_ns();
                let elapsed = run(*count);
                let cpu_per_iteration = (process_cpu_ns() - cpu_before) / *count as f64;
                let per_iteration = (elapsed.as_nanos() as f64 / *count as f64).max(1.0);
                if round > 0 {
                    for (table, value) in [
                        (&mut self.groups, per_iteration),
                        (&mut self.cpu, cpu_per_iteration),
                    ] {
                        table
                            .entry(group.to_string())
                            .or_default()
                            .entry(id.clone())
                            .or_default()
                            .push(value);
                    }
                }
                if !self.is_smoke {
                    *count =
                        ((budget.as_nanos() as f64 / per_iteration) as u64).clamp(1, 10_000_000);
                }
            }
        }
    }

    fn rounds(&self, group: &str, id: &str) -> Option<&Vec<f64>> {
        self.groups.get(group)?.get(id)
    }

    /// The median time of one iteration over the rounds.
    pub fn median(&self, group: &str, id: &str) -> Option<f64> {
        self.rounds(group, id).map(|times| median(times.clone()))
    }

    /// The median CPU time (all threads) of one iteration over the rounds.
    pub fn median_cpu(&self, group: &str, id: &str) -> Option<f64> {
        let times = self.cpu.get(group)?.get(id)?;
        Some(median(times.clone()))
    }

    /// `id`'s time over `base`'s, round by round: (median, lowest, highest).
    pub fn ratio(&self, group: &str, id: &str, base: &str) -> Option<(f64, f64, f64)> {
        let (times, bases) = (self.rounds(group, id)?, self.rounds(group, base)?);
        let ratios: Vec<f64> = times
            .iter()
            .zip(bases)
            .map(|(time, base)| time / base)
            .collect();
        let lowest = ratios.iter().copied().fold(f64::INFINITY, f64::min);
        let highest = ratios.iter().copied().fold(0.0, f64::max);
        Some((median(ratios), lowest, highest))
    }
}

/// The `processes` group: host-wide throughput of many processes, each with one appender.
fn render_processes(
    measured: &Measured,
    facts: &Facts,
    out: &mut String,
    verdicts: &mut Vec<String>,
) {
    let group = "processes";
    let base = "1-process";
    if measured.median(group, base).is_none() {
        return;
    }
    let _ = writeln!(
        out,
        "\n**Processes appending at once.** Each process has a journal handle of its own and \
         one appender (a runner's shape) making the same transitions as above, all at once; \
         host-wide transitions/s over one process with one appender, in the same rounds. \
         They share commits through the journal's commit leader (one of them); the last row \
         commits alone (`RUNJOURNAL_COMMIT_SHARING=off`), as every process did before. CPU is \
         every process's, user + system.\n"
    );
    let mut table = Table::new(&[
        "way",
        "time per transition",
        "transitions/s, host-wide",
        "throughput × 1 process",
        "CPU per transition",
        "target",
    ]);
    for (id, label) in [
        (base, "1 process, 1 appender"),
        (
            "16-processes",
            "16 processes, 1 appender each, sharing commits",
        ),
        (
            "64-processes",
            "64 processes, 1 appender each, sharing commits",
        ),
        (
            "64-processes-alone",
            "64 processes, 1 appender each, each committing alone",
        ),
    ] {
        let Some(ns) = measured.median(group, id) else {
            table.row(&[label.to_string(), "not measured".into()]);
            continue;
        };
        let vs_one = measured.ratio(group, id, base);
        let target = match (id, vs_one) {
            ("64-processes", Some((ratio, _, _))) => {
                let is_met = 1.0 / ratio >= 8.0;
                verdicts.push(format!(
                    "64 processes × 1 appender ≥ 8× the throughput of one process: {} ({:.1}×)",
                    verdict(is_met),
                    1.0 / ratio
                ));
                format!("≥ 8× 1 process: {}", verdict(is_met))
            }
            ("64-processes-alone", Some((ratio, _, _))) => {
                let is_met = 1.0 / ratio >= 0.9;
                verdicts.push(format!(
                    "64 processes committing alone ≥ 0.9× the throughput of one process: {} \
                     ({:.2}×)",
                    verdict(is_met),
                    1.0 / ratio
                ));
                format!("≥ 0.9× 1 process: {}", verdict(is_met))
            }
            _ => String::new(),
        };
        let cpu = facts
            .process_cpu
            .iter()
            .find(|(way, _)| way == id)
            .map_or("?".to_string(), |(_, ns)| time(*ns));
        table.row(&[
            label.to_string(),
            time(ns),
            rate(1e9 / ns),
            ratio_cell(vs_one, true),
            cpu,
            target,
        ]);
    }
    out.push_str(&table.text);
}

/// A ratio with its spread over the rounds.
pub fn ratio_cell(ratio: Option<(f64, f64, f64)>, invert: bool) -> String {
    match ratio {
        None => "?".to_string(),
        Some((mid, low, high)) if invert => {
            format!("{:.1}× ({:.1}–{:.1})", 1.0 / mid, 1.0 / high, 1.0 / low)
        }
        Some((mid, low, high)) => format!("{mid:.2}× ({low:.2}–{high:.2})"),
    }
}

pub fn time(ns: f64) -> String {
    if ns >= 1e9 {
        format!("{:.2} s", ns / 1e9)
    } else if ns >= 1e6 {
        format!("{:.2} ms", ns / 1e6)
    } else if ns >= 1e3 {
        format!("{:.1} µs", ns / 1e3)
    } else {
        format!("{ns:.0} ns")
    }
}

fn rate(per_second: f64) -> String {
    if per_second >= 1e6 {
        format!("{:.2} M/s", per_second / 1e6)
    } else if per_second >= 1e4 {
        format!("{:.1} k/s", per_second / 1e3)
    } else {
        format!("{per_second:.0}/s")
    }
}

pub fn verdict(is_met: bool) -> &'static str {
    if is_met { "**met**" } else { "**missed**" }
}

pub struct Table {
    pub text: String,
}

impl Table {
    pub fn new(headers: &[&str]) -> Table {
        let mut text = format!("| {} |\n", headers.join(" | "));
        let _ = writeln!(text, "|{}", "---|".repeat(headers.len()));
        Table { text }
    }

    pub fn row(&mut self, cells: &[String]) {
        let _ = writeln!(self.text, "| {} |", cells.join(" | "));
    }
}

/// The report: the machine, then each group's table, then the targets.
pub fn render(measured: &Measured, facts: &Facts) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Measured {}: {} CPUs ({}), {} memory, Linux {}; bench directory `target/tmp` on {}; \
         {}. Load average {} at the start, {} at the end. The machine is shared, so every \
         workload of a group runs in each of {} rounds, one after the other, and each \
         ratio is the median of the per-round ratios (lowest–highest in brackets); times are \
         medians over the rounds.{}\n",
        facts.date,
        facts.cpus,
        facts.cpu_model,
        facts.memory,
        facts.kernel,
        facts.filesystem,
        facts.rustc,
        facts.load_before,
        facts.load_after,
        measured.rounds_kept(),
        if measured.is_smoke {
            " **A smoke run (`--smoke`): each workload once, at a tiny size; its figures \
             mean nothing, only that the suite runs.**"
        } else {
            ""
        },
    );
    let mut verdicts = Vec::new();

    let _ = writeln!(
        out,
        "**Durable transitions.** A runjournal transition is an `ExternalJobUpdated` record of \
         {} bytes on a run of its own, acknowledged once its commit returned \
         (`Durability::Immediate`); the file and SQLite baselines write the same bytes, the \
         pi-subagents way rewrites a {}-byte status.json. CPU is the whole process's, every \
         thread, user + system.\n",
        facts.record_bytes, facts.status_bytes
    );
    let mut table = Table::new(&[
        "way",
        "time per transition",
        "transitions/s",
        "time × append+fdatasync",
        "throughput × 1 appender",
        "CPU per transition",
        "target",
    ]);
    let group = "transition";
    let base = "append-fdatasync";
    for (id, label) in [
        (
            base,
            "append to a plain file + `fdatasync` (the physical limit)",
        ),
        (
            "two-phase-floor",
            "floor of a two-phase commit: page + `fdatasync`, header + `fdatasync`",
        ),
        (
            "redb-insert",
            "redb alone (`MultiWriter`): one insert into one table per commit",
        ),
        (
            "status-rename",
            "pi-subagents: status.json via temp file + rename, no fsync",
        ),
        (
            "status-rename-fsync",
            "the same with file + directory fsync",
        ),
        (
            "sqlite-wal-full",
            "SQLite WAL, `synchronous=FULL`, a transaction each",
        ),
        ("runjournal-1", "runjournal, 1 appender"),
        ("runjournal-16", "runjournal, 16 appenders, one handle"),
        ("runjournal-256", "runjournal, 256 appenders, one handle"),
        (
            "runjournal-16-handles",
            "runjournal, 16 handles (as 16 processes), 1 appender each",
        ),
    ] {
        let Some(ns) = measured.median(group, id) else {
            table.row(&[label.to_string(), "not measured".into()]);
            continue;
        };
        let vs_base = measured.ratio(group, id, base);
        let vs_one = measured.ratio(group, id, "runjournal-1");
        let vs_redb = measured.ratio(group, id, "redb-insert");
        let cpu = measured.median_cpu(group, id);
        let target = match (id, vs_redb, vs_one, cpu) {
            ("runjournal-1", Some((ratio, _, _)), _, _) => {
                let is_met = ratio <= 1.2;
                verdicts.push(format!(
                    "one appender within 1.2× the time of redb's own commit in the same mode: {} \
                     ({})",
                    verdict(is_met),
                    ratio_cell(vs_redb, false)
                ));
                format!(
                    "≤ 1.2× redb alone: {} ({})",
                    verdict(is_met),
                    ratio_cell(vs_redb, false)
                )
            }
            ("runjournal-256", _, Some((ratio, _, _)), Some(cpu)) => {
                let is_met = 1.0 / ratio >= 20.0 && cpu <= 40_000.0;
                verdicts.push(format!(
                    "256 appenders ≥ 20× the throughput of one, CPU ≤ 40 µs a transition: {} \
                     ({:.1}×, {})",
                    verdict(is_met),
                    1.0 / ratio,
                    time(cpu)
                ));
                format!("≥ 20× 1 appender, CPU ≤ 40 µs: {}", verdict(is_met))
            }
            _ => String::new(),
        };
        table.row(&[
            label.to_string(),
            time(ns),
            rate(1e9 / ns),
            ratio_cell(vs_base, false),
            if id.starts_with("runjournal") {
                ratio_cell(vs_one, true)
            } else {
                String::new()
            },
            measured.median_cpu(group, id).map_or("?".into(), time),
            target,
        ]);
    }
    out.push_str(&table.text);

    render_processes(measured, facts, &mut out, &mut verdicts);

    if let Some(latency) = &facts.latency {
        let _ = writeln!(
            out,
            "\n**Latency of one acknowledged transition**, from the call to its return (the \
             three alternate in rounds).\n"
        );
        let mut table = Table::new(&[
            "way",
            "transitions timed",
            "p50",
            "p99",
            "p50 × baseline p50",
            "p99 × baseline p99",
        ]);
        for (label, figures) in [
            ("append + fdatasync (baseline)", latency.baseline),
            ("runjournal, 1 appender", latency.one),
            ("runjournal, each of 256 appenders", latency.many),
        ] {
            table.row(&[
                label.to_string(),
                figures.count.to_string(),
                time(figures.p50_ns),
                time(figures.p99_ns),
                format!("{:.2}×", figures.p50_ns / latency.baseline.p50_ns),
                format!("{:.2}×", figures.p99_ns / latency.baseline.p99_ns),
            ]);
        }
        out.push_str(&table.text);
    }

    if let Some(disk) = &facts.disk {
        let _ = writeln!(
            out,
            "\n**What one commit asks of the disk**, counted through redb's own file backend \
             (the baseline: one write and one `fdatasync` per transition), beside redb alone \
             committing one insert into one table the same way; CPU is the whole process's, \
             every thread.\n"
        );
        let mut table = Table::new(&[
            "what commits",
            "commits counted",
            "batches per commit",
            "`fdatasync`s per commit",
            "writes per commit",
            "KiB written per commit",
            "file resizes per commit",
            "time per commit",
            "of it in `fdatasync`",
            "in `pwrite`",
            "the rest (CPU, locks, hand-offs)",
            "CPU per commit",
        ]);
        for figures in [&disk.redb, &disk.one, &disk.many] {
            let share = |ns: f64| format!("{} ({:.0}%)", time(ns), 100.0 * ns / figures.wall_ns);
            table.row(&[
                figures.label.clone(),
                format!("{:.0}", figures.commits),
                format!("{:.1}", figures.batches_per_commit),
                format!("{:.2}", figures.syncs),
                format!("{:.1}", figures.writes),
                format!("{:.1}", figures.bytes / 1024.0),
                format!("{:.2}", figures.set_lens),
                time(figures.wall_ns),
                share(figures.sync_ns),
                share(figures.write_ns),
                share((figures.wall_ns - figures.sync_ns - figures.write_ns).max(0.0)),
                time(figures.cpu_ns),
            ]);
        }
        out.push_str(&table.text);
    }

    let _ = writeln!(
        out,
        "\n**Replay.** One iteration = the six-record lives of 1,000 closed runs. Baseline: \
         parsing the same records as events.jsonl lines (serde_json), as a file-based tool \
         reads its history.\n"
    );
    let mut table = Table::new(&[
        "what",
        "time per record",
        "records/s",
        "time × JSON-lines parse",
        "target",
    ]);
    let group = "replay";
    for (id, label) in [
        ("events-jsonl-parse", "parse events.jsonl lines (baseline)"),
        ("fold", "`state::replay`: fold decoded records"),
        (
            "read-decode-fold",
            "end to end: read from a 100,100-run journal, decode, check, fold",
        ),
    ] {
        let Some(ns) = measured.median(group, id) else {
            table.row(&[label.to_string(), "not measured".into()]);
            continue;
        };
        let per_record = ns / 6_000.0;
        let per_second = 1e9 / per_record;
        let target = if id == "fold" {
            let is_met = per_second >= 1e6;
            verdicts.push(format!(
                "replay ≥ 1,000,000 records/s: {} ({})",
                verdict(is_met),
                rate(per_second)
            ));
            format!("≥ 1 M/s: {}", verdict(is_met))
        } else {
            String::new()
        };
        table.row(&[
            label.to_string(),
            time(per_record),
            rate(per_second),
            ratio_cell(measured.ratio(group, id, "events-jsonl-parse"), false),
            target,
        ]);
    }
    out.push_str(&table.text);

    let _ = writeln!(
        out,
        "\n**Costs that must follow active runs, not all runs.** Both homes hold 100 active \
         runs (runner alive, projections in place); the large one also 100,000 closed runs, \
         1,000× the small one's 100: a cost that followed all runs would grow about 500×.\n"
    );
    let mut table = Table::new(&[
        "what",
        "100 active + 100 closed",
        "100 active + 100,000 closed",
        "large ÷ small",
        "target",
    ]);
    for (group, small, large, label) in [
        (
            "reconcile",
            "100-active-100-closed",
            "100-active-100000-closed",
            "reconcile pass (library)",
        ),
        (
            "list",
            "library-200-runs",
            "library-100100-runs",
            "`list`'s reads (library calls)",
        ),
        (
            "list",
            "binary-200-runs",
            "binary-100100-runs",
            "`runjournal list` (a process, with its reconcile)",
        ),
    ] {
        let (Some(small_ns), Some(large_ns), Some(ratio)) = (
            measured.median(group, small),
            measured.median(group, large),
            measured.ratio(group, large, small),
        ) else {
            table.row(&[label.to_string(), "not measured".into()]);
            continue;
        };
        let is_met = ratio.0 <= 2.0;
        verdicts.push(format!(
            "{label} grows with active runs, not all runs: {} ({:.2}×)",
            verdict(is_met),
            ratio.0
        ));
        table.row(&[
            label.to_string(),
            time(small_ns),
            time(large_ns),
            ratio_cell(Some(ratio), false),
            format!("≤ 2×: {}", verdict(is_met)),
        ]);
    }
    out.push_str(&table.text);

    out.push_str(&render_felt(
        measured,
        facts.projected_appenders,
        &mut verdicts,
    ));
    out.push_str(&render_queue(measured, &mut verdicts));

    if let Some(steady) = &facts.retention {
        out.push_str(&crate::retention::render(measured, steady, &mut verdicts));
    }
    if let Some(sizes) = facts.home_size {
        out.push_str(&crate::home_size::render(measured, sizes, &mut verdicts));
    }
    if let Some(peaks) = &facts.commands {
        out.push_str(&crate::commands::render(measured, peaks, &mut verdicts));
    }
    if let Some(watched) = &facts.watcher {
        out.push_str(&crate::watcher::render(watched));
    }

    let _ = writeln!(out, "\n**Targets**\n");
    for line in verdicts {
        let _ = writeln!(out, "* {line}");
    }
    out
}

/// The rows of queues: a freed slot to the next run's step, and admitting with 10 and 10,000
/// runs waiting.
pub fn render_queue(measured: &Measured, verdicts: &mut Vec<String>) -> String {
    let mut out = String::new();
    let group = "queue";
    let _ = writeln!(
        out,
        "\n**Queues.** From a run's `Terminal` in a full queue (limit 1) to the next run's \
         `StepRunning`, by the journal's record times (whole milliseconds): the ending runner \
         admits the next run (a durable commit) and starts its runner (a process), which \
         records `RunnerStarted` and `StepRunning` (two more commits); its floor is one process \
         start and three durable commits, measured in the same rounds. Admitting a queue's \
         next run (`launch::queue::admit_next`: a read of the queue's index, then the \
         conditional append) with 10 runs waiting and with 10,000, in one journal. A reconcile \
         pass's delayed starts (`launch::delay::reconcile_delayed`: the runs due, read from the \
         `delayed` index, and whether the home's timer runs) with 10 delayed runs waiting and \
         with 10,000, each in a home of its own, none due.\n"
    );
    let mut table = Table::new(&["what", "time", "ratio", "target"]);
    let floor = composite(
        measured,
        group,
        &[("process-start", 1.0), ("durable-commit", 3.0)],
    );
    if let (Some(times), Some(floor)) = (measured.per_round(group, "slot-to-step"), &floor) {
        table.row(&[
            "slot freed → next run's step running".into(),
            time(median(times.clone())),
            format!(
                "{} its floor (1 process start + 3 durable commits, {})",
                ratio_cell(ratio_of(times, floor), false),
                time(median(floor.clone()))
            ),
            String::new(),
        ]);
    } else {
        table.row(&[
            "slot freed → next run's step running".into(),
            "not measured".into(),
        ]);
    }
    let few = measured.per_round(group, "admit-10");
    let commit = measured.per_round(group, "durable-commit");
    if let (Some(few), Some(commit)) = (few, commit) {
        table.row(&[
            "admitting the next run, 10 waiting".into(),
            time(median(few.clone())),
            format!(
                "{} a durable commit",
                ratio_cell(ratio_of(few, commit), false)
            ),
            String::new(),
        ]);
    }
    if let (Some(many), Some(few)) = (measured.per_round(group, "admit-10000"), few) {
        let ratio = ratio_of(many, few);
        let bound = 1.5;
        let target = match ratio {
            Some((mid, _, _)) => {
                let is_met = mid <= bound;
                verdicts.push(format!(
                    "admitting with 10,000 waiting ≤ {bound}× admitting with 10: {} ({mid:.2}×)",
                    verdict(is_met)
                ));
                format!("≤ {bound}×: {}", verdict(is_met))
            }
            None => String::new(),
        };
        table.row(&[
            "admitting the next run, 10,000 waiting".into(),
            time(median(many.clone())),
            format!("{} with 10 waiting", ratio_cell(ratio, false)),
            target,
        ]);
    }
    let few = measured.per_round(group, "delayed-10");
    if let (Some(many), Some(few)) = (measured.per_round(group, "delayed-10000"), few) {
        table.row(&[
            "a pass's delayed starts, 10 delayed runs waiting".into(),
            time(median(few.clone())),
            String::new(),
            String::new(),
        ]);
        let ratio = ratio_of(many, few);
        let bound = 1.5;
        let target = match ratio {
            Some((mid, _, _)) => {
                let is_met = mid <= bound;
                verdicts.push(format!(
                    "a pass's delayed starts with 10,000 waiting ≤ {bound}× with 10: {} ({mid:.2}×)",
                    verdict(is_met)
                ));
                format!("≤ {bound}×: {}", verdict(is_met))
            }
            None => String::new(),
        };
        table.row(&[
            "a pass's delayed starts, 10,000 delayed runs waiting".into(),
            time(median(many.clone())),
            format!("{} with 10 waiting", ratio_cell(ratio, false)),
            target,
        ]);
    }
    out.push_str(&table.text);
    out
}

/// Per round, the sum of `factor × time` over `terms` of a group: a composite baseline such as
/// "two process starts and two durable commits", from figures of the same rounds.
fn composite(measured: &Measured, group: &str, terms: &[(&str, f64)]) -> Option<Vec<f64>> {
    let mut sums: Option<Vec<f64>> = None;
    for (id, factor) in terms {
        let rounds = measured.per_round(group, id)?;
        let sums = sums.get_or_insert_with(|| vec![0.0; rounds.len()]);
        for (sum, value) in sums.iter_mut().zip(rounds) {
            *sum += factor * value;
        }
    }
    sums
}

/// Round by round, `times` over `bases`: (median, lowest, highest).
fn ratio_of(times: &[f64], bases: &[f64]) -> Option<(f64, f64, f64)> {
    if times.is_empty() || times.len() != bases.len() {
        return None;
    }
    let ratios: Vec<f64> = times.iter().zip(bases).map(|(t, b)| t / b).collect();
    let lowest = ratios.iter().copied().fold(f64::INFINITY, f64::min);
    let highest = ratios.iter().copied().fold(0.0, f64::max);
    Some((median(ratios), lowest, highest))
}

/// CPU per projected transition (all threads) with 256 appenders on one store over the CPU of
/// the same appenders on the journal alone, measured in the report's rounds on the code before
/// incremental projection (509 µs against 33 µs, on the 2-CPU machine of the README's report): what "halve
/// today's figure" is measured against. A ratio, because the absolute figure moves with the
/// machine and its load; the journal alone is the same code before and after.
pub const BEFORE_PROJECTED_CPU_RATIO: f64 = 14.84;

/// A percentile of a floor made of `terms` (id, factor) of the launch group: the sum of each
/// term's percentile, taken by `pick`. Percentiles do not add exactly; the sum is what the
/// floor's parts cost at that percentile each, which no launch made of them can beat.
fn floor_percentile(
    measured: &Measured,
    terms: &[(&str, f64)],
    pick: impl Fn(&Percentiles) -> f64,
) -> Option<f64> {
    let mut sum = 0.0;
    for (id, factor) in terms {
        sum += factor * pick(&measured.percentiles("launch", id)?);
    }
    Some(sum)
}

/// The floor of `run -- true`: the launcher's and the runner's process starts, and their
/// commits (`RunCreated`, `RunnerStarted`).
const RUN_FLOOR: [(&str, f64); 2] = [("process-start", 2.0), ("durable-commit", 2.0)];
/// The floor of the end of `run --wait`, from its step's exit: the step's end and the run's
/// (`StepFinished`, `Terminal`) and the runner's exit (`ProcessTerminalObserved`) each
/// durable, and one process's start and exit standing for the runner's and the launcher's
/// exits.
const WAIT_TAIL_FLOOR: [(&str, f64); 2] = [("process-start", 1.0), ("durable-commit", 3.0)];

/// The launch's rows in percentiles: `run -- true` end to end, and the end of `run --wait`
/// from its step's exit, p50 and p99 over every iteration of the rounds, against the same
/// percentiles of their floors, measured in the same rounds.
fn render_launch_percentiles(measured: &Measured, verdicts: &mut Vec<String>) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n**A launch, in percentiles**, over every iteration of the rounds above. `run -- true` \
         end to end against two process starts and two durable commits; the end of \
         `run --wait -- STEP`, from the step's exit (the step writes the wall-clock time just \
         before it exits) to `run --wait`'s exit, against three durable commits (`StepFinished`, \
         `Terminal`, the runner's exit) and one process start. A floor's percentile is the sum \
         of its parts' percentiles.\n"
    );
    let mut table = Table::new(&[
        "what",
        "iterations",
        "p50",
        "p99",
        "floor p50",
        "floor p99",
        "p50 × floor",
        "p99 × floor",
        "target",
    ]);
    for (id, label, terms, floor_label) in [
        (
            "run",
            "`runjournal run -- true`",
            &RUN_FLOOR[..],
            "2 process starts + 2 durable commits",
        ),
        (
            "wait-tail",
            "a step's exit → `run --wait`'s exit",
            &WAIT_TAIL_FLOOR[..],
            "1 process start + 3 durable commits",
        ),
    ] {
        let figures = measured.percentiles("launch", id);
        let floor_p50 = floor_percentile(measured, terms, |p| p.p50_ns);
        let floor_p99 = floor_percentile(measured, terms, |p| p.p99_ns);
        let (Some(figures), Some(floor_p50), Some(floor_p99)) = (figures, floor_p50, floor_p99)
        else {
            table.row(&[label.to_string(), "not measured".into()]);
            continue;
        };
        let (at_p50, at_p99) = (figures.p50_ns / floor_p50, figures.p99_ns / floor_p99);
        let is_met = at_p50 <= 1.5 && at_p99 <= 1.5;
        verdicts.push(format!(
            "{label} ≤ 1.5× its floor ({floor_label}) at p50 and p99: {} ({at_p50:.2}×, \
             {at_p99:.2}×)",
            verdict(is_met)
        ));
        table.row(&[
            label.to_string(),
            figures.count.to_string(),
            time(figures.p50_ns),
            time(figures.p99_ns),
            time(floor_p50),
            time(floor_p99),
            format!("{at_p50:.2}×"),
            format!("{at_p99:.2}×"),
            format!("≤ 1.5×: {}", verdict(is_met)),
        ]);
    }
    out.push_str(&table.text);
    out
}

/// The rows of the environment a launch keeps: `run` with this process's environment kept, and
/// with one near the bound, against `run --clear-env`, which keeps none: what keeping the
/// launcher's environment costs a launch (written in the creation's own transaction, no commit
/// of its own).
fn render_kept_environment(measured: &Measured, verdicts: &mut Vec<String>) -> String {
    let mut out = String::new();
    let own_bytes: usize = std::env::vars_os()
        .map(|(name, value)| name.len() + value.len() + 2)
        .sum();
    let large_bytes: usize = crate::felt::large_env()
        .iter()
        .map(|(name, value)| name.len() + value.len() + 2)
        .sum::<usize>()
        + own_bytes;
    let _ = writeln!(
        out,
        "\n**A launch's kept environment.** `run` keeps its launcher's variables, cwd and umask \
         in the journal, in the transaction of the run's creation: `run -- true` with the \
         benchmark's own environment ({own_bytes} bytes), and with 64 variables of 2 KiB added \
         ({large_bytes} bytes, within the bound), against `run --clear-env -- true`, which keeps \
         an empty one.\n"
    );
    let mut table = Table::new(&["what", "time", "× `run --clear-env`", "target"]);
    let group = "launch";
    let base = measured.per_round(group, "run-clear-env");
    match base {
        Some(base) => table.row(&[
            "`runjournal run --clear-env -- true`".into(),
            time(median(base.clone())),
            "1.00×".into(),
            String::new(),
        ]),
        None => table.row(&["`run --clear-env`".into(), "not measured".into()]),
    }
    for (id, label, bound) in [
        (
            "run",
            "`run -- true`, its launcher's environment kept",
            Some(1.1),
        ),
        (
            "run-large-env",
            "the same with 128 KiB of variables added",
            None,
        ),
    ] {
        let (Some(times), Some(base)) = (measured.per_round(group, id), base) else {
            table.row(&[label.to_string(), "not measured".into()]);
            continue;
        };
        let ratio = ratio_of(times, base);
        let target = match (bound, ratio) {
            (Some(bound), Some((mid, _, _))) => {
                let is_met = mid <= bound;
                verdicts.push(format!(
                    "a launch keeping its environment ≤ {bound}× one keeping none: {} ({mid:.2}×)",
                    verdict(is_met)
                ));
                format!("≤ {bound}×: {}", verdict(is_met))
            }
            _ => String::new(),
        };
        table.row(&[
            label.to_string(),
            time(median(times.clone())),
            ratio_cell(ratio, false),
            target,
        ]);
    }
    out.push_str(&table.text);
    out
}

/// The rows of what users feel: a chatty run, a launch, the CPU of a projected transition. Kept apart
/// from [`render`] so that other groups' rows merge without touching these.
pub fn render_felt(measured: &Measured, appenders: usize, verdicts: &mut Vec<String>) -> String {
    let mut out = String::new();

    let _ = writeln!(
        out,
        "\n**A chatty run.** One external job's progress updates through `Store::append` (a \
         durable commit, then the projection), while a follower reads the run as `run --wait` \
         does. A fresh run and one already holding 9,000 updates advance in the same rounds, \
         one update each in turn: the cost of an update must not grow with the run. \
         (pi-subagents' way, appending events and throttling status writes, is constant per \
         update by construction.)\n"
    );
    let mut table = Table::new(&["updates", "time per update", "× the first 1,000", "target"]);
    let first = measured.per_round("chatty", "first");
    let last = measured.per_round("chatty", "last");
    if let (Some(first), Some(last)) = (first, last) {
        let ratio = ratio_of(last, first);
        table.row(&[
            "the first 1,000 of a run".into(),
            time(median(first.clone())),
            "1.00×".into(),
            String::new(),
        ]);
        let target = ratio.map_or(String::new(), |(mid, _, _)| {
            let is_met = mid <= 1.2;
            verdicts.push(format!(
                "chatty run, last 1,000 of 10,000 updates ≤ 1.2× the first 1,000: {} ({mid:.2}×)",
                verdict(is_met)
            ));
            format!("≤ 1.2×: {}", verdict(is_met))
        });
        table.row(&[
            "the last 1,000 of 10,000".into(),
            time(median(last.clone())),
            ratio_cell(ratio, false),
            target,
        ]);
    } else {
        table.row(&["chatty run".into(), "not measured".into()]);
    }
    out.push_str(&table.text);

    let _ = writeln!(
        out,
        "\n**A launch.** `runjournal run -- true` creates the run (a durable commit), starts the \
         runner (a process) and returns once the runner's `RunnerStarted` is durable (a \
         second process start, a second commit): its floor is two process starts \
         (`runjournal --version`) and two durable commits (`Store::append` with its \
         projection), measured in the same rounds. `run --wait -- true` also runs the step (a \
         third process) and records four more transitions (step running, step finished, \
         terminal, the runner's exit). pueue's way for comparison: a client process and a \
         state file rewritten without fsync (`pueue add` writes no fsync).\n"
    );
    let mut table = Table::new(&["what", "time", "× its floor", "target"]);
    let group = "launch";
    for (id, label) in [
        ("process-start", "a process start (`runjournal --version`)"),
        (
            "durable-commit",
            "a durable commit (`Store::append`, projected)",
        ),
        (
            "store-open-close",
            "opening and closing the home's store beside a writer",
        ),
        (
            "status-rename",
            "status.json via temp file + rename, no fsync",
        ),
    ] {
        let cell = measured
            .median(group, id)
            .map_or("not measured".into(), time);
        table.row(&[label.to_string(), cell, String::new(), String::new()]);
    }
    let floor = composite(
        measured,
        group,
        &[("process-start", 2.0), ("durable-commit", 2.0)],
    );
    let wait_floor = composite(
        measured,
        group,
        &[("process-start", 3.0), ("durable-commit", 6.0)],
    );
    let tail_floor = composite(measured, group, &WAIT_TAIL_FLOOR);
    let pueue = composite(
        measured,
        group,
        &[("process-start", 1.0), ("status-rename", 1.0)],
    );
    // What no launch through a redb multi-writer journal avoids: each of its two processes
    // opens and closes the journal (header writes and syncs of redb's protocol).
    let redb_floor = composite(
        measured,
        group,
        &[
            ("process-start", 2.0),
            ("durable-commit", 2.0),
            ("store-open-close", 2.0),
        ],
    );
    for (label, sums) in [
        (
            "floor of `run`: 2 process starts + 2 durable commits",
            &floor,
        ),
        (
            "floor of `run --wait`: 3 process starts + 6 durable commits",
            &wait_floor,
        ),
    ] {
        let cell = sums
            .clone()
            .map_or("not measured".into(), |sums| time(median(sums)));
        table.row(&[label.to_string(), cell, "1.00×".into(), String::new()]);
    }
    for (id, label, floor, target) in [
        ("run", "`runjournal run -- true`", &floor, Some(1.5)),
        (
            "run-wait",
            "`runjournal run --wait -- true`",
            &wait_floor,
            None,
        ),
        (
            "wait-tail",
            "a step's exit → `run --wait`'s exit (floor: 1 process start + 3 durable commits)",
            &tail_floor,
            None,
        ),
    ] {
        let (Some(times), Some(floor)) = (measured.per_round(group, id), floor) else {
            table.row(&[label.to_string(), "not measured".into()]);
            continue;
        };
        let ratio = ratio_of(times, floor);
        let target = match (target, ratio) {
            (Some(bound), Some((mid, _, _))) => {
                let is_met = mid <= bound;
                verdicts.push(format!(
                    "{label} ≤ {bound}× two process starts + two durable commits: {} ({mid:.2}×)",
                    verdict(is_met)
                ));
                format!("≤ {bound}×: {}", verdict(is_met))
            }
            _ => String::new(),
        };
        table.row(&[
            label.to_string(),
            time(median(times.clone())),
            ratio_cell(ratio, false),
            target,
        ]);
    }
    if let (Some(times), Some(redb_floor)) = (measured.per_round(group, "run"), &redb_floor) {
        table.row(&[
            "floor of `run` with each process's open and close of the journal".into(),
            time(median(redb_floor.clone())),
            format!(
                "`run` is {}",
                ratio_cell(ratio_of(times, redb_floor), false)
            ),
            String::new(),
        ]);
    }
    if let Some(pueue) = pueue {
        let vs_run = measured
            .per_round(group, "run")
            .and_then(|times| ratio_of(&pueue, times));
        table.row(&[
            "pueue's way: a process start + an fsync-less rewrite".into(),
            time(median(pueue)),
            format!("{} of `run`", ratio_cell(vs_run, false)),
            String::new(),
        ]);
    }
    out.push_str(&table.text);
    out.push_str(&render_launch_percentiles(measured, verdicts));
    out.push_str(&render_kept_environment(measured, verdicts));

    let _ = writeln!(
        out,
        "\n**CPU per projected transition.** `Store::append` of one update (its commit and the \
         projection that follows) by {appenders} appenders sharing one store, each on its own \
         run; beside it the same appenders on the journal alone, and one appender. CPU is the \
         whole process's, every thread, user + system.\n"
    );
    let mut table = Table::new(&[
        "way",
        "time per transition",
        "CPU per transition",
        "CPU × the journal alone",
        "target",
    ]);
    let group = "projected";
    let journal_cpu = measured.cpu_per_round(group, "journal-many");
    for (id, label) in [
        ("store-1", "`Store::append`, 1 appender".to_string()),
        (
            "store-many",
            format!("`Store::append`, {appenders} appenders"),
        ),
        (
            "journal-many",
            format!("`Journal::append` alone, {appenders} appenders"),
        ),
    ] {
        let Some(ns) = measured.median(group, id) else {
            table.row(&[label, "not measured".into()]);
            continue;
        };
        let cpu = measured.cpu_per_round(group, id);
        let vs_journal = match (cpu, journal_cpu) {
            (Some(cpu), Some(journal)) => ratio_of(cpu, journal),
            _ => None,
        };
        let target = match (id, vs_journal) {
            ("store-many", Some((mid, _, _))) if BEFORE_PROJECTED_CPU_RATIO.is_finite() => {
                let bound = BEFORE_PROJECTED_CPU_RATIO / 2.0;
                let is_met = mid <= bound;
                verdicts.push(format!(
                    "CPU per projected transition at {appenders} appenders halved: {} \
                     ({mid:.2}× the journal alone, before {BEFORE_PROJECTED_CPU_RATIO:.2}×)",
                    verdict(is_met)
                ));
                format!("≤ {bound:.2}× (half of before): {}", verdict(is_met))
            }
            _ => String::new(),
        };
        table.row(&[
            label,
            time(ns),
            cpu.map_or("?".into(), |cpu| time(median(cpu.clone()))),
            ratio_cell(vs_journal, false),
            target,
        ]);
    }
    if let (Some(ns), Some(cpu)) = (
        measured.median("transition", "status-rename"),
        measured.median_cpu("transition", "status-rename"),
    ) {
        table.row(&[
            "pi-subagents' way: status.json via temp file + rename, no fsync (the transition \
             rounds)"
                .to_string(),
            time(ns),
            time(cpu),
            String::new(),
            String::new(),
        ]);
    }
    out.push_str(&table.text);
    out
}
