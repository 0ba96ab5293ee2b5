//! Copying a journal file as it stood at one commit, while writers append to it.

use std::path::{Path, PathBuf};

/// Bytes at the start of a redb file that hold its header (the commit slots), with room to
/// spare: redb's header is 320 bytes, in its first page.
pub(crate) const REDB_HEADER_BYTES: usize = 4096;

/// How many times [`copy_consistent`] copies a journal that changed while it was copied
/// before it gives up.
pub const COPY_ATTEMPTS: u32 = 8;

/// Why a journal could not be copied.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CopyError {
    #[error("copying journal {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "journal {path} changed during each of {attempts} attempts to copy it (writers are busy); try again later"
    )]
    KeptChanging { path: PathBuf, attempts: u32 },
}

/// Copies the journal file at `source` to `dest` (created 0600, or truncated) as it stood at
/// one commit, even while writers append to it. Nothing is written to `source`.
///
/// redb writes a commit's pages before the header that names them, and never writes over the
/// pages of the latest commit; so a copy during which neither the header nor the file's length
/// changed holds that commit whole. A copy that saw either change is made again, up to
/// [`COPY_ATTEMPTS`] times. The copy may still be flagged as needing recovery (its writers were
/// open when it was taken); opening it for writing recovers it, as after a crash.
pub fn copy_consistent(source: &Path, dest: &Path) -> Result<(), CopyError> {
    use std::io::{Read, Seek};
    use std::os::unix::fs::FileExt;

    let at = |path: &Path| {
        let path = path.to_path_buf();
        move |source| CopyError::Io { path, source }
    };
    let state_of = |file: &std::fs::File| -> std::io::Result<(u64, Vec<u8>)> {
        let len = file.metadata()?.len();
        let mut header = vec![0u8; REDB_HEADER_BYTES];
        let mut filled = 0;
        while filled < header.len() {
            match file.read_at(&mut header[filled..], filled as u64)? {
                0 => break,
                read => filled += read,
            }
        }
        header.truncate(filled);
        Ok((len, header))
    };
    // No link followed and no FIFO waited for: a journal file is a regular file.
    let mut file = crate::durable_fs::open_existing_read_only(source).map_err(at(source))?;
    for attempt in 0..COPY_ATTEMPTS {
        let before = state_of(&file).map_err(at(source))?;
        let mut out = crate::durable_fs::open_truncated(dest).map_err(at(dest))?;
        file.rewind().map_err(at(source))?;
        std::io::copy(&mut (&mut file).take(before.0), &mut out).map_err(at(dest))?;
        drop(out);
        if state_of(&file).map_err(at(source))? == before {
            return Ok(());
        }
        // Back off a little more each time, so a burst of commits can end.
        std::thread::sleep(std::time::Duration::from_millis(
            10 * u64::from(attempt + 1),
        ));
    }
    Err(CopyError::KeptChanging {
        path: source.to_path_buf(),
        attempts: COPY_ATTEMPTS,
    })
}
