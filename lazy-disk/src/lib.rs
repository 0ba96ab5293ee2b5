//! A disk that forgets what was never synced: a FUSE file system for tests, whose whole state
//! lives in memory, and which can be *cut* like a power cord.
//!
//! Each file's content and each directory's entries exist twice, as they are now (*current*:
//! what every process reads) and as they would be found after a power cut (*durable*). A cut
//! throws the current versions away; a remount then serves the durable ones through a new FUSE
//! session, so no cache of the kernel can show what was lost.
//!
//! # The model, and what ext4 and XFS promise
//!
//! The model keeps exactly what `fsync(2)` promises a program, and nothing more:
//!
//! * **File data.** `write`, `truncate`, `fallocate` change the current content only. A file's
//!   `fsync` or `fdatasync` makes its whole current content (and so its size) durable. ext4
//!   (`data=ordered`) and XFS may have written any part of unsynced data back by the time of a
//!   crash, in any order, or none of it: the model keeps none (the worst case for a program that
//!   trusts unsynced data), or, with [`Tear::Sectors`], the first whole 512-byte sectors of the
//!   last unsynced write (a write the disk was in the middle of).
//! * **Directory entries.** `create`, `mknod`, `mkdir`, `symlink`, `link`, `rename`, `unlink`,
//!   `rmdir` change a directory's current entries only; that directory's `fsync` makes all of
//!   its current entries durable at once. `fsync(2)` says a file's `fsync` does not necessarily
//!   make the entry in its directory durable, and the model does not: a file created and
//!   synced but whose directory never was is gone after a cut. ext4 and XFS keep more — their
//!   journals commit metadata changes in order, so any `fsync` there also commits every earlier
//!   create, rename and unlink, in this directory and in others. A program that is correct on
//!   this model is therefore correct on them in this respect; the converse does not hold.
//! * **A rename across directories** is two changes here, one in each directory, each durable
//!   with its own directory's `fsync`. Syncing only the target keeps the file under both names
//!   (as a hard link would); syncing only the source loses it, a state a journaling file system
//!   does not produce (it commits both halves in one transaction). A program that renames into
//!   another directory must sync the target anyway, and then both models agree on the new name.
//! * **Attributes** (mode, owner, times) are not modelled as volatile: a cut keeps them as they
//!   are. Sizes are part of the content.
//! * **After a cut** an inode exists if a durable entry reaches it from the root; its link count
//!   is that of its durable entries. A file unlinked (durably) while open is gone.
//!
//! Between the cut and the remount every request is answered `EIO` and changes nothing: the
//! cut is one instant in the order of the file system's operations, so a process that saw its
//! `fsync` return before it has that data after the remount, whatever it does afterwards.
//!
//! # What it supports
//!
//! What a runjournal home needs: `pread`/`pwrite`, `ftruncate`, `posix_fallocate` (mode 0),
//! `fsync`/`fdatasync` of files and directories, renames over existing files (and
//! `RENAME_NOREPLACE`, `RENAME_EXCHANGE`), `O_APPEND` (the end of the file as this file system
//! knows it), `O_NOFOLLOW` and `O_EXCL` (checked by the kernel against the attributes served),
//! hard links, symbolic links, unix socket and FIFO nodes (`mknod`: `bind(2)` works, and
//! `connect(2)` reaches the socket through the kernel's inode, which a lookup of the same node
//! keeps), `statvfs`, and permissions (the kernel checks them: `default_permissions`). File
//! locks (`flock`, POSIX and open-file-description locks, as redb takes them) are not served
//! by this file system: FUSE then keeps them in the kernel, which is enough while every process
//! runs on this machine, as they do in a test; a remount starts without any.
//!
//! # What processes see of each other while it runs
//!
//! Every process reaches the disk through the one kernel, whose page cache and file sizes are
//! per inode: a write one process makes is what another reads next, whatever the kernel
//! caches. The file system answers entries and attributes with no time to live and opens
//! files without keeping the kernel's cache, and its content changes only through requests;
//! at a cut it answers every request `EIO` instead of serving anything older. So no process
//! reads older data than the last write before its read: `tests/cut.rs` checks it with
//! processes that take turns under a lock appending to one file (a disk that served durable
//! instead of current bytes fails it).
//!
//! # Counting hooks
//!
//! [`LazyDisk::cut_after_fsync`] cuts right after the k-th `fsync` of a file of a given name
//! has made it durable: that `fsync` returns success, so its caller may acknowledge what it
//! synced, and everything after it fails. [`LazyDisk::fsync_count`] says how many `fsync`s a
//! name has had.

#[cfg(target_os = "linux")]
mod disk;
#[cfg(target_os = "linux")]
mod image;

#[cfg(target_os = "linux")]
pub use disk::{LazyDisk, Tear};
