//! A run leaves nothing behind and takes nothing in, and the runner's own writes never end it,
//! each shown with the real binary:
//!
//! * a descriptor the launcher inherited (`( runjournal run ... ) 3>&1 | cat`) reaches neither
//!   the runner nor a step;
//! * processes a step moved out of its group (`setsid`, a double fork) are ended and named on
//!   stop, on timeout and when the step exits;
//! * `run --wait | head -1` ends quietly with 0; `run --spec /dev/zero` is refused with 2;
//!   `logs` streams a log larger than a read buffer whole;
//! * (as root) a run whose `runs/` is a full tmpfs — `runner.log` and the step's output
//!   cannot be written, or cannot even be created — completes; the step that prints on the
//!   full disk exits 0; once space returns, the logs note what was lost.
//!
//! Synchronisation is by gates (files a step makes, FIFOs it waits on); polls have a deadline
//! only to bound a hang.

use std::fs;
use std::io::{BufRead, BufReader, Read};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use runjournal::state::StepStatus;
use runjournal::{RunId, RunState, RunStatus};

use crate::full_disk::{can_mount, fill, run_command};
use crate::support::{self, TestHome};

const BIN: &str = env!("CARGO_BIN_EXE_runjournal");

/// The bound on any wait of these tests: past it, something hangs.
const HANG_BOUND: Duration = Duration::from_secs(120);

/// `runjournal --home HOME`, with the environment of the test's own choosing.
fn runjournal(home: &Path) -> Command {
    let mut command = Command::new(BIN);
    command
        .env_remove("RUNJOURNAL_HOME")
        .env_remove("RUNJOURNAL_LAYOUT")
        .arg("--home")
        .arg(home);
    command
}

fn output_of(mut command: Command) -> Output {
    command.output().expect("runjournal runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Waits until `condition` holds; fails with `what` past [`HANG_BOUND`].
fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let started = Instant::now();
    while !condition() {
        assert!(started.elapsed() < HANG_BOUND, "gave up waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Launches `args` with `run --json`; the run's id.
fn launch(home: &TestHome, args: &[&str]) -> RunId {
    let mut command = runjournal(home.path());
    command.arg("run").arg("--json").args(args);
    let output = output_of(command);
    assert!(output.status.success(), "{}", text(&output.stderr));
    support::run_id_of(&output.stdout)
}

/// Opens the FIFO `gate` for writing and closes it: its reader (a step's `cat`) sees its end.
/// Waits for the reader to be there, up to [`HANG_BOUND`].
fn open_gate(gate: &Path) {
    use std::os::unix::fs::OpenOptionsExt;
    wait_until("the gate's reader", || {
        // Non-blocking: ENXIO while no reader has the FIFO open.
        fs::OpenOptions::new()
            .write(true)
            .custom_flags(nix::libc::O_NONBLOCK)
            .open(gate)
            .is_ok()
    });
}

/// Whether a process holds `pid` now that is not a zombie.
fn is_alive(pid: u32) -> bool {
    runjournal::platform::process(pid)
        .expect("the process table can be read")
        .is_some_and(|info| info.is_alive())
}

#[test]
fn an_inherited_descriptor_reaches_neither_the_runner_nor_its_steps() {
    let home = TestHome::new();
    // Neither end is close-on-exec: as a shell's `3>&1` leaves it.
    let (read_end, write_end) = nix::unistd::pipe().expect("pipe");
    let raw = write_end.as_raw_fd();
    let mut command = runjournal(home.path());
    command.args(["run", "--json", "--", "sleep", "300"]);
    // SAFETY: dup2 is async-signal-safe; the descriptor is open until the spawn returned.
    unsafe {
        command.pre_exec(move || {
            if nix::libc::dup2(raw, 3) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let output = output_of(command);
    drop(write_end);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let run = support::run_id_of(&output.stdout);

    // `| cat` ends when every write end is closed: the launcher's went with it, and the run's
    // processes must never have had one. The read is bounded by a thread and a deadline.
    let (done, read_done) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let read = fs::File::from(read_end).read_to_end(&mut bytes);
        let _ = done.send(read.map(|_| bytes.len()));
    });
    let read = read_done
        .recv_timeout(HANG_BOUND)
        .expect("the pipe reached its end: no process of the run holds it");
    assert_eq!(read.expect("read"), 0);

    let journal = home.journal();
    let state = support::wait_for(&journal, run, "the step to run", |state| {
        state.steps[0].status == StepStatus::Running
    });
    assert_eq!(state.status, RunStatus::Running, "the run was still going");
    let step = state.steps[0].process.as_ref().expect("the step's process");
    // StepRunning is recorded while the child waits at the gate, before its exec (and until
    // then it holds the runner's close-on-exec descriptors): look once it is `sleep`.
    wait_until("the step's exec", || {
        runjournal::platform::command_name(step.pid)
            .ok()
            .flatten()
            .as_deref()
            == Some("sleep")
    });
    let mut descriptors: Vec<String> = fs::read_dir(format!("/proc/{}/fd", step.pid))
        .expect("the step's descriptors")
        .map(|entry| {
            entry
                .expect("entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    descriptors.sort();
    assert_eq!(
        descriptors,
        ["0", "1", "2"],
        "the step has stdin and its output pipe only"
    );

    let stopped = output_of({
        let mut command = runjournal(home.path());
        command.args(["stop", &run.to_string()]);
        command
    });
    assert!(stopped.status.success(), "{}", text(&stopped.stderr));
    support::wait_terminal(&journal, run);
}

/// The processes a step sent out of its group, by pid and start time, killed on drop if a
/// failed test left them.
struct Escapees {
    processes: Vec<(u32, Option<u64>)>,
}

impl Escapees {
    fn read(dir: &Path) -> Escapees {
        let processes = ["setsid", "double"]
            .iter()
            .map(|name| {
                let pid: u32 = fs::read_to_string(dir.join(name))
                    .expect("the escapee's pid")
                    .trim()
                    .parse()
                    .expect("a pid");
                let start_time = runjournal::platform::process(pid)
                    .expect("read")
                    .and_then(|info| info.start_time);
                (pid, start_time)
            })
            .collect();
        Escapees { processes }
    }

    fn pids(&self) -> Vec<u32> {
        self.processes.iter().map(|(pid, _)| *pid).collect()
    }
}

impl Drop for Escapees {
    fn drop(&mut self) {
        for &(pid, start_time) in &self.processes {
            let is_same = runjournal::platform::process(pid)
                .ok()
                .flatten()
                .is_some_and(|info| info.start_time == start_time && info.is_alive());
            if is_same && let Ok(raw) = i32::try_from(pid) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(raw),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
    }
}

/// A step (`sh -c SCRIPT DIR`) that starts two escapees — `setsid sleep` (a session of its
/// own) and a double fork in a new session (orphaned at once, so the runner inherits it) —
/// writes their pids to DIR, waits until both are `sleep`, makes DIR/ready, then runs `tail`.
fn escaping_step(tail: &str) -> String {
    format!(
        r#"d="$0"
setsid sleep 900 &
echo $! > "$d/setsid"
setsid sh -c 'sleep 900 & echo $! > "$0/double.tmp"; mv "$0/double.tmp" "$0/double"' "$d"
s=$(cat "$d/setsid"); b=$(cat "$d/double")
until [ "$(cat /proc/$s/comm 2>/dev/null)" = sleep ] && [ "$(cat /proc/$b/comm 2>/dev/null)" = sleep ]; do sleep 0.01; done
touch "$d/ready"
{tail}"#
    )
}

/// Launches a run of one escaping step, waits for its escapees, then `end`s the run (given
/// the step's directory, where `gate` is a FIFO the step's `tail` may wait on) and checks
/// that both were ended and named in the step's error.
fn escapees_are_ended_and_named(
    run_args: &[&str],
    tail: &str,
    end: impl FnOnce(&TestHome, RunId, &Path),
) -> RunState {
    let home = TestHome::new();
    let gates = tempfile::tempdir().expect("a directory for the step's files");
    nix::unistd::mkfifo(&gates.path().join("gate"), nix::sys::stat::Mode::S_IRWXU).expect("mkfifo");
    let script = escaping_step(tail);
    let dir = gates.path().to_str().expect("a UTF-8 path");
    let mut args: Vec<&str> = run_args.to_vec();
    args.extend(["--", "sh", "-c", &script, dir]);
    let run = launch(&home, &args);
    wait_until("the step's escapees", || {
        gates.path().join("ready").exists()
    });
    let escapees = Escapees::read(gates.path());
    for pid in escapees.pids() {
        assert!(is_alive(pid), "escapee {pid} runs");
        let info = runjournal::platform::process(pid)
            .expect("read")
            .expect("alive");
        let step_group = support::state(&home.journal(), run).steps[0]
            .process
            .as_ref()
            .expect("the step's process")
            .pid;
        assert_ne!(
            info.group_id, step_group,
            "escapee {pid} left the step's group"
        );
    }
    end(&home, run, gates.path());
    let state = support::wait_terminal(&home.journal(), run);
    let error = state.steps[0].error.clone().unwrap_or_default();
    assert!(
        error.contains("ended 2 processes it left outside its process group"),
        "{error}"
    );
    for pid in escapees.pids() {
        assert!(
            error.contains(&format!("{pid} (sleep)")),
            "{pid} named: {error}"
        );
        assert!(!is_alive(pid), "escapee {pid} was ended");
    }
    state
}

fn wait_exit_code(home: &TestHome, run: RunId) -> Option<i32> {
    let mut command = runjournal(home.path());
    command.args(["wait", &run.to_string()]);
    output_of(command).status.code()
}

#[test]
fn escapees_are_ended_and_named_when_the_run_is_stopped() {
    let state = escapees_are_ended_and_named(&[], "exec sleep 300", |home, run, _| {
        let mut command = runjournal(home.path());
        command.args(["stop", &run.to_string()]);
        let output = output_of(command);
        assert!(output.status.success(), "{}", text(&output.stderr));
        assert_eq!(wait_exit_code(home, run), Some(143));
    });
    assert_eq!(state.status, RunStatus::Stopped);
}

#[test]
fn escapees_are_ended_and_named_when_the_run_times_out() {
    // The step is ready long before the timeout; the test waits for the run to end.
    let state =
        escapees_are_ended_and_named(&["--timeout", "10s"], "exec sleep 300", |home, run, _| {
            assert_eq!(wait_exit_code(home, run), Some(124));
        });
    assert_eq!(state.status, RunStatus::Failed);
}

#[test]
fn escapees_are_ended_and_named_when_the_step_exits() {
    // The step waits at its gate, so its escapees are checked before it exits.
    let tail = r#"cat "$d/gate" > /dev/null; exit 0"#;
    let state = escapees_are_ended_and_named(&[], tail, |home, run, dir| {
        open_gate(&dir.join("gate"));
        assert_eq!(wait_exit_code(home, run), Some(0));
    });
    assert_eq!(state.status, RunStatus::Complete);
    assert_eq!(state.steps[0].exit_code, Some(0));
}

#[test]
fn run_wait_into_a_closed_pipe_ends_quietly_with_0() {
    let home = TestHome::new();
    let gates = tempfile::tempdir().expect("temp dir");
    let gate = gates.path().join("gate");
    nix::unistd::mkfifo(&gate, nix::sys::stat::Mode::S_IRWXU).expect("mkfifo");
    // A chain that fails (exit 3) once its first step passes the gate: every record after
    // the gate is printed into a pipe nobody reads any more.
    let mut command = runjournal(home.path());
    command
        .args(["run", "--wait", "--name", "piped", "--step"])
        .arg(format!("cat '{}' > /dev/null", gate.display()))
        .args(["--step", "exit 3"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut launcher = command.spawn().expect("launch");
    let stdout = launcher.stdout.take().expect("stdout");
    let mut first = String::new();
    BufReader::new(stdout)
        .read_line(&mut first)
        .expect("the first line");
    assert!(first.starts_with("#1 created"), "{first:?}");
    // `| head -1` is done: the pipe's read end is closed (dropped with the reader above).
    open_gate(&gate);
    let started = Instant::now();
    let status = loop {
        if let Some(status) = launcher.try_wait().expect("try_wait") {
            break status;
        }
        assert!(started.elapsed() < HANG_BOUND, "the launcher did not end");
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    launcher
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut stderr)
        .expect("read stderr");
    assert_eq!(
        status.code(),
        Some(0),
        "a closed stdout ends quietly with 0"
    );
    assert_eq!(stderr, "", "no panic, no message");
    // The run itself went on to its own end.
    let journal = home.journal();
    let run = journal
        .view()
        .expect("view")
        .lookup_alias(&runjournal::journal::name_alias("piped"))
        .expect("alias")
        .expect("the run exists");
    let state = support::wait_terminal(&journal, run);
    assert_eq!(state.status, RunStatus::Failed);
    assert_eq!(state.terminal.expect("terminal").exit_code, 3);
}

#[test]
fn an_endless_spec_file_is_refused_with_2() {
    let home = TestHome::new();
    let mut command = runjournal(home.path());
    command.args(["run", "--spec", "/dev/zero"]);
    let output = output_of(command);
    assert_eq!(output.status.code(), Some(2), "{}", text(&output.stderr));
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains("spec /dev/zero: over the limit of 1048576 bytes"),
        "{stderr}"
    );
}

#[test]
fn logs_streams_a_log_larger_than_its_buffer_whole() {
    let home = TestHome::new();
    const BYTES: usize = 3_000_000;
    let mut command = runjournal(home.path());
    command
        .args(["run", "--json", "--wait", "--step"])
        .arg(format!("head -c {BYTES} /dev/zero | tr '\\0' x"));
    let output = output_of(command);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let run = support::run_id_of(&output.stdout);
    let mut command = runjournal(home.path());
    command.args(["logs", &run.to_string()]);
    let logs = output_of(command);
    assert!(logs.status.success(), "{}", text(&logs.stderr));
    assert_eq!(logs.stdout.len(), BYTES);
    assert!(logs.stdout.iter().all(|&byte| byte == b'x'));
}

/// What is exhausted on the tmpfs that holds `runs/`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Exhausted {
    /// Its blocks: files can be made, not written (runner.log is made empty by the launcher).
    Space,
    /// Its inodes: not even the run's directory can be made, let alone its logs.
    Inodes,
}

/// A tmpfs mounted over `path`, unmounted on drop.
struct Mounted {
    path: PathBuf,
}

impl Mounted {
    fn tmpfs(path: &Path, options: &str) -> Mounted {
        run_command(
            "mount",
            &[
                "-t",
                "tmpfs",
                "-o",
                options,
                "tmpfs",
                path.to_str().expect("a UTF-8 path"),
            ],
        );
        Mounted {
            path: path.to_path_buf(),
        }
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .args(["-l", &self.path.to_string_lossy()])
            .status();
    }
}

/// The sum of the counts of every lost-bytes note of `what` in `log`.
fn bytes_noted_lost(log: &str, what: &str) -> u64 {
    let marker = format!(" of {what} lost: ");
    log.lines()
        .filter(|line| line.starts_with("[runjournal: ") && line.contains(&marker))
        .map(|line| {
            line["[runjournal: ".len()..]
                .split(' ')
                .next()
                .and_then(|count| count.parse::<u64>().ok())
                .expect("a count")
        })
        .sum()
}

/// The journal is on the home's own file system; `runs/` (where runner.log, the output logs
/// and the projections are) is a tmpfs with nothing left of `exhausted`. The step prints 2 MB
/// on the full disk (and exits 0 for it), marks that it has, and waits at a gate; the test
/// then frees the tmpfs and opens the gate; the step prints `after` and the run completes.
fn a_run_whose_logs_cannot_be_written_completes_and_notes_the_loss(exhausted: Exhausted) {
    let dir = tempfile::tempdir().expect("temp dir");
    let home = dir.path().join("home");
    let gates = dir.path().join("gates");
    fs::create_dir(&gates).expect("gates dir");
    let made = output_of({
        let mut command = runjournal(&home);
        command.arg("list");
        command
    });
    assert!(made.status.success(), "{}", text(&made.stderr));
    let runs = home.join("runs");
    let options = match exhausted {
        Exhausted::Space => "size=1m,mode=0700",
        Exhausted::Inodes => "size=64m,nr_inodes=64,mode=0700",
    };
    let mounted = Mounted::tmpfs(&runs, options);
    let fillers = runs.join("fillers");
    fs::create_dir(&fillers).expect("fillers dir");
    match exhausted {
        Exhausted::Space => fill(&fillers.join("filler")),
        Exhausted::Inodes => {
            for index in 0.. {
                match fs::File::create_new(fillers.join(index.to_string())) {
                    Ok(_) => {}
                    Err(error) if runjournal::capacity::is_capacity_io(&error) => break,
                    Err(error) => panic!("filling the inodes: {error}"),
                }
            }
        }
    }

    const PRINTED: usize = 2_000_000;
    let script = format!(
        r#"head -c {PRINTED} /dev/zero || exit 9
touch "$0/printed"
cat "$0/gate" > /dev/null
echo after"#
    );
    let gate = gates.join("gate");
    nix::unistd::mkfifo(&gate, nix::sys::stat::Mode::S_IRWXU).expect("mkfifo");
    let mut command = runjournal(&home);
    command
        .args([
            "run",
            "--wait",
            "--name",
            "on-full-runs",
            "--",
            "sh",
            "-c",
            &script,
        ])
        .arg(&gates)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut launcher = command.spawn().expect("launch");
    wait_until("the step to print on the full disk", || {
        gates.join("printed").exists()
    });
    assert!(
        launcher.try_wait().expect("try_wait").is_none(),
        "the run goes on"
    );
    fs::remove_dir_all(&fillers).expect("free the tmpfs");
    open_gate(&gate);
    let output = launcher.wait_with_output().expect("the launcher ends");
    assert_eq!(
        output.status.code(),
        Some(0),
        "the run completed: {}{}",
        text(&output.stdout),
        text(&output.stderr)
    );
    let journal = runjournal::Journal::open(home.join("journal.redb")).expect("the journal");
    let run = journal
        .view()
        .expect("view")
        .lookup_alias(&runjournal::journal::name_alias("on-full-runs"))
        .expect("alias")
        .expect("the run exists");
    let state = support::state(&journal, run);
    assert_eq!(state.status, RunStatus::Complete);
    assert_eq!(
        state.steps[0].exit_code,
        Some(0),
        "the step's writes did not fail"
    );

    let run_dir = runs.join(run.to_string());
    let output_log = fs::read(run_dir.join("output-0.log")).expect("the output log");
    let output_text = String::from_utf8_lossy(&output_log);
    assert!(
        output_text.contains("bytes of output lost: No space left on device"),
        "{exhausted:?}: the loss is noted: {}",
        output_text.replace('\0', "")
    );
    assert!(
        output_text.ends_with("after\n"),
        "the step's last line is there"
    );
    // Every byte printed is in the log or counted in a note: the queue may still have held
    // some when space returned.
    let written = output_log.iter().filter(|&&byte| byte == 0).count() as u64;
    assert_eq!(
        written + bytes_noted_lost(&output_text, "output"),
        PRINTED as u64,
        "{exhausted:?}: written and lost add up"
    );
    let runner_log = fs::read_to_string(run_dir.join("runner.log")).expect("runner.log");
    assert!(
        runner_log.contains("of the runner's log lost: No space left on device"),
        "{exhausted:?}: {runner_log}"
    );
    assert!(
        runner_log.contains(&format!("run {run} complete (exit code 0)")),
        "{runner_log}"
    );
    drop(mounted);
}

#[test]
fn a_run_whose_logs_cannot_be_written_completes_and_notes_the_loss_on_a_full_tmpfs() {
    if can_mount("a_run_whose_logs_cannot_be_written_completes_and_notes_the_loss_on_a_full_tmpfs")
    {
        a_run_whose_logs_cannot_be_written_completes_and_notes_the_loss(Exhausted::Space);
    }
}

#[test]
fn a_run_whose_logs_cannot_be_created_completes_and_notes_the_loss_on_a_tmpfs_out_of_inodes() {
    if can_mount(
        "a_run_whose_logs_cannot_be_created_completes_and_notes_the_loss_on_a_tmpfs_out_of_inodes",
    ) {
        a_run_whose_logs_cannot_be_written_completes_and_notes_the_loss(Exhausted::Inodes);
    }
}
