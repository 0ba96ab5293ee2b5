//! A damaged journal is a damaged journal: one flipped byte in `journal.redb` — in redb's
//! header, or in any page of its b-trees — makes redb panic or fail inside our calls. Every
//! `runjournal` command then says the journal is damaged, names the file and what to run, and
//! exits 4; none panics (exit 101), hangs, or calls it a held lock. A runner whose journal is
//! damaged ends its steps' groups, says why in runner.log and exits non-zero; told to stop
//! while the journal does not answer, it gives up on the journal within its bound. Recovery
//! rebuilds every run from its intact events.jsonl. (`journal-tools`' commands on such a
//! journal are tested in `journal-tools/tests/it/damage.rs`.)

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use runjournal::event::{HostIds, Mode, RunId, RunSpec};
use runjournal::journal::{CommitSharing, JournalReader};
use runjournal::recover::{self, RecoverError};
use runjournal::state::RunStatus;
use runjournal::store::StoreOptions;
use runjournal::testkit::damage::{copy_tree, flip_byte, flip_offsets, point_pages_at_a_huge_page};
use runjournal::testkit::{shell, spec};
use runjournal::{Home, Store};

use crate::support::TestHome;

/// The bound on every command and every wait here: generous, so a slow machine passes, and a
/// command past it is killed, failing the test rather than hanging it.
const BOUND: Duration = Duration::from_secs(60);

/// The names of the pristine home's runs, each a complete run of `echo`.
const RUNS: [&str; 4] = ["first", "second", "third", "fourth"];

/// The commands run on each damaged home, in this order (the writing ones last).
const COMMANDS: &[&[&str]] = &[
    &["status", "first"],
    &["list"],
    &["list", "--all", "--json"],
    &["logs", "first"],
    &["wait", "first"],
    &["reconcile"],
    &["stop", "second"],
    &["dismiss", "third"],
    &["run", "--wait", "--", "true"],
];

/// A home made by the binary with the four complete [`RUNS`], every runner gone.
fn pristine_home() -> TestHome {
    let home = TestHome::new();
    for name in RUNS {
        let output = home
            .cmd()
            .args([
                "run",
                "--wait",
                "--name",
                name,
                "--step",
                &format!("echo {name}"),
            ])
            .output()
            .expect("run");
        assert!(output.status.success(), "{output:?}");
    }
    home
}

fn runjournal(home: &Path, args: &[&str]) -> Output {
    assert_cmd::cargo::cargo_bin_cmd!("runjournal")
        .env_remove("RUNJOURNAL_HOME")
        .env_remove("RUNJOURNAL_LAYOUT")
        .arg("--home")
        .arg(home)
        .args(args)
        .timeout(BOUND)
        .output()
        .expect("the command runs")
}

/// Runs every command on `home` in order, returning each one's exit code; none may be killed
/// (by the bound, or a signal).
fn run_commands(home: &Path, offset: Option<u64>) -> Vec<(i32, String)> {
    COMMANDS
        .iter()
        .map(|args| {
            let output = runjournal(home, args);
            let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
            let code = output.status.code().unwrap_or_else(|| {
                panic!(
                    "{args:?} (flip at {offset:?}) was killed, by the bound or a signal: {stderr}"
                )
            });
            (code, stderr)
        })
        .collect()
}

#[test]
fn every_command_on_a_journal_with_a_flipped_byte_says_it_is_damaged_and_never_panics_or_hangs() {
    let pristine = pristine_home();
    let scratch = tempfile::tempdir().expect("a temporary directory");
    let intact = scratch.path().join("intact");
    copy_tree(pristine.path(), &intact);
    let baseline: Vec<i32> = run_commands(&intact, None)
        .into_iter()
        .map(|(code, _)| code)
        .collect();
    let bytes = std::fs::metadata(pristine.file("journal.redb"))
        .expect("the journal")
        .len();
    let mut reported = BTreeSet::new();
    for offset in flip_offsets(bytes) {
        let home = scratch.path().join(format!("flip-{offset}"));
        copy_tree(pristine.path(), &home);
        let journal = home.join("journal.redb");
        flip_byte(&journal, offset);
        for ((args, (code, stderr)), expected) in COMMANDS
            .iter()
            .zip(run_commands(&home, Some(offset)))
            .zip(&baseline)
        {
            let at = format!("{args:?} with the byte at {offset} flipped");
            assert!(
                code == *expected || code == 4,
                "{at}: exit {code}, not {expected} or 4 (damage): {stderr}"
            );
            assert!(
                !stderr.contains("thread '"),
                "{at}: no panic message of Rust's: {stderr}"
            );
            assert!(
                !stderr.contains("write lock is held"),
                "{at}: damage is no held lock: {stderr}"
            );
            if code == 4 {
                reported.insert(offset);
                assert!(
                    stderr.contains(&journal.display().to_string())
                        && stderr.contains("recover --from-projections"),
                    "{at}: the message names the file and what to run: {stderr}"
                );
            }
        }
    }
    assert!(
        reported.contains(&3),
        "a flip in redb's header (its magic number) is reported as damage: {reported:?}"
    );
    assert!(
        reported.len() >= 3,
        "a flip in a page of the b-trees is reported as damage too: {reported:?}"
    );
}

/// The address space each command may take in
/// [`a_page_pointer_naming_a_2_gib_page_is_damage_not_a_2_gib_allocation`]: room for a command's
/// own needs, not for the 2 GiB page a damaged pointer names (where that allocation fails, the
/// process aborts).
const ADDRESS_SPACE_CAP: u64 = 1536 << 20;

/// Runs `runjournal --home home args` with its address space capped at [`ADDRESS_SPACE_CAP`],
/// within [`BOUND`]: its exit code (`None`: killed by a signal, as by an abort) and stderr.
fn runjournal_capped(home: &Path, args: &[&str]) -> (Option<i32>, String) {
    use std::io::Read;
    use std::os::unix::process::CommandExt;
    let mut command = Command::new(env!("CARGO_BIN_EXE_runjournal"));
    command
        .env_remove("RUNJOURNAL_HOME")
        .env_remove("RUNJOURNAL_LAYOUT")
        .arg("--home")
        .arg(home)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // SAFETY: setrlimit is a system call, safe to make between fork and exec.
    unsafe {
        command.pre_exec(|| {
            nix::sys::resource::setrlimit(
                nix::sys::resource::Resource::RLIMIT_AS,
                ADDRESS_SPACE_CAP,
                ADDRESS_SPACE_CAP,
            )
            .map_err(std::io::Error::from)
        });
    }
    let mut child = command.spawn().expect("runjournal starts");
    let code = exit_code_within_bound(&mut child, &format!("{args:?}"));
    let mut stderr = String::new();
    if let Some(mut pipe) = child.stderr.take() {
        pipe.read_to_string(&mut stderr).expect("stderr reads");
    }
    (code, stderr)
}

#[test]
fn a_page_pointer_naming_a_2_gib_page_is_damage_not_a_2_gib_allocation() {
    let pristine = pristine_home();
    let scratch = tempfile::tempdir().expect("a temporary directory");
    // The cap leaves each command the room it needs: on the intact home they succeed under it.
    let intact = scratch.path().join("intact");
    copy_tree(pristine.path(), &intact);
    for args in [&["list"][..], &["logs", "first"]] {
        let (code, stderr) = runjournal_capped(&intact, args);
        assert_eq!(code, Some(0), "{args:?} on the intact home: {stderr}");
    }
    let home = scratch.path().join("huge-page");
    copy_tree(pristine.path(), &home);
    let journal = home.join("journal.redb");
    point_pages_at_a_huge_page(&journal);
    for args in COMMANDS {
        let (code, stderr) = runjournal_capped(&home, args);
        assert_eq!(
            code,
            Some(4),
            "{args:?} on a journal whose page pointers name a 2 GiB page: damage (exit 4), \
             not an abort (no exit code) or another exit: {stderr}"
        );
        assert!(
            stderr.contains(&journal.display().to_string())
                && stderr.contains("recover --from-projections"),
            "{args:?}: the message names the file and what to run: {stderr}"
        );
    }
}

#[test]
fn recovery_rebuilds_every_run_whatever_byte_of_the_journal_was_flipped() {
    let pristine = pristine_home();
    let runs: BTreeSet<RunId> = {
        let reader = JournalReader::open(pristine.file("journal.redb")).expect("the journal");
        let view = reader.view().expect("a view");
        view.all_runs().expect("the runs").into_iter().collect()
    };
    assert_eq!(runs.len(), RUNS.len());
    let scratch = tempfile::tempdir().expect("a temporary directory");
    let bytes = std::fs::metadata(pristine.file("journal.redb"))
        .expect("the journal")
        .len();
    let mut rebuilt_offsets = 0;
    for offset in flip_offsets(bytes) {
        let root = scratch.path().join(format!("flip-{offset}"));
        copy_tree(pristine.path(), &root);
        flip_byte(&root.join("journal.redb"), offset);
        let home = Home::at(&root);
        match recover::recover_from_projections(&home) {
            Ok(recovery) => {
                rebuilt_offsets += 1;
                let rebuilt: BTreeSet<RunId> = recovery.runs.iter().map(|run| run.run).collect();
                assert_eq!(rebuilt, runs, "flip at {offset}: every run is rebuilt");
                assert!(recovery.unrecoverable.is_empty(), "flip at {offset}");
                let aside = recovery
                    .moved_aside
                    .expect("the damaged file is kept aside");
                assert!(aside.exists(), "flip at {offset}: {}", aside.display());
            }
            // A byte nobody reads (a free page): the journal reads whole, and is kept.
            Err(RecoverError::NotLost { .. }) => {}
            Err(error) => panic!("flip at {offset}: recover failed: {error:#?}"),
        }
        let output = runjournal(&root, &["list", "--all", "--json"]);
        assert!(
            output.status.success(),
            "flip at {offset}: the home works again: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        for name in RUNS {
            assert!(
                String::from_utf8_lossy(&output.stdout).contains(&format!("\"{name}\"")),
                "flip at {offset}: {name} is listed"
            );
        }
    }
    assert!(
        rebuilt_offsets >= 3,
        "most flips damage the journal, and recovery rebuilds it: {rebuilt_offsets}"
    );
}

/// A run of one `sleep` step, created through the library (so that the test starts its runner
/// itself, as its parent, and sees its exit code), and its runner started.
fn sleeping_run(home: &TestHome) -> (RunId, Child) {
    let store = Store::open_with(
        Home::at(home.path()),
        StoreOptions {
            commit_sharing: CommitSharing::Alone,
            ..StoreOptions::default()
        },
    )
    .expect("the home opens");
    let run = store
        .create_run(
            RunSpec {
                name: Some("sleeper".to_string()),
                ..spec(Mode::Single, vec![shell("sleep", "sleep 1000")])
            },
            HostIds::default(),
        )
        .expect("the run is created")
        .run;
    drop(store);
    let runner = Command::new(env!("CARGO_BIN_EXE_runjournal"))
        .env_remove("RUNJOURNAL_HOME")
        .env_remove("RUNJOURNAL_LAYOUT")
        .arg("--home")
        .arg(home.path())
        .args(["__runner", &run.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("the runner starts");
    poll("the step to run", || {
        let Ok(reader) = JournalReader::open(home.file("journal.redb")) else {
            return false;
        };
        reader
            .view()
            .and_then(|view| view.snapshot(run))
            .ok()
            .flatten()
            .is_some_and(|state| {
                state.status == RunStatus::Running && state.steps[0].process.is_some()
            })
    });
    (run, runner)
}

/// The pid of the run's step, as the journal recorded it.
fn step_pid(home: &TestHome, run: RunId) -> u32 {
    let reader = JournalReader::open(home.file("journal.redb")).expect("the journal");
    let state = reader
        .view()
        .and_then(|view| view.snapshot(run))
        .expect("the run reads")
        .expect("the run exists");
    state.steps[0]
        .process
        .as_ref()
        .expect("the step's process")
        .pid
}

fn poll(what: &str, done: impl Fn() -> bool) {
    let started = Instant::now();
    while started.elapsed() < BOUND {
        if done() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("gave up waiting for {what}");
}

/// Waits for the child to exit, within [`BOUND`]; kills it (and fails) past it.
fn exit_code_within_bound(child: &mut Child, what: &str) -> Option<i32> {
    let started = Instant::now();
    while started.elapsed() < BOUND {
        if let Some(status) = child.try_wait().expect("the child is waited for") {
            return status.code();
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("{what} did not exit within {BOUND:?}");
}

fn is_gone(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"));
    match stat {
        Err(_) => true,
        // A zombie has ended; only its parent's wait is left.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

fn runner_log(home: &TestHome, run: RunId) -> String {
    std::fs::read_to_string(
        home.path()
            .join("runs")
            .join(run.to_string())
            .join("runner.log"),
    )
    .unwrap_or_default()
}

#[test]
fn a_runner_whose_journal_is_damaged_ends_its_step_says_why_and_exits_4() {
    let home = TestHome::new();
    let (run, mut runner) = sleeping_run(&home);
    let step = step_pid(&home, run);
    let _step = KillGroupOnDrop(step);
    // The step released from its gate (its program is running): the runner has taken it as
    // running. Between its `StepRunning` and the release, the runner reads the run once more
    // (the messages waiting for the step), and damage met there ends the gated step with the
    // start, before the runner counts it running.
    poll("the step's program to run", || {
        std::fs::read(format!("/proc/{step}/cmdline"))
            .is_ok_and(|cmdline| String::from_utf8_lossy(&cmdline).contains("sleep 1000"))
    });
    // Both of redb's commit slots (one alone it rides out with the other): the runner's next
    // look at its run, a read that begins at the header, meets the damage.
    flip_byte(&home.file("journal.redb"), 100);
    flip_byte(&home.file("journal.redb"), 228);
    let code = exit_code_within_bound(&mut runner, "the runner of a damaged journal");
    assert_eq!(code, Some(4), "the runner exits with the damage exit code");
    poll("the step to be ended", || is_gone(step));
    let log = runner_log(&home, run);
    assert!(
        log.contains("corrupted") && log.contains("ending 1 running step(s)"),
        "runner.log says why it ended its step: {log}"
    );
    assert!(!log.contains("panicked"), "{log}");
}

#[test]
fn a_runner_told_to_stop_while_the_journal_does_not_answer_gives_up_within_its_bound() {
    let home = TestHome::new();
    let (run, mut runner) = sleeping_run(&home);
    let step = step_pid(&home, run);
    let _step = KillGroupOnDrop(step);
    // Another process stopped inside a commit, holding the journal's write lock: every commit
    // of the home waits for it.
    let hook = home.file("stop-in-commit");
    std::fs::write(&hook, b"").expect("arm the hook");
    let mut holder = Command::new(env!("CARGO_BIN_EXE_runjournal"))
        .env("RUNJOURNAL_TEST_STOP_IN_COMMIT", &hook)
        .env("RUNJOURNAL_COMMIT_SHARING", "off")
        .arg("--home")
        .arg(home.path())
        .args(["dismiss", &run.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("the holder starts");
    let _holder = KillOnDrop(holder.id());
    poll("the holder to stop in its commit", || {
        !hook.exists() && process_state(holder.id()) == Some('T')
    });
    kill(Pid::from_raw(runner.id() as i32), Signal::SIGTERM).expect("SIGTERM");
    let code = exit_code_within_bound(&mut runner, "the runner told to stop");
    assert_ne!(
        code,
        Some(0),
        "it recorded nothing, and says so by its exit"
    );
    poll("the step to be ended", || is_gone(step));
    let log = runner_log(&home, run);
    assert!(
        log.contains("SIGTERM received while the journal had not answered"),
        "runner.log says why: {log}"
    );
    let _ = kill(Pid::from_raw(holder.id() as i32), Signal::SIGKILL);
    let _ = holder.wait();
}

/// SIGKILLs a process when the test ends, passed or not.
struct KillOnDrop(u32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = kill(Pid::from_raw(self.0 as i32), Signal::SIGKILL);
        let _ = kill(Pid::from_raw(self.0 as i32), Signal::SIGCONT);
    }
}

/// SIGKILLs a step's process group when the test ends, so a failed test leaves no step behind.
struct KillGroupOnDrop(u32);

impl Drop for KillGroupOnDrop {
    fn drop(&mut self) {
        let _ = kill(Pid::from_raw(-(self.0 as i32)), Signal::SIGKILL);
    }
}

fn process_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}
