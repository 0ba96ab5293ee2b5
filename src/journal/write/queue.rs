//! The append queue: many callers submit, one writer takes everything waiting as one group,
//! commits it, and answers each caller with its own result.
//!
//! Invariants:
//! * bounded: a caller waits while `capacity` requests are queued (backpressure);
//! * every submitted request is answered exactly once, with the result the writer gave it,
//!   and only after the writer called `Ticket::answer` (after its commit);
//! * requests are taken in submission order, so one caller's appends land in its order;
//! * closing answers nothing by itself: requests already queued are still taken;
//! * a queue made with [`Queue::answering_dropped`] answers a request whose reply was dropped
//!   unanswered (its writer died) with the queue's own answer, so no caller waits on a writer
//!   that is gone.

use std::collections::VecDeque;

use crate::sync::{self, Arc, Condvar, Mutex, MutexGuard};

struct Slot<R> {
    answer: Mutex<Option<R>>,
    answered: Condvar,
}

/// The caller's side of a submitted request: wait here for the writer's answer.
pub(crate) struct Ticket<R> {
    slot: Arc<Slot<R>>,
}

/// The writer's side of a request: answer it once.
pub(crate) struct Reply<R> {
    /// `None` once answered.
    slot: Option<Arc<Slot<R>>>,
    /// The answer given if this reply is dropped unanswered.
    if_dropped: Option<fn() -> R>,
}

impl<R> Reply<R> {
    /// Gives the caller its result.
    pub(crate) fn answer(mut self, result: R) {
        if let Some(slot) = self.slot.take() {
            give(&slot, result);
        }
    }
}

impl<R> Drop for Reply<R> {
    fn drop(&mut self) {
        if let (Some(slot), Some(if_dropped)) = (self.slot.take(), self.if_dropped) {
            give(&slot, if_dropped());
        }
    }
}

fn give<R>(slot: &Slot<R>, result: R) {
    let mut answer = sync::lock(&slot.answer);
    debug_assert!(answer.is_none(), "a request is answered once");
    *answer = Some(result);
    drop(answer);
    slot.answered.notify_one();
}

impl<R> Ticket<R> {
    /// Waits at most about `timeout` for the answer; `None` if it has not come (wait again).
    pub(crate) fn wait_timeout(&self, timeout: std::time::Duration) -> Option<R> {
        let mut answer = sync::lock(&self.slot.answer);
        if let Some(result) = answer.take() {
            return Some(result);
        }
        answer = sync::wait_timeout(&self.slot.answered, answer, timeout);
        answer.take()
    }

    /// Waits for the answer.
    pub(crate) fn wait(self) -> R {
        let mut answer = sync::lock(&self.slot.answer);
        loop {
            if let Some(result) = answer.take() {
                return result;
            }
            answer = sync::wait(&self.slot.answered, answer);
        }
    }
}

struct State<T, R> {
    items: VecDeque<(T, Reply<R>)>,
    is_closed: bool,
}

/// A bounded multi-producer, single-consumer queue of requests with answers.
pub(crate) struct Queue<T, R> {
    state: Mutex<State<T, R>>,
    not_empty: Condvar,
    not_full: Condvar,
    capacity: usize,
    if_dropped: Option<fn() -> R>,
}

/// Submitting to a closed queue.
#[derive(Debug)]
pub(crate) struct Closed;

impl<T, R> Queue<T, R> {
    pub(crate) fn new(capacity: usize) -> Queue<T, R> {
        assert!(capacity > 0, "a queue holds at least one request");
        Queue {
            state: Mutex::new(State {
                items: VecDeque::new(),
                is_closed: false,
            }),
            not_empty: Condvar::new(),
            not_full: Condvar::new(),
            capacity,
            if_dropped: None,
        }
    }

    /// A queue whose requests, when their reply is dropped unanswered (the writer died), are
    /// answered `if_dropped()`.
    pub(crate) fn answering_dropped(capacity: usize, if_dropped: fn() -> R) -> Queue<T, R> {
        Queue {
            if_dropped: Some(if_dropped),
            ..Queue::new(capacity)
        }
    }

    /// Queues a request, waiting while the queue is full.
    pub(crate) fn submit(&self, item: T) -> Result<Ticket<R>, Closed> {
        let (ticket, reply) = self.pair();
        let mut state = sync::lock(&self.state);
        loop {
            if state.is_closed {
                return Err(Closed);
            }
            if state.items.len() < self.capacity {
                break;
            }
            state = sync::wait(&self.not_full, state);
        }
        state.items.push_back((item, reply));
        drop(state);
        self.not_empty.notify_one();
        Ok(ticket)
    }

    /// Waits for at least one request, then takes every waiting request up to `max`, in
    /// submission order; `max_weight` bounds the group by the items' weight (the first item is
    /// always taken). Returns an empty group once the queue is closed and drained.
    pub(crate) fn take_group(
        &self,
        max_weight: usize,
        weight: impl Fn(&T) -> usize,
    ) -> Vec<(T, Reply<R>)> {
        let mut state = sync::lock(&self.state);
        while state.items.is_empty() {
            if state.is_closed {
                return Vec::new();
            }
            state = sync::wait(&self.not_empty, state);
        }
        self.pop_group(state, 0, max_weight, weight)
    }

    /// Waits until at least one request is queued; `false` once the queue is closed and
    /// drained. Takes nothing: a writer that shares a committer waits here, then locks the
    /// committer, then takes what is waiting by then ([`Queue::take_waiting`]).
    pub(crate) fn wait_for_requests(&self) -> bool {
        let mut state = sync::lock(&self.state);
        while state.items.is_empty() {
            if state.is_closed {
                return false;
            }
            state = sync::wait(&self.not_empty, state);
        }
        true
    }

    /// Takes every request waiting now, as [`Queue::take_group`] does, without waiting: an
    /// empty group when none waits.
    pub(crate) fn take_waiting(
        &self,
        max_weight: usize,
        weight: impl Fn(&T) -> usize,
    ) -> Vec<(T, Reply<R>)> {
        self.pop_group(sync::lock(&self.state), 0, max_weight, weight)
    }

    /// Commits `item` on the calling thread when `committer` is free now, with the requests
    /// waiting in the queue (in submission order, before it, up to `max_weight` with it):
    /// `commit` answers every reply of the group it is given, `item`'s last. Otherwise, while
    /// another thread commits, queues `item` for whoever commits next. Either way the ticket
    /// returned waits for `item`'s answer, which a commit on this thread has already given.
    ///
    /// So one caller alone wakes nobody: no hand-off to a writer thread and back. A writer
    /// thread beside it waits for requests ([`Queue::wait_for_requests`]), locks `committer`,
    /// and only then takes what waits: a group is taken by whoever holds the committer, so the
    /// requests that queued behind a commit go together in the next one.
    pub(crate) fn commit_here_or_submit<C>(
        &self,
        committer: &Mutex<C>,
        item: T,
        max_weight: usize,
        weight: impl Fn(&T) -> usize,
        commit: impl FnOnce(&mut C, Vec<(T, Reply<R>)>),
    ) -> Result<Ticket<R>, Closed> {
        let Some(mut committing) = sync::try_lock(committer) else {
            return self.submit(item);
        };
        let state = sync::lock(&self.state);
        if state.is_closed {
            return Err(Closed);
        }
        let room = max_weight.saturating_sub(weight(&item));
        let mut group = self.pop_group(state, 1, room, &weight);
        let (ticket, reply) = self.pair();
        group.push((item, reply));
        commit(&mut committing, group);
        drop(committing);
        Ok(ticket)
    }

    /// Takes the waiting requests from the front, in order, while their weight stays within
    /// `max_weight`; the first is always taken unless `already` items are in the group.
    fn pop_group(
        &self,
        mut state: MutexGuard<'_, State<T, R>>,
        already: usize,
        max_weight: usize,
        weight: impl Fn(&T) -> usize,
    ) -> Vec<(T, Reply<R>)> {
        let mut group = Vec::new();
        let mut total = 0;
        while let Some((item, _)) = state.items.front() {
            let item_weight = weight(item);
            if already + group.len() > 0 && total + item_weight > max_weight {
                break;
            }
            total += item_weight;
            group.push(state.items.pop_front().expect("front exists"));
        }
        drop(state);
        if !group.is_empty() {
            self.not_full.notify_all();
        }
        group
    }

    /// A ticket and its reply, for a request answered without passing through the queue.
    fn pair(&self) -> (Ticket<R>, Reply<R>) {
        let slot = Arc::new(Slot {
            answer: Mutex::new(None),
            answered: Condvar::new(),
        });
        let reply = Reply {
            slot: Some(Arc::clone(&slot)),
            if_dropped: self.if_dropped,
        };
        (Ticket { slot }, reply)
    }

    /// How many requests wait to be taken (for tests).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        sync::lock(&self.state).items.len()
    }

    /// Refuses new requests; the writer drains what is queued, then sees an empty group.
    pub(crate) fn close(&self) {
        let mut state = sync::lock(&self.state);
        state.is_closed = true;
        drop(state);
        self.not_empty.notify_all();
        self.not_full.notify_all();
    }
}

#[cfg(all(test, not(runjournal_loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_group_takes_everything_waiting_in_order_up_to_the_weight() {
        let queue: Queue<u32, u32> = Queue::new(16);
        let tickets: Vec<_> = (1..=5).map(|n| queue.submit(n).expect("open")).collect();
        let group = queue.take_group(9, |n| *n as usize);
        let items: Vec<u32> = group.iter().map(|(n, _)| *n).collect();
        assert_eq!(items, vec![1, 2, 3], "1+2+3 fits 9, +4 does not");
        for (n, reply) in group {
            reply.answer(n * 10);
        }
        let rest = queue.take_group(100, |_| 1);
        assert_eq!(rest.iter().map(|(n, _)| *n).collect::<Vec<_>>(), vec![4, 5]);
        for (n, reply) in rest {
            reply.answer(n * 10);
        }
        let answers: Vec<u32> = tickets.into_iter().map(Ticket::wait).collect();
        assert_eq!(answers, vec![10, 20, 30, 40, 50]);
    }

    /// A free committer: the caller commits what waits, in order, then its own request, up
    /// to the weight; a busy one: the request is queued for whoever commits next.
    #[test]
    fn a_caller_commits_here_when_nobody_commits_and_queues_when_someone_does() {
        let queue: Queue<u32, u32> = Queue::new(16);
        let committer: Mutex<Vec<u32>> = Mutex::new(Vec::new());
        let waiting: Vec<_> = (1..=3).map(|n| queue.submit(n).expect("open")).collect();
        let commit = |log: &mut Vec<u32>, group: Vec<(u32, Reply<u32>)>| {
            for (n, reply) in group {
                log.push(n);
                reply.answer(n * 10);
            }
        };
        let own = queue
            .commit_here_or_submit(&committer, 9, 3, |_| 1, commit)
            .expect("open");
        assert_eq!(
            *sync::lock(&committer),
            vec![1, 2, 9],
            "what waits first, up to the weight with the caller's own, then its own"
        );
        assert_eq!(own.wait(), 90);
        assert_eq!(queue.len(), 1, "the request past the weight still waits");

        let busy = sync::lock(&committer);
        let queued = queue
            .commit_here_or_submit(
                &committer,
                7,
                3,
                |_| 1,
                |_, _| panic!("a busy committer is not taken"),
            )
            .expect("open");
        drop(busy);
        assert_eq!(queue.len(), 2, "queued behind the one still waiting");
        for (n, reply) in queue.take_group(usize::MAX, |_| 1) {
            reply.answer(n * 10);
        }
        assert_eq!(queued.wait(), 70);
        let answers: Vec<u32> = waiting.into_iter().map(Ticket::wait).collect();
        assert_eq!(answers, vec![10, 20, 30]);
    }

    #[test]
    fn an_overweight_first_item_is_taken_alone() {
        let queue: Queue<u32, ()> = Queue::new(4);
        queue.submit(50).expect("open");
        queue.submit(1).expect("open");
        let group = queue.take_group(10, |n| *n as usize);
        assert_eq!(group.len(), 1);
    }

    /// A writer that dies (its thread unwinds) drops the replies it held: their callers must
    /// not wait for ever.
    #[test]
    fn a_reply_dropped_unanswered_gives_the_queues_answer() {
        let queue: Queue<u32, u32> = Queue::answering_dropped(4, || 99);
        let dropped = queue.submit(1).expect("open");
        let answered = queue.submit(2).expect("open");
        let mut group = queue.take_group(usize::MAX, |_| 1);
        let (_, second) = group.pop().expect("two items");
        second.answer(20);
        drop(group);
        assert_eq!(dropped.wait(), 99);
        assert_eq!(answered.wait(), 20, "an answered reply keeps its answer");
    }

    #[test]
    fn a_full_queue_makes_the_caller_wait_and_close_refuses_new_requests() {
        let queue: Arc<Queue<u32, u32>> = Arc::new(Queue::new(1));
        let first = queue.submit(1).expect("open");
        let submitter = {
            let queue = Arc::clone(&queue);
            std::thread::spawn(move || queue.submit(2).map(Ticket::wait))
        };
        // The second submit can only complete once the writer takes the first.
        let group = queue.take_group(usize::MAX, |_| 1);
        assert_eq!(group.len(), 1);
        for (n, reply) in group {
            reply.answer(n);
        }
        assert_eq!(first.wait(), 1);
        let second = queue.take_group(usize::MAX, |_| 1);
        for (n, reply) in second {
            reply.answer(n);
        }
        assert_eq!(submitter.join().expect("thread").expect("open"), 2);
        queue.close();
        assert!(queue.submit(3).is_err());
        assert!(queue.take_group(usize::MAX, |_| 1).is_empty());
    }
}

/// Every interleaving of submitters, the writer and `close`, explored by loom
/// (`RUSTFLAGS="--cfg runjournal_loom" cargo test --release --lib loom`).
#[cfg(all(test, runjournal_loom))]
mod loom_tests {
    use loom::sync::atomic::{AtomicBool, Ordering};
    use loom::thread;

    use super::*;

    /// Explores every interleaving with at most `bound` preemptions: enough for two threads to
    /// interleave at each lock, small enough to finish in seconds.
    fn check(bound: usize, model: impl Fn() + Sync + Send + 'static) {
        let mut builder = loom::model::Builder::new();
        builder.preemption_bound = Some(bound);
        builder.check(model);
    }

    /// The writer's side: takes groups until the queue is closed and drained, marks each item
    /// committed, then answers it with its own value times ten. Returns the order it took items.
    fn writer(queue: Arc<Queue<u32, u32>>, committed: Arc<[AtomicBool; 4]>) -> Vec<u32> {
        let mut taken = Vec::new();
        loop {
            let group = queue.take_group(2, |_| 1);
            if group.is_empty() {
                return taken;
            }
            for (item, reply) in group {
                committed[item as usize].store(true, Ordering::SeqCst);
                taken.push(item);
                reply.answer(item * 10);
            }
        }
    }

    fn committed_flags() -> Arc<[AtomicBool; 4]> {
        Arc::new([
            AtomicBool::new(false),
            AtomicBool::new(false),
            AtomicBool::new(false),
            AtomicBool::new(false),
        ])
    }

    /// Two submitters (two requests each, on a queue of two slots, so submitters wait for
    /// room) and the writer: every request is answered once, with its own result, never before
    /// the writer committed it; each submitter's requests are taken in its order; and closing
    /// after the last answer lets the writer end.
    #[test]
    fn every_submit_is_answered_once_with_its_own_result_after_its_commit() {
        check(3, || {
            let queue: Arc<Queue<u32, u32>> = Arc::new(Queue::new(2));
            let committed = committed_flags();
            let writer_thread = thread::spawn({
                let queue = Arc::clone(&queue);
                let committed = Arc::clone(&committed);
                move || writer(queue, committed)
            });
            let submit_two = |queue: &Queue<u32, u32>, committed: &[AtomicBool; 4], first: u32| {
                let tickets = [
                    queue.submit(first).expect("the queue is open"),
                    queue.submit(first + 1).expect("the queue is open"),
                ];
                for (item, ticket) in (first..).zip(tickets) {
                    assert_eq!(
                        ticket.wait(),
                        item * 10,
                        "request {item} gets its own answer"
                    );
                    assert!(
                        committed[item as usize].load(Ordering::SeqCst),
                        "request {item} is answered only after its commit"
                    );
                }
            };
            let other = thread::spawn({
                let queue = Arc::clone(&queue);
                let committed = Arc::clone(&committed);
                move || submit_two(&queue, &committed, 2)
            });
            submit_two(&queue, &committed, 0);
            other.join().expect("the other submitter");
            queue.close();
            let taken = writer_thread.join().expect("the writer");
            assert_eq!(
                taken.len(),
                4,
                "every request is taken exactly once: {taken:?}"
            );
            let position = |item| taken.iter().position(|&taken| taken == item);
            assert!(position(0) < position(1), "FIFO per submitter: {taken:?}");
            assert!(position(2) < position(3), "FIFO per submitter: {taken:?}");
        });
    }

    /// What a committer does with a group: commits each request once, then answers it with its
    /// own value times ten.
    fn commit_all(log: &mut Vec<u32>, committed: &[AtomicBool; 4], group: Vec<(u32, Reply<u32>)>) {
        for (item, reply) in group {
            let was_committed = committed[item as usize].swap(true, Ordering::SeqCst);
            assert!(!was_committed, "request {item} is committed once");
            log.push(item);
            reply.answer(item * 10);
        }
    }

    /// Two appenders commit on their own thread when they find the committer free, and queue
    /// for the writer thread when they do not; the writer locks the committer before it
    /// takes what waits. Every request is committed once, by whichever thread, and
    /// answered once with its own result after its commit; closing lets the writer end.
    #[test]
    fn a_commit_here_or_by_the_writer_answers_each_request_once_after_its_commit() {
        check(3, || {
            let queue: Arc<Queue<u32, u32>> = Arc::new(Queue::new(2));
            let committer: Arc<Mutex<Vec<u32>>> = Arc::new(Mutex::new(Vec::new()));
            let committed = committed_flags();
            let writer_thread = thread::spawn({
                let queue = Arc::clone(&queue);
                let committer = Arc::clone(&committer);
                let committed = Arc::clone(&committed);
                move || {
                    while queue.wait_for_requests() {
                        let mut log = sync::lock(&committer);
                        let group = queue.take_waiting(2, |_| 1);
                        commit_all(&mut log, &committed, group);
                    }
                }
            });
            let append = |queue: &Queue<u32, u32>,
                          committer: &Mutex<Vec<u32>>,
                          committed: &[AtomicBool; 4],
                          item: u32| {
                let ticket = queue
                    .commit_here_or_submit(
                        committer,
                        item,
                        2,
                        |_| 1,
                        |log, group| {
                            commit_all(log, committed, group);
                        },
                    )
                    .expect("the queue is open");
                assert_eq!(
                    ticket.wait(),
                    item * 10,
                    "request {item} gets its own answer"
                );
                assert!(
                    committed[item as usize].load(Ordering::SeqCst),
                    "request {item} is answered only after its commit"
                );
            };
            let other = thread::spawn({
                let queue = Arc::clone(&queue);
                let committer = Arc::clone(&committer);
                let committed = Arc::clone(&committed);
                move || append(&queue, &committer, &committed, 1)
            });
            append(&queue, &committer, &committed, 0);
            other.join().expect("the other appender");
            queue.close();
            writer_thread.join().expect("the writer");
            let mut log = sync::lock(&committer).clone();
            log.sort_unstable();
            assert_eq!(log, vec![0, 1], "each request committed exactly once");
        });
    }

    /// A close racing a submit: the submit is refused, or it is answered (the writer drains
    /// what was queued before the close); it is never lost. What was queued before the close
    /// is still taken.
    #[test]
    fn close_drains_what_was_queued_and_refuses_the_rest() {
        check(3, || {
            let queue: Arc<Queue<u32, u32>> = Arc::new(Queue::new(2));
            let committed = committed_flags();
            let early = queue.submit(0).expect("the queue is open");
            let submitter = thread::spawn({
                let queue = Arc::clone(&queue);
                move || queue.submit(1).ok().map(Ticket::wait)
            });
            let writer_thread = thread::spawn({
                let queue = Arc::clone(&queue);
                let committed = Arc::clone(&committed);
                move || writer(queue, committed)
            });
            queue.close();
            assert_eq!(
                early.wait(),
                0,
                "a request queued before the close is answered"
            );
            let late = submitter.join().expect("the submitter");
            let taken = writer_thread.join().expect("the writer");
            match late {
                Some(answer) => {
                    assert_eq!(answer, 10);
                    assert_eq!(taken, vec![0, 1]);
                }
                None => assert_eq!(taken, vec![0], "a refused request is never taken"),
            }
            assert!(queue.submit(2).is_err(), "a closed queue refuses requests");
        });
    }
}
