//! Each command of journal-tools on a home built through the library: human output (as
//! snapshots, with times and ids redacted), JSON Lines, filters, exit codes, bad input.

use crate::common;

use std::io::Read;
use std::process::Stdio;

use common::{fixture, json_lines, redactions, run, tool, tool_at};

#[test]
fn inspect_runs_lists_every_run_newest_first() {
    let fixture = fixture();
    let ran = run(tool_at(&fixture, &["inspect", "runs"]));
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    redactions().bind(|| insta::assert_snapshot!("inspect_runs", fixture.redact(&ran.stdout)));
}

#[test]
fn inspect_runs_filters_by_state_time_and_count() {
    let fixture = fixture();
    let listed = |args: &[&str]| -> Vec<String> {
        let mut all = vec!["inspect", "runs", "--json"];
        all.extend_from_slice(args);
        let ran = run(tool_at(&fixture, &all));
        assert_eq!(ran.code, 0, "{args:?}: {}", ran.stderr);
        json_lines(&ran.stdout)
            .iter()
            .filter(|object| object["type"] == "run")
            .map(|object| fixture.redact(object["runId"].as_str().expect("a run id")))
            .collect()
    };
    assert_eq!(
        listed(&[]),
        ["<running-run>", "<complete-run>", "<failed-run>"]
    );
    assert_eq!(
        listed(&["--state", "failed,complete"]),
        ["<complete-run>", "<failed-run>"]
    );
    assert_eq!(listed(&["--state", "running"]), ["<running-run>"]);
    assert_eq!(listed(&["--limit", "1"]), ["<running-run>"]);
    assert_eq!(
        listed(&["--since", "1h"]).len(),
        3,
        "created within the hour"
    );
    assert!(
        listed(&["--until", "1h"]).is_empty(),
        "none created over an hour ago"
    );
    assert!(listed(&["--until", "2001-02-03"]).is_empty());
    assert_eq!(listed(&["--since", "2001-02-03 04:05"]).len(), 3);
    assert_eq!(listed(&["--since", "2001-02-03T04:05:06Z"]).len(), 3);

    let ran = run(tool_at(&fixture, &["inspect", "runs", "--json"]));
    let objects = json_lines(&ran.stdout);
    let running = &objects[0];
    assert_eq!(running["state"], "running");
    assert_eq!(running["closed"], false);
    assert_eq!(running["stepsDone"], 0);
    assert_eq!(running["stepsTotal"], 2);
    assert_eq!(running["runnerPid"], 300);
    assert_eq!(running["runnerAlive"], "dead (other boot)");
    assert_eq!(objects[3]["runs"], 3);
    assert!(!ran.stdout.contains('\x1b'), "no colour under --json");
}

#[test]
fn a_bad_time_or_state_is_a_usage_error_in_one_line() {
    let fixture = fixture();
    for args in [
        &["inspect", "runs", "--since", "last tuesday"][..],
        &["inspect", "runs", "--state", "sleeping"][..],
    ] {
        let ran = run(tool_at(&fixture, args));
        assert_eq!(ran.code, 2, "{args:?}");
        assert!(ran.stdout.is_empty());
        assert!(!ran.stderr.trim().is_empty());
    }
    let ran = run(tool_at(
        &fixture,
        &["inspect", "runs", "--since", "last tuesday"],
    ));
    assert_eq!(ran.stderr.trim().lines().count(), 1, "{}", ran.stderr);
}

#[test]
fn inspect_run_shows_the_folded_state_and_the_timeline() {
    let fixture = fixture();
    let ran = run(tool_at(
        &fixture,
        &["inspect", "run", &fixture.failed.to_string()],
    ));
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    redactions().bind(|| insta::assert_snapshot!("inspect_run", fixture.redact(&ran.stdout)));

    // A prefix, the run's name and its tool-call id name the same run.
    let prefix = fixture.failed.to_string()[..12].to_string();
    for name in [prefix.as_str(), "deploy", "call-1"] {
        let ran = run(tool_at(&fixture, &["inspect", "run", name, "--json"]));
        assert_eq!(ran.code, 0, "{name}: {}", ran.stderr);
        let objects = json_lines(&ran.stdout);
        assert_eq!(objects[0]["runId"], fixture.failed.to_string(), "{name}");
        let records: Vec<_> = objects.iter().filter(|o| o["type"] == "record").collect();
        assert_eq!(records.len(), 9);
        assert_eq!(records[5]["event"], "ExternalJobUpdated");
        assert_eq!(records[5]["fields"]["job"]["id"], "job-7");
    }
}

#[test]
fn an_unknown_run_is_named_in_one_line() {
    let fixture = fixture();
    let ran = run(tool_at(&fixture, &["inspect", "run", "7ZZZZZZZZZ"]));
    assert_eq!(ran.code, 2);
    assert_eq!(
        ran.stderr.trim(),
        "journal-tools: no run matches \"7ZZZZZZZZZ\""
    );
}

#[test]
fn inspect_events_is_a_resumable_cursor_in_commit_order() {
    let fixture = fixture();
    let ran = run(tool_at(&fixture, &["inspect", "events"]));
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    redactions().bind(|| insta::assert_snapshot!("inspect_events", fixture.redact(&ran.stdout)));

    let all = json_lines(&run(tool_at(&fixture, &["inspect", "events", "--json"])).stdout);
    let events: Vec<_> = all.iter().filter(|o| o["type"] == "event").collect();
    assert_eq!(events.len(), 20);
    let globals: Vec<u64> = events
        .iter()
        .map(|event| event["globalSeq"].as_u64().expect("a global seq"))
        .collect();
    assert_eq!(globals, (1..=20).collect::<Vec<_>>());

    // Resume from the cursor of a first page of five.
    let first = json_lines(
        &run(tool_at(
            &fixture,
            &["inspect", "events", "--limit", "5", "--json"],
        ))
        .stdout,
    );
    let cursor = first.last().expect("summary")["cursor"]
        .as_u64()
        .expect("a cursor");
    assert_eq!(cursor, 5);
    let rest = json_lines(
        &run(tool_at(
            &fixture,
            &[
                "inspect",
                "events",
                "--after-seq",
                &cursor.to_string(),
                "--json",
            ],
        ))
        .stdout,
    );
    assert_eq!(rest[0]["globalSeq"], 6);
    assert_eq!(rest.len() - 1, 15);

    // One run's records only.
    let only = json_lines(
        &run(tool_at(
            &fixture,
            &["inspect", "events", "--run", "hello", "--json"],
        ))
        .stdout,
    );
    assert_eq!(only.len() - 1, 6);
    assert!(
        only[..6]
            .iter()
            .all(|event| event["runId"] == fixture.complete.to_string())
    );
}

#[test]
fn inspect_stats_counts_runs_by_state_and_shows_the_reserve() {
    let fixture = fixture();
    // As if released on a full disk: the store made one when it opened the home.
    std::fs::remove_file(fixture.home.reserve_path()).expect("the store made a reserve");
    let ran = run(tool_at(&fixture, &["inspect", "stats"]));
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    redactions().bind(|| insta::assert_snapshot!("inspect_stats", fixture.redact(&ran.stdout)));

    std::fs::write(fixture.home.reserve_path(), b"").expect("a reserve file");
    let ran = run(tool_at(&fixture, &["inspect", "stats", "--json"]));
    let objects = json_lines(&ran.stdout);
    let stats = &objects[0];
    assert_eq!(stats["type"], "stats");
    assert_eq!(stats["runs"], 3);
    assert_eq!(stats["runsByState"]["failed"], 1);
    assert_eq!(stats["runsByState"]["running"], 1);
    assert_eq!(stats["activeRuns"], 1);
    assert_eq!(stats["records"], 20);
    assert_eq!(stats["formatVersion"], 1);
    assert_eq!(stats["hasReserve"], true);
    assert_eq!(stats["blockedSinceMs"], serde_json::Value::Null);
}

#[test]
fn inspect_verify_passes_on_a_sound_home() {
    let fixture = fixture();
    let ran = run(tool_at(&fixture, &["inspect", "verify"]));
    assert_eq!(ran.code, 0, "{}{}", ran.stdout, ran.stderr);
    assert_eq!(
        ran.stdout,
        "verified 3 runs, 20 records, 23 projection files; redb integrity check passed: no problems\n"
    );
    let objects = json_lines(&run(tool_at(&fixture, &["inspect", "verify", "--json"])).stdout);
    assert_eq!(objects.len(), 1);
    assert_eq!(objects[0]["ok"], true);
    assert_eq!(objects[0]["integrity"], "passed");
}

#[test]
fn replay_into_a_directory_renders_what_a_check_then_finds_identical() {
    let fixture = fixture();
    let out = fixture.dir.path().join("out");
    let ran = run(tool_at(
        &fixture,
        &[
            "replay",
            "--all",
            "--out",
            out.to_str().expect("utf-8 path"),
        ],
    ));
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    let redacted = fixture
        .redact(&ran.stdout)
        .replace(&out.display().to_string(), "<out>");
    redactions().bind(|| insta::assert_snapshot!("replay_out", redacted));
    // The copy is a home of its own: checked against the same journal, nothing differs.
    let ran = run({
        let mut command = tool();
        command
            .arg("--journal")
            .arg(fixture.journal_path())
            .arg("--home")
            .arg(&out)
            .args(["replay", "--all", "--check"]);
        command
    });
    assert_eq!(ran.code, 0, "{}{}", ran.stdout, ran.stderr);
    let status: serde_json::Value = serde_json::from_slice(
        &std::fs::read(out.join(format!("runs/{}/status.json", fixture.failed)))
            .expect("status.json written"),
    )
    .expect("JSON");
    assert_eq!(status["state"], "failed");
    assert_eq!(status["journalSeq"], 9);
    assert!(
        out.join(format!("results/{}.json", fixture.failed))
            .exists()
    );
}

#[test]
fn replay_until_seq_shows_a_run_as_it_stood_then() {
    let fixture = fixture();
    let out = fixture.dir.path().join("then");
    let ran = run(tool_at(
        &fixture,
        &[
            "replay",
            "--run",
            "deploy",
            "--until-seq",
            "4",
            "--out",
            out.to_str().expect("utf-8 path"),
        ],
    ));
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    let status: serde_json::Value = serde_json::from_slice(
        &std::fs::read(out.join(format!("runs/{}/status.json", fixture.failed)))
            .expect("status.json written"),
    )
    .expect("JSON");
    assert_eq!(status["state"], "running");
    assert_eq!(status["journalSeq"], 4);
    assert_eq!(status["steps"][0]["status"], "complete");
    assert_eq!(status["steps"][1]["status"], "pending");
    let events = std::fs::read_to_string(out.join(format!("runs/{}/events.jsonl", fixture.failed)))
        .expect("events.jsonl written");
    assert_eq!(events.lines().count(), 4);
    assert!(
        !out.join(format!("results/{}.json", fixture.failed))
            .exists(),
        "no result before the run ended"
    );

    // Past the head, or without --out, it is refused.
    let ran = run(tool_at(
        &fixture,
        &[
            "replay",
            "--run",
            "deploy",
            "--until-seq",
            "99",
            "--out",
            "x",
        ],
    ));
    assert_eq!(ran.code, 2);
    assert!(ran.stderr.contains("--until-seq 99"), "{}", ran.stderr);
    let ran = run(tool_at(
        &fixture,
        &["replay", "--run", "deploy", "--until-seq", "2"],
    ));
    assert_eq!(ran.code, 2, "{}", ran.stderr);
}

#[test]
fn replay_needs_to_be_told_what_to_replay() {
    let fixture = fixture();
    let ran = run(tool_at(&fixture, &["replay"]));
    assert_eq!(ran.code, 2);
    assert!(ran.stderr.contains("--run RUN or --all"), "{}", ran.stderr);
}

#[test]
fn replay_json_lists_each_file_written() {
    let fixture = fixture();
    let out = fixture.dir.path().join("out");
    let ran = run(tool_at(
        &fixture,
        &[
            "replay",
            "--run",
            "hello",
            "--out",
            out.to_str().expect("utf-8"),
            "--json",
        ],
    ));
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    let objects = json_lines(&ran.stdout);
    let kinds: Vec<&str> = objects
        .iter()
        .filter(|object| object["type"] == "file")
        .map(|object| object["kind"].as_str().expect("a kind"))
        .collect();
    assert_eq!(
        kinds,
        [
            "status",
            "result",
            "events",
            "process-terminal",
            "steer-inbox-closed"
        ]
    );
    assert!(
        objects
            .iter()
            .all(|o| o["type"] != "file" || o["action"] == "written")
    );
    assert_eq!(objects.last().expect("summary")["filesChanged"], 5);
}

#[test]
fn a_file_that_is_not_a_journal_is_refused_in_one_line_with_exit_4() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("not-a-journal.redb");
    std::fs::write(&path, vec![0x5a; 8192]).expect("write");
    let ran = run({
        let mut command = tool();
        command
            .arg("--journal")
            .arg(&path)
            .args(["inspect", "stats"]);
        command
    });
    assert_eq!(ran.code, 4, "{}", ran.stderr);
    assert_eq!(ran.stderr.trim().lines().count(), 1, "{}", ran.stderr);
    assert!(
        ran.stderr.contains("is not a runjournal journal"),
        "{}",
        ran.stderr
    );
    assert_eq!(
        std::fs::read(&path).expect("read"),
        vec![0x5a; 8192],
        "the file is left as it was"
    );

    let ran = run({
        let mut command = tool();
        command
            .arg("--journal")
            .arg(dir.path().join("missing.redb"))
            .args(["inspect", "runs"]);
        command
    });
    assert_eq!(ran.code, 2, "{}", ran.stderr);
    assert!(ran.stderr.contains("missing.redb"), "{}", ran.stderr);
}

#[test]
fn a_closed_stdout_exits_quietly() {
    let fixture = fixture();
    let mut child = std::process::Command::new(assert_cmd::cargo::cargo_bin("journal-tools"))
        .arg("--home")
        .arg(fixture.root())
        .args(["inspect", "events"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    // Close the reading end before the tool writes: its write fails with EPIPE.
    drop(child.stdout.take());
    let status = child.wait().expect("wait");
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .expect("stderr piped")
        .read_to_string(&mut stderr)
        .expect("read stderr");
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert_eq!(stderr, "", "nothing said about the closed pipe");
}

#[test]
fn the_home_comes_from_the_environment_without_home() {
    let fixture = fixture();
    let ran = run({
        let mut command = tool();
        command
            .env("RUNJOURNAL_HOME", fixture.root())
            .args(["inspect", "runs", "--json"]);
        command
    });
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    assert_eq!(json_lines(&ran.stdout).len(), 4);
}

/// A writer blocked on a full disk and one retrying through storage errors are both shown,
/// each with its cause (the markers of this test process, which is alive).
#[test]
fn inspect_stats_names_why_each_blocked_writer_is_blocked() {
    use runjournal::capacity::{self, BlockCause, Blocked};
    let fixture = fixture();
    let writer = runjournal::liveness::current().expect("this process's identity");
    for (since_ms, cause) in [
        (1_700_000_000_000, BlockCause::Capacity),
        (1_700_000_001_000, BlockCause::Io { errno: 5 }),
    ] {
        capacity::mark_blocked(
            &fixture.home,
            &Blocked {
                writer: writer.clone(),
                since_ms,
                cause,
            },
        )
        .expect("a marker");
    }
    let ran = run(tool_at(&fixture, &["inspect", "stats"]));
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    let pid = writer.pid;
    assert!(
        ran.stdout.contains(&format!(
            "blocked      pid {pid} on a full disk since 2023-11-14 22:13:20Z; pid {pid} on storage errors (I/O error) since 2023-11-14 22:13:21Z"
        )),
        "{}",
        ran.stdout
    );
    let ran = run(tool_at(&fixture, &["inspect", "stats", "--json"]));
    let stats = &json_lines(&ran.stdout)[0];
    assert_eq!(stats["blockedSinceMs"], 1_700_000_000_000u64);
    assert_eq!(
        stats["blocked"],
        serde_json::json!([
            {"pid": pid, "sinceMs": 1_700_000_000_000u64, "cause": "capacity"},
            {"pid": pid, "sinceMs": 1_700_000_001_000u64, "cause": "io", "errno": 5},
        ])
    );
}

#[test]
fn every_json_line_keeps_the_one_key_convention() {
    let fixture = fixture();
    let running = fixture.running.to_string();
    for args in [
        &["inspect", "runs", "--json"][..],
        &["inspect", "run", &running, "--json"],
        &["inspect", "events", "--json"],
        &["inspect", "stats", "--json"],
        &["inspect", "verify", "--json"],
    ] {
        let ran = run(tool_at(&fixture, args));
        let objects = json_lines(&ran.stdout);
        assert!(!objects.is_empty(), "{args:?}: {}", ran.stdout);
        for object in &objects {
            assert_eq!(
                runjournal::json::keys_off_convention(object),
                Vec::<String>::new(),
                "{args:?}: {object}"
            );
        }
    }
}

/// Each queue in the stats: its limit, its active runs and its waiting ones; a home without
/// queues shows no line for them.
#[test]
fn inspect_stats_shows_each_queue() {
    let fixture = fixture();
    let ran = run(tool_at(&fixture, &["inspect", "stats"]));
    assert!(!ran.stdout.contains("queues"), "{}", ran.stdout);
    {
        let store = runjournal::Store::open(fixture.home.clone()).expect("the home opens");
        store.journal().set_queue_limit("gpu", 0).expect("a limit");
        let spec = runjournal::spec::RunDraft {
            steps: vec![runjournal::spec::named_step(
                runjournal::event::StepAction::Shell {
                    script: "true".to_string(),
                },
            )],
            ..runjournal::spec::RunDraft::default()
        }
        .finish()
        .expect("a valid run")
        .spec;
        for _ in 0..3 {
            store
                .create_queued_run(
                    spec.clone(),
                    runjournal::HostIds::default(),
                    runjournal::Event::QueueJoined {
                        queue: "gpu".to_string(),
                        idle_timeout_ms: None,
                        heartbeat_ms: None,
                    },
                )
                .expect("a run waits in the queue");
        }
    }
    let ran = run(tool_at(&fixture, &["inspect", "stats"]));
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    assert!(
        ran.stdout.contains("queues       gpu 0/0 active, 3 queued"),
        "{}",
        ran.stdout
    );
    let ran = run(tool_at(&fixture, &["inspect", "stats", "--json"]));
    let stats = &json_lines(&ran.stdout)[0];
    assert_eq!(
        stats["queues"],
        serde_json::json!([{"name": "gpu", "maxActive": 0, "active": 0, "waiting": 3}])
    );
}
