//! The journal handle's committer: takes every append waiting in the queue as one group,
//! numbers this handle's batches with its writer id, and has the group committed — through
//! another process's commit leader when there is one (`share`), otherwise here
//! ([`commit_and_rejudge`]) — then answers each caller with its own result.
//!
//! The [`Committer`] is held by whichever thread commits: an appender that finds nobody
//! committing commits its own batch, with whatever waits, on its own thread
//! ([`Queue::commit_here_or_submit`]), so one appender alone wakes nobody; while one commits,
//! the others queue, and the writer thread ([`run`]) takes them as the next group.
//!
//! A panic while a group is committed (redb meeting damaged bytes) is contained: the group's
//! callers, and every caller queued after them, are answered [`AppendError::Damaged`], the
//! committer is gone, the queue is closed and the writer thread ends, so nobody waits on a
//! writer that is gone; later appends of the handle get the same answer at once ([`Death`]).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use crate::event::now_ms;
use crate::journal::file::contain::contain;
use crate::journal::format::error::{AppendError, Damaged};
use crate::journal::share::Sharing;
use crate::journal::write::append::Batch;
use crate::journal::write::commit::{
    Answer, CapacityState, Origin, Request, Shared, commit_and_rejudge, one_answer_per_batch,
};
use crate::journal::write::queue::{Queue, Reply};

/// Why the writer ended before its handle closed, once it has: what every later append is
/// answered.
#[derive(Default)]
pub(crate) struct Death {
    damaged: Mutex<Option<Damaged>>,
}

impl Death {
    /// The damage the writer died of, if it did.
    pub(crate) fn cause(&self) -> Option<Damaged> {
        self.damaged
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    fn record(&self, damaged: &Damaged) {
        *self
            .damaged
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(damaged.clone());
    }
}

/// The answer to a caller whose batch met damage, or was queued behind it.
fn damaged_answer(damaged: &Damaged) -> Answer {
    Answer {
        result: Err(AppendError::Damaged(damaged.clone())),
        refused_against: None,
        // The panic may have come after the commit landed.
        was_retried: true,
    }
}

/// What commits a group, and what it keeps from one group to the next: the handle's next
/// writer seq, its standing against a full disk, its role in commit sharing. A handle keeps it
/// in a lock (`None` once the writer has died or ended); whoever holds the lock commits.
pub(crate) struct Committer {
    next_writer_seq: u64,
    capacity: CapacityState,
    sharing: Sharing,
}

impl Committer {
    pub(crate) fn new(shared: &Arc<Shared>, queue: &Arc<Queue<Request, Answer>>) -> Committer {
        Committer {
            next_writer_seq: 1,
            capacity: CapacityState::of(shared),
            sharing: Sharing::new(shared, queue),
        }
    }

    /// The group's requests as batches, this handle's numbered in order, and their replies.
    fn number(&mut self, shared: &Shared, group: Vec<(Request, Reply<Answer>)>) -> Numbered {
        let time_ms = now_ms();
        let mut numbered = Numbered {
            replies: Vec::with_capacity(group.len()),
            batches: Vec::with_capacity(group.len()),
        };
        for (request, reply) in group {
            let (writer, writer_seq, time_ms) = match request.origin {
                Origin::Local => {
                    self.next_writer_seq += 1;
                    (shared.writer, self.next_writer_seq - 1, time_ms)
                }
                Origin::Remote {
                    writer,
                    writer_seq,
                    time_ms,
                } => (writer, writer_seq, time_ms),
            };
            numbered.batches.push(Batch {
                run: request.run,
                events: request.events,
                condition: request.condition,
                writer,
                writer_seq,
                time_ms,
                private: request.private,
            });
            numbered.replies.push(reply);
        }
        numbered
    }

    /// Commits `batches` through another process's commit leader when there is one to hand
    /// them to; otherwise here, as the leader or alone. Panics as redb does on damage.
    fn commit(&mut self, shared: &Shared, batches: Vec<Batch>) -> Vec<Answer> {
        #[cfg(test)]
        test_hook::run_before_commit(shared.location.path());
        let Committer {
            next_writer_seq,
            capacity,
            sharing,
        } = self;
        let mut renumber = |batch: Batch| {
            let writer_seq = *next_writer_seq;
            *next_writer_seq += 1;
            Batch {
                writer_seq,
                time_ms: now_ms(),
                ..batch
            }
        };
        match sharing.commit_through_leader(&batches, capacity, &mut renumber) {
            Some(answers) => answers,
            None => commit_and_rejudge(shared, batches, capacity, false, &mut renumber),
        }
    }

    /// The writer's end, once its handle closes and the queue is drained: leadership handed
    /// on, the full-disk marker removed.
    fn finish(mut self, shared: &Shared) {
        self.sharing.finish();
        self.capacity.clear_marker_at_exit(shared);
    }
}

struct Numbered {
    replies: Vec<Reply<Answer>>,
    batches: Vec<Batch>,
}

/// Commits `group` with the committer in `slot` and answers each caller with its own result.
/// A contained panic kills the writer ([`die`]): the committer leaves `slot`, so every thread
/// after this one finds it gone. Returns whether the writer lives.
pub(crate) fn commit_group(
    slot: &mut Option<Committer>,
    shared: &Shared,
    queue: &Queue<Request, Answer>,
    death: &Death,
    group: Vec<(Request, Reply<Answer>)>,
) -> bool {
    let Some(committer) = slot.as_mut() else {
        // The writer died in another thread's commit, and its damage answers this group; or
        // it ended, and the dropped replies say so.
        if let Some(damaged) = death.cause() {
            for (_, reply) in group {
                reply.answer(damaged_answer(&damaged));
            }
        }
        return false;
    };
    let Numbered { replies, batches } = committer.number(shared, group);
    let batch_count = batches.len() as u64;
    let runs: Vec<_> = batches.iter().map(|batch| batch.run).collect();
    match contain(|| committer.commit(shared, batches)) {
        Ok(answers) => {
            shared
                .stats
                .batches
                .fetch_add(batch_count, Ordering::Relaxed);
            for (reply, answer) in replies
                .into_iter()
                .zip(one_answer_per_batch(answers, &runs))
            {
                reply.answer(answer);
            }
            true
        }
        Err(panic) => {
            let damaged = Damaged::new(shared.location.path(), "committing", panic);
            if let Some(committer) = slot.take() {
                die(shared, queue, death, damaged, replies, committer);
            }
            false
        }
    }
}

/// The writer thread: commits the groups that queue while another thread commits, until the
/// queue is closed and drained or the writer dies. It waits for requests, then for the
/// committer, and takes the group only then: everything that queued behind a commit goes in
/// the next one (an appender holding the committer may have taken it all: nothing to do).
pub(crate) fn run(
    shared: Arc<Shared>,
    queue: Arc<Queue<Request, Answer>>,
    committer: Arc<crate::sync::Mutex<Option<Committer>>>,
    death: Arc<Death>,
) {
    // However this thread ends, nothing stays queued unanswered.
    let _drain = DrainOnExit(&queue);
    while queue.wait_for_requests() {
        let mut slot = crate::sync::lock(&committer);
        let group = queue.take_waiting(shared.options.max_group_events, |request| {
            request.events.len()
        });
        if group.is_empty() {
            continue;
        }
        if !commit_group(&mut slot, &shared, &queue, &death, group) {
            return;
        }
    }
    if let Some(committer) = crate::sync::lock(&committer).take() {
        committer.finish(&shared);
    }
}

/// Ends the writer after a contained panic: the damage recorded for later appends, the queue
/// closed, the group's callers and every request still queued answered with it, then the
/// handle dropped (the next read reopens) and the leadership handed on, both contained.
fn die(
    shared: &Shared,
    queue: &Queue<Request, Answer>,
    death: &Death,
    damaged: Damaged,
    replies: Vec<Reply<Answer>>,
    committer: Committer,
) {
    death.record(&damaged);
    queue.close();
    for reply in replies {
        reply.answer(damaged_answer(&damaged));
    }
    loop {
        let group = queue.take_group(usize::MAX, |_| 1);
        if group.is_empty() {
            break;
        }
        for (_, reply) in group {
            reply.answer(damaged_answer(&damaged));
        }
    }
    // Best effort: a leader that cannot say goodbye leaves a socket nobody answers, which the
    // next handle finds dead.
    let _ = contain(move || {
        if let Some(db) = shared.database() {
            shared.discard_database(&db);
            drop(db);
        }
        committer.finish(shared);
    });
}

/// Closes the queue and drops what is still in it when the writer thread ends, whichever way:
/// each dropped reply answers its caller ([`Queue::answering_dropped`]).
struct DrainOnExit<'a>(&'a Queue<Request, Answer>);

impl Drop for DrainOnExit<'_> {
    fn drop(&mut self) {
        self.0.close();
        loop {
            let group = self.0.take_group(usize::MAX, |_| 1);
            if group.is_empty() {
                break;
            }
            drop(group);
        }
    }
}

/// A test's stand-in for redb panicking on damaged bytes: a hook the writer thread runs where
/// a commit starts, inside its containment, for the journal at the path the hook names (tests
/// run side by side in one process, each with its own journal).
#[cfg(test)]
pub(crate) mod test_hook {
    use std::path::{Path, PathBuf};
    use std::sync::{Mutex, MutexGuard};

    type Hook = Box<dyn FnOnce() + Send>;

    static BEFORE_COMMIT: Mutex<Vec<(PathBuf, Hook)>> = Mutex::new(Vec::new());

    fn hooks() -> MutexGuard<'static, Vec<(PathBuf, Hook)>> {
        BEFORE_COMMIT
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Runs `hook` once, where the next commit of the journal at `path` starts.
    pub(crate) fn before_commit_of(path: &Path, hook: impl FnOnce() + Send + 'static) {
        hooks().push((path.to_path_buf(), Box::new(hook)));
    }

    pub(super) fn run_before_commit(path: &Path) {
        let hook = {
            let mut hooks = hooks();
            let index = hooks.iter().position(|(of, _)| of == path);
            index.map(|index| hooks.remove(index).1)
        };
        if let Some(hook) = hook {
            hook();
        }
    }
}
