//! No process holds the others hostage through the commit leader, with the real binaries: a
//! runner that leads the journal's commits is stopped (SIGSTOP) while idle, or inside a
//! commit, and every other command and runner still gets on or gives up with a clear word;
//! impostors where a client would connect are never handed a batch.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::support::{TestHome, run_id_of, wait_for, wait_terminal};
use runjournal::RunId;
use runjournal::state::RunStatus;

/// Polls `done` until it holds; panics after a generous bound.
fn poll(what: &str, done: impl Fn() -> bool) {
    for _ in 0..1200 {
        if done() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("gave up waiting for {what}");
}

/// The pid the commit lock names: the journal's leader (for people and tests).
fn leader_pid(home: &TestHome) -> Option<u32> {
    std::fs::read_to_string(home.file("journal.redb.commit.lock"))
        .ok()
        .and_then(|text| text.trim().parse().ok())
}

/// `/proc/<pid>/stat`'s state letter.
fn process_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// Launches `run --json ARGS`, waits until its runner leads the journal's commits, and returns
/// the run, its runner's pid, and a handle of the test's own, opened now: opening a journal for
/// writing takes its write lock for a moment, which a process stopped in a commit holds.
fn launch_leading_runner(
    home: &TestHome,
    envs: &[(&str, &Path)],
    args: &[&str],
) -> (RunId, u32, runjournal::Journal) {
    let mut command = home.cmd();
    command.args(["run", "--json"]).args(args);
    for (key, value) in envs {
        command.env(key, value);
    }
    let output = command.output().expect("runs");
    assert!(output.status.success(), "{output:?}");
    let run = run_id_of(&output.stdout);
    let journal = home.journal();
    // Its step running, so that its runner has no commit left to make while the step runs:
    // stopped then, it is idle, not inside a commit.
    let state = wait_for(&journal, run, "the runner to start its step", |state| {
        state.runner.is_some()
            && state.status == RunStatus::Running
            && state
                .steps
                .iter()
                .any(|step| step.status == runjournal::state::StepStatus::Running)
    });
    let pid = state.runner.expect("a runner").identity.pid;
    poll("the runner to lead", || leader_pid(home) == Some(pid));
    (run, pid, journal)
}

/// Continues `pid` when dropped, so that a failing test leaves no stopped process behind.
struct Stopped(u32);

impl Stopped {
    fn new(pid: u32) -> Stopped {
        kill(Pid::from_raw(pid as i32), Signal::SIGSTOP).expect("SIGSTOP");
        poll("the process to stop", || process_state(pid) == Some('T'));
        Stopped(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = kill(Pid::from_raw(self.0 as i32), Signal::SIGCONT);
    }
}

#[test]
fn a_stopped_idle_leader_holds_up_no_launch_stop_or_runner() {
    let home = TestHome::new();
    let (first, leader, journal) = launch_leading_runner(&home, &[], &["--", "sleep", "3"]);
    let stopped = Stopped::new(leader);

    let output = home
        .cmd()
        .args(["run", "--json", "--", "true"])
        .timeout(Duration::from_secs(60))
        .output()
        .expect("runs");
    assert!(output.status.success(), "run -- true: {output:?}");
    let quick = run_id_of(&output.stdout);

    // A runner started now commits every transition of its run without the stopped leader.
    let output = home
        .cmd()
        .args(["run", "--wait", "--", "true"])
        .timeout(Duration::from_secs(60))
        .output()
        .expect("runs");
    assert_eq!(
        output.status.code(),
        Some(0),
        "run --wait -- true: {output:?}"
    );

    let output = home
        .cmd()
        .args(["run", "--json", "--", "sleep", "60"])
        .timeout(Duration::from_secs(60))
        .output()
        .expect("runs");
    assert!(output.status.success(), "{output:?}");
    let long = run_id_of(&output.stdout);
    wait_for(&journal, long, "the long run's step to run", |state| {
        state.status == RunStatus::Running && state.runner.is_some()
    });
    let output = home
        .cmd()
        .args(["stop", &long.to_string()])
        .timeout(Duration::from_secs(60))
        .output()
        .expect("runs");
    assert!(output.status.success(), "stop: {output:?}");
    assert_eq!(wait_terminal(&journal, long).status, RunStatus::Stopped);
    assert_eq!(wait_terminal(&journal, quick).status, RunStatus::Complete);
    assert_eq!(
        process_state(leader),
        Some('T'),
        "the leader stayed stopped throughout"
    );

    // Continued, the stopped runner's own run goes on and ends as asked.
    drop(stopped);
    let state = wait_terminal(&journal, first);
    assert_eq!(state.status, RunStatus::Complete);
    assert_eq!(state.terminal.expect("terminal").exit_code, 0);
}

#[test]
fn a_leader_stopped_inside_a_commit_fails_a_launch_naming_it_and_then_everything_lands_once() {
    let home = TestHome::new();
    let hook = home.file("stop-in-commit");
    let (first, leader, journal) = launch_leading_runner(
        &home,
        &[("RUNJOURNAL_TEST_STOP_IN_COMMIT", &hook)],
        &["--step", "sleep 2", "--step", "true"],
    );
    // Another runner, whose step ends while the leader is stopped.
    let output = home
        .cmd()
        .args(["run", "--json", "--", "sleep", "4"])
        .output()
        .expect("runs");
    assert!(output.status.success(), "{output:?}");
    let other = run_id_of(&output.stdout);
    wait_for(&journal, other, "the other runner to start", |state| {
        state.status == RunStatus::Running && state.runner.is_some()
    });
    // The runner's next commit (its step's end) stops it inside the write transaction.
    std::fs::write(&hook, b"").expect("arm the hook");
    poll("the leader to stop inside its commit", || {
        !hook.exists() && process_state(leader) == Some('T')
    });
    let _continue_on_failure = Stopped(leader);

    let output = home
        .cmd()
        .env("RUNJOURNAL_LOCK_TIMEOUT", "3s")
        .args(["run", "--json", "--", "true"])
        .timeout(Duration::from_secs(60))
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    assert!(
        stderr.contains(&format!("held by process {leader}")) && stderr.contains("since"),
        "names the process and since when: {stderr}"
    );
    let view = journal.view().expect("view");
    assert_eq!(
        view.run_count().expect("runs"),
        2,
        "the launch made nothing"
    );
    // The other runner waits on, and says so in its log.
    let log = home.path().join(format!("runs/{other}/runner.log"));
    poll("the other runner to log that it is blocked", || {
        std::fs::read_to_string(&log).is_ok_and(|text| text.contains("write lock"))
    });
    assert!(
        !crate::support::state(&journal, other).is_terminal(),
        "it waits on"
    );

    drop(_continue_on_failure);
    let state = wait_terminal(&journal, first);
    assert_eq!(state.status, RunStatus::Complete);
    assert_eq!(wait_terminal(&journal, other).status, RunStatus::Complete);
    let records = crate::support::records(&journal, first);
    let names = crate::support::event_names(&records);
    let finished = names.iter().filter(|name| **name == "StepFinished").count();
    assert_eq!(finished, 2, "each step's end landed once: {names:?}");
    let seqs: Vec<u64> = records.iter().map(|record| record.seq).collect();
    assert_eq!(
        seqs,
        (1..=records.len() as u64).collect::<Vec<_>>(),
        "gap-free and once"
    );
}

fn is_root(test: &str) -> bool {
    runjournal::testkit::skip::needs_root(test, "act as another user")
}

/// A home whose socket path is too long to bind beside the journal.
fn long_home(root: &Path) -> PathBuf {
    let home = root.join("h".repeat(90)).join("home");
    std::fs::create_dir_all(&home).expect("mkdir");
    home
}

/// Listens at `path` as `owner` would, never accepting; the listener is returned to count who
/// connected.
fn squat(path: &Path, owner: u32) -> std::os::unix::net::UnixListener {
    let listener = std::os::unix::net::UnixListener::bind(path).expect("bind the squatter");
    nix::unistd::chown(path, Some(nix::unistd::Uid::from_raw(owner)), None).expect("chown");
    listener.set_nonblocking(true).expect("nonblocking");
    listener
}

#[test]
fn a_squatter_of_the_private_socket_directory_is_never_reached_and_hangs_nobody() {
    if !is_root("a_squatter_of_the_private_socket_directory_is_never_reached") {
        return;
    }
    let scratch = tempfile::tempdir().expect("temp dir");
    let runtime = scratch.path().join("runtime");
    std::fs::create_dir(&runtime).expect("mkdir");
    std::fs::set_permissions(&runtime, std::fs::Permissions::from_mode(0o1777)).expect("chmod");
    // Another user made this user's private socket directory first, open to all, and listens
    // at every socket name in it that a client could try.
    let uid = nix::unistd::geteuid().as_raw();
    let taken = runtime.join(format!("runjournal-{uid}"));
    std::fs::create_dir(&taken).expect("mkdir");
    std::fs::set_permissions(&taken, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    nix::unistd::chown(&taken, Some(nix::unistd::Uid::from_raw(65534)), None).expect("chown");
    let home = long_home(scratch.path());
    let journal = home.join("journal.redb");
    let name = {
        use sha2::Digest;
        // Where a client of this home would connect, were the directory ours.
        let canonical = home.canonicalize().expect("canonical").join("journal.redb");
        let digest = sha2::Sha256::digest(canonical.as_os_str().as_encoded_bytes());
        let hex: String = digest[..12].iter().map(|b| format!("{b:02x}")).collect();
        format!("{hex}.sock")
    };
    let squatter = squat(&taken.join(name), 65534);
    let run = |args: &[&str]| {
        assert_cmd::cargo::cargo_bin_cmd!("runjournal")
            .env("RUNJOURNAL_RUNTIME_DIR", &runtime)
            .env_remove("RUNJOURNAL_HOME")
            .arg("--home")
            .arg(&home)
            .args(args)
            .timeout(Duration::from_secs(60))
            .output()
            .expect("runs")
    };
    let first = run(&["run", "--json", "--", "sleep", "3"]);
    assert!(first.status.success(), "{first:?}");
    let first = run_id_of(&first.stdout);
    let journal = runjournal::Journal::open(&journal).expect("opens");
    // Its runner has committed: were it leading through an abstract name, the name shows now.
    wait_for(&journal, first, "the runner to start", |state| {
        state.runner.is_some()
    });
    let table = std::fs::read_to_string("/proc/net/unix").expect("/proc/net/unix");
    assert!(!table.contains("@runjournal"), "no abstract name: {table}");
    let waited = run(&["run", "--wait", "--", "true"]);
    assert_eq!(waited.status.code(), Some(0), "{waited:?}");
    assert_eq!(wait_terminal(&journal, first).status, RunStatus::Complete);
    assert!(
        squatter.accept().is_err(),
        "nobody connected to the squatter"
    );
}

#[test]
fn a_process_of_the_overflow_uid_never_joins_a_leader_of_that_uid() {
    if !is_root("a_process_of_the_overflow_uid_never_joins_a_leader_of_that_uid") {
        return;
    }
    let overflow: u32 = std::fs::read_to_string("/proc/sys/kernel/overflowuid")
        .expect("overflowuid")
        .trim()
        .parse()
        .expect("a number");
    let scratch = tempfile::tempdir().expect("temp dir");
    std::fs::set_permissions(scratch.path(), std::fs::Permissions::from_mode(0o755))
        .expect("chmod");
    let home = scratch.path().join("home");
    std::fs::create_dir(&home).expect("mkdir");
    nix::unistd::chown(&home, Some(nix::unistd::Uid::from_raw(overflow)), None).expect("chown");
    std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    // Any unmapped process of the host shows as the overflow uid: one listens where this
    // home's leader would.
    let squatter = squat(&home.join("journal.redb.commit.sock"), overflow);
    // What the overflow uid executes must be where it can reach: the build tree may sit under a
    // directory only its owner may enter.
    let runjournal = crate::support::runjournal_for_another_user();
    let mut command = std::process::Command::new(runjournal.path());
    std::os::unix::process::CommandExt::uid(&mut command, overflow);
    // And it works in a directory it can enter: the test's own may be private.
    command
        .current_dir(scratch.path())
        .env_remove("RUNJOURNAL_HOME")
        .env("RUNJOURNAL_RUNTIME_DIR", scratch.path())
        .arg("--home")
        .arg(&home)
        .args(["run", "--wait", "--", "true"]);
    let output = assert_cmd::Command::from_std(command)
        .timeout(Duration::from_secs(60))
        .output()
        .expect("runs");
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    assert!(
        squatter.accept().is_err(),
        "the overflow uid handed nothing to a peer of that uid"
    );
    // The run landed: its owner lists it, ended.
    let mut command = std::process::Command::new(runjournal.path());
    std::os::unix::process::CommandExt::uid(&mut command, overflow);
    command
        .current_dir(scratch.path())
        .env_remove("RUNJOURNAL_HOME")
        .arg("--home")
        .arg(&home)
        .args(["list", "--all", "--json"]);
    let listed = assert_cmd::Command::from_std(command)
        .timeout(Duration::from_secs(60))
        .output()
        .expect("runs");
    assert!(listed.status.success(), "{listed:?}");
    let text = String::from_utf8_lossy(&listed.stdout);
    assert!(
        text.contains("\"complete\""),
        "the run is there, complete: {text}"
    );
}
