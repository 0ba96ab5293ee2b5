//! The macOS implementation of [`super`]: the system calls only. Every decision on what they
//! answered is in `macos_facts.rs`, which is unit-tested on Linux too.
//!
//! * A process's facts: `proc_pidinfo(PROC_PIDTBSDINFO)`, asked with `arg = 1` so that the
//!   kernel finds zombies too; its start time (`pbi_start_tvsec`, `pbi_start_tvusec`) is
//!   kept to the microsecond. The kernel answers that flavor only for this user's processes
//!   (or for root): for another user's it refuses with `EPERM`, and
//!   `PROC_PIDT_SHORTBSDINFO`, which it answers for everyone, gives the rest without a start
//!   time.
//! * A group's members and a process's children: `proc_listpgrppids` and
//!   `proc_listchildpids` (zombies included), then each pid's facts.
//! * The boot id: `kern.bootsessionuuid` (a UUID made at every boot), else `kern.boottime`.
//! * Preallocation: `fcntl(F_PREALLOCATE)` then `ftruncate`; zeros written where the file
//!   system does not support it.
//! * A close-on-exec pipe: `pipe` then `FD_CLOEXEC` on both ends (macOS has no `pipe2`).
//! * No child subreaper: macOS has none. Orphans of a step go to launchd, which reaps them.
//! * Unix sockets: `getpeereid` for the peer's user (macOS has no user namespaces), and
//!   `SO_NOSIGPIPE` instead of SIGPIPE.
//!
//! `sysinfo` is not used: the facts it has are coarser than these (start times in whole
//! seconds, no process group id) and it reads them by the same calls.

use std::fs::File;
use std::io::{self, Write};
use std::mem::{MaybeUninit, size_of};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;

use nix::errno::Errno;
use nix::fcntl::{FcntlArg, FdFlag, fcntl};

use super::ProcessInfo;
use super::macos_facts::{self as facts, BsdInfo, PidInfoAnswer, ShortBsdInfo};

const _: () = assert!(facts::SZOMB == libc::SZOMB, "SZOMB as XNU defines it");

/// The most pids one listing asks for (a group or a process's children); the buffer grows by
/// doubling up to it. Far above macOS's default `kern.maxproc`.
const MAX_LISTED_PIDS: usize = 1 << 20;

/// The first buffer of a listing, in pids.
const FIRST_LISTING_PIDS: usize = 64;

/// macOS has no pidfd: callers check a process's identity right before `kill` instead.
pub(super) fn pidfd_open(_pid: u32) -> io::Result<Option<OwnedFd>> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "macOS has no process descriptors (pidfd)",
    ))
}

/// Never reached: [`pidfd_open`] hands out no descriptor on macOS.
pub(super) fn pidfd_send_signal(
    _fd: &OwnedFd,
    _signal: nix::sys::signal::Signal,
) -> io::Result<bool> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "macOS has no process descriptors (pidfd)",
    ))
}

/// macOS has no PID namespaces: every process of the machine shares one numbering.
pub(super) fn pid_namespace() -> io::Result<Option<u64>> {
    Ok(None)
}

pub(super) fn uptime_ms() -> Option<u64> {
    None
}

pub(super) fn boot_id() -> io::Result<String> {
    match sysctl_bytes(c"kern.bootsessionuuid", 64) {
        Ok(bytes) => facts::boot_id_from_session_uuid(&bytes),
        // A kernel without it (it has been there since macOS 10.13 at least).
        Err(error) if error.raw_os_error() == Some(libc::ENOENT) => {
            let mut boot_time = MaybeUninit::<libc::timeval>::zeroed();
            let mut size = size_of::<libc::timeval>();
            // SAFETY: the name is NUL-terminated; `boot_time` has room for `size` bytes, the
            // size of the timeval kern.boottime holds; nothing is set (new value null).
            let answer = unsafe {
                libc::sysctlbyname(
                    c"kern.boottime".as_ptr(),
                    boot_time.as_mut_ptr().cast(),
                    &mut size,
                    std::ptr::null_mut(),
                    0,
                )
            };
            if answer != 0 {
                return Err(io::Error::last_os_error());
            }
            if size != size_of::<libc::timeval>() {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("kern.boottime is {size} bytes, not a timeval"),
                ));
            }
            // SAFETY: sysctl filled all of it (checked just above); a timeval has no invalid
            // bit patterns.
            let boot_time = unsafe { boot_time.assume_init() };
            let seconds = u64::try_from(boot_time.tv_sec).unwrap_or(0);
            let microseconds = u64::try_from(boot_time.tv_usec).unwrap_or(u64::MAX);
            facts::boot_id_from_boot_time(seconds, microseconds)
        }
        Err(error) => Err(error),
    }
}

/// A string-valued sysctl of at most `capacity` bytes.
fn sysctl_bytes(name: &std::ffi::CStr, capacity: usize) -> io::Result<Vec<u8>> {
    let mut bytes = vec![0_u8; capacity];
    let mut size = bytes.len();
    // SAFETY: the name is NUL-terminated; `bytes` has room for `size` bytes; nothing is set.
    let answer = unsafe {
        libc::sysctlbyname(
            name.as_ptr(),
            bytes.as_mut_ptr().cast(),
            &mut size,
            std::ptr::null_mut(),
            0,
        )
    };
    if answer != 0 {
        return Err(io::Error::last_os_error());
    }
    bytes.truncate(size.min(capacity));
    Ok(bytes)
}

/// One `proc_pidinfo` call of `flavor` for `pid` into a `T`, and what it came to.
///
/// # Safety
/// `T` must be the structure the kernel writes for `flavor`, one for which any bytes are a
/// valid value (plain integers and arrays of them).
unsafe fn pidinfo<T>(pid: u32, flavor: i32) -> io::Result<(PidInfoAnswer, MaybeUninit<T>)> {
    let raw_pid = i32::try_from(pid).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("pid {pid} is too large"),
        )
    })?;
    let structure_bytes = size_of::<T>();
    let buffer_bytes = i32::try_from(structure_bytes).expect("a proc_info structure is small");
    let mut value = MaybeUninit::<T>::zeroed();
    Errno::clear();
    // SAFETY: `value` has room for `buffer_bytes` bytes; `arg = 1` asks the kernel to look
    // among zombies too (it does so for the BSD info flavors only when `arg` is non-zero).
    let returned =
        unsafe { libc::proc_pidinfo(raw_pid, flavor, 1, value.as_mut_ptr().cast(), buffer_bytes) };
    let answer = facts::pidinfo_answer(returned, structure_bytes, Errno::last_raw());
    Ok((answer, value))
}

pub(super) fn process(pid: u32) -> io::Result<Option<ProcessInfo>> {
    // SAFETY: PROC_PIDTBSDINFO writes a proc_bsdinfo: integers and char arrays.
    let (answer, value) = unsafe { pidinfo::<libc::proc_bsdinfo>(pid, libc::PROC_PIDTBSDINFO)? };
    match answer {
        PidInfoAnswer::Filled => {
            // SAFETY: the kernel filled it (and it started zeroed); any bytes are valid.
            let info = unsafe { value.assume_init() };
            let info = BsdInfo {
                pid: info.pbi_pid,
                parent_pid: info.pbi_ppid,
                group_id: info.pbi_pgid,
                status: info.pbi_status,
                start_seconds: info.pbi_start_tvsec,
                start_microseconds: info.pbi_start_tvusec,
            };
            Ok(Some(facts::process_info(pid, &info)?))
        }
        PidInfoAnswer::NoProcess => Ok(None),
        PidInfoAnswer::NotPermitted => unreadable_process(pid),
        PidInfoAnswer::Failed { errno } => Err(io::Error::from_raw_os_error(errno)),
        PidInfoAnswer::Short { written_bytes } => {
            Err(facts::FactError::Short { pid, written_bytes }.into())
        }
    }
}

/// Another user's process: what the kernel shows everyone of it.
fn unreadable_process(pid: u32) -> io::Result<Option<ProcessInfo>> {
    // SAFETY: PROC_PIDT_SHORTBSDINFO writes a proc_bsdshortinfo: integers and char arrays.
    let (answer, value) =
        unsafe { pidinfo::<libc::proc_bsdshortinfo>(pid, libc::PROC_PIDT_SHORTBSDINFO)? };
    match answer {
        PidInfoAnswer::Filled => {
            // SAFETY: the kernel filled it (and it started zeroed); any bytes are valid.
            let info = unsafe { value.assume_init() };
            let info = ShortBsdInfo {
                pid: info.pbsi_pid,
                parent_pid: info.pbsi_ppid,
                group_id: info.pbsi_pgid,
                status: info.pbsi_status,
            };
            Ok(Some(facts::unreadable_process_info(pid, &info)?))
        }
        // It went away between the two looks.
        PidInfoAnswer::NoProcess => Ok(None),
        PidInfoAnswer::NotPermitted => Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("the kernel shows nothing of process {pid} to this user"),
        )),
        PidInfoAnswer::Failed { errno } => Err(io::Error::from_raw_os_error(errno)),
        PidInfoAnswer::Short { written_bytes } => {
            Err(facts::FactError::Short { pid, written_bytes }.into())
        }
    }
}

/// The pids a `proc_list*pids` function lists for `key`, the buffer grown until it holds
/// them all.
fn list_pids(
    key: u32,
    list: unsafe extern "C" fn(libc::pid_t, *mut libc::c_void, libc::c_int) -> libc::c_int,
) -> io::Result<Vec<u32>> {
    let raw_key = libc::pid_t::try_from(key).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("pid {key} is too large"),
        )
    })?;
    let mut capacity = FIRST_LISTING_PIDS;
    loop {
        let mut buffer = vec![0_i32; capacity];
        let buffer_bytes = i32::try_from(capacity * size_of::<i32>())
            .expect("MAX_LISTED_PIDS pids fit an int of bytes");
        Errno::clear();
        // SAFETY: `buffer` has room for `buffer_bytes` bytes of pids.
        let count = unsafe { list(raw_key, buffer.as_mut_ptr().cast(), buffer_bytes) };
        // The wrappers answer 0 both for "none" and for an error: errno tells them apart.
        if count <= 0 && Errno::last_raw() != 0 {
            return Err(io::Error::from_raw_os_error(Errno::last_raw()));
        }
        match facts::listed_pids(count, &buffer) {
            Some(pids) => return Ok(pids),
            None if capacity < MAX_LISTED_PIDS => capacity *= 2,
            None => {
                return Err(io::Error::other(format!(
                    "more than {MAX_LISTED_PIDS} processes listed for {key}"
                )));
            }
        }
    }
}

/// The facts of each pid, leaving out those gone since they were listed.
fn processes_of(pids: Vec<u32>) -> io::Result<Vec<ProcessInfo>> {
    let mut processes = Vec::with_capacity(pids.len());
    for pid in pids {
        if let Some(process) = process(pid)? {
            processes.push(process);
        }
    }
    Ok(processes)
}

pub(super) fn group_members(group_id: u32) -> io::Result<Vec<ProcessInfo>> {
    let members = processes_of(list_pids(group_id, libc::proc_listpgrppids)?)?;
    // A pid listed, then reused by a process of another group before we looked, is not a
    // member.
    Ok(members
        .into_iter()
        .filter(|process| process.group_id == group_id)
        .collect())
}

pub(super) fn children(pid: u32) -> io::Result<Vec<ProcessInfo>> {
    let children = processes_of(list_pids(pid, libc::proc_listchildpids)?)?;
    Ok(children
        .into_iter()
        .filter(|process| process.parent_pid == pid)
        .collect())
}

pub(super) fn become_child_subreaper() -> io::Result<()> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "macOS has no child subreaper; orphans go to launchd, which reaps them",
    ))
}

pub(super) fn die_with_parent(_parent: u32) -> io::Result<()> {
    // No parent-death signal: the child outlives its parent, bounded by its own end.
    Ok(())
}

pub(super) fn preallocate(file: &File, bytes: u64) -> io::Result<()> {
    let length = libc::off_t::try_from(bytes).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("cannot preallocate {bytes} bytes: too large"),
        )
    })?;
    // Contiguous blocks if the file system has them, else any.
    let mut preallocated = Ok(());
    for flags in [
        libc::F_ALLOCATECONTIG | libc::F_ALLOCATEALL,
        libc::F_ALLOCATEALL,
    ] {
        let mut store = libc::fstore_t {
            fst_flags: flags,
            fst_posmode: libc::F_PEOFPOSMODE,
            fst_offset: 0,
            fst_length: length,
            fst_bytesalloc: 0,
        };
        // SAFETY: F_PREALLOCATE reads and writes one fstore_t, which `store` is.
        let answer = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_PREALLOCATE, &mut store) };
        preallocated = if answer == -1 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        };
        if preallocated.is_ok() {
            break;
        }
    }
    match preallocated {
        // F_PREALLOCATE allocates blocks but leaves the length: set it.
        Ok(()) => file.set_len(bytes),
        Err(error) if facts::preallocation_falls_back_to_zeros(&error) => write_zeros(file, bytes),
        Err(error) => Err(error),
    }
}

/// Allocates by writing: `bytes` zeros from the start of `file`, then syncs them so the
/// blocks are really taken.
fn write_zeros(file: &File, bytes: u64) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    const CHUNK_BYTES: usize = 64 << 10;
    let zeros = vec![0_u8; CHUNK_BYTES];
    let mut offset = 0_u64;
    while offset < bytes {
        let left = usize::try_from(bytes - offset).unwrap_or(usize::MAX);
        let chunk = &zeros[..left.min(CHUNK_BYTES)];
        file.write_all_at(chunk, offset)?;
        offset += chunk.len() as u64;
    }
    file.sync_all()
}

pub(super) fn pipe_cloexec() -> io::Result<(OwnedFd, OwnedFd)> {
    // macOS has no pipe2, so the ends are made close-on-exec just after: a child forked by
    // another thread in between would keep them across its exec. The one caller,
    // `runner::step_process::spawn_gated`, makes pipes and forks one spawn at a time, and no
    // other thread of the runner forks, so nothing can fork in that window.
    let (read_end, write_end) = nix::unistd::pipe().map_err(io::Error::from)?;
    for end in [&read_end, &write_end] {
        fcntl(end, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC)).map_err(io::Error::from)?;
    }
    Ok((read_end, write_end))
}

/// macOS has no watch on a directory's files here: a wait only sleeps, and the caller's
/// bounded polling is the wake-up.
#[derive(Debug)]
pub(super) struct DirWatch;

impl DirWatch {
    pub(super) const IS_WOKEN_BY_CHANGES: bool = false;

    pub(super) fn new(_dir: &std::path::Path, _names: &[&str]) -> io::Result<DirWatch> {
        Ok(DirWatch)
    }

    pub(super) fn watch_also(&self, _dir: &std::path::Path) -> io::Result<()> {
        Ok(())
    }

    pub(super) fn wait(&self, timeout: std::time::Duration) -> io::Result<bool> {
        std::thread::sleep(timeout);
        Ok(false)
    }
}

/// `sun_path` is 104 bytes on macOS, NUL included.
pub(super) const MAX_SOCKET_PATH_BYTES: usize = 103;

/// macOS has no path that names an open directory.
pub(super) fn path_through_dir(_dir: std::os::fd::BorrowedFd<'_>) -> Option<std::path::PathBuf> {
    None
}

pub(super) fn peer_uid(socket: &UnixStream) -> io::Result<u32> {
    let mut uid: libc::uid_t = 0;
    let mut gid: libc::gid_t = 0;
    // SAFETY: both out-pointers point to live locals of the types getpeereid writes; the
    // descriptor is open for the duration of the call (borrowed from `socket`).
    let result = unsafe { libc::getpeereid(socket.as_raw_fd(), &mut uid, &mut gid) };
    if result != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(uid)
}

pub(super) fn no_sigpipe(socket: &UnixStream) -> io::Result<()> {
    let on: libc::c_int = 1;
    // SAFETY: the option value is a live c_int and its size is given; the descriptor is open
    // for the duration of the call (borrowed from `socket`).
    let result = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_NOSIGPIPE,
            (&raw const on).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if result != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

pub(super) fn send_all(socket: &UnixStream, bytes: &[u8]) -> io::Result<()> {
    // SO_NOSIGPIPE (set by `no_sigpipe`) turns a gone peer into EPIPE.
    let mut socket = socket;
    socket.write_all(bytes)
}

pub(super) fn peer_is_this_user(socket: &UnixStream) -> io::Result<bool> {
    Ok(peer_uid(socket)? == nix::unistd::geteuid().as_raw())
}

pub(super) fn may_share_commits() -> bool {
    true
}

pub(super) fn unix_stream_socket() -> io::Result<OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: a plain socket(2) call; the descriptor it returns is owned from here on.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just opened and nothing else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: F_SETFD with FD_CLOEXEC on an open descriptor.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

pub(super) fn journal_write_lock_holder(_path: &std::path::Path) -> Option<(u32, String)> {
    None
}

pub(super) fn flock_holder(_path: &std::path::Path) -> Option<(u32, String)> {
    None
}

pub(super) fn processes_with_open(_path: &std::path::Path) -> Vec<(u32, String)> {
    Vec::new()
}
