//! What only the operating system knows, behind one small platform-neutral API: facts about
//! processes (identity, zombie state, process-group members, children, command name), making
//! this process a child subreaper, preallocating a file, a close-on-exec pipe, and keeping
//! inherited descriptors from reaching the programs this process starts.
//!
//! Each fact comes from one implementation per operating system, chosen at compile time:
//! `linux.rs` reads `/proc`; `macos.rs` asks the kernel through `proc_pidinfo`,
//! `proc_list*pids` and `sysctl`, and takes every decision on the answers in
//! `macos_facts.rs`, which is pure and unit-tested on Linux too. On any other target the
//! crate refuses to build, rather than pretend to know facts it cannot.
//!
//! | fact | Linux | macOS |
//! |---|---|---|
//! | start time | `/proc/<pid>/stat` field 22, clock ticks since boot | `pbi_start_tvsec`/`tvusec`, microseconds since the Unix epoch |
//! | boot id | `/proc/sys/kernel/random/boot_id` | `kern.bootsessionuuid` (else `kern.boottime`) |
//! | zombie | state `Z`, `X` | `p_stat == SZOMB` |
//! | group members, children | a scan of `/proc` | `proc_listpgrppids`, `proc_listchildpids` |
//! | another user's process | readable (unless `/proc` is mounted `hidepid`) | no start time (`start_time: None`) |
//! | child subreaper | `PR_SET_CHILD_SUBREAPER` | none: orphans go to launchd, which reaps them |
//! | preallocation | `posix_fallocate` | `F_PREALLOCATE`, else zeros written |
//! | close-on-exec pipe | `pipe2(O_CLOEXEC)` | `pipe`, then `FD_CLOEXEC` on both ends |
//! | a directory's files changing | inotify | none: a watch only sleeps, its caller polls |
//! | command name | `/proc/<pid>/comm` | not known yet (`None`): the portable fallback |
//! | descriptors from N on: close-on-exec | `close_range(CLOSE_RANGE_CLOEXEC)` | `fcntl` on each up to the soft `RLIMIT_NOFILE` (portable fallback) |
//! | descriptors from N on: closed | `close_range`, else a walk of `/proc/self/fd` | `close` on each up to the soft `RLIMIT_NOFILE` (portable fallback) |
//! | a Unix socket peer's user | `SO_PEERCRED` | `getpeereid` |
//! | sending on a socket whose peer left | `send(MSG_NOSIGNAL)` | `SO_NOSIGPIPE` on the socket |
//! | longest socket path | 107 bytes | 103 bytes |
//! | a path that names an open directory | `/proc/self/fd/<fd>`, checked to lead to it | none |
//! | a socket peer of another user namespace | `/proc/<pid>/ns/user` differs: refused | none |
//! | the overflow uid (shares no commits) | `/proc/sys/kernel/overflowuid` | none |
//! | who holds the journal's write lock | a scan of `/proc/<pid>/fdinfo` | not known (`None`) |
//!
//! What a process nobody can see means is decided once, in [`crate::liveness`]: a pid that no
//! process holds, or that a process holds whose start time this user may not read, is not
//! the process we recorded (ours ran as this user, and one's own processes are always
//! readable), so a recorded process is judged dead then, never alive for as long as a
//! stranger keeps the pid. An error from this module means the platform could not look at
//! all; it is never an answer about a process.
//!
//! The judgements built on these facts live in the domain modules: whether a recorded process
//! is alive in [`crate::liveness`], whether a process group is ours and how it is ended in
//! [`crate::process_group`].
//!
//! Invariant: this is the only module that reads `/proc` or calls an API of one operating
//! system; everything else calls it (or POSIX, which every target has).

use std::fs::File;
use std::io;
use std::os::fd::{OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use crate::event::ProcessIdentity;

#[cfg(target_os = "linux")]
mod linux;
#[cfg(target_os = "linux")]
use linux as os;

#[cfg(target_os = "macos")]
mod macos;
#[cfg(target_os = "macos")]
use macos as os;
#[cfg(any(test, target_os = "macos"))]
mod macos_facts;
pub mod resources;
pub mod space;

#[cfg(not(any(target_os = "linux", target_os = "macos")))]
compile_error!(
    "runjournal knows process facts only on Linux and macOS: src/platform/ needs an \
     implementation for this target"
);

/// One process as the operating system shows it now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessInfo {
    pub pid: u32,
    /// The parent's pid (0 for a process without one, such as init).
    pub parent_pid: u32,
    /// The id of the process group it belongs to (0 when it shows none: a process the kernel
    /// is tearing down).
    pub group_id: u32,
    /// When it started, in the platform's own unit (on Linux, clock ticks since boot; on
    /// macOS, microseconds since the Unix epoch). Only ever compared for equality: a
    /// different value under the same pid, in the same boot, is another process. `None` when
    /// this user may not read it (on macOS, another user's process unless we are root): such
    /// a process is never taken for one we recorded.
    pub start_time: Option<u64>,
    /// It has exited and waits for its parent to reap it (on Linux, state `Z`, or `X` while
    /// it is being removed; on macOS, `SZOMB`).
    pub is_zombie: bool,
}

impl ProcessInfo {
    /// Whether the process counts as alive. The one zombie rule of the crate: a zombie has
    /// exited and only waits to be reaped, by a parent that may never do it, so it is not
    /// alive — neither as a recorded process (`liveness`) nor as a member of a group
    /// (`process_group`).
    pub fn is_alive(&self) -> bool {
        !self.is_zombie
    }

    /// The identity of this process, in the boot `boot_id`, its pid read in the PID namespace
    /// `pid_namespace` ([`pid_namespace`]); `None` when its start time is not ours to read.
    pub fn identity(&self, boot_id: String, pid_namespace: Option<u64>) -> Option<ProcessIdentity> {
        Some(ProcessIdentity {
            pid: self.pid,
            start_time: self.start_time?,
            boot_id,
            pid_namespace,
        })
    }
}

/// The id of the current boot (on Linux, `/proc/sys/kernel/random/boot_id`; on macOS,
/// `kern.bootsessionuuid`): it changes at every reboot, so a process recorded under another
/// one is gone.
pub fn boot_id() -> io::Result<String> {
    os::boot_id()
}

/// How long the host has been up, counting time suspended, in ms: a clock that no change of
/// the wall clock moves. On Linux, `/proc/uptime`, read as a file so that nothing which fakes
/// a process's clocks (a preloaded library) fakes it; `None` where it cannot be read, and on
/// macOS for now.
pub fn uptime_ms() -> Option<u64> {
    os::uptime_ms()
}

/// The PID namespace whose numbers this process sees and records as pids: on Linux, the inode
/// of `/proc/self/ns/pid` (the same number `lsns` shows); `None` where the platform has no PID
/// namespaces (macOS, or a Linux kernel without `/proc/self/ns`). A pid names one process only
/// within one namespace: a process in a sandbox or container with a namespace of its own sees
/// other numbers, and not at all the processes outside it.
///
/// Fails when `/proc` was mounted for another namespace than this process's (`/proc/self`
/// is not this process, as after `unshare --pid --fork` without `--mount-proc`): no pid read
/// from it would mean what this process means by it.
pub fn pid_namespace() -> io::Result<Option<u64>> {
    os::pid_namespace()
}

/// What the operating system shows of `pid` now; `None` when no process has that pid (or
/// none this user can see: Linux's `/proc` mounted `hidepid=2` hides other users'
/// processes). A zombie is shown, as one.
pub fn process(pid: u32) -> io::Result<Option<ProcessInfo>> {
    os::process(pid)
}

/// The identity (pid, start time, boot id, the PID namespace the pid is read in) of the
/// process holding `pid` now; `None` when no
/// process holds it. A zombie still has one. A process whose start time this user may not
/// read has none we could use: that is an error (`PermissionDenied`).
pub fn identity_of(pid: u32) -> io::Result<Option<ProcessIdentity>> {
    let Some(info) = process(pid)? else {
        return Ok(None);
    };
    info.identity(boot_id()?, pid_namespace()?)
        .map(Some)
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("the start time of process {pid} is not readable by this user"),
            )
        })
}

/// The identity of this process.
pub fn current_identity() -> io::Result<ProcessIdentity> {
    identity_of(std::process::id())?.ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            "this process is not among the system's processes",
        )
    })
}

/// Every process in process group `group_id`, zombies included (each says whether it is one),
/// in no particular order. Empty when the group has no member left.
pub fn group_members(group_id: u32) -> io::Result<Vec<ProcessInfo>> {
    os::group_members(group_id)
}

/// The children of `pid` (processes whose parent it is now, zombies included), in no
/// particular order. A descendant that was orphaned and handed to a subreaper (or, on
/// macOS, to launchd) is that process's child, not its original parent's: walking children
/// from a process finds only the descendants still attached to it.
pub fn children(pid: u32) -> io::Result<Vec<ProcessInfo>> {
    os::children(pid)
}

/// Makes this process the child subreaper of its descendants: an orphan among them becomes
/// its child (instead of init's), so it can see and reap it. Linux only: on macOS, which has
/// no subreaper, it fails with `Unsupported`, and orphans go to launchd, which reaps them.
pub fn become_child_subreaper() -> io::Result<()> {
    os::become_child_subreaper()
}

/// This process's file mode creation mask. Read by setting it to `0o077` and back at once: a
/// file another thread creates in between gets the stricter mask, never a looser one.
pub fn umask() -> u32 {
    use nix::sys::stat::{Mode, umask};
    let old = umask(Mode::from_bits_truncate(0o077));
    umask(old);
    // `mode_t` is a u32 on Linux and a u16 on macOS.
    #[allow(clippy::useless_conversion)]
    u32::from(old.bits())
}

/// Sets the file mode creation mask. Async-signal-safe (one system call): it may run between
/// fork and exec, as a `pre_exec` hook.
pub fn set_umask(mask: u32) {
    use nix::sys::stat::{Mode, umask};
    #[allow(clippy::useless_conversion, clippy::unnecessary_cast)]
    let bits = (mask & 0o777) as nix::libc::mode_t;
    umask(Mode::from_bits_truncate(bits));
}

/// Asks the kernel to SIGKILL this process when the thread that forked it exits, and exits at
/// once if that happened already. For a child that must not outlive the one waiting for it (a
/// completion hook dies with its deliverer, so a delivery found abandoned is not still
/// running). Async-signal-safe; a `pre_exec` hook. `parent` is the forking process's pid. On
/// macOS there is no such request: nothing is done.
pub fn die_with_parent(parent: u32) -> io::Result<()> {
    os::die_with_parent(parent)
}

/// Allocates `bytes` of real blocks to `file` from its start (not a sparse file): deleting
/// it frees that much space. A full disk fails with a capacity error.
pub fn preallocate(file: &File, bytes: u64) -> io::Result<()> {
    os::preallocate(file, bytes)
}

/// A handle on one process that outlives its pid: a signal sent through it reaches that process
/// or, once it has exited, nobody — never a process that got its pid since (Linux's pidfd).
#[derive(Debug)]
pub struct ProcessHandle {
    fd: OwnedFd,
}

impl ProcessHandle {
    /// Sends `signal` to the process; `Ok(false)` when it has exited (it may be a zombie,
    /// which signals do not reach).
    pub fn signal(&self, signal: nix::sys::signal::Signal) -> io::Result<bool> {
        os::pidfd_send_signal(&self.fd, signal)
    }

    /// Sleeps until the process has exited (it may be a zombie still) or `timeout` passed:
    /// whether it has exited. One `poll` on the descriptor, which becomes readable when the
    /// process exits: the caller wakes at that moment, not at its next look.
    pub fn wait_exited(&self, timeout: Duration) -> io::Result<bool> {
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        use std::os::fd::AsFd;
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let left = PollTimeout::try_from(left).unwrap_or(PollTimeout::MAX);
            let mut fds = [PollFd::new(self.fd.as_fd(), PollFlags::POLLIN)];
            match poll(&mut fds, left) {
                Ok(0) => return Ok(false),
                Ok(_) => return Ok(true),
                Err(nix::errno::Errno::EINTR) => {
                    if std::time::Instant::now() >= deadline {
                        return Ok(false);
                    }
                }
                Err(error) => return Err(error.into()),
            }
        }
    }
}

/// A [`ProcessHandle`] on the process holding `pid` now; `Ok(None)` when no process holds it.
/// Fails with `ErrorKind::Unsupported` where the platform has none (macOS; Linux before 5.3):
/// the caller then falls back to a check of the identity right before `kill`.
///
/// The handle names whatever process held the pid when it was opened: check that process's
/// identity after opening it, and the handle is known to name the recorded process (a pid is
/// not handed to another process while its holder, zombie included, exists).
pub fn open_process(pid: u32) -> io::Result<Option<ProcessHandle>> {
    Ok(os::pidfd_open(pid)?.map(|fd| ProcessHandle { fd }))
}

/// A pipe, (read end, write end), both close-on-exec. On Linux they are from the start, so
/// no child spawned at the same moment by another thread inherits them across its exec; on
/// macOS (no `pipe2`) they become so just after, which is safe only while no other thread
/// forks meanwhile (see `macos.rs`).
pub fn pipe_cloexec() -> io::Result<(OwnedFd, OwnedFd)> {
    os::pipe_cloexec()
}

/// A watch on the files of one directory: a follower sleeps on it instead of a fixed delay
/// and wakes as soon as a file there is written, made, renamed or removed. On Linux it is an
/// inotify watch; where the platform has none (macOS here) it only sleeps, and the caller's
/// bounded polling is the wake-up.
#[derive(Debug)]
pub struct DirWatch {
    inner: os::DirWatch,
}

/// Watches the files of `dir` named in `names` (all its files when `names` is empty; not its
/// subdirectories' files).
pub fn watch_dir(dir: &Path, names: &[&str]) -> io::Result<DirWatch> {
    Ok(DirWatch {
        inner: os::DirWatch::new(dir, names)?,
    })
}

impl DirWatch {
    /// Waits until a file of the directory changed or `timeout` passed; `true` when woken by a
    /// change. Changes queue up between calls, so one made after a caller looked and before it
    /// waits wakes it at once: look, then wait, never miss.
    pub fn wait(&self, timeout: Duration) -> io::Result<bool> {
        self.inner.wait(timeout)
    }

    /// Watches the files of `dir` too (those named at [`watch_dir`], or all of them).
    pub fn watch_also(&self, dir: &Path) -> io::Result<()> {
        self.inner.watch_also(dir)
    }

    /// Whether changes wake a wait (an inotify watch), or it only sleeps.
    pub fn is_woken_by_changes(&self) -> bool {
        os::DirWatch::IS_WOKEN_BY_CHANGES
    }
}

/// The longest path, in bytes, that a Unix socket can be bound to or connected at
/// (`sun_path` less its terminating NUL).
pub const MAX_SOCKET_PATH_BYTES: usize = os::MAX_SOCKET_PATH_BYTES;

/// A path that leads to the directory open as `dir`, wherever that directory is now, for the
/// calls that take only a path (a socket's bind and connect, a watch): on Linux
/// `/proc/self/fd/<dir>`, checked to lead to it; `None` where there is none (macOS, a missing
/// `/proc`).
pub fn path_through_dir(dir: std::os::fd::BorrowedFd<'_>) -> Option<std::path::PathBuf> {
    os::path_through_dir(dir)
}

/// The effective user id of the process at the other end of a connected Unix socket, as the
/// kernel recorded it: for a client, the process that made the listening socket; for a
/// server, the process that connected.
pub fn peer_uid(socket: &UnixStream) -> io::Result<u32> {
    os::peer_uid(socket)
}

/// Makes writes on `socket` whose peer has gone away fail with `BrokenPipe` instead of raising
/// SIGPIPE, which would end a process that does not ignore it (a host embedding the library
/// may not). Call it once on each socket before [`send_all`].
pub fn no_sigpipe(socket: &UnixStream) -> io::Result<()> {
    os::no_sigpipe(socket)
}

/// Writes all of `bytes` to `socket`, never raising SIGPIPE (see [`no_sigpipe`]).
pub fn send_all(socket: &UnixStream, bytes: &[u8]) -> io::Result<()> {
    os::send_all(socket, bytes)
}

/// Whether the process at the other end of a connected Unix socket is of this process's user,
/// and may share its commits: the same effective uid, and on Linux the same user namespace
/// (a process of another user namespace that maps no uid of ours shows as the overflow uid,
/// whoever it is). Any failure to tell is a no.
pub fn peer_is_this_user(socket: &UnixStream) -> io::Result<bool> {
    os::peer_is_this_user(socket)
}

/// Whether this process may lead or join a commit leader at all: not when its effective uid
/// is the overflow uid (on Linux, `/proc/sys/kernel/overflowuid`: what an unmapped uid shows
/// as, so that every unmapped process of the host would look like it).
pub fn may_share_commits() -> bool {
    os::may_share_commits()
}

/// Connects to the Unix socket at `path` without waiting: a listener whose backlog is full
/// (one that does not accept: stopped, frozen) fails with `WouldBlock` at once rather than
/// leaving the caller blocked. The stream returned is blocking and close-on-exec.
pub fn connect_without_waiting(path: &Path) -> io::Result<UnixStream> {
    use std::os::fd::{AsRawFd, FromRawFd};
    use std::os::unix::ffi::OsStrExt;
    let bytes = path.as_os_str().as_bytes();
    // SAFETY: an all-zero sockaddr_un is a valid value of the type.
    let mut address: nix::libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if bytes.len() >= address.sun_path.len() || bytes.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "a socket path too long for a socket address",
        ));
    }
    address.sun_family = nix::libc::AF_UNIX as nix::libc::sa_family_t;
    for (slot, byte) in address.sun_path.iter_mut().zip(bytes) {
        *slot = *byte as nix::libc::c_char;
    }
    let socket = os::unix_stream_socket()?;
    set_nonblocking(socket.as_raw_fd(), true)?;
    // SAFETY: the address is a live, NUL-terminated sockaddr_un and its size is given; the
    // descriptor is open for the duration of the call (owned by `socket`).
    let result = unsafe {
        nix::libc::connect(
            socket.as_raw_fd(),
            (&raw const address).cast(),
            std::mem::size_of::<nix::libc::sockaddr_un>() as nix::libc::socklen_t,
        )
    };
    if result != 0 {
        let error = io::Error::last_os_error();
        return Err(match error.raw_os_error() {
            Some(nix::libc::EINPROGRESS) => io::Error::from(io::ErrorKind::WouldBlock),
            _ => error,
        });
    }
    set_nonblocking(socket.as_raw_fd(), false)?;
    // SAFETY: `socket` is an open descriptor of a connected stream socket, handed over whole.
    Ok(unsafe { UnixStream::from_raw_fd(std::os::fd::IntoRawFd::into_raw_fd(socket)) })
}

fn set_nonblocking(fd: RawFd, on: bool) -> io::Result<()> {
    // SAFETY: F_GETFL and F_SETFL take and return plain flags on an open descriptor.
    let flags = unsafe { nix::libc::fcntl(fd, nix::libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    let flags = if on {
        flags | nix::libc::O_NONBLOCK
    } else {
        flags & !nix::libc::O_NONBLOCK
    };
    // SAFETY: as above.
    if unsafe { nix::libc::fcntl(fd, nix::libc::F_SETFL, flags) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The process that holds the write lock of the redb journal at `path` (redb's writer byte, an
/// open-file-description lock), as its pid and command name, for messages; `None` when it
/// cannot be found (another user's process, or a platform that does not tell: macOS).
pub fn journal_write_lock_holder(path: &Path) -> Option<(u32, String)> {
    os::journal_write_lock_holder(path)
}

/// This user's other processes that have the file at `path` open — or had it open when it was
/// removed from there (the link `/proc/<pid>/fd/<fd>` then names it `(deleted)`), as pid and
/// command name; empty where the platform does not tell (macOS, for now).
pub fn processes_with_open(path: &Path) -> Vec<(u32, String)> {
    os::processes_with_open(path)
}

/// The process that holds an exclusive `flock` on the file at `path` (a run's projection lock,
/// say), as [`journal_write_lock_holder`] finds the journal's.
pub fn flock_holder(path: &Path) -> Option<(u32, String)> {
    os::flock_holder(path)
}

/// The command name of `pid` (on Linux, `/proc/<pid>/comm`: the program's file name, cut to
/// 15 bytes), for messages that name a process; `None` when no process holds `pid`, or where
/// the platform does not tell it yet (macOS, for now).
pub fn command_name(pid: u32) -> io::Result<Option<String>> {
    #[cfg(target_os = "linux")]
    {
        os::command_name(pid)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = pid;
        Ok(None)
    }
}

/// How many threads this process has now (on Linux, the entries of `/proc/self/task`); `None`
/// where the platform does not tell it yet (macOS, for now).
pub fn thread_count() -> io::Result<Option<usize>> {
    #[cfg(target_os = "linux")]
    {
        os::thread_count().map(Some)
    }
    #[cfg(not(target_os = "linux"))]
    {
        Ok(None)
    }
}

/// Marks every open descriptor from `first` on close-on-exec, so a program this process execs
/// starts without them. Async-signal-safe (raw system calls only, no allocation): it may run
/// between fork and exec, as a `pre_exec` hook.
pub fn mark_cloexec_from(first: RawFd) -> io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        os::mark_cloexec_from(first)
    }
    #[cfg(not(target_os = "linux"))]
    {
        portable::mark_cloexec_from(first)
    }
}

/// Closes every open descriptor from `first` on. For the start of a fresh process that owns
/// none of them yet (the runner): anything else would pull descriptors from under the objects
/// holding them. Not for a `pre_exec` hook (the Linux fallback reads a directory).
pub fn close_from(first: RawFd) -> io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        os::close_from(first)
    }
    #[cfg(not(target_os = "linux"))]
    {
        portable::close_from(first)
    }
}

/// What every POSIX system offers for the descriptor calls above: a walk of every descriptor
/// number below the soft `RLIMIT_NOFILE` (no descriptor can be at or above it). It is Linux's
/// fallback for kernels without `close_range`, and the implementation on other platforms.
mod portable {
    use std::io;
    use std::os::fd::RawFd;

    use nix::libc;

    /// The highest descriptor number worth trying, plus one: the soft limit on open
    /// descriptors, capped so that an unlimited one does not mean billions of calls.
    fn descriptor_bound() -> RawFd {
        /// Above any soft limit a system ships by default (Linux allows up to 2^20).
        const MAX_DESCRIPTORS: libc::rlim_t = 1 << 20;
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes only into `limit`, which is a valid rlimit.
        let answer = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
        let soft = if answer == 0 && limit.rlim_cur != libc::RLIM_INFINITY {
            limit.rlim_cur.min(MAX_DESCRIPTORS)
        } else {
            MAX_DESCRIPTORS
        };
        RawFd::try_from(soft).unwrap_or(RawFd::MAX)
    }

    /// Async-signal-safe: getrlimit and fcntl only.
    pub(super) fn mark_cloexec_from(first: RawFd) -> io::Result<()> {
        for fd in first.max(0)..descriptor_bound() {
            // SAFETY: F_GETFD and F_SETFD read and set a descriptor's flags; a number that is
            // not an open descriptor answers EBADF and is skipped.
            let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
            if flags >= 0 && flags & libc::FD_CLOEXEC == 0 {
                // SAFETY: as above.
                unsafe { libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC) };
            }
        }
        Ok(())
    }

    pub(super) fn close_from(first: RawFd) -> io::Result<()> {
        for fd in first.max(0)..descriptor_bound() {
            // SAFETY: closing a number that is not an open descriptor answers EBADF; the
            // caller owns every descriptor from `first` on (see `super::close_from`).
            unsafe { libc::close(fd) };
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    #[test]
    fn a_socket_peer_is_this_user_and_a_gone_peer_is_a_broken_pipe() {
        let (ours, theirs) = UnixStream::pair().expect("a socket pair");
        let uid = nix::unistd::geteuid().as_raw();
        assert_eq!(peer_uid(&ours).expect("peer of ours"), uid);
        assert_eq!(peer_uid(&theirs).expect("peer of theirs"), uid);
        no_sigpipe(&ours).expect("no SIGPIPE");
        send_all(&ours, b"hello").expect("send");
        drop(theirs);
        // Another test of this process may fork while the peer is open: the child holds a
        // copy of it until its exec closes it (the socket is close-on-exec), and a send meanwhile
        // still lands. So the send is tried until it fails, for a few seconds at most.
        let mut sent = 0;
        let error = loop {
            match send_all(&ours, b"gone") {
                Err(error) => break error,
                Ok(()) => {
                    sent += 1;
                    assert!(sent < 500, "the peer is gone, yet sends still land");
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
            }
        };
        assert_eq!(error.kind(), io::ErrorKind::BrokenPipe, "{error}");
    }

    /// Listens at `path` with a backlog of one, as a process that stopped accepting leaves
    /// its socket once the backlog filled.
    fn listen_with_backlog_of_one(path: &Path) -> OwnedFd {
        use std::os::fd::{AsRawFd, FromRawFd};
        use std::os::unix::ffi::OsStrExt;
        let bytes = path.as_os_str().as_bytes();
        // SAFETY: an all-zero sockaddr_un is a valid value of the type.
        let mut address: nix::libc::sockaddr_un = unsafe { std::mem::zeroed() };
        address.sun_family = nix::libc::AF_UNIX as nix::libc::sa_family_t;
        for (slot, byte) in address.sun_path.iter_mut().zip(bytes) {
            *slot = *byte as nix::libc::c_char;
        }
        // SAFETY: plain socket, bind and listen calls on a descriptor owned here, with a live
        // address of the size given.
        unsafe {
            let fd = nix::libc::socket(nix::libc::AF_UNIX, nix::libc::SOCK_STREAM, 0);
            assert!(fd >= 0, "socket");
            let fd = OwnedFd::from_raw_fd(fd);
            let bound = nix::libc::bind(
                fd.as_raw_fd(),
                (&raw const address).cast(),
                std::mem::size_of::<nix::libc::sockaddr_un>() as nix::libc::socklen_t,
            );
            assert_eq!(bound, 0, "bind");
            assert_eq!(nix::libc::listen(fd.as_raw_fd(), 1), 0, "listen");
            fd
        }
    }

    #[test]
    fn a_connect_never_waits_for_a_listener_that_does_not_accept() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("s.sock");
        assert!(
            connect_without_waiting(&path).is_err(),
            "nothing listens yet"
        );
        let listener = UnixListener::bind(&path).expect("bind");
        let first = connect_without_waiting(&path).expect("a listener with room");
        assert!(peer_is_this_user(&first).expect("peer"), "our own process");
        let (server, _) = listener.accept().expect("accept");
        assert!(peer_is_this_user(&server).expect("peer"));
        drop(listener);
        std::fs::remove_file(&path).expect("remove");
        // Nobody accepts: the backlog fills, and a connect then fails at once rather than
        // wait.
        let _stopped = listen_with_backlog_of_one(&path);
        let mut kept = Vec::new();
        let refused = (0..64).find_map(|_| match connect_without_waiting(&path) {
            Ok(stream) => {
                kept.push(stream);
                None
            }
            Err(error) => Some(error),
        });
        let refused = refused.expect("a full backlog refuses");
        #[cfg(target_os = "linux")]
        assert_eq!(refused.kind(), io::ErrorKind::WouldBlock, "{refused}");
        assert!(!kept.is_empty(), "the backlog had room before it was full");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn the_overflow_uid_shares_no_commits() {
        let overflow: u32 = std::fs::read_to_string("/proc/sys/kernel/overflowuid")
            .expect("overflowuid")
            .trim()
            .parse()
            .expect("a number");
        assert_eq!(
            may_share_commits(),
            nix::unistd::geteuid().as_raw() != overflow
        );
    }

    #[test]
    fn this_process_has_an_identity_of_this_boot() {
        let me = current_identity().expect("identity of this process");
        assert_eq!(me.pid, std::process::id());
        assert_eq!(me.boot_id, boot_id().expect("boot id"));
        assert_eq!(me.pid_namespace, pid_namespace().expect("PID namespace"));
        #[cfg(target_os = "linux")]
        assert!(me.pid_namespace.is_some(), "Linux has PID namespaces");
        let info = process(me.pid).expect("read").expect("this process exists");
        assert_eq!(info.start_time, Some(me.start_time));
        assert!(info.is_alive());
    }

    #[test]
    fn a_child_is_among_the_children_and_the_group_members() {
        use std::os::unix::process::CommandExt;
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .process_group(0)
            .spawn()
            .expect("spawn sleep");
        let pid = child.id();
        let children = children(std::process::id()).expect("children");
        let members = group_members(pid).expect("members");
        child.kill().expect("kill");
        child.wait().expect("reap");
        assert!(
            children.iter().any(|process| process.pid == pid),
            "{children:?}"
        );
        assert_eq!(
            members
                .iter()
                .map(|process| process.pid)
                .collect::<Vec<_>>(),
            vec![pid],
            "the child leads a group of its own"
        );
        assert_eq!(members[0].parent_pid, std::process::id());
        assert_eq!(members[0].group_id, pid);
    }

    #[test]
    fn an_unreaped_child_shows_as_a_zombie_that_is_not_alive() {
        let mut child = std::process::Command::new("true")
            .spawn()
            .expect("spawn true");
        let pid = child.id();
        // Bounded wait for the child to exit; it stays a zombie until we reap it.
        let mut seen = None;
        for _ in 0..500 {
            seen = process(pid).expect("read");
            if seen.as_ref().is_some_and(|info| info.is_zombie) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let seen = seen.expect("an unreaped child keeps its pid");
        assert!(seen.is_zombie && !seen.is_alive(), "{seen:?}");
        child.wait().expect("reap");
        assert_eq!(process(pid).expect("read"), None, "reaped: gone");
    }

    #[test]
    fn a_preallocated_file_has_its_blocks() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().expect("temp dir");
        let file = File::create(dir.path().join("reserve")).expect("create");
        preallocate(&file, 1 << 20).expect("preallocate");
        let metadata = file.metadata().expect("metadata");
        assert_eq!(metadata.len(), 1 << 20);
        assert!(
            metadata.blocks() * 512 >= 1 << 20,
            "allocated, not sparse: {} blocks",
            metadata.blocks()
        );
    }

    #[test]
    fn a_write_in_a_watched_directory_wakes_the_watch() {
        let dir = tempfile::tempdir().expect("temp dir");
        let watch = watch_dir(dir.path(), &["events.jsonl"]).expect("watch");
        if !watch.is_woken_by_changes() {
            return;
        }
        // A file it does not watch: no wake-up.
        std::fs::write(dir.path().join("output-0.log"), b"noise").expect("write");
        assert!(!watch.wait(Duration::from_millis(1)).expect("wait"));
        // Written before the wait: it is queued, so the wait returns at once. A minute of
        // timeout is never reached unless the change is lost, which is the failure.
        std::fs::write(dir.path().join("events.jsonl"), b"{}\n").expect("write");
        assert!(watch.wait(Duration::from_secs(60)).expect("wait"));
        // Drained: with nothing new, a short wait times out.
        assert!(!watch.wait(Duration::from_millis(1)).expect("wait"));
    }

    #[test]
    fn a_cloexec_pipe_carries_bytes_and_is_close_on_exec() {
        use std::io::{Read, Write};
        let (read_end, write_end) = pipe_cloexec().expect("pipe");
        for fd in [&read_end, &write_end] {
            let flags = nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_GETFD).expect("F_GETFD");
            assert_ne!(flags & nix::libc::FD_CLOEXEC, 0, "close-on-exec");
        }
        File::from(write_end).write_all(b"hi").expect("write");
        let mut text = String::new();
        File::from(read_end)
            .read_to_string(&mut text)
            .expect("read");
        assert_eq!(text, "hi");
    }

    #[test]
    fn a_child_has_its_command_name() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("spawn sleep");
        // A vfork-style spawn returns once the child's exec replaced its memory, a moment
        // before the kernel renames it: until then it bears the spawning thread's name. Look
        // again until it is renamed; the deadline only bounds a hang.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let name = loop {
            let name = command_name(child.id());
            let is_renamed = matches!(&name, Ok(Some(name)) if name == "sleep");
            if is_renamed || std::time::Instant::now() >= deadline {
                break name;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        };
        child.kill().expect("kill");
        child.wait().expect("reap");
        assert_eq!(name.expect("read").as_deref(), Some("sleep"));
        assert_eq!(command_name(u32::MAX - 1).expect("read"), None);
    }

    /// Whether a pipe end this process holds without close-on-exec is still open in a child
    /// after its exec, when `mark` ran between fork and exec.
    fn is_open_in_child(mark: impl FnMut() -> io::Result<()> + Send + Sync + 'static) -> bool {
        use std::os::fd::AsRawFd;
        use std::os::unix::process::CommandExt;
        let (read_end, write_end) = nix::unistd::pipe().expect("pipe");
        let fd = write_end.as_raw_fd();
        let mut command = std::process::Command::new("sh");
        command
            .arg("-c")
            .arg(format!("[ -e /proc/self/fd/{fd} ] || [ -e /dev/fd/{fd} ]"));
        // SAFETY: the hook only makes raw system calls (the function under test promises so).
        unsafe {
            command.pre_exec(mark);
        }
        let status = command.status().expect("run sh");
        drop((read_end, write_end));
        status.success()
    }

    #[test]
    fn descriptors_marked_close_on_exec_do_not_reach_a_child() {
        assert!(
            is_open_in_child(|| Ok(())),
            "an inherited pipe reaches the child"
        );
        assert!(!is_open_in_child(|| mark_cloexec_from(3)));
        assert!(!is_open_in_child(|| portable::mark_cloexec_from(3)));
    }

    #[test]
    fn closing_from_a_number_closes_that_one_and_above_only() {
        // In a child of its own: closing descriptors in the test process would pull them from
        // under other tests.
        for implementation in ["platform", "portable"] {
            let output = std::process::Command::new(std::env::current_exe().expect("test binary"))
                .args([
                    "--exact",
                    "platform::tests::close_from_child",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env("RUNJOURNAL_CLOSE_FROM_CHILD", implementation)
                .output()
                .expect("run the child");
            assert!(
                output.status.success(),
                "{implementation}: {}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
            assert!(
                String::from_utf8_lossy(&output.stdout).contains("1 passed"),
                "{implementation}: the child ran the check"
            );
        }
    }

    /// The launcher waits on its runner's exit through this: a wait wakes once the process has
    /// exited (before it is reaped), and times out while it runs.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_process_handle_wait_ends_at_the_exit_and_times_out_while_it_runs() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("sleep starts");
        let handle = open_process(child.id())
            .expect("pidfd_open works on this kernel")
            .expect("the child holds its pid");
        assert!(
            !handle
                .wait_exited(Duration::from_millis(50))
                .expect("a wait"),
            "a running process has not exited"
        );
        child.kill().expect("the child is killed");
        // Generous: the wait returns at the exit, long before this bound.
        assert!(
            handle.wait_exited(Duration::from_secs(30)).expect("a wait"),
            "a killed process has exited"
        );
        assert!(
            child.try_wait().expect("a look").is_some(),
            "the exit is there to reap at once"
        );
    }

    /// The body of [`closing_from_a_number_closes_that_one_and_above_only`], in a child.
    #[test]
    fn close_from_child() {
        use std::os::fd::{AsRawFd, IntoRawFd};
        let Ok(implementation) = std::env::var("RUNJOURNAL_CLOSE_FROM_CHILD") else {
            return;
        };
        let (low_read, low_write) = nix::unistd::pipe().expect("pipe");
        let (high_read, high_write) = nix::unistd::pipe().expect("pipe");
        let low = low_read.as_raw_fd().min(low_write.as_raw_fd());
        let high = high_read.as_raw_fd().min(high_write.as_raw_fd());
        assert!(high > low + 1, "pipes get rising numbers");
        let first = high;
        let raw: Vec<RawFd> = [low_read, low_write, high_read, high_write]
            .into_iter()
            .map(IntoRawFd::into_raw_fd)
            .collect();
        match implementation.as_str() {
            "portable" => portable::close_from(first).expect("close"),
            _ => close_from(first).expect("close"),
        }
        for fd in raw {
            // SAFETY: F_GETFD only reads a descriptor's flags.
            let is_open = unsafe { nix::libc::fcntl(fd, nix::libc::F_GETFD) } >= 0;
            assert_eq!(is_open, fd < first, "descriptor {fd}");
        }
    }
}
