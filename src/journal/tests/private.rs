//! What a run keeps in the home only — its environment, its hooks — and the hook indexes:
//! written in the transaction of the batch that moves them, gone with a prune.

use super::*;
use crate::event::{HookOutcome, ProcessExit};
use crate::run_env::{RunEnvironment, RunPrivate};

fn environment() -> RunEnvironment {
    RunEnvironment::of(
        [(b"SECRET".to_vec(), b"s3cr3t".to_vec())],
        &[],
        Some(Path::new("/work")),
        Some(0o027),
    )
    .expect("small")
}

fn create_with(journal: &Journal, on_exit: &[&str]) -> RunId {
    journal
        .create(Creation {
            spec: spec(None),
            hosts: HostIds::default(),
            more: Vec::new(),
            private: Some(RunPrivate {
                env: Some(environment()),
                on_exit: on_exit.iter().map(|command| command.to_string()).collect(),
            }),
        })
        .expect("created")
        .run
}

fn attempted(attempt: u32) -> Event {
    Event::HookAttempted {
        hook: 0,
        attempt,
        claimant: runner_identity(),
        by: "runner".to_string(),
        lease_ms: 60_000,
    }
}

fn ended(attempt: u32, outcome: HookOutcome, retry_at_ms: Option<UnixMs>) -> Event {
    Event::HookEnded {
        hook: 0,
        attempt,
        outcome,
        retry_at_ms,
    }
}

fn failed() -> HookOutcome {
    HookOutcome::Failed {
        exit: ProcessExit {
            code: Some(1),
            signal: None,
        },
    }
}

/// Ends `run` before any runner took it, as a launcher that gives up does.
fn end(journal: &Journal, run: RunId) {
    journal
        .append(
            run,
            vec![
                repaired_failure(),
                process_gone("", Proof::NotStarted, Observer::Launcher),
            ],
            Condition::none(),
        )
        .expect("ended");
}

#[test]
fn a_run_is_created_with_its_environment_and_hooks_in_one_transaction() {
    let (_dir, journal) = new_journal();
    let run = create_with(&journal, &["echo done"]);
    let view = journal.view().expect("a view");
    assert_eq!(view.run_env(run).expect("reads"), Some(environment()));
    assert_eq!(view.run_hooks(run).expect("reads").own, vec!["echo done"]);
    assert!(!view.has_hooks_due(run).expect("reads"), "not ended yet");
    // The values are in no record.
    for record in view.records(run).expect("records") {
        let bytes = record.encode().expect("encodes");
        assert!(
            !bytes.windows(6).any(|window| window == b"s3cr3t"),
            "{record:?}"
        );
    }
}

#[test]
fn a_refused_creation_keeps_nothing_of_its_environment() {
    let (_dir, journal) = new_journal();
    journal.set_queue_limit("q", 1).expect("limit");
    let refused = journal.create(Creation {
        spec: spec(None),
        hosts: HostIds::default(),
        more: vec![Event::QueueJoined {
            queue: "no-such-queue".to_string(),
            idle_timeout_ms: None,
            heartbeat_ms: None,
        }],
        private: Some(RunPrivate {
            env: Some(environment()),
            on_exit: vec!["echo".to_string()],
        }),
    });
    assert!(
        matches!(refused, Err(AppendError::Queue { .. })),
        "{refused:?}"
    );
    let db = journal.database().expect("a handle");
    let txn = db.begin_read().expect("a read");
    let table = txn
        .open_table(tables::RUN_ENV)
        .expect("the table exists once written to");
    assert_eq!(redb::ReadableTableMetadata::len(&table).expect("len"), 0);
}

#[test]
fn a_run_with_hooks_is_due_from_its_end_until_each_is_delivered() {
    let (_dir, journal) = new_journal();
    let run = create_with(&journal, &["echo done"]);
    end(&journal, run);
    let due = |journal: &Journal| journal.view().expect("a view").hooks_due().expect("reads");
    assert_eq!(due(&journal), vec![run]);
    journal
        .append(run, vec![attempted(1)], Condition::none())
        .expect("claimed");
    journal
        .append(run, vec![ended(1, failed(), Some(5))], Condition::none())
        .expect("failed, retried later");
    assert_eq!(due(&journal), vec![run], "a failure with a retry stays due");
    journal
        .append(
            run,
            vec![attempted(2), ended(2, HookOutcome::Delivered, None)],
            Condition::none(),
        )
        .expect("delivered");
    assert!(due(&journal).is_empty());
    let view = journal.view().expect("a view");
    assert!(view.hooks_given_up().expect("reads").is_empty());
}

#[test]
fn a_hook_given_up_is_listed_until_its_run_is_pruned() {
    let (_dir, journal) = new_journal();
    let run = create_with(&journal, &["false"]);
    end(&journal, run);
    let mut events = Vec::new();
    for attempt in 1..crate::event::MAX_HOOK_ATTEMPTS {
        events.extend([attempted(attempt), ended(attempt, failed(), Some(5))]);
    }
    let last = crate::event::MAX_HOOK_ATTEMPTS;
    events.extend([attempted(last), ended(last, HookOutcome::TimedOut, None)]);
    journal
        .append(run, events, Condition::none())
        .expect("given up");
    let view = journal.view().expect("a view");
    assert!(view.hooks_due().expect("reads").is_empty());
    assert_eq!(view.hooks_given_up().expect("reads"), vec![run]);
    drop(view);
    let pruned = journal.prune(&[run], &[], now_ms()).expect("pruned");
    assert!(matches!(pruned[0].1, prune::Pruned::Done(_)), "{pruned:?}");
    let view = journal.view().expect("a view");
    assert!(view.hooks_given_up().expect("reads").is_empty());
    assert_eq!(
        view.run_env(run).expect("reads"),
        None,
        "the secrets go with it"
    );
    assert!(view.run_hooks(run).expect("reads").is_empty());
}

#[test]
fn the_homes_hook_joins_a_run_at_its_end_and_a_run_with_hooks_due_is_not_pruned() {
    let (_dir, journal) = new_journal();
    let before = create_with(&journal, &[]);
    journal
        .set_home_hook(Some("notify-send ended"))
        .expect("set");
    end(&journal, before);
    let view = journal.view().expect("a view");
    assert_eq!(
        view.home_hook().expect("reads").as_deref(),
        Some("notify-send ended")
    );
    let hooks = view.run_hooks(before).expect("reads");
    assert_eq!(hooks.all(), vec!["notify-send ended"]);
    assert_eq!(view.hooks_due().expect("reads"), vec![before]);
    drop(view);
    let pruned = journal.prune(&[before], &[], now_ms()).expect("a pass");
    assert_eq!(
        pruned,
        vec![(before, prune::Pruned::Skipped("a hook of it is still due"))]
    );
    journal.set_home_hook(None).expect("off");
    let after = create_with(&journal, &[]);
    end(&journal, after);
    let view = journal.view().expect("a view");
    assert_eq!(view.home_hook().expect("reads"), None);
    assert!(view.run_hooks(after).expect("reads").is_empty());
    assert_eq!(view.hooks_due().expect("reads"), vec![before]);
}

/// What broke: a result file rendered after a hook's records took the run's head for the
/// `Terminal`'s seq, so every pass after a delivery found it "differing" and rebuilt it.
#[test]
fn the_terminal_seq_is_found_behind_hook_records() {
    let (_dir, journal) = new_journal();
    let run = create_with(&journal, &["true"]);
    end(&journal, run);
    journal
        .append(
            run,
            vec![attempted(1), ended(1, HookOutcome::Delivered, None)],
            Condition::none(),
        )
        .expect("delivered");
    let view = journal.view().expect("a view");
    assert_eq!(view.terminal_seq(run).expect("reads"), Some(2));
}

#[test]
fn a_snapshot_with_hooks_reads_back() {
    let (_dir, journal) = new_journal();
    let run = create_with(&journal, &["true"]);
    end(&journal, run);
    let appended = journal
        .append(
            run,
            vec![attempted(1), ended(1, failed(), Some(9)), attempted(2)],
            Condition::none(),
        )
        .expect("claimed again");
    let stored = journal
        .view()
        .expect("a view")
        .snapshot(run)
        .expect("reads")
        .expect("there");
    assert_eq!(stored, appended.state);
    assert_eq!(stored.hooks.len(), 1);
    let bytes = crate::journal::format::snapshot::encode_snapshot(&stored).expect("encodes");
    assert_eq!(
        crate::journal::format::snapshot::decode_snapshot(run, &bytes),
        Ok(stored)
    );
}
