//! Bad input: one line on stderr saying what is wrong, exit code 2, and nothing written (the
//! journal's record count is the same before and after).

use crate::support;

use std::path::Path;
use std::sync::Arc;

use runjournal::event::{Event, Mode, RunId, RunSpec, now_ms};
use runjournal::testkit as kit;
use runjournal::{Condition, Journal};
use support::{TestHome, record_count, run_id_of, wait_terminal};

/// Runs `args` and checks the bad-input contract; returns the stderr line.
fn refuse(home: &TestHome, journal: &Journal, args: &[&str], expected: &str) -> String {
    refuse_with_env(home, journal, &[], args, expected)
}

/// [`refuse`], with the variables `env` set for the command.
fn refuse_with_env(
    home: &TestHome,
    journal: &Journal,
    env: &[(&str, &str)],
    args: &[&str],
    expected: &str,
) -> String {
    let before = record_count(journal);
    let output = home
        .cmd()
        .envs(env.iter().copied())
        .args(args)
        .output()
        .expect("runs");
    // Arguments as long as the ones over a limit are shown cut.
    let args: Vec<String> = args
        .iter()
        .map(|arg| arg.chars().take(80).collect())
        .collect();
    let stderr = String::from_utf8(output.stderr).expect("utf-8 stderr");
    assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
    assert_eq!(
        stderr.lines().count(),
        1,
        "{args:?}: one line, got {stderr:?}"
    );
    assert!(
        stderr.contains(expected),
        "{args:?}: {stderr:?} should mention {expected:?}"
    );
    assert_eq!(
        record_count(journal),
        before,
        "{args:?} wrote to the journal"
    );
    stderr
}

/// A home holding one finished run of one shell step, a journal handle of the test's, and the
/// run's id.
fn home_with_a_run() -> (TestHome, Journal, RunId) {
    let (home, run) = support::home_with_a_run();
    let journal = home.journal();
    wait_terminal(&journal, run);
    // Its runner's exit is recorded by whoever sees it first (the home's watcher among them):
    // recorded before a refusal counts the records.
    support::wait_for(&journal, run, "its runner's exit recorded", |state| {
        state.process_terminal.is_some()
    });
    (home, journal, run)
}

fn spec() -> Arc<RunSpec> {
    Arc::new(kit::spec(Mode::Single, vec![kit::shell("s", "true")]))
}

#[test]
fn an_unknown_run_id_is_refused() {
    let (home, journal, _) = home_with_a_run();
    for command in ["status", "wait", "logs", "stop", "dismiss"] {
        refuse(
            &home,
            &journal,
            &[command, "01ARZ3NDEKTSV4RRFFQ69G5FAV"],
            "no run matches",
        );
    }
    refuse(
        &home,
        &journal,
        &[
            "job",
            "update",
            "01ARZ3NDEKTSV4RRFFQ69G5FAV",
            "0",
            "--state",
            "running",
        ],
        "no run matches",
    );
}

#[test]
fn an_ambiguous_prefix_is_refused() {
    let (home, journal, _) = home_with_a_run();
    // Two runs whose ids share their first 25 characters.
    let mut low = [0x01u8; 16];
    low[15] = 0x00;
    let mut high = low;
    high[15] = 0x01;
    for id in [low, high] {
        journal
            .append(
                RunId::from_bytes(id),
                vec![Event::RunCreated {
                    spec: spec(),
                    created_at_ms: now_ms(),
                    session_id: None,
                    completion_owner_id: None,
                    tool_call_id: None,
                }],
                Condition::expect_head(0),
            )
            .expect("create a run");
    }
    let prefix = RunId::from_bytes(low).to_string()[..20].to_string();
    for command in ["status", "stop", "dismiss", "logs", "wait"] {
        refuse(&home, &journal, &[command, &prefix], "matches 2 runs");
    }
}

#[test]
fn ids_outside_the_alphabet_are_refused_before_any_path_is_built() {
    let (home, journal, _) = home_with_a_run();
    for text in [
        "../../etc/passwd",
        "01ARZ3ND/../x",
        "..",
        "01ARZ3NDEKTSV4RRFFQ69G5FAV/",
    ] {
        for command in ["status", "logs", "stop", "dismiss", "wait"] {
            refuse(&home, &journal, &[command, text], "run id");
        }
        refuse(
            &home,
            &journal,
            &["job", "update", text, "0", "--state", "running"],
            "run id",
        );
    }
    refuse(&home, &journal, &["status", "01AR"], "shorter than 8");
}

#[test]
fn a_malformed_spec_is_refused() {
    let (home, journal, _) = home_with_a_run();
    let cases = [
        ("truncated.json", r#"{"steps": ["#, "not valid JSON"),
        (
            "unknown.json",
            r#"{"steps": [{"shell": "true"}], "colour": "red"}"#,
            "unknown field",
        ),
        (
            "two-actions.json",
            r#"{"steps": [{"shell": "true", "command": ["x"]}]}"#,
            "exactly one of",
        ),
        ("no-steps.json", r#"{"steps": []}"#, "no steps"),
        (
            "bad-mode.json",
            r#"{"mode": "serial", "steps": [{"shell": "true"}]}"#,
            "unknown variant",
        ),
        (
            "bad-timeout.json",
            r#"{"timeout": "soon", "steps": [{"shell": "true"}]}"#,
            "not a duration",
        ),
        (
            "single-two.json",
            r#"{"mode": "single", "steps": [{"shell": "a"}, {"shell": "b"}]}"#,
            "exactly one step",
        ),
    ];
    for (name, text, expected) in cases {
        let path = home.file(name);
        std::fs::write(&path, text).expect("write the spec");
        let path = path.display().to_string();
        refuse(&home, &journal, &["run", "--spec", &path], expected);
    }
    let missing = home.file("missing.json").display().to_string();
    refuse(
        &home,
        &journal,
        &["run", "--spec", &missing],
        "No such file",
    );
}

#[test]
fn a_bad_duration_is_refused() {
    let (home, journal, run) = home_with_a_run();
    for duration in ["10x", "soon", "0s", "-1s", "1.5s"] {
        let flag = format!("--timeout={duration}");
        refuse(&home, &journal, &["run", &flag, "--", "true"], "--timeout");
        refuse(
            &home,
            &journal,
            &["wait", &run.to_string(), &flag],
            "--timeout",
        );
    }
}

#[test]
fn a_step_index_out_of_range_is_refused() {
    let (home, journal, run) = home_with_a_run();
    let run = run.to_string();
    refuse(&home, &journal, &["logs", &run, "--step", "1"], "no step 1");
    refuse(
        &home,
        &journal,
        &["job", "update", &run, "5", "--state", "running"],
        "no step 5",
    );
    refuse(
        &home,
        &journal,
        &["job", "update", &run, "minus-one", "--state", "running"],
        "not a step number",
    );
}

#[test]
fn an_update_of_a_step_that_is_not_an_external_job_is_refused() {
    let (home, journal, run) = home_with_a_run();
    refuse(
        &home,
        &journal,
        &["job", "update", &run.to_string(), "0", "--state", "running"],
        "not an external-job step",
    );
    refuse(
        &home,
        &journal,
        &[
            "job",
            "update",
            &run.to_string(),
            "0",
            "--state",
            "finished",
        ],
        "unknown job state",
    );
}

#[test]
fn an_update_of_an_external_job_that_has_ended_is_refused() {
    let home = TestHome::new();
    let output = home
        .cmd()
        .args([
            "run",
            "--wait",
            "--json",
            "--external-job",
            "echo '{\"state\": \"succeeded\"}'",
        ])
        .output()
        .expect("runs");
    assert!(output.status.success());
    let run = run_id_of(&output.stdout);
    let journal = home.journal();
    refuse(
        &home,
        &journal,
        &["job", "update", &run.to_string(), "0", "--state", "running"],
        "after the run ended complete",
    );
}

#[test]
fn run_arguments_that_make_no_run_are_refused() {
    let (home, journal, _) = home_with_a_run();
    refuse(&home, &journal, &["run"], "no steps");
    refuse(
        &home,
        &journal,
        &["run", "--mode", "single", "--step", "a", "--step", "b"],
        "exactly one step",
    );
    refuse(
        &home,
        &journal,
        &[
            "run",
            "--mode",
            "parallel",
            "--concurrency",
            "0",
            "--step",
            "a",
        ],
        "concurrency",
    );
    refuse(
        &home,
        &journal,
        &["run", "--mode", "serial", "--", "true"],
        "unknown mode",
    );
    refuse(
        &home,
        &journal,
        &["run", "--step", "a", "--", "true"],
        "cannot be used with",
    );
    refuse(
        &home,
        &journal,
        &["list", "--state", "sleeping"],
        "unknown run state",
    );
}

/// Regression: `--timeout 1ns` became a timeout of 0 ms, and `--heartbeat 500us` recorded a
/// run whose runner then refused its heartbeat and exited 2. A duration finer than a
/// millisecond is refused where it is parsed: a flag, a spec file, a `wait`.
#[test]
fn a_duration_finer_than_a_millisecond_is_refused_where_it_is_parsed() {
    let (home, journal, run) = home_with_a_run();
    for duration in ["1ns", "500us", "1s500us"] {
        for flag in ["--timeout", "--heartbeat", "--idle-timeout"] {
            let arg = format!("{flag}={duration}");
            let stderr = refuse(&home, &journal, &["run", &arg, "--", "true"], flag);
            assert!(stderr.contains("finer than a millisecond"), "{stderr}");
        }
        let arg = format!("--timeout={duration}");
        refuse(
            &home,
            &journal,
            &["wait", &run.to_string(), &arg],
            "finer than a millisecond",
        );
        let spec = home.file("fine.json");
        std::fs::write(
            &spec,
            format!(r#"{{"timeout": "{duration}", "steps": [{{"shell": "true"}}]}}"#),
        )
        .expect("write the spec");
        refuse(
            &home,
            &journal,
            &["run", "--spec", &spec.display().to_string()],
            "finer than a millisecond",
        );
    }
}

/// Regression: a 120 KB `--session-id` went as far as the journal, whose lifecycle rule
/// refused it: exit 1 with three copies of a lifecycle message. Every identifier over its limit
/// is bad input, refused before the journal is touched, naming the limit.
#[test]
fn an_over_long_identifier_exits_2_naming_its_limit() {
    let (home, journal, run) = home_with_a_run();
    let long = "a".repeat(120 * 1024);
    for flag in ["--session-id", "--owner-id", "--tool-call-id", "--name"] {
        let stderr = refuse(&home, &journal, &["run", flag, &long, "--", "true"], "4096");
        assert!(
            stderr.contains("over the limit") && stderr.len() < 400,
            "{flag}: one short line: {stderr}"
        );
    }
    let spec = home.file("ids.json");
    std::fs::write(
        &spec,
        format!(r#"{{"sessionId": "{long}", "steps": [{{"shell": "true"}}]}}"#),
    )
    .expect("write the spec");
    refuse(
        &home,
        &journal,
        &["run", "--spec", &spec.display().to_string()],
        "session id is 122880 bytes, over the limit of 4096",
    );
    refuse(
        &home,
        &journal,
        &["run", "--queue", &long, "--", "true"],
        "1 to 64",
    );
    refuse(
        &home,
        &journal,
        &["queue", &long, "--max-active", "1"],
        "1 to 64",
    );
    for command in ["status", "wait", "logs", "stop", "dismiss"] {
        refuse(&home, &journal, &[command, &long], "over 4096 bytes");
    }
    for command in ["stop", "interrupt"] {
        refuse(
            &home,
            &journal,
            &[command, &run.to_string(), "--reason", &long],
            "over the limit of 4096",
        );
    }
}

/// The entries of `dir`, sorted, or none when it does not exist.
fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|entry| entry.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// Runs `runjournal --home HOME ARGS` and checks it is refused as bad input, one line
/// holding `expected`.
fn refuse_home(home: &Path, args: &[&str], expected: &str) {
    let output = assert_cmd::cargo::cargo_bin_cmd!("runjournal")
        .env_remove("RUNJOURNAL_HOME")
        .env_remove("RUNJOURNAL_LAYOUT")
        .arg("--home")
        .arg(home)
        .args(args)
        .timeout(std::time::Duration::from_secs(120))
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "{args:?}: one line: {stderr}");
    assert!(
        stderr.contains(expected),
        "{args:?}: {stderr} should say {expected:?}"
    );
}

/// Regression: `list --home /` made a full home at `/`, with its 8 MiB reserve. A home is
/// made only where nothing else lives: never at `/`, never in a directory of other files;
/// a missing or empty directory becomes one, and an existing home opens whatever else it
/// holds.
#[test]
fn a_home_is_made_only_in_a_missing_or_empty_directory() {
    let commands: [&[&str]; 4] = [
        &["list"],
        &["reconcile"],
        &["queue", "q"],
        &["run", "--", "true"],
    ];
    let root_before = entries(Path::new("/"));
    for args in commands {
        refuse_home(Path::new("/"), args, "root of the file system");
    }
    assert_eq!(
        entries(Path::new("/")),
        root_before,
        "nothing was made at /"
    );

    let dir = tempfile::tempdir().expect("temp dir");
    let project = dir.path().join("project");
    std::fs::create_dir(&project).expect("mkdir");
    std::fs::write(project.join("Cargo.toml"), b"[package]\n").expect("a file of something else");
    std::fs::create_dir(project.join("src")).expect("mkdir");
    for args in commands {
        refuse_home(
            &project,
            args,
            "holds no journal but other files (Cargo.toml, src)",
        );
    }
    assert_eq!(
        entries(&project),
        ["Cargo.toml", "src"],
        "nothing was made there"
    );

    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).expect("mkdir");
    let missing = dir.path().join("missing/home");
    for home in [&empty, &missing] {
        assert_cmd::cargo::cargo_bin_cmd!("runjournal")
            .env_remove("RUNJOURNAL_HOME")
            .arg("--home")
            .arg(home)
            .arg("list")
            .timeout(std::time::Duration::from_secs(120))
            .assert()
            .success();
        assert!(home.join("journal.redb").is_file(), "{}", home.display());
    }
    // An existing home opens, whatever else was put in it.
    let (home, _run) = support::home_with_a_run();
    std::fs::write(home.file("notes.txt"), b"mine").expect("a file of the user's");
    home.cmd().arg("list").assert().success();
}

/// A queue whose limit is 0 holds every run without starting one: `queue`, `run` and `list`
/// each say it is held, and how to let it go.
#[test]
fn a_held_queue_says_so_in_queue_run_and_list() {
    let home = TestHome::new();
    let held =
        "held: a limit of 0 starts no run until `runjournal queue q --max-active N` raises it";
    let said = |args: &[&str]| {
        let output = home
            .cmd()
            .args(args)
            .assert()
            .success()
            .get_output()
            .stdout
            .clone();
        String::from_utf8(output).expect("utf-8")
    };
    let text = said(&["queue", "q", "--max-active", "0"]);
    assert!(text.contains(held), "queue: {text}");
    let text = said(&["run", "--queue", "q", "--", "true"]);
    assert!(
        text.contains("queued in q") && text.contains(held),
        "run: {text}"
    );
    let text = said(&["list"]);
    assert!(text.contains(held), "list: {text}");
    let text = said(&["queue", "q"]);
    assert!(text.contains(held), "queue: {text}");
    let text = said(&["queue", "q", "--max-active", "1"]);
    assert!(!text.contains("held"), "let go: {text}");
}
/// Regression: a run whose working directory did not exist was created, and failed at its
/// first step with "No such file or directory", which read like a missing program. Now a
/// missing directory, a file in its place and a program not on the run's PATH are refused at
/// launch, each named, and no run is created.
#[test]
fn a_run_that_cannot_start_is_refused_at_launch_naming_why() {
    let (home, journal, _) = home_with_a_run();
    let file = home.file("a-file");
    std::fs::write(&file, b"").expect("write");
    let spec_with_cwd = |name: &str, cwd: &str| {
        let spec = home.file(name);
        let text = serde_json::json!({"cwd": cwd, "steps": [{"command": ["true"]}]});
        std::fs::write(&spec, text.to_string()).expect("write the spec");
        spec.display().to_string()
    };
    let missing = spec_with_cwd("missing.json", "/no/such/directory/here");
    let not_dir = spec_with_cwd("not-dir.json", &file.display().to_string());
    let cases: [(&[&str], &str); 4] = [
        (
            &["run", "--spec", &missing],
            "/no/such/directory/here does not exist",
        ),
        (&["run", "--spec", &not_dir], "is not a directory"),
        (
            &["run", "--", "no-such-program-anywhere", "--now"],
            "program \"no-such-program-anywhere\" is not found on the run's PATH",
        ),
        (
            &["run", "--", "./not/here.sh"],
            "not/here.sh is not an executable file",
        ),
    ];
    for (args, expected) in cases {
        refuse(&home, &journal, args, expected);
    }
    let runs = std::fs::read_dir(home.file("runs"))
        .expect("runs")
        .filter(|entry| {
            entry
                .as_ref()
                .is_ok_and(|entry| entry.file_name().to_string_lossy().parse::<RunId>().is_ok())
        })
        .count();
    assert_eq!(runs, 1, "no run directory was made but the first run's");
}

/// A missing argument is named on the one line, and so is one that cannot go with another.
#[test]
fn a_missing_or_conflicting_argument_is_named() {
    let (home, journal, run) = home_with_a_run();
    for command in ["status", "wait", "logs", "stop"] {
        refuse(&home, &journal, &[command], "<RUN>");
    }
    let run = run.to_string();
    refuse(
        &home,
        &journal,
        &["status", &run, "--home-health"],
        "cannot be used with",
    );
    refuse(&home, &journal, &["scrub", "--every", "0s"], "is zero");
}

/// A POSIX `TZ` rule whose local time is about noon now (its standard offset chosen so), with
/// daylight saving time starting today at 02:00 (`starts_today`: 02:00 to 03:00 is skipped) or
/// ending today at 03:00 (else: 02:00 to 03:00 happens twice). Noon is hours from either
/// midnight, so the command run now has the same today.
fn tz_with_a_transition_today(starts_today: bool) -> String {
    let now = jiff::Timestamp::now();
    let utc_hour = i32::from(jiff::tz::TimeZone::UTC.to_datetime(now).hour());
    // Local minus UTC, in hours: -11 to +12.
    let offset_hours = 12 - utc_hour;
    let offset = jiff::tz::Offset::from_hours(i8::try_from(offset_hours).expect("an hour offset"))
        .expect("a valid offset");
    let today = jiff::tz::TimeZone::fixed(offset).to_datetime(now).date();
    // POSIX's zero-based day of the year, leap days counted.
    let day = i32::from(today.day_of_year()) - 1;
    let other_day = (day + 180) % 365;
    let (start, end) = if starts_today {
        (day, other_day)
    } else {
        (other_day, day)
    };
    // POSIX writes the standard offset west of UTC as positive.
    format!("XST{}XDT,{start}/2,{end}/3", -offset_hours)
}

/// Regression: `--at 9999-12-31T23:59:59Z`, past the last instant a timestamp holds, was
/// refused as "not a start time"; a local `--at` time the clocks skip today or show twice was
/// taken an hour off what was meant, and one under a `TZ` that names no zone was read in UTC.
/// Each is refused, saying why (and the range).
#[test]
fn a_start_time_out_of_range_skipped_shown_twice_or_in_an_unknown_zone_is_refused() {
    let (home, journal, _) = home_with_a_run();
    refuse(
        &home,
        &journal,
        &["run", "--at", "9999-12-31T23:59:59Z", "--", "true"],
        "is out of range: a start time is from 1970-01-01T00:00:00Z to 9999-12-30T22:00:00Z",
    );
    let skipping = tz_with_a_transition_today(true);
    refuse_with_env(
        &home,
        &journal,
        &[("TZ", &skipping)],
        &["run", "--at", "02:30", "--", "true"],
        "does not exist today",
    );
    let repeating = tz_with_a_transition_today(false);
    refuse_with_env(
        &home,
        &journal,
        &[("TZ", &repeating)],
        &["run", "--at", "02:30", "--", "true"],
        "happens twice today",
    );
    refuse_with_env(
        &home,
        &journal,
        &[("TZ", "Nowhere/Bogus")],
        &["run", "--at", "14:30", "--", "true"],
        "time zone is unknown",
    );
    // The same zones take an unambiguous local time, and any zone an RFC 3339 time; the runs
    // are stopped then, so that the home's timer has nothing left to wait for.
    for (tz, at) in [
        (skipping.as_str(), "23:59:59"),
        ("Nowhere/Bogus", "2999-01-01T00:00:00Z"),
    ] {
        let output = home
            .cmd()
            .env("TZ", tz)
            .args(["run", "--json", "--at", at, "--", "true"])
            .assert()
            .success()
            .get_output()
            .stdout
            .clone();
        let run = run_id_of(&output);
        home.cmd()
            .args(["stop", &run.to_string()])
            .assert()
            .success();
    }
}
