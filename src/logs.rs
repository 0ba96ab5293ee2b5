//! Reading the logs a run leaves behind (`runner.log`, `output-<i>.log`): the end of one, as a
//! run's summary or a failure's reason quotes it, and the bytes after an offset, streamed as
//! `logs` (and `logs --follow`) prints them.
//!
//! Invariant: reading a tail costs the same whatever the file's size: it seeks to the end and
//! reads at most [`TailBounds::window_bytes`], never the whole file.
//! Invariant: streaming holds at most [`COPY_CHUNK_BYTES`] of a log in memory, and stops at
//! the length the log had when it was opened, so a log growing as fast as it is read cannot
//! keep one call going.
//! Invariant: a log is opened without following a symbolic link in its place (`O_NOFOLLOW`):
//! what a tail quotes goes into the journal (a summary, a failure's reason), and must be the
//! run's own text, never a file a link points to.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::Path;

/// How much of a log is held in memory at once while it is streamed.
pub const COPY_CHUNK_BYTES: usize = 64 * 1024;

/// How much of a log's end a tail keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TailBounds {
    /// At most this many lines (empty lines do not count and are not kept).
    pub max_lines: usize,
    /// At most this many bytes of text; a longer tail keeps its end, after a `…`.
    pub max_bytes: usize,
}

/// The least a tail reads, so a few short lines after a long run of blank ones still show.
const MIN_WINDOW_BYTES: u64 = 4096;

impl TailBounds {
    /// How many bytes at the end of the file are read: enough for `max_bytes` of text after
    /// trailing blank lines and a partial first line.
    pub fn window_bytes(self) -> u64 {
        (self.max_bytes as u64)
            .saturating_mul(4)
            .max(MIN_WINDOW_BYTES)
    }
}

/// Opens a log for reading, refusing a symbolic link in its place (ELOOP), without blocking:
/// a FIFO a user put in a log's place opens at once even with no writer (and has no bytes
/// to show by its length) instead of hanging the reader.
fn open_log(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
        .open(path)
}

/// The last lines of a log: at most `bounds.max_lines` non-empty lines, their trailing
/// whitespace trimmed, joined by `\n`, at most `bounds.max_bytes` long (a longer tail keeps its
/// end, after a `…`). Bytes that are not UTF-8 become U+FFFD. A file that does not exist has
/// an empty tail; other read errors are returned.
pub fn tail(path: &Path, bounds: TailBounds) -> io::Result<String> {
    let mut file = match open_log(path) {
        Ok(file) => file,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(String::new()),
        Err(error) => return Err(error),
    };
    let length = file.metadata()?.len();
    let window = bounds.window_bytes();
    let start = length.saturating_sub(window);
    file.seek(SeekFrom::Start(start))?;
    let mut bytes = Vec::new();
    file.take(window).read_to_end(&mut bytes)?;
    // A window that starts inside the file starts inside a line: drop that partial line (it
    // may also start inside a UTF-8 sequence), unless it is all there is.
    let bytes = match bytes.iter().position(|&byte| byte == b'\n') {
        Some(newline) if start > 0 => &bytes[newline + 1..],
        _ => &bytes[..],
    };
    Ok(tail_of_text(&String::from_utf8_lossy(bytes), bounds))
}

/// The last `max_bytes` bytes of a log as text, as pi-subagents keeps a command's output (a
/// byte tail, decoded, then trimmed): a UTF-8 sequence cut at the window's start is dropped,
/// other bytes that are not UTF-8 become U+FFFD. `Ok(None)` when the file does not exist.
pub fn byte_tail(path: &Path, max_bytes: u64) -> io::Result<Option<String>> {
    let mut file = match open_log(path) {
        Ok(file) => file,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(error),
    };
    let length = file.metadata()?.len();
    let start = length.saturating_sub(max_bytes);
    file.seek(SeekFrom::Start(start))?;
    let mut bytes = Vec::new();
    file.take(max_bytes).read_to_end(&mut bytes)?;
    // At most three continuation bytes begin a window cut inside a character.
    let skip = if start > 0 {
        bytes
            .iter()
            .take(3)
            .take_while(|&&byte| byte & 0xC0 == 0x80)
            .count()
    } else {
        0
    };
    Ok(Some(
        String::from_utf8_lossy(&bytes[skip..]).trim().to_string(),
    ))
}

/// The tail of a text already read, as [`tail`] describes it.
fn tail_of_text(text: &str, bounds: TailBounds) -> String {
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim_end)
        .filter(|line| !line.is_empty())
        .collect();
    let first = lines.len().saturating_sub(bounds.max_lines);
    let tail = lines[first..].join("\n");
    if tail.len() <= bounds.max_bytes {
        return tail;
    }
    // Keep the end, which is what a reader of a summary or a failure wants, after a mark
    // when there is room for one.
    const CUT_MARK: &str = "…";
    let mark = if bounds.max_bytes > CUT_MARK.len() {
        CUT_MARK
    } else {
        ""
    };
    let mut cut = tail.len() - (bounds.max_bytes - mark.len());
    while !tail.is_char_boundary(cut) {
        cut += 1;
    }
    format!("{mark}{}", &tail[cut..])
}

/// The bytes a log has past an offset, opened and not read yet.
#[derive(Debug)]
pub struct NewBytes {
    file: File,
    /// How many there are: the log's length when it was opened, less the offset.
    count: u64,
}

/// Why streaming a log failed: reading the log, or writing what was read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CopyError {
    #[error("reading the log: {0}")]
    Read(#[source] io::Error),
    #[error("writing the log's bytes: {0}")]
    Write(#[source] io::Error),
}

/// The bytes of the log at `path` past `offset`, as its length is now; `None` when there are
/// none (a log that does not exist yet has none).
pub fn new_bytes(path: &Path, offset: u64) -> io::Result<Option<NewBytes>> {
    let mut file = match open_log(path) {
        Ok(file) => file,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(error),
    };
    let length = file.metadata()?.len();
    if length <= offset {
        return Ok(None);
    }
    file.seek(SeekFrom::Start(offset))?;
    Ok(Some(NewBytes {
        file,
        count: length - offset,
    }))
}

impl NewBytes {
    /// How many bytes there are.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Writes them to `out`, [`COPY_CHUNK_BYTES`] at a time; the bytes written (fewer than
    /// [`NewBytes::count`] only if the log was cut short meanwhile).
    pub fn copy_to(self, out: &mut impl Write) -> Result<u64, CopyError> {
        let mut reader = self.file.take(self.count);
        let mut buffer = vec![0u8; COPY_CHUNK_BYTES];
        let mut copied = 0u64;
        loop {
            let count = match reader.read(&mut buffer) {
                Ok(0) => return Ok(copied),
                Ok(count) => count,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
                Err(error) => return Err(CopyError::Read(error)),
            };
            out.write_all(&buffer[..count]).map_err(CopyError::Write)?;
            copied += count as u64;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bounds(max_lines: usize, max_bytes: usize) -> TailBounds {
        TailBounds {
            max_lines,
            max_bytes,
        }
    }

    /// `runjournal logs` of a run whose log is a FIFO nobody writes to any more: a blocking
    /// open would wait for a writer forever.
    #[test]
    fn a_fifo_in_a_logs_place_without_a_writer_does_not_hang_a_reader() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("output-0.log");
        nix::unistd::mkfifo(&path, nix::sys::stat::Mode::S_IRWXU).expect("mkfifo");
        assert!(
            new_bytes(&path, 0).expect("opens at once").is_none(),
            "a FIFO has no bytes by its length"
        );
    }

    #[test]
    fn a_byte_tail_keeps_the_end_trimmed_and_drops_a_character_cut_at_its_start() {
        // "é" is two bytes: a window of 5 starts inside it.
        let (_dir, path) = file_with("aé-xy\n".as_bytes());
        assert_eq!(byte_tail(&path, 5).expect("read").as_deref(), Some("-xy"));
        assert_eq!(
            byte_tail(&path, 64).expect("read").as_deref(),
            Some("aé-xy")
        );
        let missing = path.with_file_name("missing.log");
        assert_eq!(byte_tail(&missing, 64).expect("read"), None);
    }

    #[test]
    fn a_link_in_a_logs_place_is_not_read_through() {
        let (dir, victim) = file_with(b"secret\n");
        let link = dir.path().join("output-0.log");
        std::os::unix::fs::symlink(&victim, &link).expect("link");
        assert!(tail(&link, bounds(5, 300)).is_err());
        assert!(new_bytes(&link, 0).is_err());
        assert!(byte_tail(&link, 64).is_err());
    }

    fn file_with(bytes: &[u8]) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("out.log");
        std::fs::write(&path, bytes).expect("write the log");
        (dir, path)
    }

    #[test]
    fn only_the_last_non_empty_lines_are_kept() {
        let (_dir, path) = file_with(b"1\n2\n\n3\n4  \n5\n\n6\n\n");
        assert_eq!(tail(&path, bounds(3, 100)).expect("reads"), "4\n5\n6");
        assert_eq!(tail(&path, bounds(1, 100)).expect("reads"), "6");
    }

    #[test]
    fn a_long_file_is_read_only_at_its_end() {
        // 200,000 lines: far more than the window, which must not hold the start.
        let text: String = (0..200_000).map(|line| format!("line {line}\n")).collect();
        let (_dir, path) = file_with(text.as_bytes());
        let bounds = bounds(3, 100);
        assert!((text.len() as u64) > 10 * bounds.window_bytes());
        assert_eq!(
            tail(&path, bounds).expect("reads"),
            "line 199997\nline 199998\nline 199999"
        );
    }

    #[test]
    fn the_bound_in_bytes_keeps_the_end() {
        let long = "x".repeat(50);
        let (_dir, path) = file_with(format!("{long}\nabcdefgh\n").as_bytes());
        let tail = tail(&path, bounds(5, 30)).expect("reads");
        assert!(tail.len() <= 30, "{} bytes: {tail:?}", tail.len());
        assert!(tail.starts_with('…'), "{tail:?}");
        assert!(tail.ends_with("\nabcdefgh"), "{tail:?}");
    }

    #[test]
    fn the_byte_bound_holds_even_below_the_mark() {
        let (_dir, path) = file_with(b"abcdef\n");
        for max_bytes in 0..8 {
            let tail = tail(&path, bounds(5, max_bytes)).expect("reads");
            assert!(tail.len() <= max_bytes, "{max_bytes}: {tail:?}");
        }
        assert_eq!(tail(&path, bounds(5, 2)).expect("reads"), "ef");
    }

    #[test]
    fn the_byte_bound_never_splits_a_character() {
        let (_dir, path) = file_with("é".repeat(40).as_bytes());
        let tail = tail(&path, bounds(5, 31)).expect("reads");
        assert!(tail.len() <= 31, "{} bytes", tail.len());
        assert!(tail.trim_start_matches('…').chars().all(|c| c == 'é'));
    }

    #[test]
    fn invalid_utf8_is_replaced_not_refused() {
        let (_dir, path) = file_with(b"ok\nbad \xff\xfe bytes\n");
        assert_eq!(
            tail(&path, bounds(5, 100)).expect("reads"),
            "ok\nbad \u{fffd}\u{fffd} bytes"
        );
    }

    #[test]
    fn a_window_starting_inside_a_character_drops_that_partial_line() {
        // The window starts in the middle of the first line's multi-byte characters.
        let bounds = bounds(5, 100);
        let first = "é".repeat(bounds.window_bytes() as usize);
        let (_dir, path) = file_with(format!("{first}\nlast line\n").as_bytes());
        assert_eq!(tail(&path, bounds).expect("reads"), "last line");
    }

    #[test]
    fn a_missing_file_has_an_empty_tail() {
        let dir = tempfile::tempdir().expect("temp dir");
        assert_eq!(
            tail(&dir.path().join("missing.log"), bounds(3, 100)).expect("no error"),
            ""
        );
        assert!(
            new_bytes(&dir.path().join("missing.log"), 0)
                .expect("no error")
                .is_none()
        );
    }

    #[test]
    fn streaming_from_an_offset_gives_what_follows() {
        let (_dir, path) = file_with(b"hello world");
        let bytes = new_bytes(&path, 6).expect("opens").expect("there is more");
        assert_eq!(bytes.count(), 5);
        let mut out = Vec::new();
        assert_eq!(bytes.copy_to(&mut out).expect("copies"), 5);
        assert_eq!(out, b"world");
        assert!(new_bytes(&path, 11).expect("opens").is_none());
    }

    #[test]
    fn streaming_stops_at_the_length_the_log_had_when_opened() {
        let (_dir, path) = file_with(&vec![b'a'; 3 * COPY_CHUNK_BYTES + 7]);
        let bytes = new_bytes(&path, 0).expect("opens").expect("bytes");
        // The log grows after it was opened: the growth is for the next call.
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .and_then(|mut file| file.write_all(b"later"))
            .expect("append");
        let mut out = Vec::new();
        let copied = bytes.copy_to(&mut out).expect("copies");
        assert_eq!(copied, (3 * COPY_CHUNK_BYTES + 7) as u64);
        assert!(out.iter().all(|&byte| byte == b'a'));
        let rest = new_bytes(&path, copied)
            .expect("opens")
            .expect("the growth");
        assert_eq!(rest.count(), 5);
    }

    #[test]
    fn a_failed_write_is_told_from_a_failed_read() {
        struct Closed;
        impl Write for Closed {
            fn write(&mut self, _: &[u8]) -> io::Result<usize> {
                Err(io::ErrorKind::BrokenPipe.into())
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let (_dir, path) = file_with(b"x");
        let bytes = new_bytes(&path, 0).expect("opens").expect("bytes");
        assert!(matches!(
            bytes.copy_to(&mut Closed),
            Err(CopyError::Write(error)) if error.kind() == io::ErrorKind::BrokenPipe
        ));
    }
}
