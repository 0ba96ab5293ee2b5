//! The journal handle's writer thread: takes every append waiting in the queue as one group,
//! numbers this handle's batches with its writer id, and has the group committed — through
//! another process's commit leader when there is one (`share`), otherwise here
//! ([`commit_and_rejudge`]) — then answers each caller with its own result.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::event::now_ms;
use crate::journal::share::Sharing;
use crate::journal::write::append::Batch;
use crate::journal::write::commit::{
    Answer, CapacityState, Origin, Request, Shared, commit_and_rejudge, one_answer_per_batch,
};
use crate::journal::write::queue::{Queue, Reply};

/// The writer thread: runs until the queue is closed and drained.
pub(crate) fn run(shared: Arc<Shared>, queue: Arc<Queue<Request, Answer>>) {
    let mut next_writer_seq = 1u64;
    let mut capacity = CapacityState::of(&shared);
    let mut sharing = Sharing::new(&shared, &queue);
    loop {
        let group = queue.take_group(shared.options.max_group_events, |request| {
            request.events.len()
        });
        if group.is_empty() {
            sharing.finish();
            capacity.clear_marker_at_exit(&shared);
            return;
        }
        let time_ms = now_ms();
        let mut replies: Vec<Reply<Answer>> = Vec::with_capacity(group.len());
        let mut batches = Vec::with_capacity(group.len());
        for (request, reply) in group {
            let (writer, writer_seq, time_ms) = match request.origin {
                Origin::Local => {
                    next_writer_seq += 1;
                    (shared.writer, next_writer_seq - 1, time_ms)
                }
                Origin::Remote {
                    writer,
                    writer_seq,
                    time_ms,
                } => (writer, writer_seq, time_ms),
            };
            batches.push(Batch {
                run: request.run,
                events: request.events,
                condition: request.condition,
                writer,
                writer_seq,
                time_ms,
                private: request.private,
            });
            replies.push(reply);
        }
        let batch_count = batches.len() as u64;
        let runs: Vec<_> = batches.iter().map(|batch| batch.run).collect();
        let mut renumber = |batch: Batch| {
            let writer_seq = next_writer_seq;
            next_writer_seq += 1;
            Batch {
                writer_seq,
                time_ms: now_ms(),
                ..batch
            }
        };
        // Through another process's commit leader when there is one to hand the group to;
        // otherwise committed here, as the leader or alone.
        let answers = match sharing.commit_through_leader(&batches, &mut capacity, &mut renumber) {
            Some(answers) => answers,
            None => commit_and_rejudge(&shared, batches, &mut capacity, false, &mut renumber),
        };
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
    }
}
