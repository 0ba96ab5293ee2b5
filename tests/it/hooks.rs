//! Completion hooks with the real binaries: a hook runs once a run's end is journaled,
//! whatever ended it — its runner, a stop, the reconciler after the runner was SIGKILLed — with
//! the run's id, state, exit code and result path beside its launcher's environment; a hook
//! that fails is tried again and, once delivered, never again; a deliverer killed between a
//! hook's exit and its record costs at most one more delivery; a hook past its timeout is
//! ended with its group; what a hook leaves outside its group is ended, by a runner and by a
//! deliverer; a deliverer SIGKILLed mid-hook takes its hook's whole group with it; the home's
//! hook runs for every run that ends while it is set.

use std::path::{Path, PathBuf};
use std::time::Duration;

use runjournal::event::{Event, HookOutcome};
use runjournal::{Journal, RunId, RunStatus};
use serde_json::Value;

use crate::support::{TestHome, launch, records, wait_for, wait_terminal};

/// Most polls of a bounded wait for a file, and the pause between two: a minute.
const POLLS: u32 = 1200;
const POLL: Duration = Duration::from_millis(50);

/// The lines of `path` once it has at least `count` of them; panics after a minute.
fn wait_lines(path: &Path, count: usize) -> Vec<String> {
    for _ in 0..POLLS {
        let lines = read_lines(path);
        if lines.len() >= count {
            return lines;
        }
        std::thread::sleep(POLL);
    }
    panic!(
        "{} never held {count} lines: {:?}",
        path.display(),
        read_lines(path)
    );
}

fn read_lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// The hook records of a run: (hook, attempt, how it ended) for each `HookEnded`, and how many
/// attempts were claimed.
fn hook_history(journal: &Journal, run: RunId) -> (usize, Vec<(u32, u32, HookOutcome)>) {
    let records = records(journal, run);
    let claimed = records
        .iter()
        .filter(|record| matches!(record.event, Event::HookAttempted { .. }))
        .count();
    let ended = records
        .iter()
        .filter_map(|record| match &record.event {
            Event::HookEnded {
                hook,
                attempt,
                outcome,
                ..
            } => Some((*hook, *attempt, outcome.clone())),
            _ => None,
        })
        .collect();
    (claimed, ended)
}

/// Waits until every hook of `run` is delivered or given up (its `hooks_due` entry gone).
fn wait_settled(journal: &Journal, run: RunId) {
    for _ in 0..POLLS {
        let view = journal.view().expect("a view");
        let is_terminal = view
            .snapshot(run)
            .expect("reads")
            .is_some_and(|state| state.is_terminal());
        if is_terminal && !view.has_hooks_due(run).expect("reads") {
            return;
        }
        drop(view);
        std::thread::sleep(POLL);
    }
    panic!("run {run}: its hooks never settled");
}

fn runner_pid(stdout: &[u8]) -> i32 {
    let object: Value = serde_json::from_slice(stdout).expect("run --json prints JSON");
    i32::try_from(object["runnerPid"].as_u64().expect("a runner pid")).expect("a pid")
}

fn out_file(home: &TestHome, name: &str) -> PathBuf {
    home.path().join(name)
}

/// What the issue asked for first: a run whose runner was SIGKILLed mid-step is closed by the
/// reconciler, and its hook fires — exactly once, however many passes follow — with the run's
/// facts and its launcher's environment.
#[test]
fn a_hook_fires_exactly_once_for_a_run_whose_runner_was_sigkilled_and_reconciled() {
    let home = TestHome::new();
    let out = out_file(&home, "hook.out");
    let hook = format!(
        "echo \"$RUNJOURNAL_RUN_ID $RUNJOURNAL_RUN_STATE $RUNJOURNAL_EXIT_CODE $RUNJOURNAL_RESULT_PATH $FROM_LAUNCHER\" >> {}",
        out.display()
    );
    let output = home
        .cmd()
        .env("FROM_LAUNCHER", "launcher-value")
        .args(["run", "--json", "--on-exit", &hook, "--", "sleep", "60"])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let run = crate::support::run_id_of(&output);
    let journal = home.journal();
    wait_for(&journal, run, "its runner to take it", |state| {
        state.status == RunStatus::Running
    });
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(runner_pid(&output)),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("the runner is killed");
    // The reconciler sees the runner gone only once it is reaped (it is not our child: init
    // reaps it); each pass until then finds it alive.
    wait_for(&journal, run, "the reconciler to close it", |_| {
        home.cmd().arg("reconcile").assert().success();
        journal
            .view()
            .expect("view")
            .snapshot(run)
            .expect("reads")
            .is_some_and(|state| state.is_terminal())
    });
    let lines = wait_lines(&out, 1);
    wait_settled(&journal, run);
    for _ in 0..3 {
        home.cmd().arg("reconcile").assert().success();
    }
    std::thread::sleep(Duration::from_secs(2));
    let lines_after = read_lines(&out);
    assert_eq!(lines_after, lines, "the hook ran once");
    let result = home.path().join("results").join(format!("{run}.json"));
    assert_eq!(
        lines,
        vec![format!(
            "{run} failed 1 {} launcher-value",
            result.display()
        )]
    );
    let (claimed, ended) = hook_history(&journal, run);
    assert_eq!(claimed, 1);
    assert_eq!(ended, vec![(0, 1, HookOutcome::Delivered)]);
}

/// A hook that fails its first attempt is tried again, by the runner that ended the run, and
/// once its delivery is journaled it is never run again.
#[test]
fn a_hook_that_fails_first_is_tried_again_and_never_after_its_delivery() {
    let home = TestHome::new();
    let out = out_file(&home, "hook.out");
    let mark = out_file(&home, "failed-once");
    let hook = format!(
        "if [ -e {mark} ]; then echo delivered >> {out}; else touch {mark}; exit 3; fi",
        mark = mark.display(),
        out = out.display()
    );
    let run = launch(&home, &["--on-exit", &hook, "--", "true"]);
    let journal = home.journal();
    wait_terminal(&journal, run);
    wait_settled(&journal, run);
    home.cmd().arg("reconcile").assert().success();
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(read_lines(&out), vec!["delivered".to_string()]);
    let (claimed, ended) = hook_history(&journal, run);
    assert_eq!(claimed, 2);
    assert_eq!(
        ended,
        vec![
            (
                0,
                1,
                HookOutcome::Failed {
                    exit: runjournal::event::ProcessExit {
                        code: Some(3),
                        signal: None
                    }
                }
            ),
            (0, 2, HookOutcome::Delivered),
        ]
    );
    let listed = home
        .cmd()
        .args(["hooks", &run.to_string(), "--json"])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let listed: Value = serde_json::from_slice(&listed).expect("JSON");
    assert_eq!(listed[0]["status"], "delivered");
    assert_eq!(listed[0]["attempts"], 2);
    // Nothing undelivered is left to list.
    home.cmd()
        .arg("hooks")
        .assert()
        .success()
        .stdout("no hook is pending, failing or given up\n");
}

/// The kill point between a hook's exit and its record: the deliverer (here the ending runner)
/// is SIGKILLed right after its hook exited. The claim it left names a dead process, so the
/// next reconcile pass records the attempt abandoned and delivers the hook again: at most one
/// more delivery, and none after that.
#[test]
fn a_deliverer_killed_between_a_hooks_exit_and_its_record_delivers_it_once_more_at_most() {
    let home = TestHome::new();
    // The home first: it is made only in an empty directory, and the kill file goes beside it.
    home.cmd().arg("list").assert().success();
    let out = out_file(&home, "hook.out");
    let kill_file = out_file(&home, "kill-after-hook");
    std::fs::write(&kill_file, b"").expect("the kill file");
    let hook = format!("echo ran >> {}", out.display());
    let run = {
        let output = home
            .cmd()
            .env(runjournal::hooks::KILL_AFTER_HOOK_ENV, &kill_file)
            .args(["run", "--json", "--on-exit", &hook, "--", "true"])
            .assert()
            .success()
            .get_output()
            .stdout
            .clone();
        crate::support::run_id_of(&output)
    };
    let journal = home.journal();
    wait_terminal(&journal, run);
    wait_lines(&out, 1);
    // The runner removed the kill file as it killed itself: the next deliverer lives.
    for _ in 0..POLLS {
        if !kill_file.exists() {
            break;
        }
        std::thread::sleep(POLL);
    }
    assert!(!kill_file.exists(), "the runner reached the kill point");
    wait_for(
        &journal,
        run,
        "the reconciler to see the runner gone",
        |_| {
            home.cmd().arg("reconcile").assert().success();
            let (claimed, ended) = hook_history(&journal, run);
            claimed == 2 && ended.len() == 2
        },
    );
    wait_settled(&journal, run);
    for _ in 0..2 {
        home.cmd().arg("reconcile").assert().success();
    }
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(read_lines(&out), vec!["ran".to_string(), "ran".to_string()]);
    let (claimed, ended) = hook_history(&journal, run);
    assert_eq!(claimed, 2, "one more attempt, no third");
    assert!(
        matches!(&ended[0], (0, 1, HookOutcome::Abandoned { reason }) if reason.contains("died")),
        "{ended:?}"
    );
    assert_eq!(ended[1], (0, 2, HookOutcome::Delivered));
}

/// A hook past its timeout is ended with its process group and counts as a failed attempt,
/// tried again later; `hooks` lists it as failing, with when it is due.
#[test]
fn a_hook_past_its_timeout_is_ended_and_listed_as_failing() {
    let home = TestHome::new();
    let pids = out_file(&home, "hook.pids");
    // The hook's group id (field 5 of its stat): a sentinel, not the hook's shell, leads it.
    let hook = format!(
        "read -r _ _ _ _ group _ < /proc/$$/stat; echo $group >> {}; sleep 60 & sleep 60",
        pids.display()
    );
    let run = {
        let output = home
            .cmd()
            .env(runjournal::hooks::HOOK_TIMEOUT_ENV, "300ms")
            .args(["run", "--json", "--on-exit", &hook, "--", "true"])
            .assert()
            .success()
            .get_output()
            .stdout
            .clone();
        crate::support::run_id_of(&output)
    };
    let journal = home.journal();
    wait_terminal(&journal, run);
    // The runner tries it three times (the retries due within its wait), then leaves it.
    for _ in 0..POLLS {
        let (_, ended) = hook_history(&journal, run);
        if ended.len() >= 3 {
            break;
        }
        std::thread::sleep(POLL);
    }
    let (_, ended) = hook_history(&journal, run);
    assert!(
        ended.len() >= 3
            && ended
                .iter()
                .all(|(_, _, outcome)| *outcome == HookOutcome::TimedOut),
        "{ended:?}"
    );
    // Each attempt's group was ended: no process of a hook is left alive.
    for group in read_lines(&pids) {
        let group: u32 = group.parse().expect("a group id");
        let alive: Vec<u32> = runjournal::platform::group_members(group)
            .expect("the system's processes read")
            .into_iter()
            .filter(runjournal::platform::ProcessInfo::is_alive)
            .map(|member| member.pid)
            .collect();
        assert!(alive.is_empty(), "hook group {group} still has {alive:?}");
    }
    let listed = home
        .cmd()
        .args(["hooks", "--json"])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let listed: Value = serde_json::from_slice(&listed).expect("JSON");
    let hook = &listed[0];
    assert_eq!(hook["runId"], run.to_string());
    assert!(
        ["failed", "running"].contains(&hook["status"].as_str().unwrap_or_default()),
        "{hook}"
    );
    assert_eq!(hook["lastOutcome"], "timed-out", "{hook}");
}

/// A run stopped while it waits in its queue never had a runner: the reconcile pass of the next
/// command that reads starts a deliverer, and its hook runs with the run's state, `stopped`.
#[test]
fn a_hook_runs_for_a_queued_run_that_was_stopped() {
    let home = TestHome::new();
    home.cmd()
        .args(["queue", "q", "--max-active", "0"])
        .assert()
        .success();
    let out = out_file(&home, "hook.out");
    let hook = format!("echo \"$RUNJOURNAL_RUN_STATE\" >> {}", out.display());
    let run = launch(&home, &["--queue", "q", "--on-exit", &hook, "--", "true"]);
    home.cmd()
        .args(["stop", &run.to_string()])
        .assert()
        .success();
    home.cmd().arg("list").assert().success();
    assert_eq!(wait_lines(&out, 1), vec!["stopped".to_string()]);
}

/// The home's hook runs for every run that ends while it is set, beside each run's own, and
/// not for runs that end once it is off.
#[test]
fn the_homes_hook_runs_for_every_run_that_ends_while_it_is_set() {
    let home = TestHome::new();
    let out = out_file(&home, "home-hook.out");
    let hook = format!("echo \"home $RUNJOURNAL_RUN_ID\" >> {}", out.display());
    home.cmd().args(["hook", "set", &hook]).assert().success();
    home.cmd()
        .args(["hook", "show"])
        .assert()
        .success()
        .stdout(format!("{hook}\n"));
    let own = out_file(&home, "own.out");
    let own_hook = format!("echo own >> {}", own.display());
    let first = launch(&home, &["--on-exit", &own_hook, "--", "true"]);
    let second = launch(&home, &["--", "false"]);
    let lines = wait_lines(&out, 2);
    let mut expected = vec![format!("home {first}"), format!("home {second}")];
    let mut lines = lines;
    lines.sort();
    expected.sort();
    assert_eq!(lines, expected);
    assert_eq!(wait_lines(&own, 1), vec!["own".to_string()]);

    home.cmd().args(["hook", "off"]).assert().success();
    let shown = home
        .cmd()
        .args(["hook", "show", "--json"])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let shown: Value = serde_json::from_slice(&shown).expect("JSON");
    assert_eq!(shown["command"], Value::Null);
    let third = launch(&home, &["--", "true"]);
    let journal = home.journal();
    wait_terminal(&journal, third);
    wait_settled(&journal, first);
    wait_settled(&journal, second);
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(read_lines(&out).len(), 2, "no home hook once it is off");
    assert!(
        journal
            .view()
            .expect("view")
            .run_hooks(third)
            .expect("reads")
            .is_empty()
    );
}

/// Bad hooks are bad input: nothing is written.
#[test]
fn an_empty_hook_is_refused_and_nothing_is_written() {
    let home = TestHome::new();
    home.cmd()
        .args(["run", "--on-exit", " ", "--", "true"])
        .assert()
        .code(2);
    home.cmd().args(["hook", "set", ""]).assert().code(2);
    assert!(
        !home.path().join("runs").exists()
            || std::fs::read_dir(home.path().join("runs"))
                .expect("runs")
                .flatten()
                .all(|entry| entry.file_name().to_string_lossy().starts_with('.')),
        "no run was made"
    );
}

/// What broke: a projection after a hook's records rendered the run's result file with the
/// run's head as its `Terminal`'s seq, so the result changed after it was published and every
/// reconcile pass found it differing from a fresh one.
#[test]
fn a_result_keeps_the_seq_of_its_terminal_after_the_hooks_records() {
    let home = TestHome::new();
    let run = launch(&home, &["--on-exit", "true", "--", "true"]);
    let journal = home.journal();
    wait_terminal(&journal, run);
    wait_settled(&journal, run);
    // Its runner outlives the hooks' records a little: closed (seen to end) first, so that the
    // pass below has nothing of its own to record.
    drop(journal);
    crate::support::reconcile_until_closed(&home.file("journal.redb"), &[run], || {
        home.cmd().arg("reconcile").assert().success();
    });
    let journal = home.journal();
    // The process that recorded the run closed (its runner's parent, or a pass) projects that
    // record after its commit: the check below is of the files once it has.
    let events = home
        .path()
        .join("runs")
        .join(run.to_string())
        .join("events.jsonl");
    let recorded = records(&journal, run).len();
    for _ in 0..600 {
        let projected = std::fs::read_to_string(&events).map_or(0, |text| {
            text.lines().filter(|line| !line.trim().is_empty()).count()
        });
        if projected == recorded {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let terminal_seq = records(&journal, run)
        .iter()
        .find(|record| matches!(record.event, Event::Terminal { .. }))
        .expect("a Terminal")
        .seq;
    let result = home.path().join("results").join(format!("{run}.json"));
    let result: Value =
        serde_json::from_slice(&std::fs::read(&result).expect("the result")).expect("JSON");
    assert_eq!(result["journalSeq"], terminal_seq, "{result}");
    // A pass finds the files as a fresh projection has them. The process that closed the run
    // writes its status.json when its store goes, after its commit: a pass may meet that
    // write still to come, and rewrite it; the next finds nothing. With the bug, every pass
    // rewrote the result.
    let mut last = String::new();
    for _ in 0..20 {
        let output = home
            .cmd()
            .args(["reconcile", "--json"])
            .assert()
            .success()
            .get_output()
            .stdout
            .clone();
        last = String::from_utf8_lossy(&output).into_owned();
        if !last.contains("\"reprojected\":true") {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    panic!("every pass rewrote the run's files: {last}");
}

/// The pids of the live processes (not zombies) with an argument that contains `marker`.
fn processes_with(marker: &str) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|name| name.parse().ok())
        else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let has_marker = cmdline
            .split(|byte| *byte == 0)
            .any(|arg| String::from_utf8_lossy(arg).contains(marker));
        let is_alive = runjournal::platform::process(pid)
            .ok()
            .flatten()
            .is_some_and(|info| info.is_alive());
        if has_marker && is_alive {
            found.push(pid);
        }
    }
    found
}

/// Waits, within a bound, until no live process has `marker` in its arguments; past it, kills
/// those left (so that a failure leaves nothing behind) and fails naming them.
fn assert_none_left_with(marker: &str, what: &str) {
    let mut left = processes_with(marker);
    for _ in 0..POLLS {
        if left.is_empty() {
            return;
        }
        std::thread::sleep(POLL);
        left = processes_with(marker);
    }
    let mut doomed = left.clone();
    while let Some(pid) = doomed.pop() {
        if let Ok(children) = runjournal::platform::children(pid) {
            doomed.extend(children.iter().map(|child| child.pid));
        }
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(i32::try_from(pid).expect("a pid")),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    panic!("{what}: processes {left:?} (with {marker}) are still alive");
}

/// A hook that starts a daemon in a session of its own and waits until it is up: `setsid`
/// takes it out of the hook's process group, so ending the group does not reach it.
fn daemon_hook(marker: &str, up: &Path) -> String {
    format!(
        "setsid sh -c 'echo up > {up}; sleep 7777; :' {marker} & \
         while [ ! -s {up} ]; do sleep 0.05; done",
        up = up.display()
    )
}

/// What broke: a hook's `setsid sh -c "sleep 7777"` outlived it (reparented to init), where
/// the same line in a step is ended and named. Now a hook's leftovers are ended as a step's
/// are — by the runner that delivers it, and by a deliverer a reconcile pass starts — and
/// `hooks.log` names them.
#[test]
fn what_a_hook_leaves_outside_its_group_is_ended_by_its_runner_and_by_a_deliverer() {
    let home = TestHome::new();
    let marker = format!("rj-hook-daemon-{}", std::process::id());
    // Delivered by the run's runner.
    let up = out_file(&home, "runner-daemon.up");
    let by_runner = format!("{marker}-runner");
    let run = launch(
        &home,
        &["--on-exit", &daemon_hook(&by_runner, &up), "--", "true"],
    );
    let journal = home.journal();
    wait_terminal(&journal, run);
    wait_settled(&journal, run);
    assert_eq!(
        read_lines(&up),
        vec!["up".to_string()],
        "the daemon started"
    );
    assert_none_left_with(&by_runner, "a hook the runner delivered");
    let (_, ended) = hook_history(&journal, run);
    assert_eq!(ended, vec![(0, 1, HookOutcome::Delivered)]);
    let log = std::fs::read_to_string(
        home.path()
            .join("runs")
            .join(run.to_string())
            .join("hooks.log"),
    )
    .unwrap_or_default();
    assert!(
        log.contains("ended 2 processes it left outside its process group"),
        "hooks.log names what was ended: {log}"
    );

    // Delivered by a deliverer: a delayed run stopped before its time has no runner.
    let up = out_file(&home, "deliverer-daemon.up");
    let by_deliverer = format!("{marker}-deliverer");
    let run = launch(
        &home,
        &[
            "--delay",
            "1h",
            "--on-exit",
            &daemon_hook(&by_deliverer, &up),
            "--",
            "true",
        ],
    );
    home.cmd()
        .args(["stop", &run.to_string()])
        .assert()
        .success();
    home.cmd().arg("reconcile").assert().success();
    wait_settled(&journal, run);
    assert_eq!(
        read_lines(&up),
        vec!["up".to_string()],
        "the daemon started"
    );
    assert_none_left_with(&by_deliverer, "a hook a deliverer delivered");
    let (_, ended) = hook_history(&journal, run);
    assert_eq!(ended, vec![(0, 1, HookOutcome::Delivered)]);
}

/// What broke: with the delivering runner SIGKILLed mid-hook, only the hook's `sh -c` died
/// (it dies with its parent); a child it had started went on and finished its work after the
/// next attempt had started. Now the hook's whole group dies with its deliverer: an attempt
/// found abandoned is not still running.
#[test]
fn a_hooks_whole_group_dies_with_a_deliverer_killed_mid_hook() {
    let home = TestHome::new();
    let marker = format!("rj-hook-child-{}", std::process::id());
    let started = out_file(&home, "hook.started");
    let hook = format!(
        "echo started >> {}; sh -c 'sleep 7777; :' {marker}",
        started.display()
    );
    let output = home
        .cmd()
        // The hook outlives this test unless its group is ended with its deliverer.
        .env(runjournal::hooks::HOOK_TIMEOUT_ENV, "10m")
        .args(["run", "--json", "--on-exit", &hook, "--", "true"])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let run = crate::support::run_id_of(&output);
    let journal = home.journal();
    wait_terminal(&journal, run);
    wait_lines(&started, 1);
    for _ in 0..POLLS {
        if !processes_with(&marker).is_empty() {
            break;
        }
        std::thread::sleep(POLL);
    }
    assert!(
        !processes_with(&marker).is_empty(),
        "the hook's child started"
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(runner_pid(&output)),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("the runner is killed");
    assert_none_left_with(&marker, "the hook of a runner SIGKILLed mid-hook");
    let (claimed, ended) = hook_history(&journal, run);
    assert_eq!(
        (claimed, ended.len()),
        (1, 0),
        "the attempt is left claimed"
    );
}
