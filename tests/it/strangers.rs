//! Strangers, with the real binary: a home someone else owns or may write, links
//! planted where runjournal writes, an empty `--home`. Tests that need root (a home of
//! another user) skip without it, and fail instead where `RUNJOURNAL_REQUIRE_ROOT_TESTS=1`.

use crate::support;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use runjournal::state::StepStatus;
use support::{TestHome, run_id_of, wait_for, wait_terminal};

const REQUIRE_ROOT_ENV: &str = "RUNJOURNAL_REQUIRE_ROOT_TESTS";

/// Whether this test may run as it needs root; prints why not, or fails when root tests are
/// required.
pub fn is_root(test: &str, why: &str) -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    assert!(
        std::env::var(REQUIRE_ROOT_ENV).as_deref() != Ok("1"),
        "{test} needs root and {REQUIRE_ROOT_ENV}=1 says root tests must run"
    );
    eprintln!("skipped {test}: needs root to {why}");
    false
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .unwrap_or_else(|error| panic!("chmod {mode:o} {}: {error}", path.display()));
}

/// A home with one finished run.
fn home_with_a_run() -> TestHome {
    support::home_with_a_run().0
}

/// Every command that opens the home refuses it with exit 1 and one line naming `path` and
/// `fix`.
fn every_command_refuses(home: &TestHome, path: &Path, fix: &str) {
    for args in [
        &["list"][..],
        &["status", "01ARZ3NDEKTSV4RRFFQ69G5FAV"],
        &["reconcile"],
        &["run", "--", "true"],
    ] {
        let output = home.cmd().args(args).output().expect("runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: one line: {stderr}");
        assert!(
            stderr.contains(&path.display().to_string()) && stderr.contains(fix),
            "{args:?}: {stderr} should name {} and say {fix:?}",
            path.display()
        );
    }
}

#[test]
fn a_home_others_may_write_is_refused_by_every_command() {
    let home = home_with_a_run();
    let runs = home.file("runs");
    let results = home.file("results");
    let journal = home.file("journal.redb");
    for (path, mode, private_mode) in [
        (home.path().to_path_buf(), 0o770, 0o700),
        (home.path().to_path_buf(), 0o707, 0o700),
        (runs, 0o777, 0o700),
        (results, 0o730, 0o700),
        (journal, 0o666, 0o600),
    ] {
        chmod(&path, mode);
        every_command_refuses(&home, &path, &format!("chmod go-w {}", path.display()));
        chmod(&path, private_mode);
    }
    let output = home.cmd().arg("list").output().expect("runs");
    assert!(
        output.status.success(),
        "private again, accepted: {output:?}"
    );
}

#[test]
fn a_refused_home_is_left_as_it_was() {
    let home = TestHome::new();
    chmod(home.path(), 0o777);
    let output = home
        .cmd()
        .args(["run", "--", "true"])
        .output()
        .expect("runs");
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let entries = std::fs::read_dir(home.path()).expect("list").count();
    assert_eq!(entries, 0, "nothing was made in a refused home");
    chmod(home.path(), 0o700);
}

#[test]
fn a_home_of_another_user_is_refused() {
    if !is_root(
        "a_home_of_another_user_is_refused",
        "give a home to another user",
    ) {
        return;
    }
    let home = home_with_a_run();
    // nobody
    let stranger = nix::unistd::Uid::from_raw(65534);
    for path in [home.file("runs"), home.file("journal.redb")] {
        nix::unistd::chown(&path, Some(stranger), None).expect("chown");
        every_command_refuses(&home, &path, "chown 0");
        nix::unistd::chown(&path, Some(nix::unistd::geteuid()), None).expect("chown back");
    }
    let output = home.cmd().arg("list").output().expect("runs");
    assert!(output.status.success(), "ours again, accepted: {output:?}");
}

#[test]
fn a_journal_that_is_a_link_is_refused() {
    let home = home_with_a_run();
    let elsewhere = home.file("elsewhere.redb");
    std::fs::rename(home.file("journal.redb"), &elsewhere).expect("move the journal");
    std::os::unix::fs::symlink(&elsewhere, home.file("journal.redb")).expect("link");
    every_command_refuses(&home, &home.file("journal.redb"), "symbolic link");
}

/// A link planted where a step's output log will be is neither written through nor read
/// through: the file it points to is untouched, and its content does not reach the journal
/// (a run's summary quotes its last step's log). The step itself runs: its output is lost,
/// as any output a log cannot take.
#[test]
fn a_link_planted_as_a_step_log_is_not_written_through() {
    let home = TestHome::new();
    let victim = home.file("victim");
    std::fs::write(&victim, b"precious\n").expect("the victim file");
    let output = home
        .cmd()
        .args([
            "run",
            "--json",
            "--step",
            "sleep 2",
            "--step",
            "echo overwritten",
        ])
        .output()
        .expect("runs");
    assert!(output.status.success(), "{output:?}");
    let run = run_id_of(&output.stdout);
    let journal = home.journal();
    wait_for(&journal, run, "step 0 to run", |state| {
        state.steps[0].status == StepStatus::Running
    });
    let log = home.path().join(format!("runs/{run}/output-1.log"));
    std::os::unix::fs::symlink(&victim, &log).expect("plant a link");
    let state = wait_terminal(&journal, run);
    assert_eq!(std::fs::read(&victim).expect("read"), b"precious\n");
    assert!(
        std::fs::symlink_metadata(&log)
            .expect("lstat")
            .file_type()
            .is_symlink(),
        "the link is left for its owner to see"
    );
    let terminal = state.terminal.expect("terminal");
    assert!(
        !terminal.summary.contains("precious"),
        "the victim's content is not quoted: {:?}",
        terminal.summary
    );
    let records = support::records(&journal, run);
    assert!(
        !format!("{records:?}").contains("precious"),
        "nor recorded anywhere"
    );
}

#[test]
fn an_empty_home_is_bad_input_and_an_empty_variable_is_unset() {
    let cwd = tempfile::tempdir().expect("a directory to run in");
    let output = assert_cmd::cargo::cargo_bin_cmd!("runjournal")
        .current_dir(cwd.path())
        .env_remove("RUNJOURNAL_HOME")
        .args(["--home", "", "list"])
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--home"), "{stderr}");
    assert_eq!(
        std::fs::read_dir(cwd.path()).expect("list").count(),
        0,
        "nothing was made in the current directory"
    );

    let state = tempfile::tempdir().expect("XDG_STATE_HOME");
    let output = assert_cmd::cargo::cargo_bin_cmd!("runjournal")
        .current_dir(cwd.path())
        .env("RUNJOURNAL_HOME", "")
        .env("XDG_STATE_HOME", state.path())
        .arg("list")
        .output()
        .expect("runs");
    assert!(output.status.success(), "{output:?}");
    assert!(
        state.path().join("runjournal/journal.redb").is_file(),
        "an empty RUNJOURNAL_HOME counts as unset"
    );
    assert_eq!(std::fs::read_dir(cwd.path()).expect("list").count(), 0);
}

/// `runjournal ARGS` with this home, run inside a new PID namespace with a /proc of its own:
/// the sandbox of a coding-agent host.
fn in_new_pid_namespace(home: &TestHome, args: &[&str]) -> std::process::Output {
    std::process::Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc"])
        .arg(assert_cmd::cargo::cargo_bin!("runjournal"))
        .arg("--home")
        .arg(home.path())
        .args(args)
        .env_remove("RUNJOURNAL_HOME")
        .env_remove("RUNJOURNAL_LAYOUT")
        .output()
        .expect("unshare runs")
}

/// A run of one step (`script`) whose step is running.
fn running_run(home: &TestHome, script: &str) -> (runjournal::Journal, runjournal::RunId) {
    let output = home
        .cmd()
        .args(["run", "--json", "--step", script])
        .output()
        .expect("runs");
    assert!(output.status.success(), "{output:?}");
    let run = run_id_of(&output.stdout);
    let journal = home.journal();
    wait_for(&journal, run, "the step to run", |state| {
        state.steps[0].status == StepStatus::Running
    });
    (journal, run)
}

/// Regression: `list`, `status` and `reconcile` in another PID namespace found the
/// runner's pid absent there, declared it dead and failed the live run. Now its runner is
/// unknown there: nothing is recorded, nothing signalled, `reconcile` says why, and the run
/// completes on its own.
#[test]
fn a_reader_in_another_pid_namespace_leaves_a_live_run_alone() {
    if !is_root(
        "a_reader_in_another_pid_namespace_leaves_a_live_run_alone",
        "make a PID namespace (unshare)",
    ) {
        return;
    }
    let home = TestHome::new();
    let (journal, run) = running_run(&home, "sleep 3");
    let head = support::state(&journal, run).head_seq;
    let run_text = run.to_string();
    for args in [&["list"][..], &["status", &run_text], &["reconcile"]] {
        let output = in_new_pid_namespace(&home, args);
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "{args:?}: {output:?}");
        match args[0] {
            "status" => assert!(
                stdout.contains("unknown (other PID namespace)"),
                "status says the runner is unknown here: {stdout}"
            ),
            "reconcile" => assert!(
                stdout.contains("runner-elsewhere") && stdout.contains("PID namespace"),
                "reconcile says why it left the run alone: {stdout}"
            ),
            _ => {}
        }
    }
    let state = support::state(&journal, run);
    assert_eq!(state.head_seq, head, "nothing was recorded: {state:?}");
    assert!(!state.is_terminal());
    let state = wait_terminal(&journal, run);
    assert_eq!(state.status, runjournal::RunStatus::Complete, "{state:?}");
    let terminal = state.terminal.expect("terminal");
    assert_eq!(
        terminal.repaired_by, None,
        "the runner recorded its own end"
    );
}

/// `stop` in another PID namespace records the request and signals nothing (it cannot tell the
/// runner from a stranger there); the runner sees the request in the journal and stops.
#[test]
fn a_stop_from_another_pid_namespace_is_heeded_without_a_signal() {
    if !is_root(
        "a_stop_from_another_pid_namespace_is_heeded_without_a_signal",
        "make a PID namespace (unshare)",
    ) {
        return;
    }
    let home = TestHome::new();
    let (journal, run) = running_run(&home, "sleep 60");
    let output = in_new_pid_namespace(&home, &["stop", &run.to_string()]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{output:?}");
    assert!(
        stdout.contains("the runner will see it when it next looks"),
        "not signalled: {stdout}"
    );
    let state = wait_terminal(&journal, run);
    assert_eq!(state.status, runjournal::RunStatus::Stopped, "{state:?}");
}

const INNER_ENV: &str = "RUNJOURNAL_STRANGERS_INNER";

/// Runs the test `name` of this binary again, inside a new PID namespace with a /proc of its
/// own, where it may hand out pids at will (`ns_last_pid`); its output must say it ran.
fn run_inside_a_pid_namespace(name: &str) {
    let output = std::process::Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc"])
        .arg(std::env::current_exe().expect("this test binary"))
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(INNER_ENV, "1")
        .output()
        .expect("unshare runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stdout.contains("1 passed"),
        "{name} inside a PID namespace:\n{stdout}\n{stderr}"
    );
    assert!(
        stderr.contains("inside: done") || stdout.contains("inside: done"),
        "the scenario ran: {stdout}\n{stderr}"
    );
}

/// The next process this one starts gets `pid` (within this PID namespace).
fn next_pid_is(pid: u32) {
    std::fs::write("/proc/sys/kernel/ns_last_pid", (pid - 1).to_string())
        .expect("write ns_last_pid");
}

fn identity_of(pid: u32) -> runjournal::event::ProcessIdentity {
    runjournal::liveness::identity_of(pid)
        .expect("read /proc")
        .expect("the process exists")
}

fn is_alive(pid: u32) -> bool {
    runjournal::platform::process(pid)
        .expect("read /proc")
        .is_some_and(|process| process.is_alive())
}

/// The recycled-pid hole: a step's group empties, a stranger is given the
/// leader's pid, leads a group of its own under that id and exits, leaving a member. The
/// reconciler, failing the run of the dead runner, must not signal that group; `stop`'s
/// signal must not reach a process that got a recorded runner's pid.
#[test]
fn a_recycled_pid_leading_a_strangers_group_is_not_signalled() {
    use std::os::unix::process::CommandExt;
    use std::process::Command;
    const NAME: &str = "strangers::a_recycled_pid_leading_a_strangers_group_is_not_signalled";
    if std::env::var_os(INNER_ENV).is_none() {
        if is_root(NAME, "make a PID namespace and choose pids (ns_last_pid)") {
            run_inside_a_pid_namespace(NAME);
        }
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let store = runjournal::Store::open(runjournal::Home::at(dir.path())).expect("store");
    let spec = runjournal::event::RunSpec {
        name: None,
        mode: runjournal::event::Mode::Single,
        concurrency: 1,
        timeout_ms: None,
        cwd: None,
        steps: vec![runjournal::event::StepSpec {
            name: "s".to_string(),
            action: runjournal::event::StepAction::Shell {
                script: "true".to_string(),
            },
        }],
    };
    let run = store
        .create_run(spec, runjournal::event::HostIds::default())
        .expect("create")
        .run;
    // The runner, dead by the time the reconciler looks.
    let mut runner = Command::new("true").spawn().expect("spawn");
    let runner_identity = identity_of(runner.id());
    runner.wait().expect("reap");
    // The step's leader, in a group of its own; it exits and is reaped.
    let mut leader = Command::new("sleep")
        .arg("60")
        .process_group(0)
        .spawn()
        .expect("spawn");
    let leader_identity = identity_of(leader.id());
    assert!(leader_identity.pid_namespace.is_some());
    store
        .append(
            run,
            vec![
                runjournal::event::Event::RunnerStarted {
                    runner: runner_identity.clone(),
                    instance_id: "i".to_string(),
                },
                runjournal::event::Event::StepRunning {
                    step: 0,
                    process: Some(leader_identity.clone()),
                },
            ],
            runjournal::Condition::none(),
        )
        .expect("append");
    leader.kill().expect("kill");
    leader.wait().expect("reap");
    // In another clock tick than the leader's start (see below).
    std::thread::sleep(std::time::Duration::from_millis(50));
    // A stranger gets the leader's pid, leads a group under that id, and leaves a member.
    next_pid_is(leader_identity.pid);
    let ready = dir.path().join("ready");
    let mut stranger = Command::new("sh")
        .arg("-c")
        .arg(format!("sleep 60 & echo $! > {}; exit 0", ready.display()))
        .process_group(0)
        .spawn()
        .expect("spawn the stranger");
    assert_eq!(stranger.id(), leader_identity.pid, "the pid was recycled");
    stranger.wait().expect("reap the stranger");
    let member: u32 = std::fs::read_to_string(&ready)
        .expect("the member's pid")
        .trim()
        .parse()
        .expect("a pid");
    assert_eq!(
        runjournal::platform::process(member)
            .expect("read")
            .map(|process| process.group_id),
        Some(leader_identity.pid),
        "the stranger's member is in a group under the recorded leader's id"
    );

    let report =
        runjournal::reconcile::reconcile(&store, &runjournal::reconcile::Options::default())
            .expect("reconcile");
    let outcome = report
        .outcomes
        .iter()
        .find(|outcome| outcome.run == run)
        .expect("the run was decided");
    assert_eq!(outcome.row, "runner-died", "{outcome:?}");
    assert!(
        !outcome.appended.is_empty(),
        "the run was failed: {outcome:?}"
    );
    assert!(is_alive(member), "the stranger's member was not signalled");

    // A runner's recorded identity whose pid another process holds now is not signalled.
    let mut recorded = Command::new("true").spawn().expect("spawn");
    let recorded_identity = identity_of(recorded.id());
    recorded.wait().expect("reap");
    // Linux counts start times in clock ticks (10 ms): a process started in the same tick
    // under the same pid would be the same identity. Reusing a pid that fast takes a pid
    // space wrapped around within a tick; here it would take only ns_last_pid.
    std::thread::sleep(std::time::Duration::from_millis(50));
    next_pid_is(recorded_identity.pid);
    let mut holder = Command::new("sleep").arg("60").spawn().expect("spawn");
    assert_eq!(holder.id(), recorded_identity.pid, "the pid was recycled");
    assert!(
        !runjournal::process_group::signal_process(
            &recorded_identity,
            nix::sys::signal::Signal::SIGKILL
        )
        .expect("signal")
    );
    assert_eq!(holder.try_wait().expect("try_wait"), None, "not signalled");

    holder.kill().expect("kill");
    holder.wait().expect("reap");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(member).expect("pid")),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill the member");
    // This process is the namespace's init: the member was handed to it.
    let _ = nix::sys::wait::waitpid(
        nix::unistd::Pid::from_raw(i32::try_from(member).expect("pid")),
        None,
    );
    eprintln!("inside: done");
}

const RUNS_TABLE: redb::TableDefinition<&[u8; 16], &[u8]> = redb::TableDefinition::new("runs");
const RECORDS_TABLE: redb::TableDefinition<&[u8; 24], &[u8]> =
    redb::TableDefinition::new("records");

/// Puts `bytes` in the journal's `table` under `key`, behind the library's back.
fn forge<K: redb::Key + 'static>(
    home: &TestHome,
    table: redb::TableDefinition<K, &[u8]>,
    key: K::SelfType<'_>,
    bytes: &[u8],
) {
    let db = redb::Database::builder()
        .set_concurrency_mode(redb::ConcurrencyMode::MultiWriter)
        .open(home.file("journal.redb"))
        .expect("the journal opens as a redb database");
    let txn = db.begin_write().expect("write");
    txn.open_table(table)
        .expect("the table")
        .insert(key, bytes)
        .expect("insert");
    txn.commit().expect("commit");
}

/// A queued run of one shell step, created through the library (no runner started).
fn queued_run(home: &TestHome, script: &str) -> runjournal::RunId {
    let store = runjournal::Store::open(runjournal::Home::at(home.path())).expect("store");
    let spec = runjournal::event::RunSpec {
        name: None,
        mode: runjournal::event::Mode::Parallel,
        concurrency: 1,
        timeout_ms: None,
        cwd: None,
        steps: vec![runjournal::event::StepSpec {
            name: "s".to_string(),
            action: runjournal::event::StepAction::Shell {
                script: script.to_string(),
            },
        }],
    };
    store
        .create_run(spec, runjournal::event::HostIds::default())
        .expect("create")
        .run
}

/// The same run's state with a spec no runner can run: no program, and a parallel run of
/// concurrency 0 (a runner given it would panic, or wait forever for a step it never starts).
fn forged_state(home: &TestHome, run: runjournal::RunId) -> runjournal::RunState {
    let mut state = support::state(&home.journal(), run);
    let spec = std::sync::Arc::make_mut(&mut state.spec);
    spec.concurrency = 0;
    spec.steps[0].action = runjournal::event::StepAction::Command { argv: vec![] };
    state
}

/// `runjournal __runner RUN`, as the launcher starts it, bounded.
fn run_the_runner(home: &TestHome, run: runjournal::RunId) -> std::process::Output {
    home.cmd()
        .args(["__runner", &run.to_string()])
        .timeout(std::time::Duration::from_secs(60))
        .output()
        .expect("the runner runs")
}

/// A snapshot forged (with a checksum that matches) to hold a spec the runner would choke on is
/// not trusted: the runner runs the run its records describe.
#[test]
fn a_forged_snapshot_is_not_what_the_runner_runs() {
    let home = TestHome::new();
    let marker = home.file("ran");
    let run = queued_run(&home, &format!("echo real > '{}'", marker.display()));
    let forged = forged_state(&home, run);
    let bytes = runjournal::testkit::encode_snapshot(&forged).expect("encodes");
    forge(&home, RUNS_TABLE, &run.to_bytes(), &bytes);

    let output = run_the_runner(&home, run);
    assert!(output.status.success(), "{output:?}");
    assert_eq!(
        std::fs::read_to_string(&marker).expect("the step ran"),
        "real\n"
    );
    let state = support::state(&home.journal(), run);
    assert_eq!(state.status, runjournal::RunStatus::Complete, "{state:?}");
    assert_eq!(state.spec.concurrency, 1, "the records' spec");
}

/// A record forged (with a checksum that matches) to create the run with such a spec is
/// refused when read: the runner fails with a message, and does not panic or hang; `status`
/// says what is wrong.
#[test]
fn a_forged_record_fails_the_runner_cleanly() {
    let home = TestHome::new();
    let run = queued_run(&home, "true");
    let forged = forged_state(&home, run);
    let record = support::records(&home.journal(), run)
        .into_iter()
        .next()
        .expect("RunCreated");
    let runjournal::event::Event::RunCreated {
        created_at_ms,
        session_id,
        completion_owner_id,
        tool_call_id,
        ..
    } = record.event.clone()
    else {
        panic!("the first record creates the run");
    };
    let forged_record = runjournal::event::RecordEnvelope {
        event: runjournal::event::Event::RunCreated {
            spec: std::sync::Arc::clone(&forged.spec),
            created_at_ms,
            session_id,
            completion_owner_id,
            tool_call_id,
        },
        ..record
    };
    let mut key = [0u8; 24];
    key[..16].copy_from_slice(&run.to_bytes());
    key[16..].copy_from_slice(&1u64.to_be_bytes());
    forge(
        &home,
        RECORDS_TABLE,
        &key,
        &forged_record.encode().expect("encodes"),
    );
    let bytes = runjournal::testkit::encode_snapshot(&forged).expect("encodes");
    forge(&home, RUNS_TABLE, &run.to_bytes(), &bytes);

    let output = run_the_runner(&home, run);
    // A record that does not pass its checks is damage: exit 4, as journal-tools says it.
    assert_eq!(output.status.code(), Some(4), "no panic (101): {output:?}");
    // The runner writes its own log.
    let log = std::fs::read_to_string(home.path().join(format!("runs/{run}/runner.log")))
        .unwrap_or_default();
    assert!(
        log.contains("no run accepts")
            || String::from_utf8_lossy(&output.stderr).contains("no run accepts"),
        "{log} {output:?}"
    );
    let output = home
        .cmd()
        .args(["status", &run.to_string()])
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(4), "{output:?}");
    assert!(stderr.contains("no run accepts"), "{stderr}");
}

/// Bytes that would drive a terminal: ESC (escape sequences), BEL (ends an OSC title), and the
/// C1 CSI.
fn has_terminal_controls(bytes: &[u8]) -> bool {
    bytes.contains(&0x1b)
        || bytes.contains(&0x07)
        || bytes.windows(2).any(|pair| pair == [0xc2, 0x9b])
}

/// Hostile text — a run name that retitles the terminal, a step command that clears it, a
/// provider message with an escape sequence — is shown escaped (`\x1b`) by `run --wait`,
/// `status`, `list` and `reconcile`; the JSON of `status --json` is serde's, unchanged.
#[test]
fn hostile_text_reaches_the_terminal_escaped() {
    let home = TestHome::new();
    let provider = r#"printf '%s\n' '{"state":"running","message":"\u001b[2J wiped"}' '{"state":"failed","message":"\u001b]2;pwned\u0007"}'"#;
    let output = home
        .cmd()
        .args([
            "run",
            "--wait",
            "--name",
            "\u{1b}]2;owned\u{7}",
            "--step",
            "printf '\\033[2J' # \u{1b}[31m red",
            "--external-job",
            provider,
        ])
        .output()
        .expect("runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(1), "the job failed: {output:?}");
    assert!(
        !has_terminal_controls(&output.stdout),
        "run --wait: {stdout}"
    );
    assert!(
        !has_terminal_controls(&output.stderr),
        "run --wait: {output:?}"
    );
    assert!(
        stdout.contains("\\x1b[31m red"),
        "the step's name, escaped: {stdout}"
    );
    assert!(
        stdout.contains("\\x1b[2J wiped"),
        "the provider's message, escaped: {stdout}"
    );
    assert!(stdout.contains("\\x1b]2;pwned\\x07"), "{stdout}");
    let run = home
        .journal()
        .view()
        .expect("view")
        .all_runs()
        .expect("runs")
        .pop()
        .expect("the run");
    for args in [
        &["status", &run.to_string()][..],
        &["list"],
        &["reconcile"],
        &["logs", &run.to_string()],
    ] {
        let output = home.cmd().args(args).output().expect("runs");
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "{args:?}: {output:?}");
        if args[0] == "logs" {
            // A step's output is the step's own, passed through as it wrote it (like cat).
            assert!(output.stdout.contains(&0x1b), "logs: {stdout}");
            continue;
        }
        assert!(!has_terminal_controls(&output.stdout), "{args:?}: {stdout}");
        if args[0] != "reconcile" {
            assert!(
                stdout.contains("\\x1b]2;owned\\x07"),
                "{args:?}: the name, escaped: {stdout}"
            );
        }
    }
    let output = home
        .cmd()
        .args(["status", "--json", &run.to_string()])
        .output()
        .expect("runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(!has_terminal_controls(&output.stdout), "{stdout}");
    assert!(
        stdout.contains(r"\u001b[2J"),
        "serde's JSON escapes, unchanged: {stdout}"
    );
}
