//! The journal's commit lock: who leads, and how a leader that stays stopped loses the lead.
//!
//! The lock is an `flock` on the file the lock path names (`journal.redb.commit.lock`), held by
//! the leader for as long as it leads; the lock path is taken only with the lock file it names
//! at that moment ([`Lease::try_take`] checks after locking that the path still names the file
//! it locked). A leader stopped past its clients' leader timeout keeps its `flock`, so the lead
//! is taken over without it ([`Lease::take_over`]): a fresh lock file, locked first, is renamed
//! over the lock path. The stopped leader's lock is then on a file no path names; once it runs
//! again it finds the lock path naming another file (`Lease::is_deposed`) and stops serving.
//!
//! Nothing here is needed for a batch to land once: two leaders at once (a deposed one that ran
//! again before it looked, and its successor) commit batches of one writer under the same seqs,
//! and the writers' marks let each land at most once whoever judges it. The lease keeps
//! commits shared, and keeps a stopped leader from costing every new process its timeout.

use std::fs::File;
use std::io::{self, Seek, Write};
use std::path::{Path, PathBuf};

use crate::durable_fs;

/// A file as (device, inode): which file a path names at a moment.
pub(crate) type FileId = (u64, u64);

/// Which file `path` names now, without following a link; `None` when nothing is there.
/// Every path here is a file of the home, opened (looked at, renamed) relative to the home's
/// held directory by [`durable_fs`].
pub(crate) fn file_id(path: &Path) -> io::Result<Option<FileId>> {
    Ok(durable_fs::look(path)?.map(|entry| entry.stamp.id()))
}

/// The commit lock, held.
#[derive(Debug)]
pub(crate) struct Lease {
    file: File,
    id: FileId,
}

impl Lease {
    /// Takes the lock at `path` if nobody holds it, making the lock file (0600) if needed;
    /// `None` when another process holds it, or put another file in its place meanwhile. A
    /// link in its place is not followed, and a file of another user, or one others may write,
    /// is refused.
    pub(crate) fn try_take(path: &Path) -> io::Result<Option<Lease>> {
        let file = durable_fs::open_lock_file(path)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => return Ok(None),
            Err(std::fs::TryLockError::Error(error)) => return Err(error),
        }
        let id = opened_id(&file)?;
        // Locked, but a taking over may have put another file at the path since it was opened:
        // that file's holder leads.
        if file_id(path)? != Some(id) {
            return Ok(None);
        }
        Ok(Some(Lease { file, id }))
    }

    /// Takes the lock at `path` from the leader that holds it, found stopped: a fresh lock
    /// file, locked, is renamed over the path. `from` is the lock file that leader held, as the
    /// caller saw it before it found the leader silent: when the path names another file now,
    /// someone took the lead over already and `None` is returned (that leader is not the one
    /// found silent). Only a regular file of this user is replaced.
    pub(crate) fn take_over(path: &Path, from: Option<FileId>) -> io::Result<Option<Lease>> {
        match durable_fs::look(path) {
            Ok(Some(entry)) => {
                let is_ours = entry.facts.kind == durable_fs::EntryKind::File
                    && entry.facts.owner_uid == durable_fs::effective_uid();
                if !is_ours || Some(entry.stamp.id()) != from {
                    return Ok(None);
                }
            }
            // Nobody leads any more: take the lock as usual.
            Ok(None) => return Lease::try_take(path),
            Err(_) => return Ok(None),
        }
        let fresh = fresh_path(path);
        let file = durable_fs::create_exclusive(&fresh)?;
        let taken = (|| {
            file.try_lock().map_err(|error| match error {
                std::fs::TryLockError::WouldBlock => io::Error::from(io::ErrorKind::WouldBlock),
                std::fs::TryLockError::Error(error) => error,
            })?;
            let id = opened_id(&file)?;
            durable_fs::rename(&fresh, path)?;
            Ok(id)
        })();
        match taken {
            Ok(id) => Ok(Some(Lease { file, id })),
            Err(error) => {
                let _ = durable_fs::remove_if_present(&fresh);
                Err(error)
            }
        }
    }

    /// The lock file this lease holds.
    pub(crate) fn id(&self) -> FileId {
        self.id
    }

    /// Replaces the lock file's content with `note` (who leads, for people and tests to read;
    /// nothing decides by it).
    pub(crate) fn write_note(&self, note: &[u8]) -> io::Result<()> {
        let mut file = &self.file;
        file.set_len(0)?;
        file.rewind()?;
        file.write_all(note)
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        // Closing the file releases the lock as well; unlocking first only makes it prompt.
        let _ = self.file.unlock();
    }
}

/// Whether the lead of the holder of lock file `id` was taken over: the lock path names
/// another file (or none). A failure to look counts as not.
pub(crate) fn is_deposed(path: &Path, id: FileId) -> bool {
    matches!(file_id(path), Ok(found) if found != Some(id))
}

/// Which file an open file is.
fn opened_id(file: &File) -> io::Result<FileId> {
    use std::os::unix::fs::MetadataExt;
    let metadata = file.metadata()?;
    Ok((metadata.dev(), metadata.ino()))
}

/// A name beside `path` for a fresh lock file, of this process and moment.
fn fresh_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.subsec_nanos());
    name.push(format!(".{}-{nanos}", std::process::id()));
    PathBuf::from(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_holder_at_a_time_and_the_next_after_it_lets_go() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("journal.redb.commit.lock");
        let first = Lease::try_take(&path).expect("looks").expect("free");
        assert!(Lease::try_take(&path).expect("looks").is_none(), "held");
        assert!(!is_deposed(&path, first.id()));
        drop(first);
        assert!(
            Lease::try_take(&path).expect("looks").is_some(),
            "free again"
        );
    }

    #[test]
    fn a_taken_over_lease_knows_it_was_deposed_and_the_path_is_held_by_its_successor() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("journal.redb.commit.lock");
        let stopped = Lease::try_take(&path).expect("looks").expect("free");
        let successor = Lease::take_over(&path, Some(stopped.id()))
            .expect("takes over")
            .expect("from the leader found silent");
        assert!(
            is_deposed(&path, stopped.id()),
            "the stopped leader finds it was deposed"
        );
        assert!(!is_deposed(&path, successor.id()));
        assert!(
            Lease::try_take(&path).expect("looks").is_none(),
            "the path's lock is the successor's"
        );
        // A second taker that found the same leader silent deposes nobody: the lead has moved.
        assert!(
            Lease::take_over(&path, Some(stopped.id()))
                .expect("looks")
                .is_none()
        );
        assert!(!is_deposed(&path, successor.id()));
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .expect("read dir")
            .map(|entry| entry.expect("entry").file_name())
            .collect();
        assert_eq!(names.len(), 1, "no fresh file left behind: {names:?}");
    }

    #[test]
    fn a_file_of_another_kind_in_the_place_of_the_lock_is_not_replaced() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("journal.redb.commit.lock");
        std::fs::create_dir(&path).expect("a directory in its place");
        let id = file_id(&path).expect("looks");
        assert!(Lease::take_over(&path, id).expect("looks").is_none());
        assert!(path.is_dir(), "left alone");
    }
}
