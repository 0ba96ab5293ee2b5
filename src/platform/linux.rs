//! The Linux implementation of [`super`]: `/proc` for process facts (with the crate's one
//! parser of `/proc/<pid>/stat`), `prctl`, `posix_fallocate`, `pipe2`, `close_range`, inotify,
//! Unix sockets' `SO_PEERCRED` (with the peer's user namespace) and `MSG_NOSIGNAL`, and the
//! holder of a journal's write lock from `/proc/<pid>/fdinfo`.

use std::fs::{self, File};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

use nix::libc;

use super::ProcessInfo;

/// Reads the boot id, checked to be what the kernel writes (a UUID): it is compared, stored
/// in the journal and put into file names.
pub(super) fn uptime_ms() -> Option<u64> {
    let text = fs::read_to_string("/proc/uptime").ok()?;
    let seconds = text.split_whitespace().next()?;
    let (whole, fraction) = seconds.split_once('.').unwrap_or((seconds, "0"));
    let whole: u64 = whole.parse().ok()?;
    let hundredths: u64 = format!("{fraction:0<2}").get(..2)?.parse().ok()?;
    whole.checked_mul(1000)?.checked_add(hundredths * 10)
}

pub(super) fn boot_id() -> io::Result<String> {
    let text = fs::read_to_string("/proc/sys/kernel/random/boot_id")?;
    let boot_id = text.trim();
    let is_well_formed = !boot_id.is_empty()
        && boot_id.len() <= 64
        && boot_id
            .bytes()
            .all(|byte| byte.is_ascii_hexdigit() || byte == b'-');
    if !is_well_formed {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("the boot id {boot_id:?} is not a UUID"),
        ));
    }
    Ok(boot_id.to_string())
}

/// This process's PID namespace (see [`super::pid_namespace`]), read once: a process never
/// changes its own.
pub(super) fn pid_namespace() -> io::Result<Option<u64>> {
    static PID_NAMESPACE: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    if let Some(namespace) = PID_NAMESPACE.get() {
        return Ok(*namespace);
    }
    let namespace = read_pid_namespace()?;
    Ok(*PID_NAMESPACE.get_or_init(|| namespace))
}

fn read_pid_namespace() -> io::Result<Option<u64>> {
    use std::os::unix::fs::MetadataExt;
    // /proc shows the pids of the namespace it was mounted for: this process's pids only when
    // /proc/self is this process.
    let self_link = fs::read_link("/proc/self")?;
    let me = std::process::id().to_string();
    if self_link.as_os_str() != me.as_str() {
        return Err(io::Error::other(format!(
            "/proc belongs to another PID namespace than this process (/proc/self is {}, this process is {me}): mount a /proc of its own (unshare --mount-proc)",
            self_link.display()
        )));
    }
    match fs::metadata("/proc/self/ns/pid") {
        Ok(metadata) => Ok(Some(metadata.ino())),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(error) => Err(error),
    }
}

/// `/proc/<pid>/stat`, parsed; `None` when no process has that pid (or it went away while we
/// looked).
pub(super) fn process(pid: u32) -> io::Result<Option<ProcessInfo>> {
    let stat = match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat,
        Err(error) if is_gone(&error) => return Ok(None),
        Err(error) => return Err(error),
    };
    parse_stat(pid, &stat)
        .map(Some)
        .map_err(|error| io::Error::new(io::ErrorKind::InvalidData, error))
}

/// Every process of group `group_id`: a scan of `/proc`.
pub(super) fn group_members(group_id: u32) -> io::Result<Vec<ProcessInfo>> {
    Ok(processes()?
        .into_iter()
        .filter(|process| process.group_id == group_id)
        .collect())
}

/// Every child of `pid`: a scan of `/proc`.
pub(super) fn children(pid: u32) -> io::Result<Vec<ProcessInfo>> {
    Ok(processes()?
        .into_iter()
        .filter(|process| process.parent_pid == pid)
        .collect())
}

/// Every process now (thread-group leaders: `/proc` lists no other thread at its top level).
/// A process that exits while we look is left out.
fn processes() -> io::Result<Vec<ProcessInfo>> {
    let mut processes = Vec::new();
    for entry in fs::read_dir("/proc")? {
        let name = entry?.file_name();
        let Some(pid) = name
            .to_str()
            .filter(|name| name.bytes().all(|byte| byte.is_ascii_digit()))
            .and_then(|name| name.parse::<u32>().ok())
        else {
            continue;
        };
        if let Some(process) = process(pid)? {
            processes.push(process);
        }
    }
    Ok(processes)
}

/// Whether reading a process's file failed because the process is gone: the directory is
/// missing, or the process was reaped between open and read.
fn is_gone(error: &io::Error) -> bool {
    error.kind() == io::ErrorKind::NotFound || error.raw_os_error() == Some(nix::libc::ESRCH)
}

/// Why a `/proc/<pid>/stat` line could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub(super) enum StatError {
    #[error("/proc/{pid}/stat has no command name in parentheses")]
    NoCommandName { pid: u32 },
    #[error("/proc/{pid}/stat ends before field {field} ({name})")]
    TooShort {
        pid: u32,
        field: usize,
        name: &'static str,
    },
    #[error("/proc/{pid}/stat field {field} ({name}) is not a number: {text:?}")]
    NotANumber {
        pid: u32,
        field: usize,
        name: &'static str,
        text: String,
    },
}

/// Parses one `/proc/<pid>/stat` line (proc(5)). Pure.
///
/// Field 2, the command name, is in parentheses and may itself hold spaces and parentheses,
/// so the fields are counted from the last `)`: after it come state (3), ppid (4), pgrp (5)
/// ... starttime (22).
pub(super) fn parse_stat(pid: u32, stat: &str) -> Result<ProcessInfo, StatError> {
    let after_name = stat
        .rfind(')')
        .map(|end| &stat[end + 1..])
        .ok_or(StatError::NoCommandName { pid })?;
    // Field 3 is the first after the name: index 0 here holds field 3.
    const FIRST_FIELD: usize = 3;
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let text_of = |field: usize, name: &'static str| {
        fields
            .get(field - FIRST_FIELD)
            .copied()
            .ok_or(StatError::TooShort { pid, field, name })
    };
    let number_of = |field: usize, name: &'static str| {
        let text = text_of(field, name)?;
        text.parse::<u64>().map_err(|_| StatError::NotANumber {
            pid,
            field,
            name,
            text: text.to_string(),
        })
    };
    // A pid-valued field must fit a pid, not only be a number. A negative one means none: a
    // process the kernel is tearing down shows its group as -1 (seen on Linux 6.18, by a scan
    // of every process that met one), and it is then in no group and has no parent.
    let pid_of = |field: usize, name: &'static str| {
        let text = text_of(field, name)?;
        let not_a_pid = || StatError::NotANumber {
            pid,
            field,
            name,
            text: text.to_string(),
        };
        let value = text.parse::<i64>().map_err(|_| not_a_pid())?;
        if value < 0 {
            return Ok(0);
        }
        u32::try_from(value).map_err(|_| not_a_pid())
    };
    let state = text_of(3, "state")?;
    let parent_pid = pid_of(4, "ppid")?;
    let group_id = pid_of(5, "pgrp")?;
    let start_time = number_of(22, "starttime")?;
    Ok(ProcessInfo {
        pid,
        parent_pid,
        group_id,
        start_time: Some(start_time),
        is_zombie: matches!(state, "Z" | "X" | "x"),
    })
}

pub(super) fn become_child_subreaper() -> io::Result<()> {
    nix::sys::prctl::set_child_subreaper(true).map_err(io::Error::from)
}

pub(super) fn die_with_parent(parent: u32) -> io::Result<()> {
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL).map_err(io::Error::from)?;
    // The parent may have died before the request: then this process was reparented already.
    if u32::try_from(nix::unistd::getppid().as_raw()).ok() != Some(parent) {
        return Err(io::Error::other(
            "the parent exited before the child started",
        ));
    }
    Ok(())
}

pub(super) fn preallocate(file: &File, bytes: u64) -> io::Result<()> {
    let length = i64::try_from(bytes).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("cannot preallocate {bytes} bytes: too large"),
        )
    })?;
    nix::fcntl::posix_fallocate(file, 0, length).map_err(io::Error::from)
}

/// `pidfd_open(pid, 0)` (Linux 5.3): `None` for a pid nobody holds; `Unsupported` on an older
/// kernel (ENOSYS), or where a sandbox's seccomp filter refuses the call (EPERM).
pub(super) fn pidfd_open(pid: u32) -> io::Result<Option<OwnedFd>> {
    use std::os::fd::FromRawFd;
    let pid = nix::libc::pid_t::try_from(pid).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("pid {pid} is out of range"),
        )
    })?;
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1; no memory
    // is shared with the kernel.
    let fd = unsafe { nix::libc::syscall(nix::libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        let error = io::Error::last_os_error();
        return match error.raw_os_error() {
            Some(nix::libc::ESRCH) => Ok(None),
            Some(nix::libc::ENOSYS | nix::libc::EPERM) => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("pidfd_open is not available: {error}"),
            )),
            _ => Err(error),
        };
    }
    let fd = std::os::fd::RawFd::try_from(fd)
        .map_err(|_| io::Error::other(format!("pidfd_open returned descriptor {fd}")))?;
    // SAFETY: the kernel just returned this descriptor, which nothing else owns.
    Ok(Some(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// `pidfd_send_signal(fd, signal, NULL, 0)`: `false` when the process has exited (ESRCH).
pub(super) fn pidfd_send_signal(
    fd: &OwnedFd,
    signal: nix::sys::signal::Signal,
) -> io::Result<bool> {
    use std::os::fd::AsRawFd;
    // SAFETY: the descriptor is a pidfd this process owns; a null info with flags 0 asks the
    // kernel to fill in the signal information as `kill` would.
    let answer = unsafe {
        nix::libc::syscall(
            nix::libc::SYS_pidfd_send_signal,
            fd.as_raw_fd(),
            signal as nix::libc::c_int,
            std::ptr::null::<nix::libc::siginfo_t>(),
            0,
        )
    };
    if answer == 0 {
        return Ok(true);
    }
    let error = io::Error::last_os_error();
    match error.raw_os_error() {
        Some(nix::libc::ESRCH) => Ok(false),
        _ => Err(error),
    }
}

pub(super) fn pipe_cloexec() -> io::Result<(OwnedFd, OwnedFd)> {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(io::Error::from)
}

/// `sun_path` is 108 bytes on Linux, NUL included.
pub(super) const MAX_SOCKET_PATH_BYTES: usize = 107;

/// `/proc/self/fd/<dir>`, once it is checked to lead to the directory open as `dir` (the same
/// device and inode): `/proc` may be missing, or be another PID namespace's.
pub(super) fn path_through_dir(dir: std::os::fd::BorrowedFd<'_>) -> Option<std::path::PathBuf> {
    let through = std::path::PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd()));
    let seen = nix::sys::stat::stat(&through).ok()?;
    let held = nix::sys::stat::fstat(dir).ok()?;
    ((seen.st_dev, seen.st_ino) == (held.st_dev, held.st_ino)).then_some(through)
}

pub(super) fn peer_uid(socket: &UnixStream) -> io::Result<u32> {
    peer_credentials(socket).map(|credentials| credentials.uid)
}

fn peer_credentials(socket: &UnixStream) -> io::Result<libc::ucred> {
    let mut credentials = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut length = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: the buffer is a `ucred` and `length` is its size, as SO_PEERCRED expects; the
    // descriptor is open for the duration of the call (borrowed from `socket`).
    let result = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&raw mut credentials).cast(),
            &mut length,
        )
    };
    if result != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(credentials)
}

pub(super) fn peer_is_this_user(socket: &UnixStream) -> io::Result<bool> {
    let credentials = peer_credentials(socket)?;
    let uid = nix::unistd::geteuid().as_raw();
    // A pid of 0: the peer is in a PID namespace this one cannot see into.
    if credentials.uid != uid || uid == overflow_uid() || credentials.pid <= 0 {
        return Ok(false);
    }
    let theirs = fs::read_link(format!("/proc/{}/ns/user", credentials.pid));
    let ours = fs::read_link("/proc/self/ns/user");
    Ok(matches!((theirs, ours), (Ok(theirs), Ok(ours)) if theirs == ours))
}

/// `/proc/sys/kernel/overflowuid`, else the kernel's default.
fn overflow_uid() -> u32 {
    fs::read_to_string("/proc/sys/kernel/overflowuid")
        .ok()
        .and_then(|text| text.trim().parse().ok())
        .unwrap_or(65534)
}

pub(super) fn may_share_commits() -> bool {
    nix::unistd::geteuid().as_raw() != overflow_uid()
}

pub(super) fn unix_stream_socket() -> io::Result<OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: a plain socket(2) call; the descriptor it returns is owned from here on.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just opened and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// redb's writer byte: the first of its lock range (`1 << 62`), as `/proc/<pid>/fdinfo/<fd>`
/// prints it.
const REDB_WRITER_BYTE: u64 = 1 << 62;

/// Scans this user's processes' descriptors (`/proc/<pid>/fdinfo/<fd>`, whose `lock:` lines
/// show the locks held through that descriptor, with the file's device and inode) for a write
/// lock on the journal's writer byte. Open-file-description locks show no pid in
/// `/proc/locks`, hence the scan.
pub(super) fn journal_write_lock_holder(path: &std::path::Path) -> Option<(u32, String)> {
    let writer_byte = format!(" {REDB_WRITER_BYTE} {REDB_WRITER_BYTE}");
    lock_holder(path, |line| {
        line.contains(" WRITE ") && line.trim_end().ends_with(&writer_byte)
    })
}

/// The process holding an exclusive `flock` on the file at `path`, by the same scan as
/// [`journal_write_lock_holder`] (a descriptor inherited by a child shows in both: the first
/// found is named).
pub(super) fn flock_holder(path: &std::path::Path) -> Option<(u32, String)> {
    lock_holder(path, |line| {
        line.contains(" FLOCK ") && line.contains(" WRITE ")
    })
}

pub(super) fn processes_with_open(path: &std::path::Path) -> Vec<(u32, String)> {
    use std::os::unix::ffi::OsStrExt;
    // The name the kernel shows: the path made absolute, links above it resolved.
    let shown = match path.parent().map(fs::canonicalize) {
        Some(Ok(dir)) => match path.file_name() {
            Some(name) => dir.join(name),
            None => return Vec::new(),
        },
        _ => path.to_path_buf(),
    };
    let mut deleted = shown.as_os_str().as_bytes().to_vec();
    deleted.extend_from_slice(b" (deleted)");
    let mut found = Vec::new();
    for pid in other_pids() {
        let Ok(descriptors) = fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        let holds = descriptors.flatten().any(|descriptor| {
            fs::read_link(descriptor.path()).is_ok_and(|target| {
                let target = target.as_os_str().as_bytes();
                target == shown.as_os_str().as_bytes() || target == deleted.as_slice()
            })
        });
        if holds {
            found.push((pid, command_name(pid).ok().flatten().unwrap_or_default()));
        }
    }
    found
}

/// The pids `/proc` lists, this process's left out (none when it cannot be read).
fn other_pids() -> impl Iterator<Item = u32> {
    let own = std::process::id();
    fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(move |entry| {
            let pid = entry.file_name().to_str()?.parse::<u32>().ok()?;
            (pid != own).then_some(pid)
        })
}

/// The first of this user's other processes with a descriptor on the file at `path` whose
/// `lock:` line (in `/proc/<pid>/fdinfo/<fd>`) `is_wanted` accepts.
fn lock_holder(path: &std::path::Path, is_wanted: impl Fn(&str) -> bool) -> Option<(u32, String)> {
    use std::os::unix::fs::MetadataExt;
    let metadata = fs::metadata(path).ok()?;
    let dev = metadata.dev();
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    let file = format!("{major:02x}:{minor:02x}:{} ", metadata.ino());
    for pid in other_pids() {
        let Ok(descriptors) = fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
            continue;
        };
        for descriptor in descriptors.flatten() {
            let Ok(info) = fs::read_to_string(descriptor.path()) else {
                continue;
            };
            let holds = info
                .lines()
                .any(|line| line.starts_with("lock:") && line.contains(&file) && is_wanted(line));
            if holds {
                let name = command_name(pid).ok().flatten().unwrap_or_default();
                return Some((pid, name));
            }
        }
    }
    None
}

pub(super) fn no_sigpipe(_socket: &UnixStream) -> io::Result<()> {
    // Every send passes MSG_NOSIGNAL instead.
    Ok(())
}

pub(super) fn send_all(socket: &UnixStream, mut bytes: &[u8]) -> io::Result<()> {
    while !bytes.is_empty() {
        // SAFETY: the pointer and length describe `bytes`, which outlives the call; the
        // descriptor is open for the duration of the call (borrowed from `socket`).
        let sent = unsafe {
            libc::send(
                socket.as_raw_fd(),
                bytes.as_ptr().cast(),
                bytes.len(),
                libc::MSG_NOSIGNAL,
            )
        };
        match sent {
            0 => return Err(io::Error::from(io::ErrorKind::WriteZero)),
            sent if sent > 0 => bytes = &bytes[sent as usize..],
            _ => {
                let error = io::Error::last_os_error();
                if error.kind() != io::ErrorKind::Interrupted {
                    return Err(error);
                }
            }
        }
    }
    Ok(())
}

/// `/proc/<pid>/comm`, without its newline; `None` when no process has that pid.
pub(super) fn command_name(pid: u32) -> io::Result<Option<String>> {
    match fs::read(format!("/proc/{pid}/comm")) {
        Ok(bytes) => {
            let bytes = bytes.strip_suffix(b"\n").unwrap_or(&bytes);
            Ok(Some(String::from_utf8_lossy(bytes).into_owned()))
        }
        Err(error) if is_gone(&error) => Ok(None),
        Err(error) => Err(error),
    }
}

pub(super) fn thread_count() -> io::Result<usize> {
    Ok(fs::read_dir("/proc/self/task")?.count())
}

/// `close_range(first, ~0, flags)` as a raw system call (glibc has a wrapper only since 2.34,
/// and none is needed): whether the kernel did it. A kernel before 5.9 (or 5.11 for
/// `CLOSE_RANGE_CLOEXEC`) answers ENOSYS or EINVAL, and the caller falls back.
fn close_range(first: RawFd, flags: libc::c_uint) -> bool {
    let Ok(first) = libc::c_uint::try_from(first.max(0)) else {
        return true;
    };
    // SAFETY: close_range takes three integers and touches only this process's descriptor
    // table; it is a plain system call, async-signal-safe.
    let answer = unsafe { libc::syscall(libc::SYS_close_range, first, libc::c_uint::MAX, flags) };
    answer == 0
}

/// `close_range(CLOSE_RANGE_CLOEXEC)`, else the portable walk. Async-signal-safe.
pub(super) fn mark_cloexec_from(first: RawFd) -> io::Result<()> {
    if close_range(first, libc::CLOSE_RANGE_CLOEXEC) {
        return Ok(());
    }
    super::portable::mark_cloexec_from(first)
}

/// `close_range`, else each descriptor `/proc/self/fd` lists (the directory's own one left
/// for last, closed with it), else the portable walk.
pub(super) fn close_from(first: RawFd) -> io::Result<()> {
    if close_range(first, 0) {
        return Ok(());
    }
    let listed: Option<Vec<RawFd>> = fs::read_dir("/proc/self/fd").ok().map(|entries| {
        entries
            .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<RawFd>().ok())
            .filter(|&fd| fd >= first)
            .collect()
    });
    match listed {
        Some(listed) => {
            // The directory's descriptor was closed when `read_dir` was dropped: closing a
            // number that is no longer open answers EBADF, which is fine.
            for fd in listed {
                // SAFETY: the caller owns every descriptor from `first` on.
                unsafe { libc::close(fd) };
            }
            Ok(())
        }
        None => super::portable::close_from(first),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stat line as the kernel writes it, with `name`, `state`, ppid 1, pgrp 77 and start
    /// time 12345 (fields 6 to 52 filled with plausible numbers).
    fn stat_line(pid: u32, name: &str, state: &str) -> String {
        let mut fields = vec![
            pid.to_string(),
            format!("({name})"),
            state.to_string(),
            "1".to_string(),  // 4 ppid
            "77".to_string(), // 5 pgrp
        ];
        for number in 6..=52 {
            fields.push(if number == 22 {
                "12345".to_string()
            } else {
                "0".to_string()
            });
        }
        fields.join(" ") + "\n"
    }

    #[test]
    fn a_plain_line_parses() {
        let info = parse_stat(42, &stat_line(42, "sleep", "S")).expect("parses");
        assert_eq!(
            info,
            ProcessInfo {
                pid: 42,
                parent_pid: 1,
                group_id: 77,
                start_time: Some(12345),
                is_zombie: false,
            }
        );
    }

    /// Found by crash_kill: a scan of the group met a process whose stat showed pgrp -1, and
    /// ending the group failed on it.
    #[test]
    fn a_negative_group_or_parent_is_none() {
        let line = stat_line(42, "sh", "S").replacen(" 1 77 ", " -1 -1 ", 1);
        let info = parse_stat(42, &line).expect("parses");
        assert_eq!((info.parent_pid, info.group_id), (0, 0));
        for text in ["x", "4294967296", "1.5"] {
            let line = stat_line(42, "sh", "S").replacen(" 1 77 ", &format!(" 1 {text} "), 1);
            assert!(parse_stat(42, &line).is_err(), "pgrp {text:?}");
        }
    }

    #[test]
    fn a_name_with_spaces_and_parentheses_does_not_shift_the_fields() {
        for name in ["a) 1 2 (b", "x)", "(", ") Z 9 9 (", "two words", ""] {
            let info = parse_stat(7, &stat_line(7, name, "R")).expect("parses");
            assert_eq!(
                (
                    info.parent_pid,
                    info.group_id,
                    info.start_time,
                    info.is_zombie
                ),
                (1, 77, Some(12345), false),
                "name {name:?}"
            );
        }
    }

    #[test]
    fn zombie_and_dead_states_are_zombies_and_others_are_not() {
        for (state, is_zombie) in [
            ("Z", true),
            ("X", true),
            ("x", true),
            ("R", false),
            ("S", false),
            ("D", false),
            ("T", false),
            ("t", false),
            ("I", false),
        ] {
            let info = parse_stat(7, &stat_line(7, "z", state)).expect("parses");
            assert_eq!(info.is_zombie, is_zombie, "state {state}");
        }
    }

    #[test]
    fn short_or_damaged_lines_are_refused_with_what_is_missing() {
        assert_eq!(
            parse_stat(7, "7 no-parentheses S 1 77"),
            Err(StatError::NoCommandName { pid: 7 })
        );
        assert_eq!(
            parse_stat(7, "7 (name)"),
            Err(StatError::TooShort {
                pid: 7,
                field: 3,
                name: "state"
            })
        );
        assert_eq!(
            parse_stat(7, "7 (name) S 1 77 0 0"),
            Err(StatError::TooShort {
                pid: 7,
                field: 22,
                name: "starttime"
            })
        );
        let line = stat_line(7, "name", "S").replace(" 12345 ", " soon ");
        assert!(matches!(
            parse_stat(7, &line),
            Err(StatError::NotANumber { field: 22, .. })
        ));
        assert!(matches!(
            parse_stat(7, "7 (name) S one 77"),
            Err(StatError::NotANumber { field: 4, .. })
        ));
        assert!(parse_stat(7, "").is_err());
    }

    #[test]
    fn the_kernels_line_for_a_tricky_name_parses() {
        // The real thing: a program whose name holds ") " must not shift the fields.
        let dir = tempfile::tempdir().expect("temp dir");
        let tricky = dir.path().join("a) 1 2 (b");
        std::os::unix::fs::symlink("/bin/sleep", &tricky).expect("symlink");
        let mut child = std::process::Command::new(&tricky)
            .arg("30")
            .spawn()
            .expect("spawn");
        let stat = fs::read_to_string(format!("/proc/{}/stat", child.id())).expect("stat");
        let parsed = process(child.id()).expect("read");
        child.kill().expect("kill");
        child.wait().expect("reap");
        assert!(stat.contains("(a) 1 2 (b)"), "{stat}");
        let info = parsed.expect("the child existed");
        assert_eq!(info.parent_pid, std::process::id());
        let me = process(std::process::id())
            .expect("read")
            .expect("this process");
        assert_eq!(info.group_id, me.group_id, "the child stays in our group");
        assert!(info.start_time >= me.start_time);
    }

    #[test]
    fn a_pid_nobody_holds_is_none() {
        // Pids stay below 2^22 on Linux.
        assert_eq!(process(u32::MAX - 1).expect("read"), None);
    }
}

/// An inotify watch on one directory's files.
#[derive(Debug)]
pub(super) struct DirWatch {
    inotify: nix::sys::inotify::Inotify,
    /// The files whose changes wake a wait; empty: every file.
    names: Vec<std::ffi::OsString>,
}

impl DirWatch {
    pub(super) const IS_WOKEN_BY_CHANGES: bool = true;

    pub(super) fn new(dir: &std::path::Path, names: &[&str]) -> io::Result<DirWatch> {
        use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
        let inotify = Inotify::init(InitFlags::IN_CLOEXEC | InitFlags::IN_NONBLOCK)
            .map_err(io::Error::from)?;
        inotify
            .add_watch(
                dir,
                AddWatchFlags::IN_MODIFY
                    | AddWatchFlags::IN_CREATE
                    | AddWatchFlags::IN_MOVED_TO
                    | AddWatchFlags::IN_DELETE
                    | AddWatchFlags::IN_CLOSE_WRITE,
            )
            .map_err(io::Error::from)?;
        Ok(DirWatch {
            inotify,
            names: names.iter().map(std::ffi::OsString::from).collect(),
        })
    }

    pub(super) fn watch_also(&self, dir: &std::path::Path) -> io::Result<()> {
        use nix::sys::inotify::AddWatchFlags;
        self.inotify
            .add_watch(
                dir,
                AddWatchFlags::IN_MODIFY
                    | AddWatchFlags::IN_CREATE
                    | AddWatchFlags::IN_MOVED_TO
                    | AddWatchFlags::IN_DELETE
                    | AddWatchFlags::IN_CLOSE_WRITE,
            )
            .map(|_| ())
            .map_err(io::Error::from)
    }

    pub(super) fn wait(&self, timeout: std::time::Duration) -> io::Result<bool> {
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        use std::os::fd::AsFd;
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let left = PollTimeout::try_from(left).unwrap_or(PollTimeout::MAX);
            let mut fds = [PollFd::new(self.inotify.as_fd(), PollFlags::POLLIN)];
            match poll(&mut fds, left) {
                Ok(0) => return Ok(false),
                Ok(_) => {}
                // A signal: taken as a wake-up; the caller looks and waits again.
                Err(nix::errno::Errno::EINTR) => return Ok(true),
                Err(error) => return Err(error.into()),
            }
            if self.drain()? {
                return Ok(true);
            }
        }
    }

    /// Reads every queued event; whether one concerns a watched file.
    fn drain(&self) -> io::Result<bool> {
        let mut is_wanted = false;
        loop {
            match self.inotify.read_events() {
                Ok(events) if !events.is_empty() => {
                    is_wanted |= events.iter().any(|event| {
                        self.names.is_empty()
                            || event
                                .name
                                .as_ref()
                                .is_some_and(|name| self.names.contains(name))
                    });
                }
                Ok(_) | Err(nix::errno::Errno::EAGAIN) => return Ok(is_wanted),
                Err(error) => return Err(error.into()),
            }
        }
    }
}
