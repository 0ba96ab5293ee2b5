//! A full disk delays writes and loses nothing: tests on real full file systems (a small tmpfs,
//! a small loop-mounted ext4, and a btrfs subvolume whose quota runs out, EDQUOT, as home), and
//! EMFILE through a low RLIMIT_NOFILE.
//!
//! These need root (to mount). Without root they print that they skipped; where every test
//! must run (CI, `runjournal::testkit::skip`) a skip is a failure.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use runjournal::HostIds;
use runjournal::capacity;
use runjournal::event::{Event, Mode, RunSpec};
use runjournal::journal::CapacityEvent;
use runjournal::projection;
use runjournal::store::StoreOptions;
use runjournal::testkit::lifecycle::chain_lifecycle;
use runjournal::testkit::{self as kit, namespaced_identity};
use runjournal::{Condition, Home, RunId, RunStatus, Store, state};

/// Whether this test may run; skips it, saying why, otherwise (`testkit::skip`).
pub(crate) fn can_mount(test: &str) -> bool {
    kit::skip::needs_root(test, "mount a small file system")
}

pub(crate) fn run_command(program: &str, args: &[&str]) {
    let output = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|error| panic!("{program}: {error}"));
    assert!(
        output.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A small file system mounted on a temp dir, unmounted on drop.
pub(crate) struct SmallFs {
    mount_point: tempfile::TempDir,
    _image_dir: Option<tempfile::TempDir>,
}

impl SmallFs {
    pub(crate) fn tmpfs(size: &str) -> SmallFs {
        let mount_point = tempfile::tempdir().expect("mount point");
        let path = mount_point.path().to_str().expect("utf-8 path");
        run_command(
            "mount",
            &["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs", path],
        );
        SmallFs {
            mount_point,
            _image_dir: None,
        }
    }

    fn ext4(megabytes: u64) -> SmallFs {
        let image_dir = tempfile::tempdir().expect("image dir");
        let image = image_dir.path().join("fs.img");
        std::fs::File::create(&image)
            .and_then(|file| file.set_len(megabytes << 20))
            .expect("image file");
        let image = image.to_str().expect("utf-8 path");
        run_command("mkfs.ext4", &["-q", "-F", image]);
        let mount_point = tempfile::tempdir().expect("mount point");
        let path = mount_point.path().to_str().expect("utf-8 path");
        run_command("mount", &["-o", "loop", image, path]);
        SmallFs {
            mount_point,
            _image_dir: Some(image_dir),
        }
    }

    /// A loop-mounted btrfs with quotas on and a subvolume `home` limited to `megabytes`:
    /// writes past it fail with EDQUOT, whoever makes them. (A quota, not a full disk: the file
    /// system has room to spare. This kernel has no quota format for ext4, CONFIG_QFMT_V2, so
    /// btrfs's qgroups are the quota a test can meet for real.) Commits every second, so that
    /// freed space is accounted soon.
    fn btrfs_with_quota(megabytes: u64) -> SmallFs {
        let image_dir = tempfile::tempdir().expect("image dir");
        let image = image_dir.path().join("fs.img");
        std::fs::File::create(&image)
            .and_then(|file| file.set_len(256 << 20))
            .expect("image file");
        let image = image.to_str().expect("utf-8 path");
        run_command("mkfs.btrfs", &["-q", "-f", image]);
        let mount_point = tempfile::tempdir().expect("mount point");
        let path = mount_point.path().to_str().expect("utf-8 path").to_string();
        let path = path.as_str();
        run_command("mount", &["-o", "loop,commit=1", image, path]);
        let fs = SmallFs {
            mount_point,
            _image_dir: Some(image_dir),
        };
        let home = fs.path().join("home");
        let home_text = home.to_str().expect("utf-8 path");
        run_command("btrfs", &["quota", "enable", path]);
        run_command("btrfs", &["subvolume", "create", home_text]);
        run_command(
            "btrfs",
            &["qgroup", "limit", &format!("{megabytes}M"), home_text],
        );
        fs
    }

    pub(crate) fn path(&self) -> &Path {
        self.mount_point.path()
    }
}

/// Whether `programs` are installed; skips the test, saying why, otherwise (CI installs
/// them, and there a skip fails).
fn has_programs(test: &str, programs: &[&str]) -> bool {
    let missing: Vec<&str> = programs
        .iter()
        .copied()
        .filter(|program| Command::new(program).arg("--version").output().is_err())
        .collect();
    if missing.is_empty() {
        return true;
    }
    kit::skip::skip(test, &format!("needs {missing:?}"));
    false
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let path = self.mount_point.path().to_string_lossy().into_owned();
        let _ = Command::new("umount").args(["-l", &path]).status();
    }
}

/// Writes `path` until the file system is full.
pub(crate) fn fill(path: &Path) {
    let mut file = std::fs::File::create(path).expect("filler file");
    let chunk = vec![0xa5u8; 64 << 10];
    loop {
        match file.write(&chunk) {
            Ok(0) => break,
            Ok(_) => {}
            Err(error) => {
                assert!(capacity::is_capacity_io(&error), "filling: {error}");
                break;
            }
        }
    }
    let _ = file.sync_all();
}

/// A chain with large step texts, so each RunCreated takes real space.
fn big_spec(steps: usize) -> RunSpec {
    let script = format!("echo {}", "x".repeat(3000));
    kit::spec(Mode::Chain, kit::numbered(steps, &kit::sh(&script)))
}

/// An acknowledged batch: run, first seq, last seq, and the events (empty for a create).
type AckedBatch = (RunId, u64, u64, Vec<Event>);

/// Waits for `condition`, failing with `what` after a generous bound.
fn wait_for(what: &str, mut condition: impl FnMut() -> bool) {
    let started = Instant::now();
    while !condition() {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The full scenario on a home that lives on a small file system at `root`. Returns what the
/// writer reported. `can_mark_blocked`: whether an empty file can be made on the full file
/// system (ext4 and tmpfs: yes, it needs no data block; a btrfs subvolume over its quota: no,
/// its metadata counts against the quota), so that other processes see the writer blocked.
fn rides_out_a_full_disk(root: &Path, can_mark_blocked: bool) -> Vec<CapacityEvent> {
    let home_dir = root.join("home");
    let events: Arc<Mutex<Vec<CapacityEvent>>> = Arc::default();
    let listener_events = Arc::clone(&events);
    let options = StoreOptions {
        reserve_bytes: 4 << 20,
        listener: Some(Arc::new(move |event: &CapacityEvent| {
            listener_events
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .push(event.clone());
        })),
        ..StoreOptions::default()
    };
    let store =
        Arc::new(Store::open_with(Home::at(&home_dir), options).expect("open on the small fs"));
    assert!(
        store.home().reserve_path().is_file(),
        "the reserve is made at open"
    );
    let steps = 4u32;
    let chain = store
        .create_run(big_spec(steps as usize), HostIds::default())
        .expect("create the chain")
        .run;

    let filler = root.join("filler-1");
    fill(&filler);
    let has_event = |wanted: fn(&CapacityEvent) -> bool| {
        events
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .iter()
            .any(wanted)
    };

    // The "runner": the chain progresses while big runs are created beside it, all on the full
    // disk. Each acknowledged batch is recorded with the events it carried.
    let acked: Arc<Mutex<Vec<AckedBatch>>> = Arc::default();
    let writer = {
        let store = Arc::clone(&store);
        let acked = Arc::clone(&acked);
        std::thread::spawn(move || {
            let mut chain_batches = chain_lifecycle(steps, 10).into_iter();
            for round in 0..40 {
                let created = store
                    .create_run(big_spec(60), HostIds::default())
                    .expect("a create lands eventually");
                acked.lock().expect("acks").push((
                    created.run,
                    created.first_seq,
                    created.last_seq,
                    vec![],
                ));
                let next = (round % 5 == 0).then(|| chain_batches.next()).flatten();
                if let Some(events) = next {
                    let appended = store
                        .append(chain, events.clone(), Condition::expect_not_terminal())
                        .expect("a chain transition lands eventually");
                    acked.lock().expect("acks").push((
                        chain,
                        appended.first_seq,
                        appended.last_seq,
                        events,
                    ));
                }
            }
            for events in chain_batches {
                let appended = store
                    .append(chain, events.clone(), Condition::none())
                    .expect("a chain transition lands eventually");
                acked.lock().expect("acks").push((
                    chain,
                    appended.first_seq,
                    appended.last_seq,
                    events,
                ));
            }
        })
    };

    // The first capacity error releases the reserve; then the disk is filled again, so the
    // writer must wait for space.
    wait_for("the reserve to be released", || {
        has_event(|event| matches!(event, CapacityEvent::ReserveReleased { .. }))
    });
    assert!(!store.home().reserve_path().exists());
    fill(&root.join("filler-2"));
    wait_for("the writer to be blocked", || {
        has_event(|event| matches!(event, CapacityEvent::Blocked { .. }))
    });
    // The disk stays full, so the writer keeps meeting ENOSPC and its marker stays up.
    if can_mark_blocked {
        wait_for("other processes to see the block", || {
            let status = capacity::read_status(store.home()).expect("capacity status");
            status.blocked_since_ms().is_some() && !status.has_reserve
        });
    }

    // Space returns (a sync makes a file system that accounts freed space at its next commit,
    // such as btrfs with quotas, account it now).
    std::fs::remove_file(&filler).expect("free space");
    std::fs::remove_file(root.join("filler-2")).expect("free space");
    nix::unistd::sync();
    writer.join().expect("every append was acknowledged");
    wait_for("the writer to be unblocked", || {
        has_event(|event| matches!(event, CapacityEvent::Unblocked { .. }))
    });
    assert!(has_event(|event| matches!(
        event,
        CapacityEvent::ReserveRestored { .. }
    )));
    assert!(
        store.home().reserve_path().is_file(),
        "the reserve is back: {:?}",
        events
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    );
    assert!(
        capacity::read_status(store.home())
            .expect("status")
            .blocked
            .is_empty(),
        "no longer blocked"
    );
    assert_eq!(
        store.flush_projections(Duration::from_secs(30)),
        0,
        "projections caught up"
    );

    // Every acknowledged event present once, in order; every run consistent.
    let view = store.journal().view().expect("view");
    let acked = acked.lock().expect("acks");
    let mut per_run: BTreeMap<RunId, Vec<(u64, u64)>> = BTreeMap::new();
    for (run, first, last, events) in acked.iter() {
        per_run.entry(*run).or_default().push((*first, *last));
        if !events.is_empty() {
            let records = view.records(*run).expect("records");
            let stored: Vec<&Event> = records
                .iter()
                .filter(|record| (*first..=*last).contains(&record.seq))
                .map(|record| &record.event)
                .collect();
            assert_eq!(
                stored,
                events.iter().collect::<Vec<_>>(),
                "run {run} {first}..{last}"
            );
        }
    }
    assert_eq!(per_run.len(), 41, "40 big runs and the chain");
    for (run, mut batches) in per_run {
        batches.sort();
        let records = view.records(run).expect("records");
        let acked_seqs: Vec<u64> = batches
            .iter()
            .flat_map(|(first, last)| *first..=*last)
            .collect();
        let stored_seqs: Vec<u64> = records.iter().map(|record| record.seq).collect();
        let created_seq = vec![1];
        let expected = if run == chain {
            [created_seq, acked_seqs].concat()
        } else {
            acked_seqs
        };
        assert_eq!(
            stored_seqs, expected,
            "run {run}: each acknowledged record once, gap-free"
        );
        let snapshot = view.snapshot(run).expect("snapshot").expect("exists");
        let replayed = state::replay(&records).expect("fold").expect("non-empty");
        assert_eq!(snapshot, replayed, "run {run}: snapshot equals replay");
        let (state, records, links) = projection::load(&view, run).expect("load");
        let damage: Vec<_> =
            projection::check_plan(&projection::plan(store.home(), &state, &records, &links))
                .into_iter()
                .filter(|difference| difference.is_damage())
                .collect();
        assert!(
            damage.is_empty(),
            "run {run}: projections equal a fresh replay: {damage:?}"
        );
    }
    let chain_state = view.snapshot(chain).expect("snapshot").expect("exists");
    assert_eq!(chain_state.status, RunStatus::Complete);
    assert!(chain_state.is_closed());
    drop(view);
    assert!(
        store
            .journal()
            .check_integrity()
            .expect("integrity check runs"),
        "redb's integrity check passes"
    );
    events
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .clone()
}

#[test]
fn a_full_tmpfs_delays_writes_and_loses_nothing() {
    if !can_mount("a_full_tmpfs_delays_writes_and_loses_nothing") {
        return;
    }
    // Room for the journal's whole growth in the scenario and the reserve: the fillers take
    // whatever is free, and once they go the reserve must fit again.
    let fs = SmallFs::tmpfs("48m");
    rides_out_a_full_disk(fs.path(), true);
}

#[test]
fn a_full_ext4_delays_writes_and_loses_nothing() {
    if !can_mount("a_full_ext4_delays_writes_and_loses_nothing") {
        return;
    }
    let fs = SmallFs::ext4(48);
    rides_out_a_full_disk(fs.path(), true);
}

/// A real EDQUOT: the home is a btrfs subvolume whose quota runs out (twice) while runs are
/// written, on a file system with room to spare. The writer waits it out as it waits out a
/// full disk, and loses nothing.
#[test]
fn an_exhausted_quota_delays_writes_with_edquot_and_loses_nothing() {
    let test = "an_exhausted_quota_delays_writes_with_edquot_and_loses_nothing";
    if !can_mount(test) || !has_programs(test, &["mkfs.btrfs", "btrfs"]) {
        return;
    }
    let fs = SmallFs::btrfs_with_quota(48);
    let events = rides_out_a_full_disk(&fs.path().join("home"), false);
    let quota_errors: Vec<&String> = events
        .iter()
        .filter_map(|event| match event {
            CapacityEvent::Blocked { error, cause, .. } => {
                assert_eq!(*cause, capacity::BlockCause::Capacity, "{error}");
                Some(error)
            }
            _ => None,
        })
        .collect();
    assert!(
        !quota_errors.is_empty()
            && quota_errors
                .iter()
                .all(|error| error.contains("Disk quota exceeded (os error 122)")),
        "the writer was blocked by EDQUOT: {events:?}"
    );
}

#[test]
fn a_journal_cannot_be_created_on_a_full_disk_and_nothing_is_left_half_made() {
    if !can_mount("a_journal_cannot_be_created_on_a_full_disk_and_nothing_is_left_half_made") {
        return;
    }
    let fs = SmallFs::tmpfs("4m");
    fill(&fs.path().join("filler"));
    let home_dir: PathBuf = fs.path().join("home");
    let error = Store::open_with(
        Home::at(&home_dir),
        StoreOptions {
            reserve_bytes: 1 << 20,
            listener: None,
            ..StoreOptions::default()
        },
    )
    .expect_err("no room for a journal");
    let message = error.to_string();
    assert!(message.contains("No space left on device"), "{message}");
    assert!(
        message.contains("journal.redb"),
        "the message names the file: {message}"
    );
    assert!(
        !home_dir.exists(),
        "nothing half made is left: {}",
        home_dir.display()
    );
}

const EMFILE_CHILD_ENV: &str = "RUNJOURNAL_TEST_EMFILE_CHILD";

/// In a child process (the limit is per process): with every file descriptor in use, an
/// append still commits (its journal file is already open) and the projection waits; once
/// descriptors are free again it is written, equal to a fresh projection.
#[test]
fn running_out_of_file_descriptors_delays_projections_and_loses_nothing() {
    if let Ok(home) = std::env::var(EMFILE_CHILD_ENV) {
        emfile_child(Path::new(&home));
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let output = Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            "full_disk::running_out_of_file_descriptors_delays_projections_and_loses_nothing",
            "--test-threads=1",
        ])
        .env(EMFILE_CHILD_ENV, dir.path())
        .output()
        .expect("spawn the child");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "the child's checks passed: {stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // A renamed test would make the filter match nothing, and an empty run passes.
    assert!(
        stdout.contains("running 1 test") && stdout.contains("1 passed"),
        "the child ran exactly this one test: {stdout}"
    );
}

fn emfile_child(home_dir: &Path) {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let store = Store::open_with(
        Home::at(home_dir),
        StoreOptions {
            reserve_bytes: 0,
            listener: None,
            ..StoreOptions::default()
        },
    )
    .expect("open");
    let run = store
        .create_run(big_spec(1), HostIds::default())
        .expect("create")
        .run;
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).expect("getrlimit");
    setrlimit(Resource::RLIMIT_NOFILE, 256, hard).expect("setrlimit");
    let mut hoard = Vec::new();
    loop {
        match std::fs::File::open("/dev/null") {
            Ok(file) => hoard.push(file),
            Err(error) => {
                assert!(capacity::is_capacity_io(&error), "{error}");
                break;
            }
        }
    }
    // No descriptor is left: the projection cannot make its temp file.
    let appended = store
        .append(
            run,
            vec![Event::RunnerStarted {
                runner: namespaced_identity(1),
                instance_id: "r".to_string(),
            }],
            Condition::none(),
        )
        .expect("the commit needs no new descriptor");
    assert_eq!(appended.last_seq, 2);
    assert_eq!(store.pending_projections(), 1, "the projection waits");
    drop(hoard);
    let status = std::fs::read_to_string(store.home().status_path(run)).expect("status");
    assert!(
        status.contains("\"journalSeq\": 1") || status.contains("\"journalSeq\": 2"),
        "{status}"
    );
    assert_eq!(store.flush_projections(Duration::from_secs(30)), 0);
    let view = store.journal().view().expect("view");
    let (state, records, links) = projection::load(&view, run).expect("load");
    assert!(
        projection::check_plan(&projection::plan(store.home(), &state, &records, &links))
            .is_empty(),
        "the projection caught up"
    );
}

/// Through the real binary: a run launched on a full disk waits (the launcher blocks on its
/// first commit, visibly to `list` and `status`) and completes once space returns.
#[test]
fn a_run_launched_on_a_full_disk_waits_for_space_and_completes() {
    if !can_mount("a_run_launched_on_a_full_disk_waits_for_space_and_completes") {
        return;
    }
    let fs = SmallFs::tmpfs("16m");
    let home = fs.path().join("home");
    let runjournal = env!("CARGO_BIN_EXE_runjournal");
    let command = |args: &[&str]| {
        let mut command = Command::new(runjournal);
        command
            .arg("--home")
            .arg(&home)
            .args(args)
            .env("RUNJOURNAL_RESERVE_BYTES", "0");
        command
    };
    // Make the home while there is room, then fill the disk.
    let made = command(&["list"]).output().expect("list");
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    fill(&fs.path().join("filler"));

    // Sixty steps with long commands: the run's first record needs more room than the
    // journal file has spare.
    let mut launch = command(&["run", "--wait", "--name", "on-full-disk"]);
    for index in 0..60 {
        launch.args(["--step", &format!("true {index} {}", "y".repeat(3000))]);
    }
    let mut launcher = launch
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("launch");
    let home_handle = Home::at(&home);
    wait_for("the launcher to be blocked on the full disk", || {
        capacity::read_status(&home_handle)
            .expect("capacity status")
            .blocked_since_ms()
            .is_some()
    });
    assert!(
        launcher.try_wait().expect("try_wait").is_none(),
        "the launcher waits for space instead of failing"
    );
    let listed = command(&["list"]).output().expect("list while blocked");
    assert!(
        listed.status.success(),
        "{}",
        String::from_utf8_lossy(&listed.stderr)
    );
    let listed = String::from_utf8_lossy(&listed.stdout);
    assert!(
        listed.contains("blocked on a full disk"),
        "list says so: {listed}"
    );

    std::fs::remove_file(fs.path().join("filler")).expect("free space");
    let output = launcher.wait_with_output().expect("the launcher ends");
    assert!(
        output.status.success(),
        "the run completed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let store = Store::open_with(
        Home::at(&home),
        StoreOptions {
            reserve_bytes: 0,
            listener: None,
            ..StoreOptions::default()
        },
    )
    .expect("open");
    let view = store.journal().view().expect("view");
    let run = view
        .lookup_alias(&runjournal::journal::name_alias("on-full-disk"))
        .expect("alias")
        .expect("the run exists");
    let records = view.records(run).expect("records");
    let seqs: Vec<u64> = records.iter().map(|record| record.seq).collect();
    assert_eq!(seqs, (1..=records.len() as u64).collect::<Vec<_>>());
    let state = view.snapshot(run).expect("snapshot").expect("exists");
    assert_eq!(state.status, RunStatus::Complete);
    assert_eq!(
        state,
        state::replay(&records).expect("fold").expect("non-empty")
    );
    assert!(
        capacity::read_status(store.home())
            .expect("status")
            .blocked
            .is_empty(),
        "no writer is blocked any more"
    );
}
