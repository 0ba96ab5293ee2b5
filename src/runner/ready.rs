//! The runner's half of the launch handshake's wake-up. The journal is the handshake (docs/design.md,
//! "Runner and launch"): the launcher returns once it reads `RunnerStarted` there. So that it need not
//! poll for it, the launcher passes the runner, on purpose, the write end of a pipe, and names
//! its descriptor in [`READY_FD_ENV`]; once `RunnerStarted` is durable the runner writes one
//! byte to it and closes it. The launcher sleeps on the read end and looks at the journal as
//! soon as the byte, or the end of the pipe (the runner exited), arrives.
//!
//! Invariants:
//! * the signal only wakes the launcher; what it then reads in the journal decides, so a
//!   missing, lost or forged byte changes nothing but when the launcher looks;
//! * the descriptor is made close-on-exec as soon as it is taken, and the variable is removed
//!   from every step's environment: no step inherits either.

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

/// The environment variable naming the descriptor a launcher passes its runner on purpose:
/// the write end of the pipe of the launch handshake. A runner that closes inherited
/// descriptors keeps this one until it has signalled.
pub const READY_FD_ENV: &str = "RUNJOURNAL_READY_FD";

/// The write end of the handshake's pipe, taken from the environment.
#[derive(Debug)]
pub struct ReadySignal {
    pipe: File,
}

impl ReadySignal {
    /// The descriptor [`READY_FD_ENV`] names, if it is one a launcher passes: a number above
    /// 2, open, a pipe, open for writing. It is made close-on-exec at once. `Ok(None)` when the
    /// variable is not set; an error says why a value set is not used (the launcher then
    /// looks at the journal at its own pace).
    ///
    /// Call it once per process: the descriptor is owned (and closed) by what it returns.
    pub fn from_env() -> Result<Option<ReadySignal>, String> {
        let Some(text) = std::env::var_os(READY_FD_ENV) else {
            return Ok(None);
        };
        ReadySignal::take(&text.to_string_lossy()).map(Some)
    }

    /// The descriptor `text` names, checked and taken as [`ReadySignal::from_env`] does.
    fn take(text: &str) -> Result<ReadySignal, String> {
        let fd: RawFd = text
            .parse()
            .map_err(|_| format!("{READY_FD_ENV}={text:?} is not a descriptor number"))?;
        if fd <= 2 {
            return Err(format!(
                "{READY_FD_ENV}={fd} names a standard stream, not the handshake's pipe"
            ));
        }
        check_pipe_for_writing(fd).map_err(|why| format!("{READY_FD_ENV}={fd}: {why}"))?;
        // SAFETY: the descriptor is open (checked above) and was passed to this process for
        // this use alone; this is its only owner from here on (callers take it once).
        let owned = unsafe { OwnedFd::from_raw_fd(fd) };
        nix::fcntl::fcntl(
            &owned,
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
        )
        .map_err(|error| format!("{READY_FD_ENV}={fd}: making it close-on-exec: {error}"))?;
        Ok(ReadySignal {
            pipe: File::from(owned),
        })
    }

    /// The descriptor's number.
    pub fn raw_fd(&self) -> RawFd {
        use std::os::fd::AsRawFd;
        self.pipe.as_raw_fd()
    }

    /// Tells the launcher that `RunnerStarted` is durable, and closes the pipe. A launcher
    /// that is gone (a broken pipe) is no failure of the run.
    pub fn signal(mut self) -> io::Result<()> {
        match self.pipe.write_all(b"1") {
            Err(error) if error.kind() == io::ErrorKind::BrokenPipe => Ok(()),
            written => written,
        }
    }
}

/// Whether `fd` is an open pipe this process may write to.
fn check_pipe_for_writing(fd: RawFd) -> Result<(), String> {
    use nix::fcntl::{FcntlArg, OFlag, fcntl};
    use nix::sys::stat::{SFlag, fstat};
    // SAFETY: borrowed only for the two calls below, while the descriptor stays open.
    let borrowed = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    let flags = fcntl(borrowed, FcntlArg::F_GETFL).map_err(|error| format!("not open: {error}"))?;
    let mode = OFlag::from_bits_truncate(flags) & OFlag::O_ACCMODE;
    if mode != OFlag::O_WRONLY && mode != OFlag::O_RDWR {
        return Err("not open for writing".to_string());
    }
    let stat = fstat(borrowed).map_err(|error| format!("cannot be looked at: {error}"))?;
    if SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT != SFlag::S_IFIFO {
        return Err("not a pipe".to_string());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::fd::{AsRawFd, IntoRawFd};

    #[test]
    fn only_an_open_pipe_for_writing_above_the_standard_streams_is_taken() {
        assert!(ReadySignal::take("seven").is_err());
        assert!(ReadySignal::take("1").is_err(), "a standard stream");
        let dir = tempfile::tempdir().expect("temp dir");
        let file = File::create(dir.path().join("not-a-pipe")).expect("a file");
        let error = ReadySignal::take(&file.as_raw_fd().to_string()).expect_err("a file");
        assert!(error.contains("not a pipe"), "{error}");
        let (read_end, write_end) = crate::platform::pipe_cloexec().expect("a pipe");
        let error = ReadySignal::take(&read_end.as_raw_fd().to_string()).expect_err("read end");
        assert!(error.contains("not open for writing"), "{error}");
        // The write end is taken (owned from here: into_raw_fd gives it up), signals one
        // byte, and closes.
        let number = write_end.into_raw_fd();
        let ready = ReadySignal::take(&number.to_string()).expect("the write end");
        ready.signal().expect("signal");
        let mut read = Vec::new();
        File::from(read_end).read_to_end(&mut read).expect("read");
        assert_eq!(read, b"1", "one byte, then the end of the pipe");
    }
}
