//! Step processes: spawned behind a gate in their own process group, so the journal can name
//! them before they run, and ended as a whole group.
//!
//! # The gate
//!
//! `StepRunning` must be durable before the step's program runs, yet it carries the child's
//! identity (pid, start time, boot id), which exists only once the child does. So the child is
//! forked with a `pre_exec` hook that, after std has put it in its own process group, writes its
//! pid to a "hello" pipe and then blocks reading one byte from a "gate" pipe. The parent reads
//! the pid, reads the identity from `/proc`, commits `StepRunning`, and only then writes the
//! byte: the child execs. If the parent closes the gate instead, the hook fails with
//! `ECANCELED`, the child exits without ever running the program, and std reaps it.
//!
//! std's `spawn` returns only once the child has exec'd (it waits on its own error pipe), so the
//! spawn runs on a blocking thread while the parent works the gate.
//!
//! Invariant: the hook makes only raw system calls (getpid, write, read, close), which are
//! async-signal-safe, as code between fork and exec in a threaded process must be.
//! Invariant: a group is reported gone only when `kill(-pgid, 0)` fails with `ESRCH`.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus};
use std::time::Duration;

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::signal::{Signal, killpg};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{Pid, close, getpid, pipe2, read, write};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// How long a group has, after SIGKILL, to be seen gone before we report members left.
pub const KILL_VERIFY_TIMEOUT: Duration = Duration::from_secs(5);

/// How often a group is looked at while waiting for it to empty.
const GROUP_POLL_INTERVAL: Duration = Duration::from_millis(20);

/// A child forked and held at the gate: it exists (and has an identity) but has not exec'd.
#[derive(Debug)]
pub struct GatedChild {
    pid: u32,
    gate: OwnedFd,
    spawning: JoinHandle<io::Result<Child>>,
}

/// Forks `command` in a new process group and holds it at the gate. The returned child has
/// not run its program yet; call [`GatedChild::release`] or [`GatedChild::abort`].
///
/// Spawns must not overlap: a child forked while another is gated would inherit that one's
/// gate and delay its abort until it execs itself.
pub async fn spawn_gated(mut command: Command) -> io::Result<GatedChild> {
    let (hello_read, hello_write) = pipe2(OFlag::O_CLOEXEC).map_err(io::Error::from)?;
    let (gate_read, gate_write) = pipe2(OFlag::O_CLOEXEC).map_err(io::Error::from)?;
    let hello_fd = hello_write.as_raw_fd();
    let gate_read_fd = gate_read.as_raw_fd();
    let gate_write_fd = gate_write.as_raw_fd();
    command.process_group(0);
    // SAFETY: the hook runs between fork and exec and makes only async-signal-safe system
    // calls on file descriptors that the parent keeps open until `spawn` has returned.
    unsafe {
        command.pre_exec(move || hold_at_gate(hello_fd, gate_read_fd, gate_write_fd));
    }
    let spawning = tokio::task::spawn_blocking(move || {
        let spawned = command.spawn();
        // The child holds its own copies until it execs or exits; the reader below sees end of
        // file once both are gone, whatever happened to the child.
        drop(hello_write);
        drop(gate_read);
        spawned
    });
    let hello = tokio::task::spawn_blocking(move || read_hello(&hello_read))
        .await
        .map_err(join_error)??;
    match hello {
        Some(pid) => Ok(GatedChild {
            pid,
            gate: gate_write,
            spawning,
        }),
        None => {
            // The child never reached the gate: the spawn failed and says why.
            let spawned = spawning.await.map_err(join_error)?;
            match spawned {
                Ok(mut child) => {
                    // Unreachable in practice (a child that execs has passed the gate); make
                    // sure it does not run unrecorded.
                    let _ = child.kill();
                    let _ = child.wait();
                    Err(io::Error::other(
                        "the child exec'd without passing the gate",
                    ))
                }
                Err(error) => Err(error),
            }
        }
    }
}

impl GatedChild {
    /// The child's pid, which is also its process group id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Opens the gate: the child execs its program. Returns the child once it has exec'd, or
    /// the exec error (a missing program, say).
    pub async fn release(self) -> io::Result<Child> {
        let written = write(&self.gate, &[1]).map_err(io::Error::from);
        drop(self.gate);
        let spawned = self.spawning.await.map_err(join_error)?;
        written?;
        spawned
    }

    /// Closes the gate without opening it: the child exits without running its program.
    pub async fn abort(self) {
        drop(self.gate);
        // std reaps a child whose pre_exec hook failed before it returns the error.
        if let Ok(Ok(mut child)) = self.spawning.await {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The child's side of the gate. Runs between fork and exec: raw system calls only.
fn hold_at_gate(hello_fd: RawFd, gate_read_fd: RawFd, gate_write_fd: RawFd) -> io::Result<()> {
    // Our copy of the gate's write end would keep the gate open if the parent closed its own.
    let _ = close(gate_write_fd);
    let pid = getpid().as_raw().to_ne_bytes();
    // SAFETY: the descriptors were inherited from the parent, which keeps them open until the
    // spawn returned; in this process nothing else closes them.
    let hello = unsafe { BorrowedFd::borrow_raw(hello_fd) };
    let gate = unsafe { BorrowedFd::borrow_raw(gate_read_fd) };
    loop {
        match write(hello, &pid) {
            Ok(_) => break,
            Err(Errno::EINTR) => continue,
            Err(errno) => return Err(io::Error::from_raw_os_error(errno as i32)),
        }
    }
    let _ = close(hello_fd);
    let mut byte = [0u8; 1];
    loop {
        match read(gate, &mut byte) {
            Ok(1) => break,
            Ok(_) => return Err(io::Error::from_raw_os_error(Errno::ECANCELED as i32)),
            Err(Errno::EINTR) => continue,
            Err(errno) => return Err(io::Error::from_raw_os_error(errno as i32)),
        }
    }
    let _ = close(gate_read_fd);
    Ok(())
}

/// Reads the pid the child writes at the gate; `None` if the child never wrote it.
fn read_hello(hello: &OwnedFd) -> io::Result<Option<u32>> {
    let mut bytes = [0u8; 4];
    let mut filled = 0;
    while filled < bytes.len() {
        match read(hello, &mut bytes[filled..]) {
            Ok(0) => return Ok(None),
            Ok(count) => filled += count,
            Err(Errno::EINTR) => continue,
            Err(errno) => return Err(errno.into()),
        }
    }
    let pid = i32::from_ne_bytes(bytes);
    u32::try_from(pid)
        .map(Some)
        .map_err(|_| io::Error::other(format!("child reported pid {pid}")))
}

fn join_error(error: tokio::task::JoinError) -> io::Error {
    io::Error::other(format!("a blocking task failed: {error}"))
}

/// A step's process group, named by its leader's pid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessGroup {
    pgid: i32,
}

impl ProcessGroup {
    /// The group whose leader is `pid` (a gated child is its own group's leader).
    pub fn led_by(pid: u32) -> ProcessGroup {
        ProcessGroup {
            pgid: i32::try_from(pid).expect("Linux pids fit in an i32"),
        }
    }

    pub fn id(self) -> u32 {
        self.pgid.unsigned_abs()
    }

    /// Sends `signal` to every member; `false` when the group has no member left.
    pub fn signal(self, signal: Signal) -> bool {
        !matches!(killpg(Pid::from_raw(self.pgid), signal), Err(Errno::ESRCH))
    }

    /// Reaps the members that became our children (orphans handed to this process as a child
    /// subreaper), then tells whether any member is left.
    ///
    /// Call it only once the leader has been reaped: `waitpid(-pgid)` would otherwise reap the
    /// leader under the nose of whoever waits for its exit status.
    pub fn is_empty_after_reaping(self) -> bool {
        loop {
            match waitpid(Pid::from_raw(-self.pgid), Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) => break,
                Ok(_) => continue,
                Err(Errno::EINTR) => continue,
                Err(_) => break,
            }
        }
        matches!(killpg(Pid::from_raw(self.pgid), None), Err(Errno::ESRCH))
    }
}

/// A group leader being waited for on a blocking thread.
#[derive(Debug)]
pub struct Leader {
    waiting: Option<JoinHandle<io::Result<ExitStatus>>>,
    status: Option<Result<ExitStatus, String>>,
}

impl Leader {
    /// Starts waiting for `child`.
    pub fn wait_for(mut child: Child) -> Leader {
        Leader {
            waiting: Some(tokio::task::spawn_blocking(move || child.wait())),
            status: None,
        }
    }

    /// Waits until the leader has exited; its exit status, or why it could not be had.
    ///
    /// Cancel-safe: the wait stays in place when this future is dropped (as the losing branch
    /// of a `select!`), and the next call picks it up.
    pub async fn exited(&mut self) -> Result<ExitStatus, String> {
        if let Some(waiting) = self.waiting.as_mut() {
            let status = match waiting.await {
                Ok(Ok(status)) => Ok(status),
                Ok(Err(error)) => Err(format!("waiting for the step's process failed: {error}")),
                Err(error) => Err(format!("waiting for the step's process failed: {error}")),
            };
            self.waiting = None;
            self.status = Some(status);
        }
        self.status
            .clone()
            .expect("the status is set once the wait has finished")
    }

    /// Waits until the leader has exited or `deadline` has passed; whether it exited.
    pub async fn exited_by(&mut self, deadline: Instant) -> bool {
        if self.status.is_some() {
            return true;
        }
        tokio::time::timeout_at(deadline, self.exited())
            .await
            .is_ok()
    }

    /// The exit status, if the leader has been reaped.
    pub fn status(&self) -> Option<&Result<ExitStatus, String>> {
        self.status.as_ref()
    }
}

/// What ending a group took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ended {
    /// SIGKILL was needed: something outlived the grace period after SIGTERM.
    pub was_killed: bool,
    /// Members were still there after SIGKILL and [`KILL_VERIFY_TIMEOUT`].
    pub has_survivors: bool,
}

/// Ends a group: SIGTERM to every member, `grace` for the leader and then the whole group to
/// go, SIGKILL to whatever is left, and a check that nothing is.
pub async fn terminate(group: ProcessGroup, leader: &mut Leader, grace: Duration) -> Ended {
    group.signal(Signal::SIGTERM);
    if wait_until_empty(group, leader, Instant::now() + grace).await {
        return Ended {
            was_killed: false,
            has_survivors: false,
        };
    }
    group.signal(Signal::SIGKILL);
    let is_empty = wait_until_empty(group, leader, Instant::now() + KILL_VERIFY_TIMEOUT).await;
    Ended {
        was_killed: true,
        has_survivors: !is_empty,
    }
}

/// After the leader exited by itself: ends whatever it left behind in its group (background
/// children), so nothing a step started outlives the step unrecorded. `None` if nothing was left.
pub async fn end_leftovers(
    group: ProcessGroup,
    leader: &mut Leader,
    grace: Duration,
) -> Option<Ended> {
    if leader.status().is_some() && group.is_empty_after_reaping() {
        return None;
    }
    Some(terminate(group, leader, grace).await)
}

/// Waits for the leader to exit and the group to empty, until `deadline`.
async fn wait_until_empty(group: ProcessGroup, leader: &mut Leader, deadline: Instant) -> bool {
    if !leader.exited_by(deadline).await {
        return false;
    }
    loop {
        if group.is_empty_after_reaping() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(GROUP_POLL_INTERVAL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::liveness;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime builds")
    }

    #[test]
    fn a_gated_child_runs_only_once_released() {
        runtime().block_on(async {
            let dir = tempfile::tempdir().expect("temp dir");
            let marker = dir.path().join("ran");
            let mut command = Command::new("sh");
            command
                .arg("-c")
                .arg(format!("touch '{}'", marker.display()));
            let gated = spawn_gated(command).await.expect("spawn");
            let identity = liveness::identity_of(gated.pid())
                .expect("read /proc")
                .expect("the gated child exists");
            assert_eq!(identity.pid, gated.pid());
            tokio::time::sleep(Duration::from_millis(100)).await;
            assert!(!marker.exists(), "the program ran before the gate opened");
            let mut child = gated.release().await.expect("release");
            assert!(child.wait().expect("wait").success());
            assert!(marker.exists());
        });
    }

    #[test]
    fn an_aborted_child_never_runs() {
        runtime().block_on(async {
            let dir = tempfile::tempdir().expect("temp dir");
            let marker = dir.path().join("ran");
            let mut command = Command::new("sh");
            command
                .arg("-c")
                .arg(format!("touch '{}'", marker.display()));
            let gated = spawn_gated(command).await.expect("spawn");
            let pid = gated.pid();
            gated.abort().await;
            assert!(!marker.exists());
            assert_eq!(
                liveness::identity_of(pid).expect("read /proc"),
                None,
                "the aborted child is reaped"
            );
        });
    }

    #[test]
    fn a_missing_program_fails_at_release() {
        runtime().block_on(async {
            let command = Command::new("/nonexistent/program");
            let gated = spawn_gated(command).await.expect("the fork succeeds");
            let error = gated.release().await.expect_err("exec fails");
            assert_eq!(error.kind(), io::ErrorKind::NotFound);
        });
    }

    #[test]
    fn terminate_ends_grandchildren_too() {
        runtime().block_on(async {
            let _ = nix::sys::prctl::set_child_subreaper(true);
            let mut command = Command::new("sh");
            command.arg("-c").arg("sleep 100 & sleep 100 & wait");
            let gated = spawn_gated(command).await.expect("spawn");
            let group = ProcessGroup::led_by(gated.pid());
            let child = gated.release().await.expect("release");
            let mut leader = Leader::wait_for(child);
            tokio::time::sleep(Duration::from_millis(200)).await;
            let ended = terminate(group, &mut leader, Duration::from_secs(3)).await;
            assert!(!ended.has_survivors);
            assert!(group.is_empty_after_reaping());
        });
    }
}
