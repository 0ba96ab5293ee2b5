//! What a journal file holds, judged from its length and its first bytes, before anything
//! opens it: missing, empty, only zeros, not a redb database, shorter than its own header says,
//! or plausibly a database. A home that holds runs refuses all but the last
//! ([`crate::store::Store::open`], [`crate::source::JournalSource::open`]), where an open would
//! otherwise initialise a new, empty journal over the lost one.
//!
//! The length check reads redb's file header (format 3: page size and region geometry at
//! fixed offsets, then the region counts, all little-endian): redb grows the file before it
//! writes a header that describes the larger layout, and writes a smaller layout before it
//! shrinks the file, so a file shorter than its header's layout was cut by someone else. The
//! header is read before and after the length, and only a length judged between two equal
//! reads counts, so a writer resizing the file meanwhile is never mistaken for a truncation.
//!
//! Invariant: examining reads; it never writes, locks or creates anything.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::Path;

use crate::home::Home;
use crate::journal::format::error::{FileFinding, OpenError};

/// redb's magic number, the first bytes of every database it finished creating.
const REDB_MAGIC: [u8; 9] = [b'r', b'e', b'd', b'b', 0x1A, 0x0A, 0xA9, 0x0D, 0x0A];

/// The part of redb's header that describes the file's layout: magic, god byte, padding, page
/// size, region header pages, region data pages, full regions, trailing region pages.
const LAYOUT_HEADER_BYTES: usize = 32;

/// Reads of the header around the length before the examination settles for "plausible".
const HEADER_READS: usize = 5;

/// Refuses the journal of a home that holds runs or results when the file is lost (missing,
/// empty, zeroed, cut short, not a database): [`OpenError::Lost`], naming what was found.
/// Reads only; a home without runs or results passes whatever its journal file is (a journal
/// is made there, or a creation cut short is finished, as before). The runs directory is
/// listed only when the file looks lost, so a healthy home costs one header read.
pub fn check_home_journal(home: &Home) -> Result<(), OpenError> {
    let path = home.journal_path();
    let io_error = |path: &Path| {
        let path = path.to_path_buf();
        move |source| OpenError::Io { path, source }
    };
    let found = examine(&path).map_err(io_error(&path))?;
    if !found.is_lost() {
        return Ok(());
    }
    let runs = home
        .run_dirs_on_disk()
        .map_err(io_error(&home.runs_dir()))?;
    let results = home
        .result_files_on_disk()
        .map_err(io_error(&home.results_dir()))?;
    if runs.is_empty() && results.is_empty() {
        return Ok(());
    }
    Err(OpenError::Lost {
        path,
        found,
        runs: runs.len(),
        results: results.len(),
        home_args: home_args(home),
    })
}

/// `--home DIR ` (and `--layout pi-subagents ` for that layout): how a command names this
/// home, for a message that says what to run.
fn home_args(home: &Home) -> String {
    let root = home.root().display().to_string();
    let quoted = if root
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "/._-+,:@".contains(c))
    {
        root
    } else {
        format!("'{}'", root.replace('\'', "'\\''"))
    };
    match home.layout() {
        crate::home::Layout::Runjournal => format!("--home {quoted} "),
        crate::home::Layout::PiSubagents => format!("--home {quoted} --layout pi-subagents "),
    }
}

/// Examines the file at `path` ([module docs](self)). Only a regular file is examined: a link,
/// a FIFO or a device in its place is an error, met without blocking
/// ([`crate::durable_fs::open_existing_read_only`]).
pub fn examine(path: &Path) -> io::Result<FileFinding> {
    let mut file = match crate::durable_fs::open_existing_read_only(path) {
        Ok(file) => file,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(FileFinding::Missing),
        Err(error) => return Err(error),
    };
    let bytes = file.metadata()?.len();
    if bytes == 0 {
        return Ok(FileFinding::Empty);
    }
    let mut previous = read_header(&mut file)?;
    if !previous.starts_with(&REDB_MAGIC) {
        return Ok(if is_all_zero(&mut file)? {
            FileFinding::Zeroed { bytes }
        } else {
            FileFinding::NotRedb { bytes }
        });
    }
    for _ in 0..HEADER_READS {
        let bytes = file.metadata()?.len();
        let header = read_header(&mut file)?;
        if header == previous {
            return Ok(judge_length(&header, bytes));
        }
        previous = header;
    }
    // The header kept changing under live writers: it is being written, so it is a journal.
    Ok(FileFinding::Plausible)
}

/// Up to [`LAYOUT_HEADER_BYTES`] from the start of the file.
fn read_header(file: &mut File) -> io::Result<Vec<u8>> {
    file.seek(SeekFrom::Start(0))?;
    let mut header = Vec::with_capacity(LAYOUT_HEADER_BYTES);
    file.by_ref()
        .take(LAYOUT_HEADER_BYTES as u64)
        .read_to_end(&mut header)?;
    Ok(header)
}

/// Whether every byte of the file is zero; stops at the first that is not.
fn is_all_zero(file: &mut File) -> io::Result<bool> {
    file.seek(SeekFrom::Start(0))?;
    let mut chunk = vec![0u8; 64 << 10];
    loop {
        let read = file.read(&mut chunk)?;
        if read == 0 {
            return Ok(true);
        }
        if chunk[..read].iter().any(|&byte| byte != 0) {
            return Ok(false);
        }
    }
}

/// Compares a file's length with the layout its header (starting with the magic number)
/// describes. Pure. A header too short to read is a truncation; one whose geometry makes no
/// sense is left to redb.
fn judge_length(header: &[u8], bytes: u64) -> FileFinding {
    let Some(expected_bytes) = layout_bytes(header) else {
        return if header.len() < LAYOUT_HEADER_BYTES {
            FileFinding::Truncated {
                bytes,
                // The smallest database redb makes is a few pages; one page is certainly less.
                expected_bytes: 4096,
            }
        } else {
            FileFinding::Plausible
        };
    };
    if bytes < expected_bytes {
        FileFinding::Truncated {
            bytes,
            expected_bytes,
        }
    } else {
        FileFinding::Plausible
    }
}

/// The length of the layout redb's header describes: the super-header page, the full
/// regions, and the trailing region (its header pages and data pages). `None` when the header
/// is short or its geometry is not one redb writes. Pure.
fn layout_bytes(header: &[u8]) -> Option<u64> {
    let field = |offset: usize| -> Option<u64> {
        let bytes: [u8; 4] = header.get(offset..offset + 4)?.try_into().ok()?;
        Some(u64::from(u32::from_le_bytes(bytes)))
    };
    let page_size = field(12)?;
    let region_header_pages = field(16)?;
    let region_data_pages = field(20)?;
    let full_regions = field(24)?;
    let trailing_pages = field(28)?;
    if !page_size.is_power_of_two() || !(512..=(1 << 20)).contains(&page_size) {
        return None;
    }
    if region_data_pages == 0 {
        return None;
    }
    let full_region_bytes = region_header_pages
        .checked_add(region_data_pages)?
        .checked_mul(page_size)?;
    let trailing_bytes = if trailing_pages > 0 {
        region_header_pages
            .checked_add(trailing_pages)?
            .checked_mul(page_size)?
    } else {
        0
    };
    page_size
        .checked_add(full_regions.checked_mul(full_region_bytes)?)?
        .checked_add(trailing_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(
        page_size: u32,
        header_pages: u32,
        data_pages: u32,
        full: u32,
        trailing: u32,
    ) -> Vec<u8> {
        let mut bytes = REDB_MAGIC.to_vec();
        bytes.extend([5, 0, 0]);
        for value in [page_size, header_pages, data_pages, full, trailing] {
            bytes.extend(value.to_le_bytes());
        }
        bytes
    }

    #[test]
    fn the_layout_length_is_the_super_header_and_the_regions() {
        assert_eq!(
            layout_bytes(&header(4096, 0, 1 << 20, 0, 27)),
            Some(4096 + 27 * 4096)
        );
        assert_eq!(
            layout_bytes(&header(4096, 2, 100, 3, 10)),
            Some(4096 + 3 * 102 * 4096 + 12 * 4096)
        );
        assert_eq!(
            layout_bytes(&header(4096, 0, 100, 1, 0)),
            Some(4096 + 100 * 4096)
        );
        assert_eq!(
            layout_bytes(&header(1000, 0, 1, 1, 1)),
            None,
            "not a power of two"
        );
        assert_eq!(
            layout_bytes(&header(4096, 0, 0, 1, 1)),
            None,
            "no data pages"
        );
        assert_eq!(layout_bytes(&header(4096, 0, 1, 1, 1)[..20]), None, "short");
    }

    #[test]
    fn a_file_shorter_than_its_layout_is_truncated() {
        let full = header(4096, 0, 1 << 20, 0, 27);
        assert_eq!(
            judge_length(&full, 4096 + 27 * 4096),
            FileFinding::Plausible
        );
        assert_eq!(
            judge_length(&full, 4096 + 28 * 4096),
            FileFinding::Plausible,
            "longer is a grown file whose header is not written yet"
        );
        assert_eq!(
            judge_length(&full, 57344),
            FileFinding::Truncated {
                bytes: 57344,
                expected_bytes: 4096 + 27 * 4096
            }
        );
        assert_eq!(
            judge_length(&full[..20], 20),
            FileFinding::Truncated {
                bytes: 20,
                expected_bytes: 4096
            }
        );
    }

    #[test]
    fn files_are_told_apart_by_their_bytes() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("journal.redb");
        assert_eq!(examine(&path).expect("examine"), FileFinding::Missing);
        std::fs::write(&path, b"").expect("write");
        assert_eq!(examine(&path).expect("examine"), FileFinding::Empty);
        std::fs::write(&path, vec![0u8; 200_000]).expect("write");
        assert_eq!(
            examine(&path).expect("examine"),
            FileFinding::Zeroed { bytes: 200_000 }
        );
        let mut almost = vec![0u8; 200_000];
        almost[150_000] = 1;
        std::fs::write(&path, &almost).expect("write");
        assert_eq!(
            examine(&path).expect("examine"),
            FileFinding::NotRedb { bytes: 200_000 }
        );
        let journal = crate::journal::Journal::open(&path);
        assert!(journal.is_err(), "not a journal: {journal:?}");
        std::fs::remove_file(&path).expect("remove");
        drop(crate::journal::Journal::open(&path).expect("a new journal"));
        assert_eq!(examine(&path).expect("examine"), FileFinding::Plausible);
        let bytes = std::fs::metadata(&path).expect("metadata").len();
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .expect("open");
        file.set_len(bytes / 2).expect("truncate");
        assert_eq!(
            examine(&path).expect("examine"),
            FileFinding::Truncated {
                bytes: bytes / 2,
                expected_bytes: bytes
            }
        );
    }

    #[test]
    fn a_lost_journal_is_refused_only_where_runs_or_results_are() {
        let dir = tempfile::tempdir().expect("temp dir");
        let home = Home::at(dir.path());
        assert!(check_home_journal(&home).is_ok(), "an empty home");
        std::fs::create_dir_all(home.runs_dir().join("not-a-run")).expect("mkdir");
        std::fs::write(home.journal_path(), b"").expect("write");
        assert!(
            check_home_journal(&home).is_ok(),
            "nothing of ours: a new journal may be made"
        );
        let run: crate::event::RunId = "01ARZ3NDEKTSV4RRFFQ69G5FAV".parse().expect("run id");
        std::fs::create_dir_all(home.results_dir()).expect("mkdir");
        std::fs::write(home.result_path(run), b"{}").expect("write");
        let error = check_home_journal(&home).expect_err("a result is there");
        assert!(
            matches!(
                &error,
                OpenError::Lost {
                    found: FileFinding::Empty,
                    runs: 0,
                    results: 1,
                    ..
                }
            ),
            "{error:?}"
        );
        let message = error.to_string();
        assert!(
            message.contains("is empty (0 bytes), but the home holds 1 result")
                && message.contains(&format!(
                    "`journal-tools --home {} recover --from-projections`",
                    dir.path().display()
                )),
            "{message}"
        );
        std::fs::create_dir_all(home.run_dir(run)).expect("mkdir");
        std::fs::remove_file(home.journal_path()).expect("remove");
        let message = check_home_journal(&home).expect_err("lost").to_string();
        assert!(
            message.contains("is missing, but the home holds 1 run and 1 result"),
            "{message}"
        );
        assert!(!home.journal_path().exists(), "nothing was made");
    }

    #[test]
    fn a_journal_in_use_is_never_judged_truncated() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("journal.redb");
        let journal = crate::journal::Journal::open(&path).expect("open");
        let spec = crate::event::RunSpec {
            name: None,
            mode: crate::event::Mode::Chain,
            concurrency: 1,
            timeout_ms: None,
            cwd: None,
            steps: (0..100)
                .map(|index| crate::event::StepSpec {
                    name: format!("step {index}"),
                    action: crate::event::StepAction::Shell {
                        script: "y".repeat(3000),
                    },
                })
                .collect(),
        };
        let start_bytes = std::fs::metadata(&path).expect("metadata").len();
        for _ in 0..40 {
            journal
                .create_run(spec.clone(), crate::event::HostIds::default())
                .expect("create");
            assert_eq!(examine(&path).expect("examine"), FileFinding::Plausible);
        }
        assert!(
            std::fs::metadata(&path).expect("metadata").len() > start_bytes,
            "the journal grew while it was examined"
        );
    }
}
