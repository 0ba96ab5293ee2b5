//! The handle a host holds: [`Runs`], opened on a home, owns every user-level action the
//! command line has (launch, resume, stop, interrupt, dismiss, a job's update, status, list,
//! wait, queues, the retention policy and prune) and [`Runs::maintain`], the upkeep every
//! reading command makes first: a reconcile pass, then the admissions its closings allow, then
//! hook delivery, then a retention pass, returning one [`Maintained`] report.
//!
//! Invariants:
//! * `maintain` reads what its passes decide on from one view of the journal, dropped before
//!   any pass acts; only when a pass wrote (a run closed, a run admitted) do the passes after
//!   it read again, so they see what it did: a home with nothing to do costs one view;
//! * when another process keeps the journal's write lock past the store's bound, the reconcile
//!   pass says so ([`crate::reconcile::Report::lock_held`]) and the passes after it are
//!   skipped: each would wait on the same lock;
//! * the runner program a pass starts (for a queued run, for hook delivery) is the handle's:
//!   the `runjournal` binary, or whatever a host built to run `__runner` and
//!   [`crate::hooks::DELIVERER_SUBCOMMAND`].

use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use crate::control::{self, ControlError, DismissOutcome, StopOutcome};
use crate::event::{ExternalJobStatus, Record, RunId, now_ms};
use crate::home::Home;
use crate::hooks::{self, HookError};
use crate::journal::{AppendError, Appended, LockHeld, OpenError, ReadError, Retention};
use crate::json::{PrunedDoc, ReconcileLine};
use crate::launch::queue::{self, Admitted, QueueError, QueueView};

use crate::launch::{
    self, Followed, LaunchError, Launched, ResumeError, Resumed, RunnerProgram, Waited,
};
use crate::reconcile::{self, ReconcileError};
use crate::resolve::{self, ListOptions, Listed};
use crate::retention::{self, PassError, PassOptions, PassReport};
use crate::spec::RunRequest;
use crate::state::RunState;
use crate::store::{Store, StoreOptions};

/// A home opened by a host, with the runner program its passes and launches start.
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use runjournal::{Home, Runs, RunnerProgram};
/// use runjournal::home::Layout;
///
/// let dir = tempfile::tempdir()?;
/// let home = Home::resolve(Some(&dir.path().join("home")), Layout::Runjournal)?;
/// // The program that runs `__runner RUN` (and delivers hooks): the runjournal binary.
/// let runs = Runs::open(home, RunnerProgram::runjournal("runjournal"))?;
/// let done = runs.maintain();
/// assert!(done.is_clean(), "{done}");
/// assert!(runs.list(Default::default())?.runs.is_empty());
/// # Ok(())
/// # }
/// ```
pub struct Runs {
    store: Store,
    runner: RunnerProgram,
}

impl Runs {
    /// Opens `home` (made if it is missing) with the options of the environment
    /// ([`StoreOptions::from_env`]'s defaults), starting runners with `runner`.
    pub fn open(home: Home, runner: RunnerProgram) -> Result<Runs, OpenError> {
        Ok(Runs::new(Store::open(home)?, runner))
    }

    /// [`Runs::open`] with `options`.
    pub fn open_with(
        home: Home,
        options: StoreOptions,
        runner: RunnerProgram,
    ) -> Result<Runs, OpenError> {
        Ok(Runs::new(Store::open_with(home, options)?, runner))
    }

    /// The handle of a store already open.
    pub fn new(store: Store, runner: RunnerProgram) -> Runs {
        Runs { store, runner }
    }

    /// The store underneath.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The home.
    pub fn home(&self) -> &Home {
        self.store.home()
    }

    /// The runner program the handle starts.
    pub fn runner(&self) -> &RunnerProgram {
        &self.runner
    }

    /// Upkeep before a read: reconcile, admit, start hook delivery, prune by the policy
    /// ([`maintain`]).
    pub fn maintain(&self) -> Maintained {
        maintain(&self.store, &self.runner)
    }

    /// Launches `request` and waits (at most [`launch::RUNNER_START_TIMEOUT`]) for its runner to
    /// take it; a queued run returns at once, waiting for its slot.
    pub fn launch(&self, request: RunRequest) -> Result<Launched, LaunchError> {
        let program = self.runner.for_request(&request);
        launch::launch(&self.store, request, &program, launch::RUNNER_START_TIMEOUT)
    }

    /// Follows a run this handle launched to its end, handing each of its records to
    /// `on_record` as it lands, and records how its runner process ended (the launcher is its
    /// parent): what a launcher owes the journal, without which the run is not closed, and so
    /// never pruned, until a reconcile pass sees the runner gone ([`launch::follow_launched`]).
    pub fn follow(
        &self,
        launched: &mut Launched,
        on_record: impl FnMut(&Record) -> ControlFlow<()>,
    ) -> Result<Followed, LaunchError> {
        launch::follow_launched(&self.store, launched, on_record)
    }

    /// Carries the paused run `run` on in a new run ([`launch::resume_with`]).
    pub fn resume(
        &self,
        run: RunId,
        options: &launch::ResumeOptions,
        heartbeat: Option<Duration>,
    ) -> Result<Resumed, ResumeError> {
        let program = self.runner.with_settings(heartbeat, options.idle_timeout);
        launch::resume_with(
            &self.store,
            run,
            options,
            &program,
            launch::RUNNER_START_TIMEOUT,
        )
    }

    /// Asks `run` to stop, `by` whom and why ([`control::request_stop`]).
    pub fn stop(&self, run: RunId, by: &str, reason: &str) -> Result<StopOutcome, ControlError> {
        control::request_stop(&self.store, run, by, reason)
    }

    /// Asks `run` to pause ([`control::request_interrupt`]).
    pub fn interrupt(
        &self,
        run: RunId,
        by: &str,
        reason: &str,
    ) -> Result<StopOutcome, ControlError> {
        control::request_interrupt(&self.store, run, by, reason)
    }

    /// Hides `run` from default listings.
    pub fn dismiss(&self, run: RunId) -> Result<DismissOutcome, ControlError> {
        control::dismiss(&self.store, run)
    }

    /// Records an external job's status for `run`'s step `step`.
    pub fn update_job(
        &self,
        run: RunId,
        step: u32,
        job: ExternalJobStatus,
    ) -> Result<Appended, ControlError> {
        control::push_job_update(&self.store, run, step, job)
    }

    /// `run`'s state as the journal holds it now; `None` when it is not there (never was, or
    /// was pruned).
    pub fn status(&self, run: RunId) -> Result<Option<RunState>, ReadError> {
        self.store.journal().view()?.snapshot(run)
    }

    /// The runs a listing shows ([`resolve::listed`]).
    pub fn list(&self, options: ListOptions) -> Result<Listed, ReadError> {
        resolve::listed(&self.store.journal().view()?, options)
    }

    /// Waits until `run` has ended or `timeout` passes ([`launch::wait_for_end`]).
    pub fn wait(&self, run: RunId, timeout: Option<Duration>) -> Result<Waited, LaunchError> {
        let deadline = timeout.map(|timeout| Instant::now() + timeout);
        launch::wait_for_end(&self.store, run, deadline)
    }

    /// `name`'s limit and use, and its first `first` waiting runs.
    pub fn queue(&self, name: &str, first: usize) -> Result<QueueView, QueueError> {
        queue::view(&self.store, name, first)
    }

    /// Sets `name`'s limit of active runs, then admits what it now allows.
    pub fn set_queue_limit(
        &self,
        name: &str,
        max_active: u64,
    ) -> Result<Vec<Admitted>, QueueError> {
        queue::set_limit(&self.store, name, max_active)?;
        queue::start_admissible(&self.store, &self.runner, &admitter(), None)
    }

    /// The retention policy: the one set, or `None` when the home never set one (the
    /// defaults, [`Retention::DEFAULT`], hold).
    pub fn retention(&self) -> Result<Option<Retention>, ReadError> {
        self.store.journal().view()?.retention_set()
    }

    /// Sets the retention policy; every later pass of every process of the home applies it.
    pub fn set_retention(&self, policy: &Retention) -> Result<(), AppendError> {
        self.store.journal().set_retention(policy)
    }

    /// Prunes everything due now under `options` ([`retention::prune_all`]), calling
    /// `progress` with the runs pruned so far between passes.
    pub fn prune(
        &self,
        options: &PassOptions,
        progress: impl FnMut(usize),
    ) -> Result<PassReport, PassError> {
        retention::prune_all(&self.store, options, progress)
    }
}

/// Who a pass's admissions are recorded as admitted by.
fn admitter() -> String {
    format!("reconciler (pid {})", std::process::id())
}

/// What [`maintain`] did, pass by pass. A pass that was skipped (the journal's write lock is
/// kept by another process: see [`Maintained::skipped`]) is `None`.
#[derive(Debug)]
pub struct Maintained {
    /// The reconcile pass.
    pub reconciled: Result<reconcile::Report, ReconcileError>,
    /// The runs waiting for others that the pass judged (before the queues admit: a run met
    /// takes its place in its queue first).
    pub judged:
        Option<Result<Vec<crate::launch::after::Settled>, crate::launch::after::DependencyError>>,
    /// The runs the pass admitted from their queues, their runners started.
    pub admitted: Option<Result<Vec<Admitted>, QueueError>>,
    /// The delayed runs the pass started once due (and the home's timer started again when
    /// runs still wait and none runs).
    pub delayed:
        Option<Result<Vec<crate::launch::delay::DueStarted>, crate::launch::delay::DelayError>>,
    /// The pid of the hook deliverer started, if a hook was due and nobody held it.
    pub deliverer: Option<Result<Option<u32>, HookError>>,
    /// The retention pass.
    pub pruned: Option<Result<PassReport, PassError>>,
    /// The pid of the scrub started, if one was due and none ran ([`crate::scrub`]).
    pub scrub: Option<Result<Option<u32>, crate::scrub::ScrubError>>,
}

impl Maintained {
    /// Who keeps the journal's write lock, when the passes after the reconcile pass were
    /// skipped for it.
    pub fn skipped(&self) -> Option<&LockHeld> {
        self.reconciled
            .as_ref()
            .ok()
            .and_then(|report| report.lock_held.as_ref())
    }

    /// Whether every pass ran and nothing failed.
    pub fn is_clean(&self) -> bool {
        self.skipped().is_none()
            && self.reconciled.as_ref().is_ok_and(|report| {
                report
                    .outcomes
                    .iter()
                    .all(|outcome| outcome.error.is_none())
            })
            && matches!(self.judged, Some(Ok(_)))
            && matches!(self.admitted, Some(Ok(_)))
            && matches!(self.delayed, Some(Ok(_)))
            && matches!(self.deliverer, Some(Ok(_)))
            && matches!(&self.pruned, Some(Ok(report)) if report.errors.is_empty())
            && matches!(self.scrub, Some(Ok(_)))
    }

    /// Whether a pass failed on damage to the journal ([`crate::journal::is_damage`] along its
    /// error's chain): a command that reports the passes then exits as damage does.
    pub fn met_damage(&self) -> bool {
        use crate::journal::is_damage_in_chain as chain;
        fn failed<T, E: std::error::Error + 'static>(pass: &Option<Result<T, E>>) -> bool {
            matches!(pass, Some(Err(error)) if chain(error))
        }
        let reconciled = match &self.reconciled {
            Ok(report) => report.outcomes.iter().any(|outcome| outcome.damaged),
            Err(error) => chain(error),
        };
        reconciled
            || failed(&self.judged)
            || failed(&self.admitted)
            || failed(&self.delayed)
            || failed(&self.deliverer)
            || failed(&self.pruned)
            || failed(&self.scrub)
    }

    /// Whether a pass wrote to the journal, so a pass after it must read again.
    fn has_written(
        reconciled: &reconcile::Report,
        admitted: &Result<Vec<Admitted>, QueueError>,
    ) -> bool {
        reconciled
            .outcomes
            .iter()
            .any(|outcome| !outcome.appended.is_empty())
            || admitted.as_ref().is_ok_and(|admitted| !admitted.is_empty())
    }
}

impl std::fmt::Display for Maintained {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.reconciled {
            Ok(report) => write!(
                f,
                "{} active run(s), {} changed",
                report.active,
                report.changed().count()
            )?,
            Err(error) => write!(f, "reconciling: {error}")?,
        }
        if let Some(held) = self.skipped() {
            return write!(f, "; the other passes skipped: {held}");
        }
        if let Some(Err(error)) = &self.judged {
            write!(f, "; judging the runs that wait for others: {error}")?;
        }
        match &self.admitted {
            Some(Ok(admitted)) => write!(f, ", {} admitted", admitted.len())?,
            Some(Err(error)) => write!(f, "; starting queued runs: {error}")?,
            None => {}
        }
        match &self.delayed {
            Some(Ok(delayed)) => write!(f, ", {} started when due", delayed.len())?,
            Some(Err(error)) => write!(f, "; starting delayed runs: {error}")?,
            None => {}
        }
        if let Some(Err(error)) = &self.deliverer {
            write!(f, "; delivering hooks: {error}")?;
        }
        match &self.pruned {
            Some(Ok(report)) => write!(f, ", {} pruned", report.chosen.len())?,
            Some(Err(error)) => write!(f, "; pruning: {error}")?,
            None => {}
        }
        if let Some(Err(error)) = &self.scrub {
            write!(f, "; scrubbing: {error}")?;
        }
        Ok(())
    }
}

impl Maintained {
    /// The lines of `runjournal reconcile` (each its `--json` object and, as `Display`, its
    /// text): a line per run the reconcile pass decided, per run admitted, per run pruned, then
    /// the summary, which counts the runs' errors and [`Maintained::failures`].
    pub fn lines(&self) -> Vec<ReconcileLine> {
        let mut lines = Vec::new();
        let (active, changed) = match &self.reconciled {
            Ok(report) => {
                lines.extend(report.outcomes.iter().map(ReconcileLine::of));
                (report.active, report.changed().count())
            }
            Err(_) => (0, 0),
        };
        if let Some(Ok(judged)) = &self.judged {
            lines.extend(judged.iter().map(ReconcileLine::judged));
        }
        if let Some(Ok(admitted)) = &self.admitted {
            lines.extend(admitted.iter().map(ReconcileLine::admitted));
        }
        if let Some(Ok(delayed)) = &self.delayed {
            lines.extend(delayed.iter().map(ReconcileLine::due));
        }
        let mut pruned = 0;
        if let Some(Ok(report)) = &self.pruned {
            lines.extend(
                report
                    .chosen
                    .iter()
                    .map(|chosen| ReconcileLine::Pruned(PrunedDoc::of(chosen))),
            );
            pruned = report.chosen.len();
        }
        let run_errors = match &self.reconciled {
            Ok(report) => report
                .outcomes
                .iter()
                .filter(|outcome| outcome.error.is_some())
                .count(),
            Err(_) => 0,
        };
        lines.push(ReconcileLine::Summary {
            active,
            changed,
            pruned,
            errors: run_errors + self.failures().len(),
        });
        lines
    }

    /// What failed, a line each, beyond a run's own error: a pass that could not run, a file a
    /// pruning could not remove (the next pass tries again).
    pub fn failures(&self) -> Vec<String> {
        let mut failures = Vec::new();
        if let Err(error) = &self.reconciled {
            failures.push(format!("reconciling: {error}"));
        }
        failures.extend(self.pass_failures());
        if let Some(Ok(report)) = &self.pruned {
            failures.extend(report.errors.iter().cloned());
        }
        failures
    }

    /// The passes after the reconcile pass that failed.
    fn pass_failures(&self) -> Vec<String> {
        let mut failures = Vec::new();
        if let Some(Err(error)) = &self.judged {
            failures.push(format!("judging the runs that wait for others: {error}"));
        }
        if let Some(Err(error)) = &self.admitted {
            failures.push(format!("starting queued runs: {error}"));
        }
        if let Some(Err(error)) = &self.delayed {
            failures.push(format!("starting delayed runs: {error}"));
        }
        if let Some(Err(error)) = &self.deliverer {
            failures.push(format!("delivering hooks: {error}"));
        }
        if let Some(Err(error)) = &self.pruned {
            failures.push(format!("pruning: {error}"));
        }
        if let Some(Err(error)) = &self.scrub {
            failures.push(format!("scrubbing: {error}"));
        }
        failures
    }

    /// What a reading command says of the upkeep it made, a line each: that the passes were
    /// skipped ([`skipped_line`]); else a repair of stale runs (one line:
    /// [`crate::show::repairs_line`]) or why the reconcile pass failed, each run whose files a
    /// held projection lock kept from being repaired, the passes that failed,
    /// and each result pruned before its host consumed it. Routine bookkeeping says nothing.
    pub fn notes(&self) -> Vec<String> {
        if let Some(held) = self.skipped() {
            return vec![skipped_line(held)];
        }
        let mut notes = Vec::new();
        match &self.reconciled {
            Ok(report) => {
                notes.extend(crate::show::repairs_line(report));
                // A stopped process keeps these runs' files stale: said, since what is read
                // from them (a host's status.json) is behind the journal meanwhile.
                notes.extend(
                    report
                        .outcomes
                        .iter()
                        .filter(|outcome| outcome.files_held)
                        .filter_map(|outcome| outcome.error.clone()),
                );
            }
            Err(error) => notes.push(format!("reconciling: {error}")),
        }
        notes.extend(self.pass_failures());
        if let Some(Ok(report)) = &self.pruned {
            notes.extend(report.clock_line());
            notes.extend(
                report
                    .chosen
                    .iter()
                    .filter(|chosen| chosen.unconsumed_result)
                    .map(|chosen| PrunedDoc::of(chosen).line("pruned")),
            );
        }
        notes
    }
}

/// The line that says the passes after the reconcile pass were skipped, and why.
pub fn skipped_line(held: &LockHeld) -> String {
    format!(
        "{held}: reconciling, starting queued runs and pruning skipped; read as the journal stands"
    )
}

/// What the passes read before any of them acts, from one view.
struct Reads {
    survey: reconcile::Survey,
    queues: Result<Vec<String>, ReadError>,
    hooks_due: Result<bool, ReadError>,
    plan: Result<retention::Plan, ReadError>,
    scrub_due: Result<bool, ReadError>,
}

fn read_all(store: &Store, prune: &PassOptions) -> Result<Reads, ReadError> {
    let view = store.journal().view()?;
    let survey = reconcile::survey(store.home(), &view)?;
    Ok(Reads {
        survey,
        queues: queue::queue_names(&view),
        hooks_due: hooks::needs_delivery(&view, now_ms()),
        plan: retention::plan(store.home(), &view, prune),
        scrub_due: crate::scrub::is_due(
            &view,
            now_ms(),
            &crate::platform::boot_id().unwrap_or_default(),
        ),
    })
}

/// The upkeep every reading command makes before it reads, and what a host calls in their
/// place: a reconcile pass ([`reconcile::act`]), the admissions its closings allow (each
/// admitted run's runner started with `runner`), a hook deliverer (`runner.program` with
/// [`hooks::DELIVERER_SUBCOMMAND`]) when a completion hook is due and nobody alive holds it,
/// then a retention pass by the home's policy, bounded ([`PassOptions::reconcile`]), and a scrub
/// of the journal started detached (`runner.program` with [`crate::scrub::SCRUB_SUBCOMMAND`]) when
/// one is due.
///
/// Every pass reads from one view taken first; a pass after one that wrote reads again. A
/// failure of one pass does not stop the next.
pub fn maintain(store: &Store, runner: &RunnerProgram) -> Maintained {
    let prune = PassOptions::reconcile();
    let reads = read_all(store, &prune);
    let (reconciled, queues, hooks_due, plan, scrub_due) = match reads {
        Ok(reads) => (
            Ok(reconcile::act(
                store,
                reads.survey,
                &reconcile::Options::default(),
            )),
            Some(reads.queues),
            Some(reads.hooks_due),
            Some(reads.plan),
            Some(reads.scrub_due),
        ),
        Err(error) => (Err(ReconcileError::Read(error)), None, None, None, None),
    };
    if reconciled
        .as_ref()
        .is_ok_and(|report| report.lock_held.is_some())
    {
        return Maintained {
            reconciled,
            judged: None,
            admitted: None,
            delayed: None,
            deliverer: None,
            pruned: None,
            scrub: None,
        };
    }
    let by = admitter();
    let judged = crate::launch::after::settle(store, runner, &by, crate::launch::after::Scope::All);
    let admitted = match queues {
        Some(Ok(queues)) => queue::start_admissible_in(store, runner, &by, &queues),
        Some(Err(error)) => Err(QueueError::Read(error)),
        None => queue::start_admissible(store, runner, &by, None),
    };
    let delayed = crate::launch::delay::reconcile_delayed(store, runner, &by);
    let has_written = reconciled
        .as_ref()
        .is_ok_and(|report| Maintained::has_written(report, &admitted))
        || judged.as_ref().is_ok_and(|judged| !judged.is_empty())
        || delayed.as_ref().is_ok_and(|delayed| !delayed.is_empty());
    let deliverer = match hooks_due {
        Some(Ok(false)) if !has_written => Ok(None),
        Some(Ok(true)) if !has_written => hooks::start_deliverer(store.home(), &runner.program)
            .map(Some)
            .map_err(HookError::Start),
        Some(Err(error)) if !has_written => Err(HookError::Read(error)),
        _ => hooks::start_deliverer_if_needed(store, &runner.program),
    };
    let pruned = match plan {
        Some(Ok(plan)) if !has_written => retention::carry_out(store, plan, &prune),
        Some(Err(error)) if !has_written => Err(PassError::Read(error)),
        _ => retention::pass(store, &prune),
    };
    let scrub = match scrub_due {
        Some(Ok(false)) => Ok(None),
        Some(Ok(true)) => crate::scrub::start(store.home(), &runner.program),
        Some(Err(error)) => Err(crate::scrub::ScrubError::Read(error)),
        None => crate::scrub::start_if_due(store, &runner.program),
    };
    Maintained {
        reconciled,
        judged: Some(judged),
        admitted: Some(admitted),
        delayed: Some(delayed),
        deliverer: Some(deliverer),
        pruned: Some(pruned),
        scrub: Some(scrub),
    }
}

#[cfg(test)]
mod tests;
