//! The one home of the helpers these tests share that no other crate needs (what other crates
//! share too is in `runjournal::testkit`): a fresh home per test with the `runjournal` command
//! bound to it and bounded polls of its journal (`home`, re-exported here); the checks every
//! recovered journal must pass; an in-memory disk with faults, a faulty file, and a scripted
//! lifecycle for the crash sweeps.

#![allow(dead_code)]

pub mod faulty_file;
mod home;
pub mod mem_disk;
pub mod script;

pub use home::*;

use runjournal::event::{Event, Record};
use runjournal::journal::View;
use runjournal::verify::{self, Severity};
use runjournal::{Home, RunId, RunState, state};

/// What every run of a journal must satisfy whatever crashed: seqs gap-free from 1, at most one
/// `Terminal`, and the stored snapshot equal to the fold of the records. Returns the run's
/// state and records.
pub fn check_run(view: &View, run: RunId) -> (RunState, Vec<Record>) {
    let records = view
        .records(run)
        .unwrap_or_else(|error| panic!("run {run}: records read: {error}"));
    let seqs: Vec<u64> = records.iter().map(|record| record.seq).collect();
    let expected: Vec<u64> = (1..=records.len() as u64).collect();
    assert_eq!(seqs, expected, "run {run}: seqs are gap-free from 1");
    let terminals = records
        .iter()
        .filter(|record| matches!(record.event, Event::Terminal { .. }))
        .count();
    assert!(
        terminals <= 1,
        "run {run}: {terminals} Terminal records (a run ends once)"
    );
    let snapshot = view
        .snapshot(run)
        .unwrap_or_else(|error| panic!("run {run}: snapshot reads: {error}"))
        .unwrap_or_else(|| panic!("run {run}: has records but no snapshot"));
    let replayed = state::replay(&records)
        .unwrap_or_else(|error| panic!("run {run}: records fold: {error}"))
        .unwrap_or_else(|| panic!("run {run}: has a snapshot but no records"));
    assert_eq!(snapshot, replayed, "run {run}: snapshot equals replay");
    (snapshot, records)
}

/// Checks every run of the view with [`check_run`], and the journal as a whole with
/// `verify` (indexes, log, snapshots; projections too when `home` is given). Returns the runs.
pub fn check_journal(view: &View, home: Option<&Home>) -> Vec<(RunState, Vec<Record>)> {
    let runs = view.all_runs().expect("the runs table reads");
    let checked: Vec<_> = runs.iter().map(|&run| check_run(view, run)).collect();
    let report = verify::verify(view, home);
    let serious: Vec<String> = report
        .problems
        .iter()
        .filter(|problem| problem.severity > Severity::Note)
        .map(|problem| {
            format!(
                "{} {}: {:?}",
                problem.severity, problem.message, problem.changes
            )
        })
        .collect();
    assert!(serious.is_empty(), "verify found problems: {serious:#?}");
    checked
}

/// The `runjournal` binary under test, copied where another user can execute it (see
/// `runjournal::testkit::other_user`): every test that runs it as another uid runs this copy.
pub fn runjournal_for_another_user() -> runjournal::testkit::other_user::ReachableCopy {
    runjournal::testkit::other_user::ReachableCopy::of(std::path::Path::new(env!(
        "CARGO_BIN_EXE_runjournal"
    )))
}

/// A temporary directory on a memory file system when there is one (`/dev/shm`), where an
/// fsync costs nothing: sweeps that open hundreds of homes stay fast. Durability there is not
/// what such a test checks.
pub fn fast_temp_dir() -> tempfile::TempDir {
    let shm = std::path::Path::new("/dev/shm");
    if shm.is_dir()
        && let Ok(dir) = tempfile::tempdir_in(shm)
    {
        return dir;
    }
    tempfile::tempdir().expect("a temporary directory")
}

/// The events of some records, in order.
pub fn events(records: &[Record]) -> Vec<Event> {
    records.iter().map(|record| record.event.clone()).collect()
}

/// Compiles the C source of a preloadable shim named `name` into the target's temp dir, and
/// returns the library's path (a C compiler is needed: CI installs build-essential).
pub fn compile_shim(name: &str, source: &str) -> std::path::PathBuf {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::create_dir_all(&dir).expect("the shim's directory");
    let source_path = dir.join(format!("{name}.c"));
    std::fs::write(&source_path, source).expect("the shim's source");
    let library = dir.join(format!("{name}.so"));
    let building = dir.join(format!("{name}.so.{}", std::process::id()));
    let output = std::process::Command::new("cc")
        .args(["-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-o"])
        .arg(&building)
        .arg(&source_path)
        .arg("-ldl")
        .output()
        .expect("cc runs (a C compiler is needed: CI installs build-essential)");
    assert!(
        output.status.success(),
        "the shim {name} compiles: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    std::fs::rename(&building, &library).expect("the shim in place");
    library
}
