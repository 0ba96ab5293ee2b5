//! Replays every file of the fuzz corpora in `fuzz/corpus/<target>/` through the same code the
//! fuzz target runs, so the corpus is a regression suite without the fuzzer.

use std::path::Path;

fn replay(target: &str, body: fn(&[u8])) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut count = 0;
    for entry in
        std::fs::read_dir(&dir).unwrap_or_else(|error| panic!("{}: {error}", dir.display()))
    {
        let path = entry.expect("corpus entry").path();
        if !path.is_file() {
            continue;
        }
        let data = std::fs::read(&path).expect("corpus file reads");
        let outcome = std::panic::catch_unwind(|| body(&data));
        assert!(
            outcome.is_ok(),
            "{target}: corpus file {} breaks a property",
            path.display()
        );
        count += 1;
    }
    assert!(
        count > 0,
        "{target}: the corpus in {} is empty",
        dir.display()
    );
}

#[test]
fn decode_record_corpus() {
    replay("decode_record", runjournal::fuzz::decode_record);
}

#[test]
fn fold_events_corpus() {
    replay("fold_events", runjournal::fuzz::fold_events);
}

#[test]
fn parse_status_json_corpus() {
    replay("parse_status_json", runjournal::fuzz::parse_status_json);
}

#[test]
fn parse_result_json_corpus() {
    replay("parse_result_json", runjournal::fuzz::parse_result_json);
}

#[test]
fn parse_spec_corpus() {
    replay("parse_spec", runjournal::fuzz::parse_spec);
}

#[test]
fn provider_line_corpus() {
    replay("provider_line", runjournal::fuzz::provider_line);
}

#[test]
fn decode_snapshot_corpus() {
    replay("decode_snapshot", runjournal::fuzz::decode_snapshot);
}

/// Writes the seeds of `fuzz/corpus/decode_snapshot/`: snapshots of the fuzz target's run as
/// this build writes them (most as payloads, which the target checksums itself) and forged
/// ones that must never decode (a spec `RunSpec::check` refuses, a state no reducer makes).
/// `RUNJOURNAL_WRITE_CORPUS=1 cargo test --test it -- --ignored
/// fuzz_corpus::write_the_decode_snapshot_seeds`.
#[test]
#[ignore = "writes the seeds of a fuzz corpus"]
fn write_the_decode_snapshot_seeds() {
    use runjournal::event::{
        Event, FORMAT_VERSION, HostIds, Mode, ProcessIdentity, RecordEnvelope, RunId, RunSpec,
        StepAction, StepSpec, WriterId,
    };
    use runjournal::state::{RunStatus, StepStatus};
    use runjournal::testkit::{encode_snapshot, snapshot_of_layout_two};
    use std::sync::Arc;

    if std::env::var("RUNJOURNAL_WRITE_CORPUS").as_deref() != Ok("1") {
        return;
    }
    let run = RunId::from_bytes([0x42; 16]);
    let spec = |mode: Mode, concurrency: u32, argv: Vec<&str>| RunSpec {
        name: Some("seed".to_string()),
        mode,
        concurrency,
        timeout_ms: None,
        cwd: None,
        steps: vec![
            StepSpec {
                name: "a".to_string(),
                action: StepAction::Command {
                    argv: argv.iter().map(|arg| arg.to_string()).collect(),
                },
            },
            StepSpec {
                name: "b".to_string(),
                action: StepAction::Shell {
                    script: "true".to_string(),
                },
            },
        ],
    };
    let identity = ProcessIdentity {
        pid: 4242,
        start_time: 99,
        boot_id: "b".to_string(),
        pid_namespace: Some(4_026_531_836),
    };
    let fold = |events: Vec<Event>| {
        let records: Vec<RecordEnvelope> = events
            .into_iter()
            .enumerate()
            .map(|(index, event)| RecordEnvelope {
                format_version: FORMAT_VERSION,
                run_id: run,
                seq: index as u64 + 1,
                time_ms: 1_700_000_000_000 + index as u64,
                writer: WriterId(7),
                writer_seq: index as u64 + 1,
                event,
            })
            .collect();
        runjournal::state::replay(&records)
            .expect("a legal life")
            .expect("records")
    };
    let created = |spec: RunSpec| Event::RunCreated {
        spec: Arc::new(spec),
        created_at_ms: 1_700_000_000_000,
        session_id: HostIds::default().session_id,
        completion_owner_id: None,
        tool_call_id: None,
    };
    let queued = fold(vec![created(spec(Mode::Chain, 1, vec!["echo", "hi"]))]);
    let running = fold(vec![
        created(spec(Mode::Parallel, 2, vec!["echo", "hi"])),
        Event::RunnerStarted {
            runner: identity.clone(),
            instance_id: "i".to_string(),
        },
        Event::StepRunning {
            step: 0,
            process: Some(identity.clone()),
        },
    ]);
    let mut empty_argv = queued.clone();
    Arc::make_mut(&mut empty_argv.spec).steps[0].action = StepAction::Command { argv: vec![] };
    let mut no_concurrency = running.clone();
    Arc::make_mut(&mut no_concurrency.spec).concurrency = 0;
    let mut running_without_runner = running.clone();
    running_without_runner.runner = None;
    let mut step_running_in_a_queued_run = queued.clone();
    step_running_in_a_queued_run.steps[0].status = StepStatus::Running;
    let mut complete_without_an_end = running.clone();
    complete_without_an_end.status = RunStatus::Complete;

    let payload = |bytes: Vec<u8>| bytes[..bytes.len() - 4].to_vec();
    let encode = |state: &runjournal::RunState| encode_snapshot(state).expect("a state encodes");
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/decode_snapshot");
    std::fs::create_dir_all(&dir).expect("the corpus directory");
    let seeds: Vec<(&str, Vec<u8>)> = vec![
        ("queued_chain", payload(encode(&queued))),
        (
            "running_parallel_with_namespaces",
            payload(encode(&running)),
        ),
        ("running_parallel_with_its_checksum", encode(&running)),
        (
            "layout_two",
            snapshot_of_layout_two(&encode(&queued), Some(5)).expect("layout 1"),
        ),
        ("forged_empty_argv", payload(encode(&empty_argv))),
        (
            "forged_parallel_of_concurrency_zero",
            payload(encode(&no_concurrency)),
        ),
        (
            "forged_running_without_runner",
            payload(encode(&running_without_runner)),
        ),
        (
            "forged_step_running_in_a_queued_run",
            payload(encode(&step_running_in_a_queued_run)),
        ),
        (
            "forged_complete_without_an_end",
            payload(encode(&complete_without_an_end)),
        ),
    ];
    for (name, bytes) in seeds {
        std::fs::write(dir.join(name), bytes).expect("write a seed");
    }
}

/// Writes the seeds of completion hooks: a run's life through a hook failed, retried and
/// delivered (`fold_events`, as postcard events), each hook record (`decode_record`), the
/// snapshot of that run and a forged one with a hook attempted before the run ended
/// (`decode_snapshot`). `RUNJOURNAL_WRITE_CORPUS=1 cargo test --test it -- --ignored
/// fuzz_corpus::write_the_hook_seeds`.
#[test]
#[ignore = "writes the seeds of a fuzz corpus"]
fn write_the_hook_seeds() {
    use runjournal::event::{
        Event, FORMAT_VERSION, HookOutcome, Mode, ProcessExit, ProcessIdentity, RecordEnvelope,
        RunId, RunSpec, StepAction, StepSpec, TerminalState, WriterId,
    };
    use runjournal::testkit::encode_snapshot;
    use std::sync::Arc;

    if std::env::var("RUNJOURNAL_WRITE_CORPUS").as_deref() != Ok("1") {
        return;
    }
    let run = RunId::from_bytes([0x42; 16]);
    let claimant = ProcessIdentity {
        pid: 4242,
        start_time: 99,
        boot_id: "b".to_string(),
        pid_namespace: Some(4_026_531_836),
    };
    let attempted = |attempt: u32| Event::HookAttempted {
        hook: 0,
        attempt,
        claimant: claimant.clone(),
        by: "runner".to_string(),
        lease_ms: 48_000,
    };
    let events = vec![
        Event::RunCreated {
            spec: Arc::new(RunSpec {
                name: Some("seed".to_string()),
                mode: Mode::Single,
                concurrency: 1,
                timeout_ms: None,
                cwd: None,
                steps: vec![StepSpec {
                    name: "a".to_string(),
                    action: StepAction::Shell {
                        script: "true".to_string(),
                    },
                }],
            }),
            created_at_ms: 1_700_000_000_000,
            session_id: None,
            completion_owner_id: None,
            tool_call_id: None,
        },
        Event::Terminal {
            state: TerminalState::Failed,
            error: Some("the runner never started".to_string()),
            summary: "failed".to_string(),
            exit_code: 1,
            repaired_by: None,
        },
        attempted(1),
        Event::HookEnded {
            hook: 0,
            attempt: 1,
            outcome: HookOutcome::Failed {
                exit: ProcessExit {
                    code: Some(1),
                    signal: None,
                },
            },
            retry_at_ms: Some(1_700_000_001_000),
        },
        attempted(2),
        Event::HookEnded {
            hook: 0,
            attempt: 2,
            outcome: HookOutcome::Delivered,
            retry_at_ms: None,
        },
    ];
    let records: Vec<RecordEnvelope> = events
        .iter()
        .enumerate()
        .map(|(index, event)| RecordEnvelope {
            format_version: FORMAT_VERSION,
            run_id: run,
            seq: index as u64 + 1,
            time_ms: 1_700_000_000_000 + index as u64,
            writer: WriterId(7),
            writer_seq: index as u64 + 1,
            event: event.clone(),
        })
        .collect();
    let delivered = runjournal::state::replay(&records)
        .expect("a legal life")
        .expect("records");
    let mut before_the_end = runjournal::state::replay(&records[..1])
        .expect("a legal life")
        .expect("records");
    before_the_end.hooks = delivered.hooks.clone();
    let payload = |bytes: Vec<u8>| bytes[..bytes.len() - 4].to_vec();
    let encode = |state: &runjournal::RunState| encode_snapshot(state).expect("a state encodes");
    let mut life = vec![0x01];
    for event in &events {
        life.extend(postcard::to_allocvec(event).expect("an event encodes"));
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus");
    let seeds: Vec<(&str, &str, Vec<u8>)> = vec![
        ("fold_events", "hook_failed_retried_and_delivered", life),
        (
            "decode_record",
            "hook_attempted",
            records[2].encode().expect("a record encodes"),
        ),
        (
            "decode_record",
            "hook_ended",
            records[3].encode().expect("a record encodes"),
        ),
        (
            "decode_snapshot",
            "ended_with_a_hook_delivered",
            payload(encode(&delivered)),
        ),
        (
            "decode_snapshot",
            "forged_hook_attempted_before_the_end",
            payload(encode(&before_the_end)),
        ),
    ];
    for (target, name, bytes) in seeds {
        std::fs::write(root.join(target).join(name), bytes).expect("write a seed");
    }
}

/// The forged seeds of `decode_snapshot` do not decode: a snapshot a runner would choke on (an
/// empty command, a parallel run of concurrency 0) or that no reducer makes is never read as a
/// state; the run is re-derived from its records instead.
#[test]
fn forged_snapshots_are_refused() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/decode_snapshot");
    let run = runjournal::RunId::from_bytes([0x42; 16]);
    let mut forged = 0;
    for entry in std::fs::read_dir(&dir).expect("the corpus") {
        let path = entry.expect("an entry").path();
        let name = path
            .file_name()
            .expect("a name")
            .to_string_lossy()
            .into_owned();
        let bytes = std::fs::read(&path).expect("a seed");
        let with_checksum = runjournal::testkit::with_checksum(&bytes);
        let decoded = runjournal::testkit::decode_snapshot(run, &with_checksum);
        if name.starts_with("forged_") {
            forged += 1;
            assert!(
                matches!(decoded, Err(runjournal::journal::SnapshotError::Invalid(_))),
                "{name}: {decoded:?}"
            );
        }
    }
    assert!(forged >= 5, "the forged seeds are there");
}

/// What fuzzing `decode_snapshot` found: a stored snapshot of a running external job whose
/// progress is NaN, beside a running step with an end time and an exit code. The reducer makes
/// neither (it refuses a non-finite progress; a step ends only by leaving `running`), so the
/// snapshot is refused and the run re-derived from its records; before, it decoded, and its
/// round trip failed (NaN is not equal to itself).
#[test]
fn forged_running_job_with_nan_progress_and_a_running_step_that_ended() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(
        "fuzz/corpus/decode_snapshot/forged_running_job_with_nan_progress_and_a_running_step_that_ended",
    );
    let bytes = std::fs::read(&path).expect("the corpus file");
    let run = runjournal::RunId::from_bytes([0x42; 16]);
    let with_checksum = runjournal::testkit::with_checksum(&bytes);
    let decoded = runjournal::testkit::decode_snapshot(run, &with_checksum);
    match decoded {
        Err(runjournal::journal::SnapshotError::Invalid(error)) => assert!(
            matches!(
                error.rule(),
                runjournal::state::ShapeRule::RunningStepStartedNotEnded
                    | runjournal::state::ShapeRule::JobProgressFinite
            ),
            "refused for one of the two defects: {error}"
        ),
        other => panic!("the forged snapshot is refused as a shape: {other:?}"),
    }
    runjournal::fuzz::decode_snapshot(&bytes);
}

#[test]
fn damaged_journal_corpus() {
    replay("damaged_journal", runjournal::fuzz::damaged_journal);
}

/// Writes the seeds of `fuzz/corpus/damaged_journal/`: a flipped byte and a zeroed page on
/// every page of the target's journal, the header's magic and a commit slot flipped, a page
/// copied over another, the file cut in the middle, and no damage at all.
/// `RUNJOURNAL_WRITE_CORPUS=1 cargo test --test it -- --ignored
/// fuzz_corpus::write_the_damaged_journal_seeds`.
#[test]
#[ignore = "writes the seeds of a fuzz corpus"]
fn write_the_damaged_journal_seeds() {
    if std::env::var("RUNJOURNAL_WRITE_CORPUS").as_deref() != Ok("1") {
        eprintln!("set RUNJOURNAL_WRITE_CORPUS=1 to write the seeds");
        return;
    }
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/damaged_journal");
    std::fs::create_dir_all(&dir).expect("the corpus directory");
    for (name, bytes) in runjournal::fuzz::damaged_journal_seeds() {
        std::fs::write(dir.join(name), bytes).expect("write a seed");
    }
}
