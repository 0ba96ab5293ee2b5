//! The lazy disk's promises, on a real mount: what was synced survives a cut, what was not
//! does not — file data and directory entries alike — and a torn write keeps whole sectors.
//!
//! These need root and `/dev/fuse`. Without them they print that they skipped; with
//! `RUNJOURNAL_REQUIRE_ROOT_TESTS=1` (as CI sets) a skip is a failure.

#![cfg(target_os = "linux")]

use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;

use lazy_disk::{LazyDisk, Tear};

const REQUIRE_ROOT_ENV: &str = "RUNJOURNAL_REQUIRE_ROOT_TESTS";

/// A fresh lazy disk on a temporary mount point, or `None` (said why) where FUSE cannot be
/// mounted and root tests are not required.
fn disk(test: &str) -> Option<(tempfile::TempDir, LazyDisk)> {
    let required = std::env::var(REQUIRE_ROOT_ENV).as_deref() == Ok("1");
    let usable = nix::unistd::geteuid().is_root() && Path::new("/dev/fuse").exists();
    if !usable {
        assert!(
            !required,
            "{test} needs root and /dev/fuse, and {REQUIRE_ROOT_ENV}=1 says root tests must run"
        );
        eprintln!("skipped {test}: needs root and /dev/fuse to mount a FUSE file system");
        return None;
    }
    let dir = tempfile::tempdir().expect("a mount point");
    let disk = LazyDisk::mount(dir.path()).expect("the lazy disk mounts");
    Some((dir, disk))
}

fn sync_dir(path: &Path) {
    File::open(path)
        .expect("the directory opens")
        .sync_all()
        .expect("the directory syncs");
}

fn names(path: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(path)
        .expect("the directory reads")
        .map(|entry| {
            entry
                .expect("an entry")
                .file_name()
                .into_string()
                .expect("utf-8")
        })
        .collect();
    names.sort();
    names
}

#[test]
fn unsynced_data_is_lost_at_a_cut_and_synced_data_kept() {
    let Some((_dir, mut disk)) = disk("unsynced_data_is_lost_at_a_cut_and_synced_data_kept") else {
        return;
    };
    let root = disk.path().to_path_buf();
    let mut synced = File::create(root.join("synced")).expect("create");
    synced.write_all(b"kept").expect("write");
    synced.sync_data().expect("fdatasync");
    synced.write_all(b" and lost").expect("write");
    synced.set_len(100).expect("a longer length, unsynced");
    let mut never = File::create(root.join("never")).expect("create");
    never.write_all(b"lost").expect("write");
    sync_dir(&root);
    // Shrunk after the sync: the cut restores the synced length.
    let shrunk = File::create(root.join("shrunk")).expect("create");
    shrunk.write_all_at(&[7; 4096], 0).expect("write");
    shrunk.sync_all().expect("fsync");
    shrunk.set_len(10).expect("truncate, unsynced");
    sync_dir(&root);
    drop((synced, never, shrunk));

    assert!(disk.cut(Tear::None));
    // Cut: nothing is served until the remount.
    let error = fs::read(root.join("synced")).expect_err("a cut disk answers nothing");
    assert_eq!(error.raw_os_error(), Some(libc_eio()));
    disk.remount().expect("remount");

    assert_eq!(fs::read(root.join("synced")).expect("read"), b"kept");
    assert_eq!(fs::read(root.join("never")).expect("read"), b"");
    assert_eq!(fs::read(root.join("shrunk")).expect("read"), vec![7; 4096]);
}

#[test]
fn unsynced_directory_entries_are_lost_at_a_cut_and_synced_ones_kept() {
    let Some((_dir, mut disk)) =
        disk("unsynced_directory_entries_are_lost_at_a_cut_and_synced_ones_kept")
    else {
        return;
    };
    let root = disk.path().to_path_buf();
    let sub = root.join("sub");
    fs::create_dir(&sub).expect("mkdir");
    sync_dir(&root);
    for name in ["renamed", "unlinked", "replaced", "linked"] {
        let file = File::create(sub.join(name)).expect("create");
        file.sync_all().expect("fsync");
    }
    fs::write(sub.join("replaced"), b"old").expect("write");
    File::open(sub.join("replaced"))
        .expect("open")
        .sync_all()
        .expect("fsync");
    sync_dir(&sub);

    // Unsynced: a rename, an unlink, a create (its data synced, its entry not), a rename over
    // an existing file, a hard link, a new directory, a symlink.
    fs::rename(sub.join("renamed"), sub.join("new-name")).expect("rename");
    fs::remove_file(sub.join("unlinked")).expect("unlink");
    let mut created = File::create(sub.join("created")).expect("create");
    created.write_all(b"data").expect("write");
    created.sync_all().expect("fsync: the data, not the entry");
    fs::write(sub.join("replacement"), b"new").expect("write");
    File::open(sub.join("replacement"))
        .expect("open")
        .sync_all()
        .expect("fsync");
    fs::rename(sub.join("replacement"), sub.join("replaced")).expect("rename over");
    fs::hard_link(sub.join("linked"), sub.join("second-link")).expect("link");
    fs::create_dir(sub.join("newdir")).expect("mkdir");
    std::os::unix::fs::symlink("linked", sub.join("symlink")).expect("symlink");
    drop(created);
    assert_eq!(
        names(&sub),
        [
            "created",
            "linked",
            "new-name",
            "newdir",
            "replaced",
            "second-link",
            "symlink"
        ]
    );

    disk.cut(Tear::None);
    disk.remount().expect("remount");
    assert_eq!(
        names(&sub),
        ["linked", "renamed", "replaced", "unlinked"],
        "every unsynced change of the directory is undone"
    );
    assert_eq!(fs::read(sub.join("replaced")).expect("read"), b"old");

    // The same changes, synced this time, are kept.
    fs::rename(sub.join("renamed"), sub.join("new-name")).expect("rename");
    fs::remove_file(sub.join("unlinked")).expect("unlink");
    fs::write(sub.join("replacement"), b"new").expect("write");
    File::open(sub.join("replacement"))
        .expect("open")
        .sync_all()
        .expect("fsync");
    fs::rename(sub.join("replacement"), sub.join("replaced")).expect("rename over");
    fs::hard_link(sub.join("linked"), sub.join("second-link")).expect("link");
    sync_dir(&sub);
    disk.cut(Tear::None);
    disk.remount().expect("remount");
    assert_eq!(
        names(&sub),
        ["linked", "new-name", "replaced", "second-link"]
    );
    assert_eq!(fs::read(sub.join("replaced")).expect("read"), b"new");
    let linked = fs::metadata(sub.join("linked")).expect("stat");
    assert_eq!(std::os::unix::fs::MetadataExt::nlink(&linked), 2);

    // A directory whose own entries were synced but whose entry in its parent was not is gone
    // with everything in it.
    let lost = root.join("lost-dir");
    fs::create_dir(&lost).expect("mkdir");
    File::create(lost.join("inside"))
        .expect("create")
        .sync_all()
        .expect("fsync");
    sync_dir(&lost);
    disk.cut(Tear::None);
    disk.remount().expect("remount");
    assert_eq!(names(&root), ["sub"]);
}

#[test]
fn a_torn_write_keeps_whole_sectors_of_the_last_unsynced_write() {
    let Some((_dir, mut disk)) =
        disk("a_torn_write_keeps_whole_sectors_of_the_last_unsynced_write")
    else {
        return;
    };
    let root = disk.path().to_path_buf();
    let file = File::create(root.join("torn")).expect("create");
    file.write_all_at(&[0; 4096], 0).expect("write");
    file.sync_all().expect("fsync");
    sync_dir(&root);
    // 100..3100 unsynced: its sector boundaries are 512, 1024, ... 3072.
    file.write_all_at(&[1; 3000], 100).expect("write");
    drop(file);

    disk.cut(Tear::Sectors(2));
    disk.remount().expect("remount");
    let content = fs::read(root.join("torn")).expect("read");
    let mut expected = vec![0u8; 4096];
    expected[100..1024].fill(1);
    assert_eq!(content.len(), expected.len());
    assert!(content == expected, "bytes 100..1024 kept, the rest lost");
}

#[test]
fn a_cut_after_the_kth_fsync_of_a_file_keeps_exactly_that_sync() {
    let Some((_dir, mut disk)) =
        disk("a_cut_after_the_kth_fsync_of_a_file_keeps_exactly_that_sync")
    else {
        return;
    };
    let root = disk.path().to_path_buf();
    let mut file = File::create(root.join("counted")).expect("create");
    sync_dir(&root);
    disk.cut_after_fsync("counted", 2, Tear::None);
    file.write_all(b"one").expect("write");
    file.sync_all().expect("first fsync");
    assert!(!disk.is_cut());
    file.write_all(b" two").expect("write");
    file.sync_all()
        .expect("the second fsync returns: its data is durable");
    assert!(disk.is_cut());
    let error = file.write_all(b" three").expect_err("the disk is cut");
    assert_eq!(error.raw_os_error(), Some(libc_eio()));
    assert_eq!(disk.fsync_count("counted"), 2);
    drop(file);
    disk.remount().expect("remount");
    assert_eq!(fs::read(root.join("counted")).expect("read"), b"one two");
}

#[test]
fn what_a_home_needs_works_on_it() {
    let Some((_dir, disk)) = disk("what_a_home_needs_works_on_it") else {
        return;
    };
    let root = disk.path().to_path_buf();

    // O_APPEND from two handles: each write lands at the end.
    let open_append = || {
        OpenOptions::new()
            .append(true)
            .create(true)
            .open(root.join("log"))
            .expect("open O_APPEND")
    };
    let (mut first, mut second) = (open_append(), open_append());
    first.write_all(b"a1\n").expect("append");
    second.write_all(b"b1\n").expect("append");
    first.write_all(b"a2\n").expect("append");
    assert_eq!(fs::read(root.join("log")).expect("read"), b"a1\nb1\na2\n");

    // pread/pwrite, set_len, fstat.
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(root.join("data"))
        .expect("open");
    file.write_all_at(b"hello", 8192).expect("pwrite");
    assert_eq!(file.metadata().expect("fstat").len(), 8197);
    file.set_len(4).expect("set_len");
    let mut buffer = Vec::new();
    file.seek(SeekFrom::Start(0)).expect("seek");
    file.read_to_end(&mut buffer).expect("read");
    assert_eq!(buffer, [0; 4]);

    // O_NOFOLLOW refuses a symlink; O_EXCL an existing file.
    std::os::unix::fs::symlink("data", root.join("link")).expect("symlink");
    let error = OpenOptions::new()
        .read(true)
        .custom_flags(libc_o_nofollow())
        .open(root.join("link"))
        .expect_err("O_NOFOLLOW on a symlink");
    assert_eq!(error.raw_os_error(), Some(libc_eloop()));
    let error = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(root.join("data"))
        .expect_err("O_EXCL on an existing file");
    assert_eq!(error.kind(), ErrorKind::AlreadyExists);

    // A unix socket bound on it, and reached.
    let listener = UnixListener::bind(root.join("socket")).expect("bind");
    let mut client = UnixStream::connect(root.join("socket")).expect("connect");
    client.write_all(b"ping").expect("send");
    let (mut served, _) = listener.accept().expect("accept");
    let mut ping = [0; 4];
    served.read_exact(&mut ping).expect("receive");
    assert_eq!(&ping, b"ping");

    // Locks, kept by the kernel: a second open file description cannot take what the first
    // holds.
    let holder = File::open(root.join("data")).expect("open");
    holder.try_lock().expect("an exclusive lock");
    let other = File::open(root.join("data")).expect("open");
    assert!(other.try_lock().is_err(), "the lock is held by the first");
    drop(holder);
    other.try_lock().expect("free once the holder closed");

    // Byte-range locks of open file descriptions (redb's): a range one description holds
    // exclusively cannot be taken by another.
    let ofd_lock = |file: &File, start: i64| {
        // SAFETY: `flock` is plain data; zeroed is a valid value, every field used is set.
        let mut lock: libc::flock = unsafe { std::mem::zeroed() };
        lock.l_type = libc::F_WRLCK as i16;
        lock.l_whence = libc::SEEK_SET as i16;
        lock.l_start = start;
        lock.l_len = 16;
        nix::fcntl::fcntl(file, nix::fcntl::FcntlArg::F_OFD_SETLK(&lock))
    };
    let first = OpenOptions::new()
        .read(true)
        .write(true)
        .open(root.join("data"))
        .expect("open");
    let second = OpenOptions::new()
        .read(true)
        .write(true)
        .open(root.join("data"))
        .expect("open");
    ofd_lock(&first, 0).expect("a range lock");
    assert!(
        ofd_lock(&second, 8).is_err(),
        "an overlapping range is held"
    );
    ofd_lock(&second, 16).expect("a range beside it is free");

    // statvfs.
    let stat = nix::sys::statvfs::statvfs(&root).expect("statvfs");
    assert!(stat.blocks_available() > 0);
}

fn libc_eio() -> i32 {
    nix::errno::Errno::EIO as i32
}

fn libc_eloop() -> i32 {
    nix::errno::Errno::ELOOP as i32
}

fn libc_o_nofollow() -> i32 {
    nix::fcntl::OFlag::O_NOFOLLOW.bits()
}
