//! Step processes: spawned behind a gate in their own process group, so the journal can name
//! them before they run, and ended as a whole group by the crate's one process-group core
//! ([`crate::process_group`]), run on a blocking thread.
//!
//! # The gate
//!
//! `StepRunning` must be durable before the step's program runs, yet it carries the child's
//! identity (pid, start time, boot id), which exists only once the child does. So the child is
//! forked with a `pre_exec` hook that, after std has put it in its own process group, writes its
//! pid to a "hello" pipe and then blocks reading one byte from a "gate" pipe. The parent reads
//! the pid, reads the identity (`platform`), commits `StepRunning`, and only then writes the
//! byte: the child execs. If the parent closes the gate instead — which dropping a
//! [`GatedChild`] without [`GatedChild::release`] does — the hook fails with `ECANCELED`, the
//! child exits without ever running the program, and std reaps it.
//!
//! std's `spawn` returns only once the child has exec'd (it waits on its own error pipe), so the
//! spawn runs on a blocking thread while the parent works the gate.
//!
//! Once through the gate, the hook marks every descriptor above 2 close-on-exec: the step
//! starts with its stdin, its output pipe and nothing else of the runner's, whatever a
//! library or a launcher left open without `O_CLOEXEC`.
//!
//! Invariant: the hook makes only raw system calls (getpid, write, read, close, fcntl or
//! close_range), which are async-signal-safe, as code between fork and exec in a threaded
//! process must be.
//! Invariant: a gated child runs its program only if `release` wrote the gate's byte.
//! Invariant: a group is reported gone only when the core saw no live member in it.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use nix::errno::Errno;
use nix::unistd::{close, getpid, read, write};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::event::ProcessIdentity;
use crate::platform;
use crate::process_group::{self as core, GroupEnd, Reaping};

/// How long a group has, after SIGKILL, to be seen gone before we report members left.
pub use crate::process_group::KILL_VERIFY_TIMEOUT;

/// A child forked and held at the gate: it exists (and has an identity) but has not exec'd.
///
/// A guard: dropped without [`GatedChild::release`], it closes the gate, so the child exits
/// without running its program and is reaped (by the spawning thread, shortly after).
#[derive(Debug)]
pub struct GatedChild {
    pid: u32,
    /// `None` once released.
    gate: Option<OwnedFd>,
    /// `None` once released.
    spawning: Option<JoinHandle<io::Result<Child>>>,
    /// Set before the gate's byte is written: a child that exec'd without it is killed.
    is_released: Arc<AtomicBool>,
}

/// Forks `command` in a new process group and holds it at the gate. The returned child has
/// not run its program yet: [`GatedChild::release`] lets it, dropping the guard aborts it.
///
/// Spawns must not overlap: a child forked while another is gated would inherit that one's
/// gate and delay its abort until it execs itself.
pub async fn spawn_gated(mut command: Command) -> io::Result<GatedChild> {
    let (hello_read, hello_write) = platform::pipe_cloexec()?;
    let (gate_read, gate_write) = platform::pipe_cloexec()?;
    let hello_fd = hello_write.as_raw_fd();
    let gate_read_fd = gate_read.as_raw_fd();
    let gate_write_fd = gate_write.as_raw_fd();
    command.process_group(0);
    // SAFETY: the hook runs between fork and exec and makes only async-signal-safe system
    // calls on file descriptors that the parent keeps open until `spawn` has returned.
    unsafe {
        command.pre_exec(move || hold_at_gate(hello_fd, gate_read_fd, gate_write_fd));
    }
    let is_released = Arc::new(AtomicBool::new(false));
    let is_released_at_spawn = Arc::clone(&is_released);
    let spawning = tokio::task::spawn_blocking(move || {
        let spawned = command.spawn();
        // The child holds its own copies until it execs or exits; the reader below sees end of
        // file once both are gone, whatever happened to the child.
        drop(hello_write);
        drop(gate_read);
        match spawned {
            Ok(mut child) if !is_released_at_spawn.load(Ordering::SeqCst) => {
                // The gate never opened, so the child did not exec: it died at the gate (a
                // signal from outside, say). It ran nothing; how it ended is its status, for
                // `release` to hand over like any child's.
                if has_exited(&mut child) {
                    return Ok(child);
                }
                // Unreachable in practice: a child execs only once `release` wrote the gate's
                // byte. Make sure it does not run unrecorded.
                let _ = child.kill();
                let _ = child.wait();
                Err(io::Error::other(
                    "the child exec'd without passing the gate",
                ))
            }
            spawned => spawned,
        }
    });
    let hello = tokio::task::spawn_blocking(move || read_hello(&hello_read))
        .await
        .map_err(join_error)??;
    match hello {
        Some(pid) => Ok(GatedChild {
            pid,
            gate: Some(gate_write),
            spawning: Some(spawning),
            is_released,
        }),
        None => {
            // The child never reached the gate: the spawn failed and says why.
            drop(gate_write);
            match spawning.await.map_err(join_error)? {
                Ok(mut child) => {
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
    /// the exec error (a missing program, say). A child that died at the gate before it opened
    /// (killed from outside) ran nothing and is returned all the same: its exit status says
    /// how the step ended.
    pub async fn release(mut self) -> io::Result<Child> {
        let (Some(gate), Some(spawning)) = (self.gate.take(), self.spawning.take()) else {
            unreachable!("only release takes the gate and the spawn, and it consumes the guard")
        };
        self.is_released.store(true, Ordering::SeqCst);
        let written = write(&gate, &[1]).map_err(io::Error::from);
        drop(gate);
        let spawned = spawning.await.map_err(join_error)?;
        match (written, spawned) {
            // Nobody read the byte: the child was gone from the gate, and never exec'd.
            (Err(error), Ok(mut child)) => {
                if has_exited(&mut child) {
                    Ok(child)
                } else {
                    let _ = child.kill();
                    let _ = child.wait();
                    Err(error)
                }
            }
            (written, spawned) => {
                written?;
                spawned
            }
        }
    }
}

impl Drop for GatedChild {
    /// Aborts a child that was not released: closing the gate makes its hook fail, so it
    /// exits without running its program, and the spawning thread's `spawn` reaps it.
    fn drop(&mut self) {
        drop(self.gate.take());
    }
}

/// Whether a child that can no longer be at its gate (its end of the gate is closed) has
/// exited. Its exit closes its descriptors just before it becomes reapable, so a few looks,
/// bounded, close that window.
fn has_exited(child: &mut Child) -> bool {
    for _ in 0..100 {
        match child.try_wait() {
            Ok(Some(_)) => return true,
            Ok(None) => std::thread::sleep(Duration::from_millis(1)),
            Err(_) => return false,
        }
    }
    false
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
    platform::mark_cloexec_from(3)
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

/// A step's process group, named by its leader.
#[derive(Debug, Clone)]
pub struct ProcessGroup {
    pid: u32,
    /// The leader's identity, which the core's ownership check needs, or why it could not be
    /// read.
    leader: Result<ProcessIdentity, String>,
}

impl ProcessGroup {
    /// The group whose leader is `pid` (a gated child is its own group's leader). Call it
    /// before the leader is reaped: its identity is read now, while its pid still names it.
    pub fn led_by(pid: u32) -> ProcessGroup {
        let leader = match platform::identity_of(pid) {
            Ok(Some(identity)) => Ok(identity),
            Ok(None) => Err(format!("process {pid} was gone before its group was named")),
            Err(error) => Err(format!(
                "cannot read the identity of process {pid}: {error}"
            )),
        };
        ProcessGroup { pid, leader }
    }

    pub fn id(&self) -> u32 {
        self.pid
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
    /// Members were still there after SIGKILL and [`KILL_VERIFY_TIMEOUT`] (or the group could
    /// not be looked at, so it was not verified empty).
    pub has_survivors: bool,
}

/// Ends a group: SIGTERM to every member, `grace` for the group to empty, SIGKILL to whatever
/// is left, and a check that nothing is; then collects the leader's exit status.
pub async fn terminate(group: ProcessGroup, leader: &mut Leader, grace: Duration) -> Ended {
    let end = end_group(&group, grace).await;
    collect_leader(leader, end).await;
    match end {
        Some(GroupEnd::NotOurs | GroupEnd::AlreadyEmpty | GroupEnd::Terminated) => Ended {
            was_killed: false,
            has_survivors: false,
        },
        Some(GroupEnd::Killed) => Ended {
            was_killed: true,
            has_survivors: false,
        },
        Some(GroupEnd::Survived) | None => Ended {
            was_killed: true,
            has_survivors: true,
        },
    }
}

/// Interrupts a group: SIGINT to every member (ownership checked as for ending it), `grace`
/// for the leader to exit, then [`terminate`]: SIGTERM, `grace`, SIGKILL to whatever is left.
pub async fn interrupt(group: ProcessGroup, leader: &mut Leader, grace: Duration) -> Ended {
    if let Ok(identity) = &group.leader {
        let identity = identity.clone();
        let sent = tokio::task::spawn_blocking(move || {
            let runner = platform::current_identity()?;
            core::signal(&identity, Some(&runner), nix::sys::signal::Signal::SIGINT)
        })
        .await;
        match sent {
            Ok(Ok(_)) => {}
            Ok(Err(error)) => super::log(&format!(
                "cannot interrupt process group {}: {error}; it is ended",
                group.pid
            )),
            Err(error) => super::log(&format!(
                "cannot interrupt process group {}: {}; it is ended",
                group.pid,
                join_error(error)
            )),
        }
        leader.exited_by(Instant::now() + grace).await;
    }
    terminate(group, leader, grace).await
}

/// After the leader exited by itself: ends whatever it left behind in its group (background
/// children), so nothing a step started outlives the step unrecorded. `None` if nothing was left.
pub async fn end_leftovers(
    group: ProcessGroup,
    leader: &mut Leader,
    grace: Duration,
) -> Option<Ended> {
    let end = end_group(&group, grace).await;
    collect_leader(leader, end).await;
    match end {
        // The leader's pid is held by another process only once our group has emptied.
        Some(GroupEnd::NotOurs | GroupEnd::AlreadyEmpty) => None,
        Some(GroupEnd::Terminated) => Some(Ended {
            was_killed: false,
            has_survivors: false,
        }),
        Some(GroupEnd::Killed) => Some(Ended {
            was_killed: true,
            has_survivors: false,
        }),
        Some(GroupEnd::Survived) | None => Some(Ended {
            was_killed: true,
            has_survivors: true,
        }),
    }
}

/// Runs the core's [`core::end`] on a blocking thread, with this runner as the groups' owner,
/// reaping the zombie members this runner inherited as their subreaper (never the leader:
/// [`Leader`] waits for it). `None`
/// when the group could not be ended or looked at; runner.log says why.
async fn end_group(group: &ProcessGroup, grace: Duration) -> Option<GroupEnd> {
    let leader = match &group.leader {
        Ok(leader) => leader.clone(),
        Err(why) => {
            super::log(&format!(
                "cannot end process group {}: {why}; it is reported with survivors",
                group.pid
            ));
            return None;
        }
    };
    // The runner owns its steps' groups: once a leader is gone, a member is ours when its
    // ancestry leads here (the runner is their child subreaper).
    let ended = tokio::task::spawn_blocking(move || {
        let runner = platform::current_identity()?;
        core::end(&leader, Some(&runner), grace, Reaping::ZombieMembers)
    })
    .await;
    match ended {
        Ok(Ok(end)) => Some(end),
        Ok(Err(error)) => {
            super::log(&format!(
                "ending process group {} failed: {error}; it is reported with survivors",
                group.pid
            ));
            None
        }
        Err(error) => {
            super::log(&format!(
                "ending process group {} failed: {}",
                group.pid,
                join_error(error)
            ));
            None
        }
    }
}

/// Collects the leader's exit status once the core saw no live member: the leader has exited
/// then, and its waiter returns at once. A group with survivors is not waited for again.
async fn collect_leader(leader: &mut Leader, end: Option<GroupEnd>) {
    let is_leader_gone = matches!(
        end,
        Some(GroupEnd::AlreadyEmpty | GroupEnd::Terminated | GroupEnd::Killed | GroupEnd::NotOurs)
    );
    let deadline = if is_leader_gone {
        Instant::now() + KILL_VERIFY_TIMEOUT
    } else {
        Instant::now()
    };
    leader.exited_by(deadline).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime builds")
    }

    fn touch_command(marker: &std::path::Path) -> Command {
        let mut command = Command::new("sh");
        command
            .arg("-c")
            .arg(format!("touch '{}'", marker.display()));
        command
    }

    #[test]
    fn a_gated_child_runs_only_once_released() {
        runtime().block_on(async {
            let dir = tempfile::tempdir().expect("temp dir");
            let marker = dir.path().join("ran");
            let gated = spawn_gated(touch_command(&marker)).await.expect("spawn");
            let identity = platform::identity_of(gated.pid())
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

    /// The guard: a gated child dropped without `release` (an early return, a `?`) never runs
    /// its program and is reaped.
    #[test]
    fn a_dropped_gated_child_never_runs_and_is_reaped() {
        runtime().block_on(async {
            let dir = tempfile::tempdir().expect("temp dir");
            let marker = dir.path().join("ran");
            let gated = spawn_gated(touch_command(&marker)).await.expect("spawn");
            let pid = gated.pid();
            assert!(
                platform::process(pid).expect("read").is_some(),
                "held at the gate"
            );
            drop(gated);
            // Bounded wait for the spawning thread to reap it.
            let mut is_reaped = false;
            for _ in 0..500 {
                if platform::process(pid).expect("read").is_none() {
                    is_reaped = true;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            assert!(is_reaped, "the aborted child is reaped");
            assert!(!marker.exists(), "the aborted child never ran its program");
        });
    }

    /// Regression (found by crash_kill): a step's process killed while it waited at its gate
    /// was reported as "cannot run the step's program: Broken pipe" (exit 126). It ran
    /// nothing, and its status says how it ended: the step is followed like any other and
    /// ends killed by the signal.
    #[test]
    fn a_gated_child_killed_at_the_gate_is_released_with_its_status() {
        use std::os::unix::process::ExitStatusExt;
        runtime().block_on(async {
            let dir = tempfile::tempdir().expect("temp dir");
            let marker = dir.path().join("ran");
            let gated = spawn_gated(touch_command(&marker)).await.expect("spawn");
            let pid = nix::unistd::Pid::from_raw(i32::try_from(gated.pid()).expect("a pid"));
            nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL).expect("kill");
            let mut child = gated
                .release()
                .await
                .expect("the dead child is handed over");
            let status = child.wait().expect("its status");
            assert_eq!(status.signal(), Some(9), "{status}");
            assert!(!marker.exists(), "it never ran its program");
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
    fn terminate_ends_grandchildren_too_and_keeps_the_leaders_status() {
        runtime().block_on(async {
            let _ = platform::become_child_subreaper();
            let mut command = Command::new("sh");
            command.arg("-c").arg("sleep 100 & sleep 100 & wait");
            let gated = spawn_gated(command).await.expect("spawn");
            let group = ProcessGroup::led_by(gated.pid());
            let child = gated.release().await.expect("release");
            let leader_identity = platform::identity_of(child.id())
                .expect("read")
                .expect("the leader is alive");
            let mut leader = Leader::wait_for(child);
            // Bounded wait for the shell's two sleeps.
            for _ in 0..500 {
                let members = platform::group_members(group.id()).expect("members");
                if members.iter().filter(|member| member.is_alive()).count() >= 3 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let ended = terminate(group, &mut leader, Duration::from_secs(30)).await;
            assert_eq!(
                ended,
                Ended {
                    was_killed: false,
                    has_survivors: false
                }
            );
            assert!(core::is_empty(&leader_identity).expect("probe"));
            let status = leader.status().cloned().expect("the leader was reaped");
            let status = status.expect("its status was had");
            assert_eq!(
                std::os::unix::process::ExitStatusExt::signal(&status),
                Some(15),
                "SIGTERM ended the leader"
            );
        });
    }
}
