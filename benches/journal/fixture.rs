//! What the benchmarks run on: realistic events, homes with many closed runs and a few active
//! ones, and the cache that keeps the 100,000-run journal between bench runs.

use std::path::{Path, PathBuf};

use runjournal::event::{
    self, Event, ExternalJobStatus, JobState, Mode, ProcessIdentity, Record, RunId, RunSpec,
    WriterId,
};
use runjournal::journal::Condition;
use runjournal::store::StoreOptions;
use runjournal::testkit as kit;
use runjournal::{Home, Journal, JournalReader, Store};

/// Bump when the runs the fixtures hold change, so a cached journal is built again.
const FIXTURE_VERSION: u32 = 1;

/// Batches queued at once while a fixture is built: the writer commits them in groups of up
/// to `max_group_events`, so 100,000 runs cost a few hundred commits, not 100,000.
const BUILD_CHUNK: usize = 5_000;

/// The instance id of every benchmark run's runner.
const RUNNER_INSTANCE: &str = "runner-4242-1";

/// The spec of a run with one external-job step: job updates are its transitions.
pub fn job_spec() -> RunSpec {
    let provider = kit::provider("./deploy-provider.sh --env staging");
    kit::spec(Mode::Single, vec![kit::step("deploy", provider)])
}

/// The spec of an ordinary one-command run.
fn command_spec() -> RunSpec {
    let build = kit::argv(&["cargo", "build", "--release", "--locked"]);
    RunSpec {
        timeout_ms: Some(600_000),
        cwd: Some("/srv/app".to_string()),
        ..kit::spec(Mode::Single, vec![kit::step("build", build)])
    }
}

pub fn created(spec: RunSpec) -> Event {
    let hosts = kit::hosts(Some("session-7f3a9c"), None, None);
    kit::created(spec, event::now_ms(), hosts)
}

pub fn runner_started(runner: ProcessIdentity) -> Event {
    kit::runner_started(runner, RUNNER_INSTANCE)
}

pub fn step_running(process: Option<ProcessIdentity>) -> Event {
    kit::step_running(0, process)
}

/// One transition of a long external job: a progress report of about the size a real
/// provider prints (its encoded record is printed in the report).
pub fn job_update(progress: u32) -> Event {
    kit::job_updated(0, job_status(f64::from(progress % 100)))
}

/// The status of the long external job at `progress`.
fn job_status(progress: f64) -> ExternalJobStatus {
    ExternalJobStatus {
        message: Some("uploading artifacts to the staging bucket".to_string()),
        url: Some("https://ci.example.com/jobs/5f2e8a61".to_string()),
        ..kit::job(JobState::Running, "job-5f2e8a61", Some(progress))
    }
}

/// The whole life of a command run after `RunCreated`: it ran, succeeded, and was seen gone.
pub fn closed_lifecycle() -> Vec<Event> {
    vec![
        created(command_spec()),
        runner_started(kit::uuid_boot_identity(4242)),
        step_running(Some(kit::uuid_boot_identity(4243))),
        kit::step_complete(0),
        kit::completed("Finished release [optimized] target(s) in 41.2s"),
        kit::runner_exited(RUNNER_INSTANCE, 0),
    ]
}

/// The records of `runs` closed lifecycles, as a journal would hold them, without a journal.
pub fn closed_records(runs: usize) -> Vec<Vec<Record>> {
    (0..runs)
        .map(|index| {
            let run = RunId::generate();
            closed_lifecycle()
                .into_iter()
                .enumerate()
                .map(|(offset, event)| Record {
                    format_version: event::FORMAT_VERSION,
                    run_id: run,
                    seq: offset as u64 + 1,
                    time_ms: event::now_ms(),
                    writer: WriterId(7),
                    writer_seq: index as u64 + 1,
                    event,
                })
                .collect()
        })
        .collect()
}

/// Appends `count` closed runs, many batches per commit.
fn add_closed_runs(journal: &Journal, count: usize) {
    let mut left = count;
    while left > 0 {
        let chunk = left.min(BUILD_CHUNK);
        let batches = (0..chunk).map(|_| {
            (
                RunId::generate(),
                closed_lifecycle(),
                Condition::expect_head(0),
            )
        });
        for result in journal.append_all(batches) {
            result.expect("a closed lifecycle is a legal batch");
        }
        left -= chunk;
    }
}

/// A journal of `count` closed runs, built once and kept under `cache_dir` (a few hundred MB
/// for 100,000 runs); later bench runs copy it.
pub fn cached_closed_journal(cache_dir: &Path, count: usize) -> PathBuf {
    let path = cache_dir.join(format!(
        "closed-{count}-format{}-fixture{FIXTURE_VERSION}.redb",
        event::FORMAT_VERSION
    ));
    if is_closed_journal(&path, count) {
        return path;
    }
    std::fs::create_dir_all(cache_dir).expect("the fixture cache directory can be made");
    let building = path.with_extension("building");
    let _ = std::fs::remove_file(&building);
    let started = std::time::Instant::now();
    {
        let journal = Journal::open(&building).expect("a new journal opens");
        add_closed_runs(&journal, count);
        let stats = journal.writer_stats();
        eprintln!(
            "built {count} closed runs in {:.1} s ({} commits for {} batches); cached for later runs",
            started.elapsed().as_secs_f64(),
            stats.commits.load(std::sync::atomic::Ordering::Relaxed),
            stats.batches.load(std::sync::atomic::Ordering::Relaxed),
        );
    }
    std::fs::rename(&building, &path).expect("the built fixture is put in place");
    path
}

fn is_closed_journal(path: &Path, count: usize) -> bool {
    let Ok(reader) = JournalReader::open(path) else {
        return false;
    };
    let Ok(view) = reader.view() else {
        return false;
    };
    view.run_count().ok() == Some(count as u64)
        && view.active_runs().is_ok_and(|active| active.is_empty())
}

/// A home (under `dir`) whose journal holds `closed` closed runs and `active` running runs,
/// each of these owned by this very process (so the reconciler finds its runner alive) and
/// projected. The closed runs come from the cache when there is one.
pub struct BenchHome {
    pub store: Store,
    pub active: Vec<RunId>,
    pub closed: usize,
}

impl BenchHome {
    pub fn build(dir: &Path, cache_dir: Option<&Path>, closed: usize, active: usize) -> BenchHome {
        let home = Home::at(dir);
        std::fs::create_dir_all(dir).expect("the home directory can be made");
        if let Some(cache_dir) = cache_dir {
            let cached = cached_closed_journal(cache_dir, closed);
            std::fs::copy(&cached, home.journal_path()).expect("the cached journal copies");
        }
        let store = Store::open_with(home, StoreOptions::default()).expect("the home opens");
        if cache_dir.is_none() {
            add_closed_runs(store.journal(), closed);
        }
        let me = runjournal::liveness::current().expect("this process has an identity");
        let runs: Vec<RunId> = (0..active).map(|_| RunId::generate()).collect();
        let batches = runs.iter().map(|&run| {
            (
                run,
                vec![
                    created(job_spec()),
                    runner_started(me.clone()),
                    step_running(None),
                ],
                Condition::expect_head(0),
            )
        });
        for result in store.journal().append_all(batches) {
            result.expect("an active run is a legal batch");
        }
        for &run in &runs {
            store.project(run).expect("an active run is projected");
        }
        BenchHome {
            store,
            active: runs,
            closed,
        }
    }

    pub fn root(&self) -> &Path {
        self.store.home().root()
    }
}
