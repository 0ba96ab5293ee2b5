use std::collections::BTreeSet;
use std::os::unix::process::CommandExt;

use super::*;
use crate::event::{ControlAction, HostIds, ProcessExit, ProcessIdentity};
use crate::home::Home;
use crate::state::RunStatus;
use crate::testkit::{chain_spec, exited_identity};

const LIVENESSES: [RunnerLiveness; 5] = [
    RunnerLiveness::None,
    RunnerLiveness::Alive,
    RunnerLiveness::Dead,
    RunnerLiveness::OtherBoot,
    RunnerLiveness::OtherNamespace,
];

fn every_input() -> Vec<Inputs> {
    let mut out = Vec::new();
    for is_terminal in [false, true] {
        for is_process_observed in [false, true] {
            for runner in LIVENESSES {
                for is_past_start_grace in [false, true] {
                    for is_waiting_for_slot in [false, true] {
                        for has_host_verdict in [false, true] {
                            out.push(Inputs {
                                is_terminal,
                                is_process_observed,
                                runner,
                                is_past_start_grace,
                                is_waiting_for_slot,
                                has_host_verdict,
                            });
                        }
                    }
                }
            }
        }
    }
    out
}

#[test]
fn every_combination_of_inputs_matches_exactly_one_row() {
    let mut rows_hit = BTreeSet::new();
    for inputs in every_input() {
        let matching: Vec<&str> = TABLE
            .iter()
            .filter(|row| (row.matches)(&inputs))
            .map(|row| row.name)
            .collect();
        assert_eq!(matching.len(), 1, "{inputs:?} matches {matching:?}");
        rows_hit.insert(matching[0]);
    }
    let names: BTreeSet<&str> = TABLE.iter().map(|row| row.name).collect();
    assert_eq!(names.len(), TABLE.len(), "row names are unique");
    assert_eq!(rows_hit, names, "every row is reachable");
    assert!(TABLE.iter().all(|row| !row.why.is_empty()));
}

#[test]
fn the_reconciler_never_acts_on_a_live_runner() {
    for inputs in every_input() {
        let row = decide(&inputs);
        if inputs.runner == RunnerLiveness::Alive && !inputs.is_process_observed {
            assert_eq!(row.action, Action::Nothing, "{inputs:?} → {}", row.name);
        }
    }
}

/// A runner of another PID namespace is unknown: nothing is repaired from here unless someone
/// recorded seeing it exit (then the run is failed from that record, and nothing signalled).
#[test]
fn the_reconciler_leaves_a_runner_of_another_namespace_alone() {
    for inputs in every_input() {
        let row = decide(&inputs);
        if inputs.runner != RunnerLiveness::OtherNamespace {
            continue;
        }
        if inputs.is_process_observed && !inputs.is_terminal {
            assert_eq!(row.action, Action::FailAfterObservedExit, "{inputs:?}");
        } else {
            assert_eq!(row.action, Action::Nothing, "{inputs:?} → {}", row.name);
        }
    }
}

fn store() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = Store::open(Home::at(dir.path())).expect("open store");
    (dir, store)
}

fn started_run(store: &Store, runner: ProcessIdentity) -> RunId {
    let run = store
        .create_run(chain_spec(2), HostIds::default())
        .expect("create")
        .run;
    store
        .append(
            run,
            vec![Event::RunnerStarted {
                runner,
                instance_id: "runner-1".to_string(),
            }],
            Condition::expect_head(1),
        )
        .expect("runner started");
    run
}

fn snapshot(store: &Store, run: RunId) -> RunState {
    store
        .journal()
        .view()
        .expect("view")
        .snapshot(run)
        .expect("read")
        .expect("exists")
}

fn only_outcome(report: &Report, run: RunId) -> &Outcome {
    let outcomes: Vec<&Outcome> = report.outcomes.iter().filter(|o| o.run == run).collect();
    assert_eq!(outcomes.len(), 1, "{report:?}");
    outcomes[0]
}

fn is_active(store: &Store, run: RunId) -> bool {
    store
        .journal()
        .view()
        .expect("view")
        .active_runs()
        .expect("read")
        .contains(&run)
}

#[test]
fn a_dead_runner_fails_the_run_naming_its_pid_and_log_tail() {
    let (_dir, store) = store();
    let runner = exited_identity();
    let run = started_run(&store, runner.clone());
    let log: String = (0..200)
        .map(|line| format!("runner line {line}\n"))
        .collect();
    std::fs::write(store.home().runner_log_path(run), log).expect("runner.log");

    let report = reconcile(&store, &Options::default()).expect("reconcile");
    let outcome = only_outcome(&report, run);
    assert_eq!(outcome.row, "runner-died");
    assert_eq!(
        outcome.appended,
        vec!["Terminal", "ProcessTerminalObserved"]
    );
    let reason = outcome.reason.clone().expect("a reason");
    assert!(
        reason.contains(&format!("runner {}", runner.pid)),
        "{reason}"
    );
    assert!(reason.contains("runner line 199"), "{reason}");
    assert!(
        !reason.contains("runner line 100"),
        "the tail is bounded: {reason}"
    );
    assert!(reason.len() < 500, "{} bytes", reason.len());

    let state = snapshot(&store, run);
    assert_eq!(state.status, RunStatus::Failed);
    let terminal = state.terminal.as_ref().expect("terminal");
    assert_eq!(terminal.repaired_by, Some(Repairer::Reconciler));
    assert_eq!(terminal.error.as_deref(), Some(reason.as_str()));
    let observed = state.process_terminal.as_ref().expect("observed");
    assert_eq!(observed.proof, Proof::Unknown);
    assert_eq!(observed.observer, Observer::Reconciler);
    assert!(state.is_closed());
    assert!(!is_active(&store, run));
    let status: serde_json::Value =
        serde_json::from_slice(&std::fs::read(store.home().status_path(run)).expect("status.json"))
            .expect("json");
    assert_eq!(status["state"], "failed");
    assert!(
        store.home().result_path(run).exists(),
        "the result is published"
    );

    let again = reconcile(&store, &Options::default()).expect("second pass");
    assert!(
        again.outcomes.is_empty(),
        "a closed run leaves the work list"
    );
}

#[test]
fn many_stale_runs_are_closed_in_fewer_commits_than_runs() {
    const RUNS: usize = 64;
    let (_dir, store) = store();
    let runner = exited_identity();
    let runs: Vec<RunId> = (0..RUNS)
        .map(|_| started_run(&store, runner.clone()))
        .collect();
    let alive = started_run(&store, liveness::current().expect("me"));
    let commits = || {
        store
            .journal()
            .writer_stats()
            .commits
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    let before = commits();

    let report = reconcile(&store, &Options::default()).expect("reconcile");

    for &run in &runs {
        let outcome = only_outcome(&report, run);
        assert_eq!(outcome.row, "runner-died");
        assert_eq!(
            outcome.appended,
            vec!["Terminal", "ProcessTerminalObserved"]
        );
        assert!(outcome.error.is_none(), "{outcome:?}");
        assert!(snapshot(&store, run).is_closed());
        let status: serde_json::Value = serde_json::from_slice(
            &std::fs::read(store.home().status_path(run)).expect("status.json"),
        )
        .expect("json");
        assert_eq!(status["state"], "failed", "run {run} is projected");
    }
    assert_eq!(only_outcome(&report, alive).row, "running");
    // The decisions are queued together: the writer groups them. One commit per run is what a
    // pass that appended run by run would cost.
    let spent = commits() - before;
    assert!(spent < RUNS as u64, "{spent} commits closed {RUNS} runs");
}

#[test]
fn a_decision_gone_stale_is_refused_and_the_next_pass_decides_again() {
    let (_dir, store) = store();
    let run = started_run(&store, exited_identity());
    let mut outcome = new_outcome(run);
    let decision = decide_run(
        &store,
        run,
        store.journal().view().and_then(|view| view.snapshot(run)),
        &Options::default(),
        &mut outcome,
    )
    .expect("to fail");
    // Someone else records the end first, between the pass's decision and its append.
    store
        .append(
            run,
            vec![Event::Terminal {
                state: TerminalState::Failed,
                error: Some("the runner's parent saw it die".to_string()),
                summary: "lost".to_string(),
                exit_code: 1,
                repaired_by: None,
            }],
            Condition::none(),
        )
        .expect("the other writer lands");
    let stale = store.append_all([(
        run,
        decision.events.clone(),
        Condition::expect_head(decision.head_seq),
    )]);
    assert!(matches!(stale[0], Err(AppendError::HeadMismatch { .. })));
    // The pass itself re-reads: the run is now terminal, only the observation is missing.
    let report = reconcile(&store, &Options::default()).expect("reconcile");
    let outcome = only_outcome(&report, run);
    assert_eq!(outcome.row, "gone-after-terminal");
    assert_eq!(outcome.appended, vec!["ProcessTerminalObserved"]);
    let state = snapshot(&store, run);
    assert!(state.is_closed());
    assert_eq!(
        state
            .terminal
            .as_ref()
            .and_then(|terminal| terminal.error.as_deref()),
        Some("the runner's parent saw it die"),
        "exactly one Terminal, the other writer's"
    );
}

#[test]
fn a_live_runner_is_left_alone() {
    let (_dir, store) = store();
    let run = started_run(&store, liveness::current().expect("me"));
    let before = snapshot(&store, run);
    let report = reconcile(&store, &Options::default()).expect("reconcile");
    let outcome = only_outcome(&report, run);
    assert_eq!((outcome.row, outcome.appended.len()), ("running", 0));
    assert_eq!(snapshot(&store, run), before);
}

fn spawn_group(script: &str) -> (std::process::Child, ProcessIdentity) {
    let child = std::process::Command::new("sh")
        .args(["-c", script])
        .process_group(0)
        .spawn()
        .expect("spawn");
    let identity = liveness::identity_of(child.id())
        .expect("read /proc")
        .expect("alive");
    (child, identity)
}

/// Whether `step` exits within a few seconds (far less than the minute its sleeps last); if
/// not, its group is killed so that nothing is left behind, and it has not.
fn has_ended_soon(step: &mut std::process::Child, process: &ProcessIdentity) -> bool {
    for _ in 0..250 {
        if step.try_wait().expect("try_wait").is_some() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let _ = process_group::signal(process, None, nix::sys::signal::Signal::SIGKILL);
    let _ = step.wait();
    false
}

#[test]
fn the_orphaned_steps_of_a_dead_runner_are_ended() {
    let (_dir, store) = store();
    let run = started_run(&store, exited_identity());
    let (mut step, process) = spawn_group("sleep 60 & sleep 60 & wait");
    store
        .append(
            run,
            vec![Event::StepRunning {
                step: 0,
                process: Some(process.clone()),
            }],
            Condition::none(),
        )
        .expect("step running");
    let report = reconcile(&store, &Options::default()).expect("reconcile");
    assert_eq!(only_outcome(&report, run).row, "runner-died");
    // Bounded, and well within the sleeps: a step left alive fails the test (found by
    // mutation testing: waiting for the step without a bound passed once its sleeps ended).
    assert!(
        has_ended_soon(&mut step, &process),
        "the step's leader was ended"
    );
    assert!(
        process_group::is_empty(&process).expect("probe"),
        "no member survives"
    );
    let state = snapshot(&store, run);
    assert_eq!(state.steps[0].status, StepStatus::Failed);
    assert_eq!(state.steps[1].status, StepStatus::Skipped);
}

/// Regression: when the runner's parent (`run --wait`) saw the runner die and recorded its
/// exit before any outcome, the reconciler failed the run ("stale") but left its running
/// steps' process groups alive, still working for a run recorded failed.
#[test]
fn the_orphaned_steps_of_a_runner_whose_exit_was_observed_are_ended() {
    let (_dir, store) = store();
    let run = started_run(&store, exited_identity());
    let (mut step, process) = spawn_group("sleep 60 & sleep 60 & wait");
    store
        .append(
            run,
            vec![
                Event::StepRunning {
                    step: 0,
                    process: Some(process.clone()),
                },
                Event::ProcessTerminalObserved {
                    instance_id: "runner-1".to_string(),
                    exit: Some(ProcessExit {
                        code: None,
                        signal: Some(9),
                    }),
                    proof: Proof::Observed,
                    observer: Observer::RunnerParent,
                },
            ],
            Condition::none(),
        )
        .expect("step running, runner seen dead");
    let report = reconcile(&store, &Options::default()).expect("reconcile");
    assert_eq!(only_outcome(&report, run).row, "stale");
    assert!(
        has_ended_soon(&mut step, &process),
        "the step's leader was ended"
    );
    assert!(
        process_group::is_empty(&process).expect("probe"),
        "no member survives"
    );
    let state = snapshot(&store, run);
    assert_eq!(state.status, RunStatus::Failed);
    assert_eq!(state.steps[0].status, StepStatus::Failed);
}

#[test]
fn a_runner_of_another_boot_fails_the_run_without_signalling_its_steps() {
    let (_dir, store) = store();
    let mut runner = liveness::current().expect("me");
    runner.boot_id = "an-earlier-boot".to_string();
    let run = started_run(&store, runner);
    // A live process group recorded as the step, under the old boot: its pid means nothing now.
    let (mut step, mut process) = spawn_group("exec sleep 60");
    let real = process.clone();
    process.boot_id = "an-earlier-boot".to_string();
    store
        .append(
            run,
            vec![Event::StepRunning {
                step: 0,
                process: Some(process),
            }],
            Condition::none(),
        )
        .expect("step running");
    let report = reconcile(&store, &Options::default()).expect("reconcile");
    let outcome = only_outcome(&report, run);
    assert_eq!(outcome.row, "host-restarted");
    assert!(
        outcome
            .reason
            .as_deref()
            .is_some_and(|r| r.contains("host restarted"))
    );
    assert!(
        !process_group::is_empty(&real).expect("probe"),
        "not signalled"
    );
    assert_eq!(snapshot(&store, run).status, RunStatus::Failed);
    step.kill().expect("kill");
    step.wait().expect("reap");
}

#[test]
fn a_queued_run_is_failed_only_after_the_start_grace() {
    let (_dir, store) = store();
    let run = store
        .create_run(chain_spec(1), HostIds::default())
        .expect("create")
        .run;
    let patient = Options {
        start_grace_ms: 3_600_000,
        ..Options::default()
    };
    let report = reconcile(&store, &patient).expect("reconcile");
    assert_eq!(only_outcome(&report, run).row, "starting");
    assert_eq!(snapshot(&store, run).status, RunStatus::Queued);

    let impatient = Options {
        start_grace_ms: 0,
        ..Options::default()
    };
    std::thread::sleep(Duration::from_millis(2));
    let report = reconcile(&store, &impatient).expect("reconcile");
    let outcome = only_outcome(&report, run);
    assert_eq!(outcome.row, "never-started");
    let state = snapshot(&store, run);
    assert_eq!(state.status, RunStatus::Failed);
    assert_eq!(
        state
            .process_terminal
            .as_ref()
            .map(|observed| observed.proof),
        Some(Proof::NotStarted)
    );
    assert!(state.is_closed());
}

#[test]
fn a_terminal_run_whose_runner_is_gone_is_closed() {
    let (_dir, store) = store();
    let run = started_run(&store, exited_identity());
    store
        .append(
            run,
            vec![Event::Terminal {
                state: TerminalState::Failed,
                error: Some("boom".to_string()),
                summary: "boom".to_string(),
                exit_code: 3,
                repaired_by: None,
            }],
            Condition::none(),
        )
        .expect("terminal");
    let report = reconcile(&store, &Options::default()).expect("reconcile");
    let outcome = only_outcome(&report, run);
    assert_eq!(outcome.row, "gone-after-terminal");
    assert_eq!(outcome.appended, vec!["ProcessTerminalObserved"]);
    let state = snapshot(&store, run);
    assert!(state.is_closed());
    assert_eq!(
        state.terminal.as_ref().map(|terminal| terminal.exit_code),
        Some(3),
        "the runner's own outcome stands"
    );
}

#[test]
fn a_stale_run_is_failed_with_the_observed_exit() {
    let (_dir, store) = store();
    let run = started_run(&store, exited_identity());
    store
        .append(
            run,
            vec![Event::ProcessTerminalObserved {
                instance_id: "runner-1".to_string(),
                exit: Some(ProcessExit {
                    code: None,
                    signal: Some(9),
                }),
                proof: Proof::Observed,
                observer: Observer::RunnerParent,
            }],
            Condition::none(),
        )
        .expect("observed");
    let report = reconcile(&store, &Options::default()).expect("reconcile");
    let outcome = only_outcome(&report, run);
    assert_eq!(outcome.row, "stale");
    assert_eq!(outcome.appended, vec!["Terminal"]);
    assert!(
        outcome
            .reason
            .as_deref()
            .is_some_and(|r| r.contains("killed by signal 9")),
        "{outcome:?}"
    );
    assert!(snapshot(&store, run).is_closed());
}

#[test]
fn concurrent_reconcilers_record_one_terminal() {
    let dir = tempfile::tempdir().expect("temp dir");
    let home = Home::at(dir.path());
    let setup = Store::open(home.clone()).expect("open");
    let runs: Vec<RunId> = (0..6)
        .map(|_| started_run(&setup, exited_identity()))
        .collect();
    drop(setup);
    let threads: Vec<_> = (0..3)
        .map(|_| {
            let home = home.clone();
            std::thread::spawn(move || {
                let store = Store::open(home).expect("open");
                reconcile(&store, &Options::default()).expect("reconcile")
            })
        })
        .collect();
    for thread in threads {
        thread.join().expect("reconciler thread");
    }
    let store = Store::open(home).expect("open");
    let view = store.journal().view().expect("view");
    for run in runs {
        let records = view.records(run).expect("records");
        let terminals = records
            .iter()
            .filter(|record| matches!(record.event, Event::Terminal { .. }))
            .count();
        assert_eq!(terminals, 1, "run {run}");
        assert!(snapshot(&store, run).is_closed());
    }
}

#[test]
fn damaged_or_stale_projections_of_active_runs_are_rebuilt() {
    let (_dir, store) = store();
    let run = started_run(&store, liveness::current().expect("me"));
    let status_path = store.home().status_path(run);
    let fresh = std::fs::read(&status_path).expect("status.json");

    std::fs::remove_file(&status_path).expect("delete");
    let report = reconcile(&store, &Options::default()).expect("reconcile");
    assert!(only_outcome(&report, run).reprojected);
    assert_eq!(std::fs::read(&status_path).expect("rebuilt"), fresh);

    // A status.json an older projector left behind: journalSeq below the head.
    store
        .append(
            run,
            vec![Event::ControlRequested {
                action: ControlAction::Stop,
                by: "test".to_string(),
                reason: "test".to_string(),
            }],
            Condition::none(),
        )
        .expect("control");
    let current = std::fs::read(&status_path).expect("status.json");
    std::fs::write(&status_path, &fresh).expect("write the old one back");
    let report = reconcile(&store, &Options::default()).expect("reconcile");
    assert!(only_outcome(&report, run).reprojected);
    assert_eq!(std::fs::read(&status_path).expect("rebuilt"), current);

    std::fs::write(&status_path, b"{ not json").expect("corrupt");
    reconcile(&store, &Options::default()).expect("reconcile");
    assert_eq!(std::fs::read(&status_path).expect("rebuilt"), current);

    let report = reconcile(&store, &Options::default()).expect("reconcile");
    assert!(
        !only_outcome(&report, run).reprojected,
        "nothing to repair now"
    );
}

#[test]
fn a_result_a_host_consumed_is_not_published_again() {
    let (_dir, store) = store();
    let run = started_run(&store, liveness::current().expect("me"));
    store
        .append(
            run,
            vec![Event::Terminal {
                state: TerminalState::Failed,
                error: None,
                summary: "done".to_string(),
                exit_code: 1,
                repaired_by: None,
            }],
            Condition::none(),
        )
        .expect("terminal");
    let result = store.home().result_path(run);
    assert!(result.exists(), "published at the terminal transition");
    std::fs::remove_file(&result).expect("a host consumes it");
    let report = reconcile(&store, &Options::default()).expect("reconcile");
    assert_eq!(only_outcome(&report, run).row, "finishing");
    assert!(!result.exists(), "not delivered twice");
}

#[test]
fn a_result_never_published_is_published_by_the_reconciler() {
    let (_dir, store) = store();
    let run = started_run(&store, exited_identity());
    // The runner committed Terminal and died before projecting: no result on disk.
    store
        .journal()
        .append(
            run,
            vec![Event::Terminal {
                state: TerminalState::Failed,
                error: None,
                summary: "done".to_string(),
                exit_code: 1,
                repaired_by: None,
            }],
            Condition::none(),
        )
        .expect("terminal without projection");
    assert!(!store.home().result_path(run).exists());
    reconcile(&store, &Options::default()).expect("reconcile");
    assert!(store.home().result_path(run).exists());
}

/// Regression: a writer that died between the commit that closed a run and its projection
/// (a `run --wait` launcher SIGKILLed right after recording the runner's exit, a reconciler
/// killed mid-pass) left the run's status.json and events.jsonl behind the journal for good:
/// the run had left the `active` table, and the reconciler walked active runs only.
#[test]
fn a_run_closed_by_a_writer_that_died_before_projecting_is_reprojected() {
    let (_dir, store) = store();
    let close_without_projecting = |run: RunId| {
        let head = snapshot(&store, run).head_seq;
        // The journal alone: the commit lands, the projection never happens.
        store
            .journal()
            .append(
                run,
                vec![
                    Event::Terminal {
                        state: TerminalState::Failed,
                        error: Some("the runner died".to_string()),
                        summary: "failed".to_string(),
                        exit_code: 1,
                        repaired_by: Some(Repairer::Reconciler),
                    },
                    Event::ProcessTerminalObserved {
                        instance_id: "runner-1".to_string(),
                        exit: None,
                        proof: Proof::Unknown,
                        observer: Observer::Reconciler,
                    },
                ],
                Condition::expect_head(head),
            )
            .expect("close the run");
        assert!(!is_active(&store, run), "the run is closed");
    };
    let is_projected = |run: RunId| {
        let view = store.journal().view().expect("view");
        let (state, records, links) = projection::load(&view, run).expect("load");
        projection::check_plan(&projection::plan(store.home(), &state, &records, &links)).is_empty()
    };

    // Before any pass has left a cursor.
    let me = liveness::current().expect("me");
    let first = started_run(&store, me.clone());
    close_without_projecting(first);
    assert!(!is_projected(first), "the files are behind the journal");
    let report = reconcile(&store, &Options::default()).expect("reconcile");
    assert!(only_outcome(&report, first).reprojected, "{report:?}");
    assert!(is_projected(first));

    // After one: the pass looks at what changed since.
    // Its runner alive (this process), the pass leaves it be.
    let second = started_run(&store, me);
    reconcile(&store, &Options::default()).expect("reconcile");
    close_without_projecting(second);
    assert!(!is_projected(second));
    let report = reconcile(&store, &Options::default()).expect("reconcile");
    assert!(only_outcome(&report, second).reprojected, "{report:?}");
    assert!(is_projected(second));
    assert!(is_projected(first));

    // Nothing changed: nothing to report.
    let report = reconcile(&store, &Options::default()).expect("reconcile");
    assert!(report.outcomes.is_empty(), "{report:?}");
}

/// Found by mutation testing: nothing checked which runs a pass reports as changed (what
/// `runjournal reconcile` prints): those it appended to and those whose projection it rebuilt,
/// not the ones it only looked at.
#[test]
fn a_pass_reports_as_changed_exactly_the_runs_it_appended_to_or_reprojected() {
    let (_dir, store) = store();
    let dead = started_run(&store, exited_identity());
    let alive = started_run(&store, liveness::current().expect("me"));
    let closed = store
        .create_run(chain_spec(1), HostIds::default())
        .expect("create")
        .run;
    store
        .append(
            closed,
            vec![
                Event::Terminal {
                    state: TerminalState::Failed,
                    error: Some("given up".to_string()),
                    summary: "given up".to_string(),
                    exit_code: 1,
                    repaired_by: Some(Repairer::Launcher),
                },
                Event::ProcessTerminalObserved {
                    instance_id: String::new(),
                    exit: None,
                    proof: Proof::NotStarted,
                    observer: Observer::Launcher,
                },
            ],
            Condition::expect_head(1),
        )
        .expect("closed");
    std::fs::remove_file(store.home().status_path(closed)).expect("delete its status");

    let report = reconcile(&store, &Options::default()).expect("reconcile");
    let changed: BTreeSet<RunId> = report.changed().map(|outcome| outcome.run).collect();
    assert_eq!(changed, BTreeSet::from([dead, closed]), "{report:?}");
    assert!(report.outcomes.iter().any(|outcome| outcome.run == alive));
}

/// Found by mutation testing: the start grace's bound. A queued run is "older than the start
/// grace" (docs/design.md, "Reconciler") only once more than the grace has passed.
#[test]
fn a_queued_run_is_past_its_start_grace_only_once_more_than_the_grace_has_passed() {
    let (_dir, store) = store();
    let run = store
        .create_run(chain_spec(1), HostIds::default())
        .expect("create")
        .run;
    let state = snapshot(&store, run);
    let options = Options::default();
    let is_past = |elapsed_ms: u64| {
        inputs_of(&state, state.created_at_ms + elapsed_ms, &options).is_past_start_grace
    };
    assert!(!is_past(0));
    assert!(!is_past(options.start_grace_ms));
    assert!(is_past(options.start_grace_ms + 1));
}

/// A run closed and projected, for the cursor tests: it leaves the `active` table at once.
fn closed_run(store: &Store) -> RunId {
    let run = store
        .create_run(chain_spec(1), HostIds::default())
        .expect("create")
        .run;
    store
        .append(
            run,
            vec![
                Event::Terminal {
                    state: TerminalState::Failed,
                    error: Some("given up".to_string()),
                    summary: "given up".to_string(),
                    exit_code: 1,
                    repaired_by: Some(Repairer::Launcher),
                },
                Event::ProcessTerminalObserved {
                    instance_id: String::new(),
                    exit: None,
                    proof: Proof::NotStarted,
                    observer: Observer::Launcher,
                },
            ],
            Condition::expect_head(1),
        )
        .expect("closed");
    run
}

/// Found by mutation testing: nothing checked that a pass's cost follows what changed
/// (docs/design.md: "its cost follows the runs not yet closed, never all runs"). A closed run that
/// did not change since the last pass of this boot is not looked at, so damage done to its
/// files since is left to `journal-tools replay`; a cursor of another boot, or one past the
/// journal's head, is not trusted, and the pass looks back instead.
#[test]
fn a_pass_looks_at_closed_runs_only_if_they_changed_since_the_last_pass_of_this_boot() {
    let (_dir, store) = store();
    let run = closed_run(&store);
    let status = store.home().status_path(run);
    reconcile(&store, &Options::default()).expect("reconcile");
    let cursor = ProjectionCursor::read(store.home()).expect("the pass left its cursor");
    std::fs::remove_file(&status).expect("delete its status");

    let report = reconcile(&store, &Options::default()).expect("reconcile");
    assert!(report.outcomes.is_empty(), "{report:?}");
    assert!(
        !status.exists(),
        "the unchanged closed run was not looked at"
    );

    for stale in [
        ProjectionCursor {
            boot_id: "another-boot".to_string(),
            ..cursor.clone()
        },
        ProjectionCursor {
            global_seq: cursor.global_seq + 1,
            ..cursor.clone()
        },
    ] {
        stale.write(store.home()).expect("write a cursor");
        let report = reconcile(&store, &Options::default()).expect("reconcile");
        assert!(
            only_outcome(&report, run).reprojected,
            "{stale:?}: the pass looked back: {report:?}"
        );
        assert!(status.exists());
        std::fs::remove_file(&status).expect("delete its status again");
    }
}

/// Found by mutation testing: a pass whose repair of a closed run failed must not move its
/// cursor past it, or no later pass would look at that run again.
#[test]
fn a_repair_that_failed_is_tried_again_by_the_next_pass() {
    let (_dir, store) = store();
    let run = closed_run(&store);
    let run_dir = store.home().run_dir(run);
    std::fs::remove_dir_all(&run_dir).expect("delete the run's files");
    std::fs::write(&run_dir, b"").expect("a file where the run's directory goes");

    let report = reconcile(&store, &Options::default()).expect("reconcile");
    assert!(
        only_outcome(&report, run).error.is_some(),
        "the repair fails: {report:?}"
    );
    std::fs::remove_file(&run_dir).expect("the obstacle goes");
    let report = reconcile(&store, &Options::default()).expect("reconcile");
    assert!(only_outcome(&report, run).reprojected, "{report:?}");
    assert!(store.home().status_path(run).exists());
}

/// Survivors of mutation testing: a runner recorded in another PID namespace is named in a
/// note saying why its run is left and where to reconcile it; a runner of this namespace gets
/// no such note.
#[test]
fn a_runner_of_another_pid_namespace_is_left_with_a_note_saying_why() {
    let (_dir, store) = store();
    let mut stranger = liveness::current().expect("me");
    let Some(here) = stranger.pid_namespace else {
        crate::testkit::skip::skip(
            "a_runner_of_another_pid_namespace_is_left_with_a_note_saying_why",
            "this platform records no PID namespace",
        );
        return;
    };
    stranger.pid_namespace = Some(here.wrapping_add(1));
    let elsewhere = started_run(&store, stranger.clone());
    let local = started_run(&store, liveness::current().expect("me"));
    let report = reconcile(&store, &Options::default()).expect("reconcile");

    let outcome = only_outcome(&report, elsewhere);
    assert!(outcome.appended.is_empty(), "left alone: {outcome:?}");
    let note = outcome.note.as_deref().expect("a note");
    for fragment in [
        format!(
            "runner {} was recorded in PID namespace {}",
            stranger.pid,
            here.wrapping_add(1)
        ),
        format!("this process is in PID namespace {here}"),
        "runjournal reconcile".to_string(),
    ] {
        assert!(note.contains(&fragment), "{note:?} should say {fragment:?}");
    }
    assert_eq!(
        only_outcome(&report, local).note,
        None,
        "a runner of this namespace"
    );
}

/// A run waiting in its queue has no runner due: the reconciler leaves it however long it
/// waits, and counts the start grace from its admission once admitted.
#[test]
fn a_run_waiting_for_a_slot_is_left_alone_and_its_grace_counts_from_its_admission() {
    for inputs in every_input() {
        let is_waiting = inputs.is_waiting_for_slot
            && !inputs.is_terminal
            && !inputs.is_process_observed
            && inputs.runner == RunnerLiveness::None;
        if is_waiting {
            assert_eq!(decide(&inputs).name, "waiting-for-slot", "{inputs:?}");
        }
    }
    let (_dir, store) = store();
    store.journal().set_queue_limit("q", 1).expect("limit");
    let joined = Event::QueueJoined {
        queue: "q".to_string(),
        idle_timeout_ms: None,
        heartbeat_ms: None,
    };
    let run = store
        .create_queued_run(chain_spec(1), HostIds::default(), joined)
        .expect("create")
        .run;
    let options = Options::default();
    let waiting = snapshot(&store, run);
    let long_after = waiting.created_at_ms + 100 * options.start_grace_ms;
    let inputs = inputs_of(&waiting, long_after, &options);
    assert!(inputs.is_waiting_for_slot && !inputs.is_past_start_grace);
    assert_eq!(decide(&inputs).action, Action::Nothing);
    let report = reconcile(&store, &options).expect("reconcile");
    assert!(report.changed().next().is_none(), "{report:?}");
    store
        .append(
            run,
            vec![Event::QueueAdmitted {
                by: "test".to_string(),
            }],
            Condition::none(),
        )
        .expect("admitted");
    let admitted = snapshot(&store, run);
    let admitted_at = admitted.startable_at_ms().expect("admitted");
    let is_past = |at: u64| inputs_of(&admitted, at, &options).is_past_start_grace;
    assert!(!is_past(admitted_at + options.start_grace_ms));
    assert!(is_past(admitted_at + options.start_grace_ms + 1));
}

/// A taker killed between a request's record and its file's removal: the next taker finds
/// the file, sees the request in the journal, and only removes the file — the stop and the
/// message are each journaled once; a request never taken is journaled by the next taker.
#[test]
fn a_request_recorded_before_a_kill_is_taken_once() {
    let dir = tempfile::tempdir().expect("temp dir");
    let home = Home::in_layout(dir.path(), crate::home::Layout::PiSubagents);
    let store = Store::open(home.clone()).expect("open store");
    let run = store
        .create_run(crate::testkit::chain_spec(2), HostIds::default())
        .expect("create")
        .run;
    store
        .append(
            run,
            vec![
                crate::testkit::runner_started(crate::testkit::identity(7), "i1"),
                crate::testkit::step_running(0, None),
            ],
            Condition::none(),
        )
        .expect("running");
    crate::control_inbox::prepare(&home, run);
    let stop_file = home.stop_requests_dir(run).join("1-stop.json");
    std::fs::write(&stop_file, r#"{"type":"stop","ts":5,"source":"host"}"#).expect("write");
    let steer_file = home.steer_requests_dir(run).join("2-steer.json");
    std::fs::write(
        &steer_file,
        r#"{"type":"steer","id":"s-1","ts":6,"message":"look"}"#,
    )
    .expect("write");
    // The killed taker recorded the stop (and nothing of the message) before it died.
    store
        .append(
            run,
            vec![crate::testkit::control(
                crate::event::ControlAction::Stop,
                "host",
                "recorded before a kill",
            )],
            Condition::none(),
        )
        .expect("recorded");

    let take_now = || {
        crate::control_inbox::take(
            &home,
            run,
            &mut crate::control_inbox::Settling::default(),
            || store.journal().view()?.snapshot(run),
            |events, condition| store.append(run, events, condition),
        )
        .expect("taken")
    };
    let taken = take_now();
    assert_eq!((taken.already_taken, taken.recorded), (1, 1), "{taken:?}");
    assert!(!stop_file.exists() && !steer_file.exists());
    let again = take_now();
    assert_eq!(
        again,
        crate::control_inbox::Taken::default(),
        "nothing is left to take"
    );

    let records = store
        .journal()
        .view()
        .expect("view")
        .records_between(run, 0, u64::MAX)
        .expect("records");
    let stops = records
        .iter()
        .filter(|record| matches!(record.event, Event::ControlRequested { .. }))
        .count();
    let steers = records
        .iter()
        .filter(|record| matches!(&record.event, Event::SteerRequested { id, .. } if id == "s-1"))
        .count();
    assert_eq!((stops, steers), (1, 1));
}
