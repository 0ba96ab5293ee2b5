//! Projections in proportion to the change: events.jsonl is appended to when its
//! end is the journal's, rewritten whole when it is not; status.json of samples is put off
//! for at most `STATUS_COALESCE`, never for a state change; whatever the path, the files end
//! up byte for byte what a fresh projection renders.

use std::os::unix::fs::MetadataExt;
use std::time::{Duration, Instant};

use runjournal::event::{Event, ExternalJobStatus, JobState, Mode, RunSpec};
use runjournal::projection::incremental::{Projector, STATUS_COALESCE};
use runjournal::projection::{self, documents::StatusDoc};
use runjournal::testkit as kit;
use runjournal::{Condition, Home, HostIds, RunId, Store};

fn job_spec() -> RunSpec {
    let render = kit::step("render", kit::provider("render-farm --watch"));
    RunSpec {
        name: Some("chatty".to_string()),
        ..kit::spec(Mode::Single, vec![render])
    }
}

fn update(state: JobState, progress: f64) -> Event {
    let job = ExternalJobStatus {
        message: Some(format!("{progress} done")),
        ..kit::job(state, "job-1", Some(progress))
    };
    kit::job_updated(0, job)
}

/// A store, and a run whose external-job step is running and has reported once, appended to the journal alone (the
/// test projects it with a projector of its own).
fn running_run(store: &Store) -> RunId {
    let run = store
        .journal()
        .create_run(job_spec(), HostIds::default())
        .expect("create")
        .run;
    let events = vec![
        kit::runner_started(kit::identity(1), "runner-1"),
        kit::step_running(0, None),
        // The job's first status is a change of shape (the step had none); what follows are
        // samples.
        update(JobState::Running, 0.0),
    ];
    store
        .journal()
        .append(run, events, Condition::none())
        .expect("start");
    run
}

fn append(store: &Store, run: RunId, event: Event) {
    store
        .journal()
        .append(run, vec![event], Condition::none())
        .expect("append");
}

fn status_seq(store: &Store, run: RunId) -> u64 {
    let bytes = std::fs::read(store.home().status_path(run)).expect("status.json");
    serde_json::from_slice::<StatusDoc>(&bytes)
        .expect("status.json parses")
        .journal_seq
}

fn inode(path: &std::path::Path) -> u64 {
    std::fs::metadata(path).expect("stat").ino()
}

/// Every file of the run equals a fresh projection's.
fn assert_current(store: &Store, run: RunId) {
    let view = store.journal().view().expect("view");
    let (state, records, links) = projection::load(&view, run).expect("load");
    let differences =
        projection::check_plan(&projection::plan(store.home(), &state, &records, &links));
    assert!(differences.is_empty(), "{differences:#?}");
}

#[test]
fn samples_are_appended_and_their_status_put_off_at_most_the_coalescing_window() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = Store::open(Home::at(dir.path())).expect("open");
    let run = running_run(&store);
    let projector = Projector::new();
    let home = store.home();
    let events_path = home.events_path(run);
    let start = Instant::now();

    let first = projector
        .project(home, store.journal(), run, start, true)
        .expect("project");
    assert_eq!(
        first.status_due, None,
        "the first projection writes everything"
    );
    assert_current(&store, run);
    let events_inode = inode(&events_path);

    // Samples within the window: events.jsonl grows in place, status.json waits.
    for (offset_ms, progress) in [(10, 0.1), (20, 0.2), (30, 0.3)] {
        append(&store, run, update(JobState::Running, progress));
        let projected = projector
            .project(
                home,
                store.journal(),
                run,
                start + Duration::from_millis(offset_ms),
                true,
            )
            .expect("project");
        assert_eq!(projected.status_due, Some(start + STATUS_COALESCE));
        assert_eq!(
            status_seq(&store, run),
            4,
            "status.json waits for the window"
        );
    }
    assert_eq!(
        inode(&events_path),
        events_inode,
        "events.jsonl was appended to, not replaced"
    );
    assert_eq!(
        projector.due_runs(start + Duration::from_millis(99)),
        vec![]
    );
    assert_eq!(projector.due_runs(start + STATUS_COALESCE), vec![run]);

    // When it is due, it is written with the latest state: every file is current.
    let due = projector
        .project(home, store.journal(), run, start + STATUS_COALESCE, false)
        .expect("project");
    assert_eq!(due.status_due, None);
    assert_eq!(projector.due_runs(start + Duration::from_secs(60)), vec![]);
    assert_current(&store, run);

    // Past the window, a sample is written at once (the leading edge).
    append(&store, run, update(JobState::Running, 0.4));
    let later = projector
        .project(
            home,
            store.journal(),
            run,
            start + Duration::from_millis(250),
            true,
        )
        .expect("project");
    assert_eq!(later.status_due, None);
    assert_current(&store, run);
}

#[test]
fn a_state_change_is_written_at_once_within_the_window() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = Store::open(Home::at(dir.path())).expect("open");
    let run = running_run(&store);
    let projector = Projector::new();
    let home = store.home();
    let start = Instant::now();
    projector
        .project(home, store.journal(), run, start, true)
        .expect("project");
    append(&store, run, update(JobState::Running, 0.5));
    let sample = projector
        .project(
            home,
            store.journal(),
            run,
            start + Duration::from_millis(1),
            true,
        )
        .expect("project");
    assert!(sample.status_due.is_some());

    // The job succeeds: a state change, written with its commit, the put-off sample with it.
    append(&store, run, update(JobState::Succeeded, 1.0));
    let change = projector
        .project(
            home,
            store.journal(),
            run,
            start + Duration::from_millis(2),
            true,
        )
        .expect("project");
    assert_eq!(change.status_due, None);
    assert_eq!(projector.due_runs(start + Duration::from_secs(60)), vec![]);
    assert_current(&store, run);
}

/// What another process projected in between is not this projector's to judge: a status that
/// is a sample of what this projector last wrote but a change of what is on disk now (the job
/// went queued and back, projected by someone else) is written at once.
#[test]
fn after_another_projection_everything_is_written_at_once() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = Store::open(Home::at(dir.path())).expect("open");
    let run = running_run(&store);
    let projector = Projector::new();
    let home = store.home();
    let start = Instant::now();
    projector
        .project(home, store.journal(), run, start, true)
        .expect("project");
    append(&store, run, update(JobState::Queued, 0.0));
    Projector::new()
        .project(home, store.journal(), run, start, true)
        .expect("another projector");
    append(&store, run, update(JobState::Running, 0.5));
    let projected = projector
        .project(
            home,
            store.journal(),
            run,
            start + Duration::from_millis(1),
            true,
        )
        .expect("project");
    assert_eq!(projected.status_due, None, "written at once");
    assert_current(&store, run);
}

#[test]
fn events_jsonl_whose_end_is_not_the_journals_is_rewritten_whole() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = Store::open(Home::at(dir.path())).expect("open");
    let run = running_run(&store);
    let home = store.home();
    let events_path = home.events_path(run);
    let projector = Projector::new();
    let now = Instant::now();
    projector
        .project(home, store.journal(), run, now, false)
        .expect("project");

    // Written by another process (a store of its own): its end is the journal's, so this
    // projector appends to it, though it is not the file it left.
    append(&store, run, update(JobState::Running, 0.1));
    Projector::new()
        .project(home, store.journal(), run, now, false)
        .expect("another projector");
    let inode_before = inode(&events_path);
    append(&store, run, update(JobState::Running, 0.2));
    projector
        .project(home, store.journal(), run, now, false)
        .expect("project");
    assert_eq!(inode(&events_path), inode_before, "appended to");
    assert_current(&store, run);

    // Damage in each way a tail can be wrong: a torn last line, an edited one, a line of a
    // seq the journal does not have, an empty file, a missing one.
    let good = std::fs::read(&events_path).expect("events.jsonl");
    let text = String::from_utf8(good.clone()).expect("utf-8");
    let edited = text.replacen("0.2 done", "0.9 done", 1);
    let ahead = text.replacen("\"seq\":6", "\"seq\":60", 1);
    let damages: Vec<Option<Vec<u8>>> = vec![
        Some(good[..good.len() - 7].to_vec()),
        Some(edited.into_bytes()),
        Some(ahead.into_bytes()),
        Some(Vec::new()),
        None,
    ];
    for (index, damage) in damages.into_iter().enumerate() {
        match damage {
            Some(bytes) => std::fs::write(&events_path, bytes).expect("damage"),
            None => std::fs::remove_file(&events_path).expect("delete"),
        }
        append(
            &store,
            run,
            update(JobState::Running, 0.3 + index as f64 / 100.0),
        );
        projector
            .project(home, store.journal(), run, now, false)
            .expect("project");
        assert_current(&store, run);
    }
}

#[test]
fn a_store_writes_the_status_it_put_off_when_flushed_or_dropped() {
    let dir = tempfile::tempdir().expect("temp dir");
    let run;
    {
        let store = Store::open(Home::at(dir.path())).expect("open");
        run = running_run(&store);
        store.project(run).expect("project");
        // Back to back: whichever of these is put off, the flush writes it.
        for progress in [0.1, 0.2, 0.3] {
            store
                .append(
                    run,
                    vec![update(JobState::Running, progress)],
                    Condition::none(),
                )
                .expect("append");
        }
        assert_eq!(store.flush_projections(Duration::from_secs(10)), 0);
        assert_current(&store, run);
        for progress in [0.4, 0.5, 0.6] {
            store
                .append(
                    run,
                    vec![update(JobState::Running, progress)],
                    Condition::none(),
                )
                .expect("append");
        }
    }
    let store = Store::open(Home::at(dir.path())).expect("open again");
    assert_eq!(status_seq(&store, run), 10, "dropping the store wrote it");
    assert_current(&store, run);
}
