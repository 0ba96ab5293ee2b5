//! Strangers, with the real binary: a home someone else owns or may write, links
//! planted where runjournal writes, an empty `--home`. Tests that need root (a home of
//! another user) skip without it, saying so, and fail instead where every test must run
//! (`runjournal::testkit::skip`).

use crate::support;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use runjournal::state::StepStatus;
use support::{TestHome, run_id_of, wait_for, wait_terminal};

use runjournal::testkit::skip::needs_root as is_root;

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
    let elsewhere = tempfile::tempdir().expect("a directory outside the home");
    let victim = elsewhere.path().join("victim");
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
/// provider message with an escape sequence — is shown escaped (`\x1b`) by `run --wait`'s
/// transitions, `status`, `list` and `reconcile`; the JSON of `status --json` is serde's,
/// unchanged. (What a step itself prints is its own: `run --wait` without `--quiet` shows it
/// as written, as `logs` does.)
#[test]
fn hostile_text_reaches_the_terminal_escaped() {
    let home = TestHome::new();
    let provider = r#"printf '%s\n' '{"state":"running","message":"\u001b[2J wiped"}' '{"state":"failed","message":"\u001b]2;pwned\u0007"}'"#;
    let output = home
        .cmd()
        .args([
            "run",
            "--wait",
            "--quiet",
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

/// `runjournal ARGS` with `home`, bounded.
fn runjournal_at(home: &Path, args: &[&str]) -> std::process::Output {
    assert_cmd::cargo::cargo_bin_cmd!("runjournal")
        .env_remove("RUNJOURNAL_HOME")
        .env_remove("RUNJOURNAL_LAYOUT")
        .arg("--home")
        .arg(home)
        .args(args)
        .timeout(std::time::Duration::from_secs(120))
        .output()
        .expect("runs")
}

/// Every file under `dir`, links included, as paths relative to it.
fn files_under(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(next) = pending.pop() {
        for entry in std::fs::read_dir(&next).expect("list").flatten() {
            let path = entry.path();
            if entry.file_type().expect("file type").is_dir() {
                pending.push(path);
            } else {
                found.push(path.strip_prefix(dir).expect("under").display().to_string());
            }
        }
    }
    found
}

/// Regression: a home inside a directory another user owns was used, so that user could
/// swap a link into its place mid-run and have root's runner write runs, results, status.json
/// and events.jsonl into a directory of their choosing. The directories above a home are
/// checked as OpenSSH's StrictModes checks them: a home under another user's directory is
/// refused by every command, naming the directory, whether it exists yet or not.
#[test]
fn a_home_under_a_directory_another_user_owns_is_refused_naming_it() {
    if !is_root(
        "a_home_under_a_directory_another_user_owns_is_refused_naming_it",
        "give a directory to another user",
    ) {
        return;
    }
    let scratch = tempfile::tempdir().expect("temp dir");
    chmod(scratch.path(), 0o755);
    let theirs = scratch.path().join("theirs");
    std::fs::create_dir(&theirs).expect("mkdir");
    let home = theirs.join("home");
    let made = runjournal_at(&home, &["run", "--wait", "--", "true"]);
    assert!(
        made.status.success(),
        "while the directory is root's: {made:?}"
    );
    // nobody
    nix::unistd::chown(&theirs, Some(nix::unistd::Uid::from_raw(65534)), None).expect("chown");
    let new_home = theirs.join("new-home");
    for home in [&home, &new_home] {
        for args in [
            &["list"][..],
            &["status", "01ARZ3NDEKTSV4RRFFQ69G5FAV"],
            &["reconcile"],
            &["run", "--", "true"],
        ] {
            let output = runjournal_at(home, args);
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert_eq!(output.status.code(), Some(1), "{args:?}: {stderr}");
            assert_eq!(stderr.lines().count(), 1, "{args:?}: one line: {stderr}");
            assert!(
                stderr.contains(&format!(
                    "{}, a directory above the home, belongs to uid 65534",
                    theirs.display()
                )),
                "{args:?}: {stderr}"
            );
        }
    }
    assert!(!new_home.exists(), "no home was made under their directory");
    nix::unistd::chown(&theirs, Some(nix::unistd::geteuid()), None).expect("chown back");
    assert!(
        runjournal_at(&home, &["list"]).status.success(),
        "ours again, accepted"
    );
}

/// A directory above the home that others may write is refused unless it is sticky, as
/// `/tmp` is: there nobody may rename or remove another user's entry.
#[test]
fn a_sticky_world_writable_parent_is_accepted_and_a_plain_one_refused() {
    let scratch = tempfile::tempdir().expect("temp dir");
    let shared = scratch.path().join("shared");
    std::fs::create_dir(&shared).expect("mkdir");
    chmod(&shared, 0o777);
    let home = shared.join("home");
    let output = runjournal_at(&home, &["run", "--wait", "--", "true"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "{}, a directory above the home, is writable by its group and others (mode 777) and not sticky",
            shared.display()
        )),
        "{stderr}"
    );
    assert!(!home.exists(), "nothing was made");
    chmod(&shared, 0o1777);
    let output = runjournal_at(&home, &["run", "--wait", "--", "true"]);
    assert!(output.status.success(), "sticky, accepted: {output:?}");
}

/// Regression for the swap itself: a directory above a home that passed its checks is renamed
/// mid-run and a link to a decoy put in its place. The runner opened the home's directory once
/// and checked it; every file it writes after the swap — the step's output, status.json,
/// events.jsonl, the result — lands in the home it checked, and nothing reaches the decoy.
#[test]
fn a_directory_swapped_above_a_checked_home_mid_run_redirects_none_of_its_writes() {
    let scratch = tempfile::tempdir().expect("temp dir");
    let parent = scratch.path().join("p");
    std::fs::create_dir(&parent).expect("mkdir");
    let home = parent.join("home");
    let output = runjournal_at(
        &home,
        &["run", "--json", "--", "sh", "-c", "sleep 2; echo done"],
    );
    assert!(output.status.success(), "{output:?}");
    let run = run_id_of(&output.stdout);
    let journal = runjournal::Journal::open(home.join("journal.redb")).expect("opens");
    wait_for(&journal, run, "the step to run", |state| {
        state.steps[0].status == StepStatus::Running
    });

    let moved = scratch.path().join("p-moved");
    std::fs::rename(&parent, &moved).expect("move the parent away");
    let decoy = scratch.path().join("decoy");
    std::fs::create_dir(&decoy).expect("mkdir");
    std::os::unix::fs::symlink(&decoy, &parent).expect("a link to the decoy in its place");

    let state = wait_terminal(&journal, run);
    assert_eq!(state.status, runjournal::RunStatus::Complete);
    let real = moved.join("home");
    let status_path = real.join(format!("runs/{run}/status.json"));
    for _ in 0..600 {
        let status = std::fs::read_to_string(&status_path).unwrap_or_default();
        if status.contains("\"state\": \"complete\"") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let status = std::fs::read_to_string(&status_path).expect("status.json in the home");
    assert!(status.contains("\"state\": \"complete\""), "{status}");
    let output_log = std::fs::read_to_string(real.join(format!("runs/{run}/output-0.log")))
        .expect("the step's output in the home");
    assert_eq!(output_log, "done\n");
    let events = std::fs::read_to_string(real.join(format!("runs/{run}/events.jsonl")))
        .expect("events.jsonl in the home");
    assert!(
        events.contains("Terminal") || events.contains("\"complete\""),
        "{events}"
    );
    assert!(
        real.join(format!("results/{run}.json")).is_file(),
        "the result in the home"
    );
    assert_eq!(
        files_under(&decoy),
        Vec::<String>::new(),
        "nothing reached the decoy"
    );
}

/// Every entry under `dir`, directories and links included, as paths relative to it.
fn entries_under(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(next) = pending.pop() {
        for entry in std::fs::read_dir(&next).expect("list").flatten() {
            let path = entry.path();
            if entry.file_type().expect("file type").is_dir() {
                pending.push(path.clone());
            }
            found.push(path.strip_prefix(dir).expect("under").display().to_string());
        }
    }
    found.sort();
    found
}

/// Puts a request file into `dir` of a run's control inbox as a host does: written aside,
/// then renamed into place.
fn drop_request(dir: &Path, name: &str, json: &str) {
    let aside = dir.join(format!(".{name}.tmp"));
    std::fs::write(&aside, json).expect("write the request aside");
    std::fs::rename(&aside, dir.join(name)).expect("rename the request into place");
}

/// Regression: the directory above a checked home was given to another user mid-run, who put
/// a link to a directory of theirs in the home's place. The runners had their control inbox,
/// the commit lock and the commit leader's socket opened by path, so they made
/// `runs/<id>/control/`, `journal.redb.commit.lock` and `journal.redb.commit.sock` in the other
/// user's directory, and never saw the requests a host dropped into the real home. Now every
/// file of the home is opened relative to the home's held directory, the socket bound through
/// it: while one runner hands the lead to another (the leader's run is stopped), and the other
/// run is steered and stopped through the real home by command and by control file, nothing
/// is made in the other user's directory, and every request is taken.
#[test]
fn a_home_swapped_for_a_link_to_another_users_directory_makes_nothing_there() {
    const NAME: &str = "a_home_swapped_for_a_link_to_another_users_directory_makes_nothing_there";
    if !is_root(NAME, "give a directory to another user") {
        return;
    }
    let scratch = tempfile::tempdir().expect("temp dir");
    chmod(scratch.path(), 0o755);
    let theirs = scratch.path().join("theirs");
    std::fs::create_dir(&theirs).expect("mkdir");
    let home = theirs.join("home");
    // The first run's runner leads the commits; the second's is its client until it ends.
    let mut runs = Vec::new();
    for _ in 0..2 {
        let output = runjournal_at(&home, &["run", "--json", "--step", "sleep 120"]);
        assert!(output.status.success(), "{output:?}");
        runs.push(run_id_of(&output.stdout));
    }
    let (leading, led) = (runs[0], runs[1]);
    let journal = runjournal::Journal::open(home.join("journal.redb")).expect("opens");
    for run in [leading, led] {
        wait_for(&journal, run, "the step to run", |state| {
            state.steps[0].status == StepStatus::Running
        });
    }
    drop(journal);

    // nobody
    let stranger = nix::unistd::Uid::from_raw(65534);
    nix::unistd::chown(&theirs, Some(stranger), None).expect("give the parent away");
    let real = scratch.path().join("real-home");
    std::fs::rename(&home, &real).expect("move the home away");
    let decoy = scratch.path().join("decoy");
    std::fs::create_dir(&decoy).expect("mkdir");
    chmod(&decoy, 0o755);
    nix::unistd::chown(&decoy, Some(stranger), None).expect("the stranger's directory");
    std::os::unix::fs::symlink(&decoy, &home).expect("a link to it in the home's place");
    let journal = runjournal::Journal::open(real.join("journal.redb")).expect("opens");

    // The leader's run ends: the lead passes to the other runner, which commits on.
    let output = runjournal_at(&real, &["stop", &leading.to_string()]);
    assert!(output.status.success(), "{output:?}");
    let state = wait_terminal(&journal, leading);
    assert_eq!(state.status, runjournal::RunStatus::Stopped, "{state:?}");
    let output = runjournal_at(&real, &["steer", &led.to_string(), "by command"]);
    assert!(output.status.success(), "{output:?}");
    let control = real.join(format!("runs/{led}/control"));
    drop_request(
        &control.join("steer-requests"),
        "1700000000000-by-file.json",
        r#"{"type":"steer","id":"by-file","ts":1700000000000,"message":"by file","source":"a host"}"#,
    );
    let steered = (0..1200).any(|_| {
        let state = support::state(&journal, led);
        if state.steer("by-file").is_some() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
        false
    });
    drop_request(
        &control.join("stop-requests"),
        "1700000000001-stop.json",
        r#"{"type":"stop","source":"a host"}"#,
    );
    let stopped = (0..1200).any(|_| {
        let state = support::state(&journal, led);
        if state.is_terminal() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
        false
    });
    if !stopped {
        // Stopped through the real home by command, so that nothing is left running.
        let _ = runjournal_at(&real, &["stop", &led.to_string()]);
        wait_terminal(&journal, led);
    }
    // Each runner ends its run, then leaves: their last files are written by then.
    let status_path = real.join(format!("runs/{led}/status.json"));
    for _ in 0..1200 {
        let status = std::fs::read_to_string(&status_path).unwrap_or_default();
        if status.contains("\"state\": \"stopped\"") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(
        entries_under(&decoy),
        Vec::<String>::new(),
        "nothing was made in the other user's directory"
    );
    assert!(
        steered,
        "the request file dropped into the real home was taken"
    );
    assert!(
        stopped,
        "the stop file dropped into the real home was taken"
    );
    let state = support::state(&journal, led);
    assert_eq!(state.status, runjournal::RunStatus::Stopped, "{state:?}");
    assert_eq!(state.steers.len(), 2, "both steers were taken: {state:?}");
    assert!(
        real.join("journal.redb.commit.lock").is_file(),
        "the lock is in the home"
    );
}
