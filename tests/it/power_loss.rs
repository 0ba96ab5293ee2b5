//! Power cuts at every sync point of a scripted lifecycle.
//!
//! The journal runs on an in-memory disk that keeps two images, what was written and what was
//! synced (redb's own crash-consistency test is the model). A fault-free run of the script
//! counts its syncs; then for every k the script runs again and the power goes right after the
//! k-th sync, or during it with only some of the unsynced writes reaching the disk. The synced
//! image is then opened as a fresh journal (redb recovers it) and must hold every append that
//! was acknowledged before the cut, each batch whole or not at all, every snapshot equal to its
//! replay; written to a file and opened as a home, the reconciler must close every run.

use crate::support;

use std::collections::BTreeMap;
use std::sync::Arc;

use runjournal::HostIds;
use runjournal::event::{Event, Mode};
use runjournal::journal::WriterOptions;
use runjournal::reconcile;
use runjournal::store::StoreOptions;
use runjournal::testkit as kit;
use runjournal::{Home, Journal, RunId, Store};
use support::mem_disk::{Fault, MemDisk};
use support::script::{self, Attempt};

/// The batches that landed per run in the fault-free run, in order.
type Reference = BTreeMap<RunId, Vec<Vec<Event>>>;

/// Runs the script on `disk`; the attempts, or none if the journal could not even be opened
/// (the power went while it was being created).
fn run_script(disk: &Arc<MemDisk>) -> Vec<Attempt> {
    // One attempt per failure: after a cut every call fails, and the writer should give up
    // rather than retry what cannot succeed (a retry window of zero).
    let options = WriterOptions {
        io_retry_window: std::time::Duration::ZERO,
        ..WriterOptions::default()
    };
    match Journal::open_with(disk.source(), options) {
        Ok(journal) => script::run(&journal),
        Err(error) => {
            assert!(
                disk.is_dead(),
                "the journal opens on a disk with power: {error}"
            );
            Vec::new()
        }
    }
}

fn reference_of(attempts: &[Attempt]) -> Reference {
    let mut reference = Reference::new();
    for attempt in attempts {
        let batches = reference.entry(attempt.run).or_default();
        if attempt.result.is_ok() {
            batches.push(attempt.events.clone());
        }
    }
    reference.retain(|_, batches| !batches.is_empty());
    reference
}

/// Checks the journal that the synced image recovers to; `label` names the cut.
fn check_recovered(label: &str, image: Vec<u8>, attempts: &[Attempt], reference: &Reference) {
    let disk = MemDisk::with_image(image);
    let journal = Journal::open_with(disk.source(), WriterOptions::default())
        .unwrap_or_else(|error| panic!("{label}: the synced image opens as a journal: {error}"));
    let view = journal.view().expect("a read view");
    let runs = support::check_journal(&view, None);

    // Acknowledged appends per run.
    let mut acked: BTreeMap<RunId, usize> = BTreeMap::new();
    for attempt in attempts.iter().filter(|attempt| attempt.result.is_ok()) {
        *acked.entry(attempt.run).or_default() += 1;
    }
    for (state, records) in &runs {
        let run = state.run_id;
        let batches = reference
            .get(&run)
            .unwrap_or_else(|| panic!("{label}: run {run} is not one the script made"));
        // The run's events are the first m batches of the fault-free run, whole.
        let events = support::events(records);
        let mut prefix: Vec<Event> = Vec::new();
        let mut landed = None;
        for m in 0..=batches.len() {
            if prefix == events {
                landed = Some(m);
                break;
            }
            if let Some(batch) = batches.get(m) {
                prefix.extend(batch.iter().cloned());
            }
        }
        let landed = landed.unwrap_or_else(|| {
            panic!(
                "{label}: run {run}: its {} events are not whole batches of the script: {events:#?}",
                events.len()
            )
        });
        let acked_here = acked.get(&run).copied().unwrap_or(0);
        assert!(
            landed >= acked_here,
            "{label}: run {run}: {acked_here} appends were acknowledged, only {landed} survived"
        );
    }
    for (run, count) in &acked {
        assert!(
            runs.iter().any(|(state, _)| state.run_id == *run),
            "{label}: run {run} had {count} acknowledged appends and is gone"
        );
    }
    drop(view);
    drop(journal);

    // The reconciler closes every run of the recovered journal.
    let home_dir = support::fast_temp_dir();
    let home = Home::at(home_dir.path());
    std::fs::create_dir_all(home.root()).expect("home dir");
    std::fs::write(home.journal_path(), disk.synced_image()).expect("write the recovered image");
    let store = Store::open_with(home.clone(), StoreOptions::default())
        .unwrap_or_else(|error| panic!("{label}: the recovered image opens as a home: {error}"));
    let report = reconcile::reconcile(&store, &reconcile::Options::default())
        .unwrap_or_else(|error| panic!("{label}: reconcile: {error}"));
    for outcome in &report.outcomes {
        assert!(
            outcome.error.is_none(),
            "{label}: reconciling {}: {outcome:?}",
            outcome.run
        );
    }
    let view = store.journal().view().expect("a read view");
    for (state, _) in support::check_journal(&view, None) {
        assert!(
            state.is_closed(),
            "{label}: run {} is closed after reconcile (state {}, process observed: {})",
            state.run_id,
            state.status,
            state.process_terminal.is_some()
        );
    }
    assert_eq!(
        view.active_runs().expect("active runs"),
        Vec::<RunId>::new()
    );
}

#[test]
fn a_power_cut_after_any_sync_loses_nothing_acknowledged_and_leaves_no_half_batch() {
    let disk = MemDisk::new(Fault::None);
    let attempts = run_script(&disk);
    let (writes, syncs) = disk.counts();
    assert!(
        syncs >= 20,
        "the script makes many sync points (counted {syncs} syncs, {writes} writes)"
    );
    let reference = reference_of(&attempts);
    assert!(
        attempts.iter().any(Attempt::is_refused_by_rule),
        "the script includes refused conditional appends"
    );
    check_recovered("fault-free", disk.synced_image(), &attempts, &reference);

    let mut cuts = 0;
    for sync in 1..=syncs {
        // A run of the script can sync less than the fault-free one (its commits grouped
        // otherwise, as a busy machine times them): then this cut never came, and the script
        // is run again, a few times at most, for the cut to come.
        for _ in 0..4 {
            let disk = MemDisk::new(Fault::CutAfterSync { sync });
            let attempts = run_script(&disk);
            if disk.injected() == 0 {
                continue;
            }
            let label = format!("power cut after sync {sync} of {syncs}");
            cuts += 1;
            check_recovered(&label, disk.synced_image(), &attempts, &reference);
            break;
        }
    }
    eprintln!("power cuts checked: {cuts} of {syncs} sync points");
    assert!(
        cuts * 10 >= syncs * 9,
        "most sync points were cut at ({cuts} of {syncs})"
    );
}

#[test]
fn a_power_cut_during_a_sync_loses_the_unsynced_writes_and_nothing_acknowledged() {
    let disk = MemDisk::new(Fault::None);
    let attempts = run_script(&disk);
    let (_, syncs) = disk.counts();
    let reference = reference_of(&attempts);

    let mut cuts = 0;
    for sync in 1..=syncs {
        // 0: everything written since the last sync is lost; otherwise only the first writes
        // of that stretch reached the disk.
        for kept in [0, 1, 3] {
            let disk = MemDisk::new(Fault::TornSync { sync, kept });
            let attempts = run_script(&disk);
            if disk.injected() == 0 {
                continue;
            }
            cuts += 1;
            let label = format!("power cut during sync {sync} of {syncs}, {kept} writes kept");
            check_recovered(&label, disk.synced_image(), &attempts, &reference);
        }
    }
    eprintln!("torn syncs checked: {cuts}");
    assert!(cuts >= syncs, "every sync point was torn at least once");
}

/// Regression: redb writes its magic number last when it creates a database, so a power cut
/// during the journal's first creation left a file that every later open refused ("not a
/// runjournal journal: magic number mismatch") until someone deleted it by hand.
#[test]
fn a_journal_whose_creation_a_power_cut_interrupted_is_created_anew() {
    // The image a cut right after the creation's first sync leaves: a header without the
    // magic number, and nothing else.
    let disk = MemDisk::new(Fault::CutAfterSync { sync: 1 });
    assert!(run_script(&disk).is_empty(), "nothing was appended");
    let image = disk.synced_image();
    assert!(
        !image.is_empty() && image[..9] == [0; 9],
        "a creation cut short"
    );

    // In a backend (as the sweeps open it) and in a file (as every process opens it).
    let recovered = MemDisk::with_image(image.clone());
    let journal = Journal::open_with(recovered.source(), WriterOptions::default())
        .expect("a creation cut short is created anew");
    assert_eq!(journal.view().expect("view").run_count().expect("count"), 0);
    drop(journal);
    let dir = support::fast_temp_dir();
    let path = dir.path().join("journal.redb");
    std::fs::write(&path, &image).expect("write the image");
    let journal = Journal::open(&path).expect("a creation cut short is created anew");
    let spec = kit::spec(Mode::Single, vec![kit::shell("one", "true")]);
    let created = journal
        .create_run(spec, HostIds::default())
        .expect("the new journal takes appends");
    assert_eq!(created.last_seq, 1);
    drop(journal);

    // A file with the same empty magic but more than a header is damage, not an unfinished
    // creation: it is refused, never emptied.
    let mut damaged = image;
    let last = damaged.len() - 1;
    damaged[last] = 0xff;
    std::fs::write(&path, &damaged).expect("write the damaged image");
    assert!(Journal::open(&path).is_err(), "a damaged file is refused");
    assert_eq!(
        std::fs::read(&path).expect("read back"),
        damaged,
        "and left as it was"
    );
}
