//! A fresh home per test, the `runjournal` command bound to it, and bounded polls of the
//! journal.

use std::path::{Path, PathBuf};
use std::time::Duration;

use runjournal::event::Record;
use runjournal::{Journal, RunId, RunState};

/// Most polls of a bounded wait, and the pause between two.
const POLL_ATTEMPTS: u32 = 1200;
const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// A fresh home in a temporary directory, and a directory beside it for the files a test
/// hands to a command (a spec, a provider script): a new home is made only in an empty
/// directory.
pub struct TestHome {
    dir: tempfile::TempDir,
    inputs: tempfile::TempDir,
}

impl TestHome {
    pub fn new() -> TestHome {
        TestHome {
            dir: tempfile::tempdir().expect("a temporary directory"),
            inputs: tempfile::tempdir().expect("a temporary directory"),
        }
    }

    /// A path outside the home for a file the test writes and gives to a command.
    pub fn input(&self, name: &str) -> PathBuf {
        self.inputs.path().join(name)
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// `runjournal --home <this home>`, with a generous timeout so a hung command fails the
    /// test instead of hanging it.
    pub fn cmd(&self) -> assert_cmd::Command {
        let mut command = assert_cmd::cargo::cargo_bin_cmd!("runjournal");
        command
            .env_remove("RUNJOURNAL_HOME")
            .env_remove("RUNJOURNAL_LAYOUT")
            .arg("--home")
            .arg(self.path())
            .timeout(Duration::from_secs(120));
        command
    }

    /// A journal handle of the test's own (the CLI's processes have theirs).
    pub fn journal(&self) -> Journal {
        Journal::open(self.path().join("journal.redb")).expect("the journal opens")
    }

    pub fn file(&self, name: &str) -> PathBuf {
        self.path().join(name)
    }

    /// Ends the home's watcher ([`stop_watcher`]).
    pub fn stop_watcher(&self) {
        stop_watcher(&runjournal::Home::at(self.path()));
    }
}

pub fn state(journal: &Journal, run: RunId) -> RunState {
    journal
        .view()
        .expect("a read view")
        .snapshot(run)
        .expect("the snapshot reads")
        .expect("the run exists")
}

pub fn records(journal: &Journal, run: RunId) -> Vec<Record> {
    journal
        .view()
        .expect("a read view")
        .records(run)
        .expect("the records read")
}

pub fn record_count(journal: &Journal) -> u64 {
    journal
        .view()
        .expect("a read view")
        .record_count()
        .expect("records count")
}

/// Polls the run until `done` holds; panics with `what` after a generous bound.
pub fn wait_for(
    journal: &Journal,
    run: RunId,
    what: &str,
    done: impl Fn(&RunState) -> bool,
) -> RunState {
    for _ in 0..POLL_ATTEMPTS {
        let state = state(journal, run);
        if done(&state) {
            return state;
        }
        std::thread::sleep(POLL_INTERVAL);
    }
    panic!(
        "run {run}: gave up waiting for {what} after {POLL_ATTEMPTS} polls; last state {:?}",
        state(journal, run).status
    );
}

/// Polls until the run is terminal.
pub fn wait_terminal(journal: &Journal, run: RunId) -> RunState {
    wait_for(journal, run, "the run to end", RunState::is_terminal)
}

/// Makes reconcile passes (with `reconcile`) until every one of `runs` is closed: its runner
/// seen to end, by its parent or by a pass. A run is terminal before its runner exits, and
/// retention keeps a run until it is closed, so a test that prunes waits for this first.
pub fn reconcile_until_closed(journal: &Path, runs: &[RunId], mut reconcile: impl FnMut()) {
    for _ in 0..POLL_ATTEMPTS {
        let all_closed = {
            let journal = Journal::open(journal).expect("the journal opens");
            let view = journal.view().expect("a view");
            runs.iter().all(|&run| {
                view.snapshot(run)
                    .expect("the run reads")
                    .is_some_and(|state| state.is_closed())
            })
        };
        if all_closed {
            return;
        }
        reconcile();
        std::thread::sleep(POLL_INTERVAL);
    }
    panic!("the runs {runs:?} were never all closed after {POLL_ATTEMPTS} polls");
}

/// A home holding one finished run of one shell step (`run --wait -- true`); its id.
pub fn home_with_a_run() -> (TestHome, RunId) {
    let home = TestHome::new();
    let output = home
        .cmd()
        .args(["run", "--wait", "--json", "--step", "true"])
        .output()
        .expect("runs");
    assert!(output.status.success(), "{output:?}");
    let run = run_id_of(&output.stdout);
    (home, run)
}

/// Starts `args` (after `run --json`) in `home` and returns the run's id.
pub fn launch(home: &TestHome, args: &[&str]) -> RunId {
    run_id_in(&launch_json(home, args))
}

/// Starts `args` (after `run --json`) in `home`, which must succeed, and returns what it
/// printed.
pub fn launch_json(home: &TestHome, args: &[&str]) -> serde_json::Value {
    let output = home
        .cmd()
        .args(["run", "--json"])
        .args(args)
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    serde_json::from_slice(&output).expect("run --json prints JSON")
}

/// The run id printed by `run --json`.
pub fn run_id_of(stdout: &[u8]) -> RunId {
    run_id_in(&serde_json::from_slice(stdout).expect("run --json prints JSON"))
}

/// The run id of a JSON document that names one (`runId`).
pub fn run_id_in(object: &serde_json::Value) -> RunId {
    object["runId"]
        .as_str()
        .expect("runId is a string")
        .parse()
        .expect("runId is a run id")
}

/// Pids of the processes in process group `pgid`, zombies included.
pub fn group_members(pgid: u32) -> Vec<u32> {
    runjournal::platform::group_members(pgid)
        .expect("the system's processes can be read")
        .into_iter()
        .map(|member| member.pid)
        .collect()
}

/// The names of the run's events, in order.
pub fn event_names(records: &[Record]) -> Vec<&'static str> {
    records.iter().map(|record| record.event.name()).collect()
}

/// Waits until step `index`'s log (in runjournal's layout) holds `text`; a minute at most.
pub fn wait_output(home: &TestHome, run: RunId, index: usize, text: &str) {
    let path = home
        .path()
        .join("runs")
        .join(run.to_string())
        .join(format!("output-{index}.log"));
    for _ in 0..1200 {
        if std::fs::read_to_string(&path).is_ok_and(|log| log.contains(text)) {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("run {run}: step {index} never printed {text:?}");
}

/// Ends the watcher of `home` — every live `runjournal __timer` started for it, one just
/// started and one standing by included — and waits until none is left: for a test that shows
/// what a command, a host or pi-subagents does without it, or that edits the file with redb
/// itself. The next command (or launch) starts another while runs are active.
pub fn stop_watcher(home: &runjournal::Home) {
    // As the watcher was given it (`hooks::home_subcommand_args`).
    let root = std::path::absolute(home.root())
        .expect("the home's path")
        .into_os_string()
        .into_encoded_bytes();
    // A launch returns once the watcher it started has exec'd: its arguments name it.
    let is_watcher = |pid: u32| {
        std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|cmdline| {
            let args: Vec<&[u8]> = cmdline.split(|byte| *byte == 0).collect();
            args.contains(&b"__timer".as_slice()) && args.contains(&root.as_slice())
        })
    };
    for _ in 0..POLL_ATTEMPTS {
        let watchers: Vec<u32> = std::fs::read_dir("/proc")
            .expect("the process table reads")
            .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
            .filter(|pid| is_watcher(*pid))
            .filter(|pid| {
                runjournal::platform::process(*pid)
                    .ok()
                    .flatten()
                    .is_some_and(|info| info.is_alive())
            })
            .collect();
        if watchers.is_empty() {
            return;
        }
        for pid in watchers {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap_or_default()),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        std::thread::sleep(POLL_INTERVAL);
    }
    panic!("a watcher of {} is still alive", home.root().display());
}

/// `verify` finds no problem with the journal's indexes (the runs' files are not looked at).
pub fn assert_indexes_verify(home: &TestHome) {
    let journal = home.journal();
    let view = journal.view().expect("view");
    let report = runjournal::verify::verify(&view, None);
    let problems: Vec<_> = report
        .problems
        .iter()
        .filter(|problem| problem.severity != runjournal::verify::Severity::Note)
        .collect();
    assert!(problems.is_empty(), "{problems:#?}");
}
