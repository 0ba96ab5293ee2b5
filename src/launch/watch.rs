//! The home's watcher (docs/design.md, "The home's watcher"): what the home's timer does
//! besides starting delayed runs, so that the home looks after itself between commands. It
//! follows every run the journal holds active: a live runner through a handle on its process
//! (Linux's pidfd), a run without one through a watch of its control inbox. A runner seen to
//! exit has its end recorded at once — `observed`, since the handle names exactly that process
//! — and a reconcile pass closes or retries its run; a request a host drops into the inbox of a
//! run no runner takes (queued, delayed, waiting for others or for its next attempt) is taken
//! by a pass at once.
//!
//! Invariants:
//! * the watcher only reads between looks, and appends nothing a command would not: the
//!   runner's end it saw, then a reconcile pass, whose appends are conditional as any pass's;
//! * a handle is kept only once the process it names was checked, after it was opened, to be
//!   the recorded runner (a pid is not handed on while its holder, zombie included, exists);
//! * what is active is read again only when the journal moved on (its global head), so a look
//!   at a quiet home costs one read of the head and one `poll` of the handles.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::event::{Event, Observer, Proof, RunId};
use crate::home::Home;
use crate::journal::{AppendError, Condition, ReadError};
use crate::liveness::{self, Liveness};
use crate::platform::{self, DirWatch, ProcessHandle};
use crate::reconcile;
use crate::state::{RunState, TransitionError};
use crate::store::Store;

use super::RunnerProgram;

/// One live runner followed: the instance it recorded, and a handle on its process (`None`
/// where the platform has none: its identity is then checked at each look).
struct Followed {
    instance_id: String,
    identity: crate::event::ProcessIdentity,
    handle: Option<ProcessHandle>,
    /// When it was first seen exited (see [`PARENT_FIRST`]).
    exited_at: Option<std::time::Instant>,
}

/// How long a runner seen exited is left to its parent (a `run --wait`, a host following it),
/// which saw how it exited, to record its end, before the watcher records that it saw it exit.
/// While the runner waits unreaped (a zombie: its parent has yet to collect it), its parent is
/// busy, and it is left up to [`PARENT_LIMIT`].
pub const PARENT_FIRST: Duration = Duration::from_secs(1);

/// The longest a runner left unreaped by its parent is waited for.
pub const PARENT_LIMIT: Duration = Duration::from_secs(10);

/// What the watcher keeps between looks.
#[derive(Default)]
pub struct Watch {
    /// The journal's global head when the active runs were last read, and how many records
    /// prunes had removed then (a prune removes runs without a record of its own).
    seen_head: Option<u64>,
    seen_pruned: u64,
    runners: BTreeMap<RunId, Followed>,
    /// Runs without a runner whose inbox is watched, and those whose inbox could not be yet
    /// (their directory is made by the projection after their creation).
    inboxes: BTreeSet<RunId>,
    unwatched: BTreeSet<RunId>,
    inbox_watch: Option<DirWatch>,
    /// Whether an inbox changed since the last look.
    is_inbox_changed: bool,
    /// A run found stale or its runner dead when the active runs were read.
    is_pass_due: bool,
}

/// What one look did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Looked {
    /// Runs it follows (a runner, an inbox): while there are some, the watcher stays.
    pub following: usize,
    /// Runners it saw exit, whose end it recorded.
    pub runners_ended: Vec<RunId>,
}

impl Watch {
    pub fn new() -> Watch {
        Watch::default()
    }

    /// One look: reads the active runs again if the journal moved on, records the end of each
    /// followed runner that exited, and makes a pass (`pass`) when a runner ended, a run was
    /// found stale, or an inbox changed. `by` names the watcher in what the pass records.
    pub fn look(
        &mut self,
        store: &Store,
        base: &RunnerProgram,
        by: &str,
        note: &mut dyn FnMut(&str),
    ) -> Result<Looked, ReadError> {
        let mut looked = Looked::default();
        let (head, pruned) = {
            let view = store.journal().view()?;
            (view.global_head()?, view.pruned_records()?)
        };
        if self.seen_head != Some(head) || self.seen_pruned != pruned {
            let is_whole = self.seen_head.is_none() || self.seen_pruned != pruned;
            self.refresh(store, self.seen_head, is_whole)?;
            self.seen_head = Some(head);
            self.seen_pruned = pruned;
        }
        self.watch_new_inboxes(store.home());
        for (run, followed) in &mut self.runners {
            if followed.exited_at.is_none() && has_exited(followed) {
                followed.exited_at = Some(std::time::Instant::now());
            }
            let Some(exited_at) = followed.exited_at else {
                continue;
            };
            let waited = exited_at.elapsed();
            if waited < PARENT_FIRST || (waited < PARENT_LIMIT && is_unreaped(&followed.identity)) {
                continue;
            }
            let event = Event::ProcessTerminalObserved {
                instance_id: followed.instance_id.clone(),
                exit: None,
                proof: Proof::Observed,
                observer: Observer::Watcher,
            };
            match store.append(*run, vec![event], Condition::none()) {
                // Its parent, or a pass, recorded it first; or the run moved on to another
                // runner: either way the pass below judges the run as it is.
                Ok(_)
                | Err(AppendError::Transition {
                    source:
                        TransitionError::ProcessTerminalAlreadyObserved { .. }
                        | TransitionError::InstanceMismatch { .. },
                    ..
                }) => {}
                Err(error) => note(&format!("run {run}: recording its runner's end: {error}")),
            }
            looked.runners_ended.push(*run);
        }
        for run in &looked.runners_ended {
            self.runners.remove(run);
        }
        let is_pass_due =
            self.is_pass_due || self.is_inbox_changed || !looked.runners_ended.is_empty();
        if is_pass_due {
            self.is_pass_due = false;
            self.is_inbox_changed = false;
            pass(store, base, by, note);
            // What the pass recorded moved the head: the next look reads the runs again.
        }
        looked.following = self.runners.len() + self.inboxes.len() + self.unwatched.len();
        Ok(looked)
    }

    /// Sleeps up to `timeout`, or less when a watched inbox changes.
    pub fn sleep(&mut self, timeout: Duration) {
        match &self.inbox_watch {
            Some(watch) => {
                if watch.wait(timeout).unwrap_or(false) {
                    self.is_inbox_changed = true;
                }
            }
            None => std::thread::sleep(timeout),
        }
    }

    /// Reads the active runs — all of them at the first look and after a prune (which removes
    /// runs without a record of its own), else only those with records after global seq
    /// `seen` (the log says which): follows each live runner not yet followed, watches the
    /// inbox of each run without one, and forgets the runs no longer active. A home of 10,000
    /// waiting runs costs the first look 10,000 snapshots, a prune a scan of the active index,
    /// and each commit the runs it touched.
    fn refresh(
        &mut self,
        store: &Store,
        seen: Option<u64>,
        is_whole: bool,
    ) -> Result<(), ReadError> {
        let states: Vec<(RunId, Option<RunState>)> = {
            let view = store.journal().view()?;
            let mut runs: BTreeSet<RunId> = match seen {
                Some(seen) => view.runs_changed_after(seen)?.0.into_iter().collect(),
                None => BTreeSet::new(),
            };
            if is_whole {
                let active: BTreeSet<RunId> = view.active_runs()?.into_iter().collect();
                self.runners.retain(|run, _| active.contains(run));
                self.inboxes.retain(|run| active.contains(run));
                self.unwatched.retain(|run| active.contains(run));
                runs.extend(active.into_iter().filter(|run| !self.is_following(*run)));
            }
            let mut states = Vec::with_capacity(runs.len());
            for run in runs {
                states.push((run, view.snapshot(run)?));
            }
            states
        };
        for (run, state) in &states {
            match state.as_ref().filter(|state| !state.is_closed()) {
                Some(state) => self.follow(state),
                None => {
                    self.runners.remove(run);
                    self.inboxes.remove(run);
                    self.unwatched.remove(run);
                }
            }
        }
        Ok(())
    }

    /// Whether the run is followed already: its runner, or its inbox.
    fn is_following(&self, run: RunId) -> bool {
        self.runners.contains_key(&run)
            || self.inboxes.contains(&run)
            || self.unwatched.contains(&run)
    }

    /// Follows one active run as it stands.
    fn follow(&mut self, state: &RunState) {
        let run = state.run_id;
        // Its runner gone and the run not ended, or ended with no runner's end to wait for.
        if state.is_stale() || (state.is_terminal() && state.runner.is_none()) {
            self.is_pass_due = true;
            return;
        }
        let runner = state
            .runner
            .as_ref()
            .filter(|_| state.process_terminal.is_none());
        let Some(runner) = runner else {
            self.runners.remove(&run);
            // A run no runner takes: a host's request in its inbox is taken by a pass.
            if !state.is_terminal() && !self.inboxes.contains(&run) {
                self.unwatched.insert(run);
            }
            return;
        };
        self.inboxes.remove(&run);
        self.unwatched.remove(&run);
        if self
            .runners
            .get(&run)
            .is_some_and(|followed| followed.instance_id == runner.instance_id)
        {
            return;
        }
        // Opened first, then the process checked: the handle names the recorded runner.
        let handle = platform::open_process(runner.identity.pid).ok().flatten();
        match liveness::check(&runner.identity) {
            Ok(Liveness::Alive) => {
                self.runners.insert(
                    run,
                    Followed {
                        instance_id: runner.instance_id.clone(),
                        identity: runner.identity.clone(),
                        handle,
                        exited_at: None,
                    },
                );
            }
            Ok(Liveness::Dead | Liveness::OtherBoot) => self.is_pass_due = true,
            // Not ours to judge from here, or not readable now: a command's pass says why.
            Ok(Liveness::OtherNamespace) | Err(_) => {}
        }
    }

    /// Watches the inboxes not watched yet whose directory is there now.
    fn watch_new_inboxes(&mut self, home: &Home) {
        let waiting: Vec<RunId> = self.unwatched.iter().copied().collect();
        for run in waiting {
            let dirs = [
                home.control_dir(run),
                home.stop_requests_dir(run),
                home.steer_requests_dir(run),
            ];
            let control = &dirs[0];
            let is_watched = match &self.inbox_watch {
                Some(watch) => watch.watch_also(control).is_ok(),
                None => match platform::watch_dir(control, &[]) {
                    Ok(watch) => {
                        self.inbox_watch = Some(watch);
                        true
                    }
                    Err(_) => false,
                },
            };
            if !is_watched {
                continue;
            }
            // The request directories, where they are: one made later shows as a change of
            // the inbox itself, and the pass it wakes takes what is in it.
            if let Some(watch) = &self.inbox_watch {
                for dir in &dirs[1..] {
                    let _ = watch.watch_also(dir);
                }
            }
            self.unwatched.remove(&run);
            self.inboxes.insert(run);
            // What a host dropped before the watch was made is taken now.
            self.is_inbox_changed = true;
        }
    }
}

/// What a command's upkeep does after a runner's end, but retention and the scrub (the next
/// command's): a reconcile pass, then the runs waiting for the runs it ended judged, the slots
/// it freed taken, and a deliverer started for the hooks now due. Failures are noted; the next
/// command's upkeep does it all again.
fn pass(store: &Store, base: &RunnerProgram, by: &str, note: &mut dyn FnMut(&str)) {
    if let Err(error) = reconcile::reconcile(store, &reconcile::Options::default()) {
        note(&format!("a reconcile pass: {error}"));
        return;
    }
    if let Err(error) = super::after::settle(store, base, by, super::after::Scope::All) {
        note(&format!("judging the runs waiting for others: {error}"));
    }
    if let Err(error) = super::queue::start_admissible(store, base, by, None) {
        note(&format!("admitting queued runs: {error}"));
    }
    if let Err(error) = crate::hooks::start_deliverer_if_needed(store, &base.program) {
        note(&format!("starting the hooks' deliverer: {error}"));
    }
}

/// Whether a followed runner has exited: its handle is readable, or (without one) its
/// identity no longer names a live process.
fn has_exited(followed: &Followed) -> bool {
    match &followed.handle {
        Some(handle) => handle.wait_exited(Duration::ZERO).unwrap_or(false),
        None => matches!(
            liveness::check(&followed.identity),
            Ok(Liveness::Dead | Liveness::OtherBoot)
        ),
    }
}

/// Whether the process of `identity` has exited and waits for its parent to collect it.
fn is_unreaped(identity: &crate::event::ProcessIdentity) -> bool {
    platform::process(identity.pid)
        .ok()
        .flatten()
        .is_some_and(|info| info.is_zombie && info.start_time == Some(identity.start_time))
}

/// Whether the journal holds a run the watcher would follow: any active run (one look at the
/// active index, whatever its size).
pub fn has_active(store: &Store) -> Result<bool, ReadError> {
    store.journal().view()?.has_active_runs()
}
