//! The commands users run, in a home of few closed runs and in one of many: `runjournal list`,
//! `status RUN`, `run -- true` and `run --wait -- true`, each a process of the real binary. Each
//! has a time row (wall time per process, in rounds) and a peak-memory row: the peak RSS of the
//! command and of every process it leaves behind (for `run`, its runner), taken in a helper
//! process of its own per sample ([`peak_rss_child_if_asked`]) so that the helper's
//! `RUSAGE_CHILDREN` holds that command's processes alone.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::Way;
use crate::fixture::BenchHome;
use crate::report::{Measured, Table, median, ratio_cell, time, verdict};

const GROUP: &str = "commands";

/// The first argument that makes this binary the peak-RSS helper: the command follows.
const PEAK_ARG: &str = "--peak-rss-of";

/// How long the helper waits for the processes a command left behind before it reports what
/// it has.
const ORPHANS_BOUND: Duration = Duration::from_secs(30);

/// The commands, by id: `list`, `status RUN`, `run -- true`, `run --wait -- true`. The two
/// `run`s print JSON (`--json`), for the run id whose runner is waited for outside the time.
const WAYS: [&str; 4] = ["list", "status", "run", "run-wait"];

/// The largest a command may cost in the large home, as a multiple of the small one.
const TARGET: f64 = 1.2;

/// The arguments of a command in `home` (after `--home ROOT`).
fn args(way: &str, home: &BenchHome) -> Vec<String> {
    let words: &[&str] = match way {
        "list" => &["list"],
        "status" => &["status"],
        "run" => &["run", "--json", "--", "true"],
        "scrub" => &["scrub"],
        _ => &["run", "--json", "--wait", "--", "true"],
    };
    let mut args: Vec<String> = words.iter().map(|word| word.to_string()).collect();
    if way == "status" {
        args.push(home.active[0].to_string());
    }
    args
}

fn id(way: &str, home: &str) -> String {
    format!("{way}-{home}")
}

/// The helper mode: `BENCH --peak-rss-of PROGRAM ARGS...` becomes a child subreaper, runs the
/// command, reaps it and every orphan handed to it (the detached runner of `run`; bounded by
/// [`ORPHANS_BOUND`]), then prints `getrusage(RUSAGE_CHILDREN).ru_maxrss`: the largest peak RSS
/// among them, in KiB on Linux. Returns false when this process is not the helper.
pub fn peak_rss_child_if_asked() -> bool {
    let mut args = std::env::args_os().skip(1);
    if args.next().as_deref() != Some(std::ffi::OsStr::new(PEAK_ARG)) {
        return false;
    }
    let program = args.next().expect("--peak-rss-of takes a command");
    // Where there is no subreaper (macOS), orphans go elsewhere and only the command counts.
    #[cfg(any(target_os = "linux", target_os = "android"))]
    nix::sys::prctl::set_child_subreaper(true).expect("the helper becomes a child subreaper");
    let status = Command::new(&program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .status()
        .expect("the command starts");
    if !status.success() {
        eprintln!("{} failed: {status}", program.to_string_lossy());
        std::process::exit(2);
    }
    reap_orphans();
    let usage = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_CHILDREN)
        .expect("getrusage of the helper's children");
    println!("{}", usage.max_rss());
    true
}

/// Reaps every child of this process until there is none, or until [`ORPHANS_BOUND`] passed.
fn reap_orphans() {
    use nix::errno::Errno;
    use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
    let started = Instant::now();
    loop {
        match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) if started.elapsed() >= ORPHANS_BOUND => {
                eprintln!(
                    "peak RSS: a process left behind still runs after {ORPHANS_BOUND:?}; \
                     reporting what was reaped"
                );
                return;
            }
            Ok(WaitStatus::StillAlive) => std::thread::sleep(Duration::from_millis(1)),
            Ok(_) | Err(Errno::EINTR) => {}
            Err(Errno::ECHILD) => return,
            Err(error) => {
                eprintln!("peak RSS: waitpid failed ({error}); reporting what was reaped");
                return;
            }
        }
    }
}

/// Runs a command in `home`, which must succeed: its wall time and its output.
fn invoke(home: &BenchHome, args: &[String]) -> (Duration, Vec<u8>) {
    let mut command = crate::felt::binary();
    command
        .arg("--home")
        .arg(home.root())
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let started = Instant::now();
    let output = command.output().expect("runjournal runs");
    let took = started.elapsed();
    assert!(
        output.status.success(),
        "runjournal {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    (took, output.stdout)
}

/// One iteration = one process of the command; a `run`'s runner is waited for after it, outside
/// the time (a runner left behind would share the disk with what is measured next).
fn timed_way<'a>(way: &'static str, home: &'a BenchHome) -> Box<dyn FnMut(u64) -> Duration + 'a> {
    let args = args(way, home);
    Box::new(move |iters| {
        let mut elapsed = Duration::ZERO;
        for _ in 0..iters {
            let (took, stdout) = invoke(home, &args);
            elapsed += took;
            if way.starts_with("run") {
                crate::felt::wait_runner_gone(home.root(), &stdout);
            }
            std::hint::black_box(stdout);
        }
        elapsed
    })
}

/// The peak RSS (KiB) of one command in `home`, measured by a fresh helper.
fn peak_kib(way: &str, home: &BenchHome) -> f64 {
    let output = Command::new(std::env::current_exe().expect("this benchmark's path"))
        .arg(PEAK_ARG)
        .arg(env!("CARGO_BIN_EXE_runjournal"))
        .arg("--home")
        .arg(home.root())
        .args(args(way, home))
        .env_remove("RUNJOURNAL_HOME")
        .env_remove("RUNJOURNAL_LAYOUT")
        .stdin(Stdio::null())
        .output()
        .expect("the peak-RSS helper runs");
    assert!(
        output.status.success(),
        "the peak-RSS helper of {way} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout)
        .trim()
        .parse()
        .expect("the helper prints a peak RSS in KiB")
}

/// Peak RSS samples (KiB) by id, and what the homes were.
pub struct Peaks {
    kib: BTreeMap<String, Vec<f64>>,
    samples: usize,
    small_closed: usize,
    large_closed: usize,
    active: usize,
    /// Runs the group launched in the small home and in the large one.
    launched: (u64, u64),
    /// A scrub of each home (`runjournal scrub`, once each): its wall time and peak RSS (KiB)
    /// in the small home, then in the large one, and the large journal's bytes.
    scrub: ((Duration, f64), (Duration, f64), u64),
}

/// The most a scrub may hold in memory, whatever the journal's size.
const SCRUB_MAX_KIB: f64 = 64.0 * 1024.0;

impl Peaks {
    fn median(&self, id: &str) -> Option<f64> {
        let values = self.kib.get(id).filter(|values| !values.is_empty())?;
        Some(median(values.clone()))
    }

    /// `id`'s peaks over `base`'s, sample by sample: (median, lowest, highest).
    fn ratio(&self, id: &str, base: &str) -> Option<(f64, f64, f64)> {
        let (peaks, bases) = (self.kib.get(id)?, self.kib.get(base)?);
        let ratios: Vec<f64> = peaks
            .iter()
            .zip(bases)
            .map(|(peak, base)| peak / base)
            .collect();
        if ratios.is_empty() {
            return None;
        }
        let lowest = ratios.iter().copied().fold(f64::INFINITY, f64::min);
        let highest = ratios.iter().copied().fold(0.0, f64::max);
        Some((median(ratios), lowest, highest))
    }
}

fn run_count(home: &BenchHome) -> u64 {
    let view = home.store.journal().view().expect("a view");
    view.run_count().expect("the runs count")
}

/// Times `list` and `status` in both homes in rounds, then samples their peak RSS; then the
/// same for `run` and `run --wait`, so that the runs these launch (they stay in the homes) are
/// not there yet when `list` and `status` are measured.
pub fn measure(
    small: &BenchHome,
    large: &BenchHome,
    measured: &mut Measured,
    budget: Duration,
    samples: usize,
) -> Peaks {
    // A fixture's journal was built without its closed runs' projections: the first command's
    // reconcile pass makes those of the last ones logged. Not in the time.
    for home in [small, large] {
        invoke(home, &args("list", home));
    }
    let before = (run_count(small), run_count(large));
    let mut kib: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for ways in [&WAYS[..2], &WAYS[2..]] {
        let mut timed: Vec<Way> = Vec::new();
        for &way in ways {
            timed.push((id(way, "small"), timed_way(way, small)));
            timed.push((id(way, "large"), timed_way(way, large)));
        }
        measured.run_rounds(GROUP, timed, budget);
        for _ in 0..samples {
            for &way in ways {
                for (name, home) in [("small", small), ("large", large)] {
                    kib.entry(id(way, name))
                        .or_default()
                        .push(peak_kib(way, home));
                }
            }
        }
    }
    // The scrub last: it copies the journal beside it, and its time follows the journal's
    // size by design (a walk of every page, daily); its memory must not.
    let scrub = |home: &BenchHome| {
        (
            invoke(home, &args("scrub", home)).0,
            peak_kib("scrub", home),
        )
    };
    let journal_bytes =
        std::fs::metadata(large.store.home().journal_path()).map_or(0, |metadata| metadata.len());
    let scrubs = (scrub(small), scrub(large), journal_bytes);
    Peaks {
        scrub: scrubs,
        kib,
        samples,
        small_closed: small.closed,
        large_closed: large.closed,
        active: small.active.len(),
        launched: (run_count(small) - before.0, run_count(large) - before.1),
    }
}

fn mib(kib: f64) -> String {
    format!("{:.1} MiB", kib / 1024.0)
}

/// The section: a time row and a peak-memory row per command, large home over small, each
/// with the target ≤ 1.2×.
pub fn render(measured: &Measured, peaks: &Peaks, verdicts: &mut Vec<String>) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n**Commands in a home of few runs and in one of many** (`--report commands`). Both \
         homes hold {} active runs (runner alive, projections in place); the small one {} \
         closed runs, the large one {}. Each command is a process of the real binary; the two \
         `run`s print JSON (`--json`) and their runner's exit is waited for outside the time. \
         Peak memory is the largest peak RSS (`ru_maxrss`) among the command and every process \
         it leaves behind (for `run`, its runner), each sample in a fresh helper process that \
         is their child subreaper and reaps them all: the median of {} sample(s) per command \
         per home, taken after the timed rounds (a peak ratio's spread is over the samples, \
         paired in order). The runs `run` launches stay in the homes: {} \
         in the small one, {} in the large one, by the end; `list` and `status` were measured \
         before any was launched.\n",
        peaks.active,
        peaks.small_closed,
        peaks.large_closed,
        peaks.samples,
        peaks.launched.0,
        peaks.launched.1,
    );
    let mut table = Table::new(&[
        "row",
        &format!("{} active + {} closed", peaks.active, peaks.small_closed),
        &format!("{} active + {} closed", peaks.active, peaks.large_closed),
        "large ÷ small (spread)",
        "target",
        "verdict",
    ]);
    for (way, command) in [
        ("list", "`runjournal list`"),
        ("status", "`runjournal status RUN`"),
        ("run", "`runjournal run -- true`"),
        ("run-wait", "`runjournal run --wait -- true`"),
    ] {
        let (small, large) = (id(way, "small"), id(way, "large"));
        let time_row = (
            format!("{command}: wall time per process"),
            measured.median(GROUP, &small).map(time),
            measured.median(GROUP, &large).map(time),
            measured.ratio(GROUP, &large, &small),
        );
        let whose = if way.starts_with("run") {
            "the command and its runner"
        } else {
            "the command"
        };
        let peak_row = (
            format!("{command}: peak RSS ({whose})"),
            peaks.median(&small).map(mib),
            peaks.median(&large).map(mib),
            peaks.ratio(&large, &small),
        );
        for (label, small, large, ratio) in [time_row, peak_row] {
            let (Some(small), Some(large)) = (small, large) else {
                table.row(&[label, "not measured".into()]);
                continue;
            };
            let is_met = ratio.is_some_and(|ratio| ratio.0 <= TARGET);
            verdicts.push(format!(
                "{label}, {} closed runs ≤ {TARGET}× {}: {} ({})",
                peaks.large_closed,
                peaks.small_closed,
                verdict(is_met),
                ratio_cell(ratio, false)
            ));
            table.row(&[
                label,
                small,
                large,
                ratio_cell(ratio, false),
                format!("≤ {TARGET}×"),
                verdict(is_met).to_string(),
            ]);
        }
    }
    let ((small_time, small_kib), (large_time, large_kib), bytes) = peaks.scrub;
    let is_met = large_kib <= SCRUB_MAX_KIB;
    verdicts.push(format!(
        "`runjournal scrub` of the {}-run journal ({bytes} bytes) within 64 MiB of memory: {} ({})",
        peaks.large_closed,
        verdict(is_met),
        mib(large_kib)
    ));
    table.row(&[
        "`runjournal scrub`: wall time (once; a walk of every page)".to_string(),
        time(small_time.as_nanos() as f64),
        time(large_time.as_nanos() as f64),
        format!(
            "{:.2}×",
            large_time.as_secs_f64() / small_time.as_secs_f64()
        ),
        "follows the journal".to_string(),
        "—".to_string(),
    ]);
    table.row(&[
        "`runjournal scrub`: peak RSS (once)".to_string(),
        mib(small_kib),
        mib(large_kib),
        format!("{:.2}×", large_kib / small_kib),
        "≤ 64 MiB".to_string(),
        verdict(is_met).to_string(),
    ]);
    out.push_str(&table.text);
    out
}
