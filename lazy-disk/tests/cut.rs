//! The lazy disk's promises, on a real mount: what was synced survives a cut, what was not
//! does not — file data and directory entries alike — and a torn write keeps whole sectors.
//!
//! These need root and `/dev/fuse`. Without them they print one line saying they skipped;
//! with `RUNJOURNAL_REQUIRE_ROOT_TESTS=1` (as CI sets: every test must run) a skip is a
//! failure. The same rule as `runjournal::testkit::skip`, which this crate cannot depend on.

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
            "{test} needs root and /dev/fuse, and {REQUIRE_ROOT_ENV}=1 says every test must run"
        );
        // Past the harness's capture, so the skip shows; a closed stderr changes nothing.
        let _ = writeln!(
            std::io::stderr(),
            "skipped {test}: needs root and /dev/fuse to mount a FUSE file system"
        );
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

/// The environment variable a child process of
/// [`processes_see_each_others_writes_at_once_under_a_lock`] finds its file in.
const LOG_CHILD_ENV: &str = "LAZY_DISK_TEST_LOG_CHILD";
const LOG_CHILD_ROUNDS: u64 = 150;
const LOG_CHILDREN: usize = 4;

/// `fcntl(F_OFD_SETLKW)` over the whole file: `F_WRLCK` to take it, `F_UNLCK` to let it go.
fn ofd_lock(file: &File, kind: i32) {
    let lock = libc::flock {
        l_type: kind as libc::c_short,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: 0,
        l_len: 0,
        l_pid: 0,
    };
    nix::fcntl::fcntl(file, nix::fcntl::FcntlArg::F_OFD_SETLKW(&lock)).expect("the lock");
}

/// One child's rounds: under the lock, it reads the whole log (its length from `fstat`, as redb
/// takes it), checks that slot `i` holds `i` in every slot, and appends the next slot; now and
/// then it syncs, and now and then it opens the file again (a new open drops the kernel's cached
/// pages of a FUSE file). A stale length or a stale page fails the check.
fn log_child(path: &Path) {
    let open = || {
        OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .expect("the log opens")
    };
    let mut file = open();
    let mut last_written = None;
    for round in 0..LOG_CHILD_ROUNDS {
        if round % 7 == 3 {
            file = open();
        }
        ofd_lock(&file, libc::F_WRLCK);
        let len = file.metadata().expect("fstat").len();
        assert_eq!(len % 8, 0, "whole slots only: {len} bytes");
        let mut bytes = vec![0u8; usize::try_from(len).expect("a length")];
        file.read_exact_at(&mut bytes, 0).expect("the log reads");
        for (index, slot) in bytes.chunks_exact(8).enumerate() {
            let value = u64::from_le_bytes(slot.try_into().expect("8 bytes"));
            assert_eq!(value, index as u64, "slot {index} of {}", len / 8);
        }
        let next = len / 8;
        if let Some(last) = last_written {
            assert!(
                next > last,
                "this process wrote slot {last}, and then read a log of {next} slots"
            );
        }
        file.write_all_at(&next.to_le_bytes(), len)
            .expect("the slot writes");
        if round % 5 == 0 {
            file.sync_data().expect("fdatasync");
        }
        last_written = Some(next);
        ofd_lock(&file, libc::F_UNLCK);
    }
}

/// Processes that take turns under a lock see each other's writes at once: the kernel's cache
/// of a file on this FUSE disk (its pages, its length) never serves one process what another
/// has since overwritten or appended. redb's processes sharing a journal rely on it; so does
/// the power-cut test, which would otherwise see a journal go back to older records while the
/// processes run.
#[test]
fn processes_see_each_others_writes_at_once_under_a_lock() {
    if let Some(path) = std::env::var_os(LOG_CHILD_ENV) {
        log_child(Path::new(&path));
        return;
    }
    let Some((_dir, disk)) = disk("processes_see_each_others_writes_at_once_under_a_lock") else {
        return;
    };
    let path = disk.path().join("log");
    File::create(&path).expect("the log");
    let children: Vec<std::process::Child> = (0..LOG_CHILDREN)
        .map(|_| {
            std::process::Command::new(std::env::current_exe().expect("this test's binary"))
                .args([
                    "--exact",
                    "processes_see_each_others_writes_at_once_under_a_lock",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(LOG_CHILD_ENV, &path)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("a child")
        })
        .collect();
    for child in children {
        let output = child.wait_with_output().expect("the child ends");
        assert!(
            output.status.success(),
            "a child saw a stale log: {output:?}"
        );
    }
    let bytes = fs::read(&path).expect("the log reads");
    assert_eq!(
        bytes.len() as u64,
        8 * LOG_CHILD_ROUNDS * LOG_CHILDREN as u64,
        "every slot of every child"
    );
}
