//! Reading the logs a run leaves behind (`runner.log`, `output-<i>.log`): the end of one, as a
//! run's summary or a failure's reason quotes it, and the bytes after an offset, as `logs
//! --follow` prints them.
//!
//! Invariant: reading a tail costs the same whatever the file's size: it seeks to the end and
//! reads at most [`TailBounds::window_bytes`], never the whole file.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::Path;

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

/// The last lines of a log: at most `bounds.max_lines` non-empty lines, their trailing
/// whitespace trimmed, joined by `\n`, at most `bounds.max_bytes` long (a longer tail keeps its
/// end, after a `…`). Bytes that are not UTF-8 become U+FFFD. A file that does not exist has
/// an empty tail; other read errors are returned.
pub fn tail(path: &Path, bounds: TailBounds) -> io::Result<String> {
    let mut file = match File::open(path) {
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

/// The bytes of a log from `offset` on; nothing for a log that does not exist yet.
pub fn read_from(path: &Path, offset: u64) -> io::Result<Vec<u8>> {
    let mut file = match File::open(path) {
        Ok(file) => file,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(error) => return Err(error),
    };
    file.seek(SeekFrom::Start(offset))?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)?;
    Ok(bytes)
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
        assert_eq!(
            read_from(&dir.path().join("missing.log"), 0).expect("no error"),
            Vec::<u8>::new()
        );
    }

    #[test]
    fn reading_from_an_offset_returns_what_follows() {
        let (_dir, path) = file_with(b"hello world");
        assert_eq!(read_from(&path, 6).expect("reads"), b"world");
        assert_eq!(read_from(&path, 11).expect("reads"), b"");
    }
}
