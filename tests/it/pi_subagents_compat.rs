//! Compatibility with the real readers: pi-subagents 0.67.0, installed from the npm registry
//! into a cache under target/, reads runs of every kind that the real `runjournal` binary made
//! in the pi-subagents layout — its status reader, its run listing and its stale-run
//! reconciler (`tests/it/pi_subagents_compat.mjs` calls them) — and must read every run, list
//! each where pi-subagents lists it, and repair none (no file under the root changes).
//!
//! Needs node and npm and the registry. Without them the test skips, saying why, and fails
//! instead where every test must run (CI, `runjournal::testkit::skip`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use runjournal::home::pi_subagents_default_root;

/// The version whose readers are checked.
const PI_SUBAGENTS_VERSION: &str = "0.67.0";
pub(crate) const SESSION_ID: &str = "pi-session-1";
const OWNER_ID: &str = "pi-owner-1";
/// Bounds for the external commands: a hung install or reader fails the test.
const NPM_TIMEOUT: Duration = Duration::from_secs(600);
const NODE_TIMEOUT: Duration = Duration::from_secs(300);

/// Skips (returns `None`) or, where CI requires the test, fails.
fn cannot_run(reason: &str) -> Option<PathBuf> {
    runjournal::testkit::skip::skip("the pi-subagents compatibility test", reason);
    None
}

fn runs_ok(program: &str) -> bool {
    std::process::Command::new(program)
        .arg("--version")
        .output()
        .is_ok_and(|output| output.status.success())
}

/// The directory pi-subagents is installed in (with its dependencies, jiti among them),
/// installed now if the cache does not hold it. Shared with the power-cut test, which reads
/// its homes of the pi-subagents layout with the same readers after each cut.
pub(crate) fn pi_subagents() -> Option<PathBuf> {
    // One install at a time in this process: both tests need it.
    static INSTALLING: Mutex<()> = Mutex::new(());
    let _installing = INSTALLING
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let name = format!("pi-subagents-{PI_SUBAGENTS_VERSION}");
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(&name);
    let is_installed = |dir: &Path| {
        let manifest = dir.join("node_modules/pi-subagents/package.json");
        std::fs::read_to_string(manifest)
            .is_ok_and(|text| text.contains(&format!("\"version\": \"{PI_SUBAGENTS_VERSION}\"")))
            && dir.join("node_modules/jiti/package.json").is_file()
    };
    if is_installed(&dir) {
        return Some(dir);
    }
    if !runs_ok("node") || !runs_ok("npm") {
        return cannot_run("node and npm are not on this machine");
    }
    // Installed beside the cache and renamed into place, so a concurrent or killed install
    // never leaves a half-filled cache behind.
    let staging = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("{name}.installing-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&staging);
    std::fs::create_dir_all(&staging).expect("make the staging directory");
    let output = assert_cmd::Command::new("npm")
        .args([
            "install",
            "--no-audit",
            "--no-fund",
            "--ignore-scripts",
            "--loglevel=error",
        ])
        .arg("--prefix")
        .arg(&staging)
        .arg(format!("pi-subagents@{PI_SUBAGENTS_VERSION}"))
        .timeout(NPM_TIMEOUT)
        .output()
        .expect("npm runs");
    if !output.status.success() || !is_installed(&staging) {
        let _ = std::fs::remove_dir_all(&staging);
        return cannot_run(&format!(
            "npm install pi-subagents@{PI_SUBAGENTS_VERSION} failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    if std::fs::rename(&staging, &dir).is_err() {
        // Another test process installed it first.
        let _ = std::fs::remove_dir_all(&staging);
    }
    assert!(
        is_installed(&dir),
        "pi-subagents is installed in {}",
        dir.display()
    );
    Some(dir)
}

/// Runs the reader script; returns its JSON report.
pub(crate) fn read_with_pi_subagents(
    install: &Path,
    env: &[(&str, &Path)],
    args: &[&str],
) -> serde_json::Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/it/pi_subagents_compat.mjs");
    let mut command = assert_cmd::Command::new("node");
    command
        .env_remove("PI_SUBAGENTS_TEMP_ROOT")
        .env_remove("TMPDIR")
        .env_remove("TMP")
        .env_remove("TEMP")
        .arg(script)
        .arg(install)
        .args(args)
        .timeout(NODE_TIMEOUT);
    for (name, value) in env {
        command.env(name, value);
    }
    let output = command.output().expect("node runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "the readers failed: {stderr}");
    // pi-subagents warns on stderr about runs it skips or index entries it drops.
    assert!(
        !stderr.contains("pi-subagents") && !stderr.contains("Ignoring"),
        "pi-subagents complained: {stderr}"
    );
    serde_json::from_slice(&output.stdout).unwrap_or_else(|_| {
        panic!(
            "one JSON report: {}",
            String::from_utf8_lossy(&output.stdout)
        )
    })
}

/// `runjournal --layout pi-subagents --home ROOT`, environment cleared of homes and layouts.
pub(crate) fn runjournal(root: &Path) -> assert_cmd::Command {
    let mut command = assert_cmd::cargo::cargo_bin_cmd!("runjournal");
    command
        .env_remove("RUNJOURNAL_HOME")
        .env_remove("RUNJOURNAL_LAYOUT")
        .env_remove("PI_SUBAGENTS_TEMP_ROOT")
        .env("RUNJOURNAL_RESERVE_BYTES", "0")
        .arg("--home")
        .arg(root)
        .args(["--layout", "pi-subagents"])
        .timeout(Duration::from_secs(120));
    command
}

/// Launches a run with the host's session and owner ids; returns its id and runner pid.
pub(crate) fn launch(root: &Path, args: &[&str]) -> (String, u32) {
    let output = runjournal(root)
        .args([
            "run",
            "--json",
            "--session-id",
            SESSION_ID,
            "--owner-id",
            OWNER_ID,
        ])
        .args(args)
        .output()
        .expect("run");
    assert!(output.status.success(), "{output:?}");
    let launched: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    let run = launched["runId"].as_str().expect("runId").to_string();
    let pid = launched["runnerPid"].as_u64().expect("runnerPid");
    (run, u32::try_from(pid).expect("a pid"))
}

/// Waits for the run's end (whatever its exit code), and then for its files: `wait` answers
/// once the end is journaled, and the runner publishes the result a moment later (after
/// status.json and the result's index, in pi-subagents' order).
fn wait(root: &Path, run: &str) {
    let output = runjournal(root).args(["wait", run]).output().expect("wait");
    assert!(
        output
            .status
            .code()
            .is_some_and(|code| code != 2 && code != 75),
        "{output:?}"
    );
    wait_published(root, run);
}

/// Waits until every file of the ended run a host may consume is published: its
/// `.result-published` marker, made after them, exists.
pub(crate) fn wait_published(root: &Path, run: &str) {
    let marker = root
        .join("async-subagent-runs")
        .join(run)
        .join(".result-published");
    for _ in 0..600 {
        if marker.exists() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    panic!("run {run}: its files were not published within 30 s of its end");
}

/// Every file under `dir`, by path, with its bytes. The temporary file of a write in progress
/// (`.NAME.PID.NONCE.tmp`, renamed over NAME once whole: a live runner's heartbeat writes its
/// status.json so) is not a file of the layout, and may be gone by the time it is read.
pub(crate) fn files_under(dir: &Path, files: &mut BTreeMap<PathBuf, Vec<u8>>) {
    for entry in std::fs::read_dir(dir).expect("read dir") {
        let path = entry.expect("entry").path();
        let name = path
            .file_name()
            .and_then(|name| name.to_str())
            .unwrap_or("");
        if name.starts_with('.') && name.ends_with(".tmp") {
            continue;
        }
        if path.is_dir() {
            files_under(&path, files);
        } else {
            files.insert(path.clone(), std::fs::read(&path).expect("read file"));
        }
    }
}

/// The files that differ between two pictures taken by [`files_under`]: made, removed or
/// rewritten.
pub(crate) fn changed_files<'a>(
    before: &'a BTreeMap<PathBuf, Vec<u8>>,
    after: &'a BTreeMap<PathBuf, Vec<u8>>,
) -> Vec<&'a PathBuf> {
    before
        .keys()
        .chain(after.keys())
        .filter(|path| before.get(*path) != after.get(*path))
        .collect()
}

/// Stops the run left running, whatever the test's outcome.
pub(crate) struct StopOnDrop<'a> {
    pub(crate) root: &'a Path,
    pub(crate) run: String,
}

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        let _ = runjournal(self.root).args(["stop", &self.run]).output();
        let _ = runjournal(self.root).args(["wait", &self.run]).output();
    }
}

/// Waits until step `index` of `run` has printed `text`.
pub(crate) fn wait_printed(root: &Path, run: &str, index: usize, text: &str) {
    let log = root
        .join("async-subagent-runs")
        .join(run)
        .join(format!("output-{index}.log"));
    for _ in 0..600 {
        if std::fs::read_to_string(&log).is_ok_and(|output| output.contains(text)) {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("run {run}: step {index} never printed {text:?}");
}

/// The stale bound pi-subagents' reconciler is given for a live runner, instead of 24 h.
const STALE_ALIVE_MS: u64 = 2000;

/// Waits until `run`'s last record is older than `quiet_ms` (its heartbeat, written meanwhile,
/// is later than the record by that much), as `status --json` shows both.
fn wait_quiet_for(root: &Path, run: &str, quiet_ms: u64) {
    for _ in 0..600 {
        let output = runjournal(root)
            .args(["status", "--json", run])
            .output()
            .expect("status");
        assert!(output.status.success(), "{output:?}");
        let status: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
        let last_record = status["lastUpdate"].as_u64().expect("lastUpdate");
        if status["runnerHeardAt"]
            .as_u64()
            .is_some_and(|heard| heard > last_record + quiet_ms)
        {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("run {run}: no heartbeat {quiet_ms} ms after its last record");
}

#[test]
fn pi_subagents_reads_lists_and_repairs_none_of_our_runs() {
    let Some(install) = pi_subagents() else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let root = dir.path().join("pi-root");
    let provider = dir.path().join("provider.sh");
    std::fs::write(
        &provider,
        "echo '{\"state\": \"running\", \"id\": \"job-1\"}'\necho '{\"state\": \"succeeded\", \"id\": \"job-1\"}'\n",
    )
    .expect("write the provider");

    // No free-space floor: under the default one (10 % of the file system free), a nearly full
    // test machine would prune the consumed runs at a reconcile pass before the prune below.
    runjournal(&root)
        .args(["retention", "--keep-free", "off"])
        .assert()
        .success();

    let mut expected: BTreeMap<String, &str> = BTreeMap::new();
    // Two runs that end first and whose results the host consumes: pruned below, they must be
    // gone for pi-subagents' readers, and nothing else of the root changed by it.
    let to_prune: Vec<String> = (0..2)
        .map(|_| launch(&root, &["--", "sh", "-c", "echo soon-pruned"]).0)
        .collect();
    for run in &to_prune {
        wait(&root, run);
        let result = root
            .join("async-subagent-results")
            .join(format!("{run}.json"));
        std::fs::remove_file(&result).expect("the host consumes the result");
    }
    let (single, _) = launch(&root, &["--", "sh", "-c", "echo the-answer-is-42"]);
    // A parallel run whose launcher waits for it, and so sees its runner's exit.
    let output = runjournal(&root)
        .args([
            "run",
            "--wait",
            "--json",
            "--session-id",
            SESSION_ID,
            "--owner-id",
            OWNER_ID,
            "--mode",
            "parallel",
            "--step",
            "true",
            "--step",
            "true",
        ])
        .output()
        .expect("run --wait");
    assert!(output.status.success(), "{output:?}");
    let waited =
        serde_json::from_slice::<serde_json::Value>(&output.stdout).expect("JSON")["runId"]
            .as_str()
            .expect("runId")
            .to_string();
    expected.insert(waited.clone(), "complete");
    // A task whose text no file pi-subagents' readers read may show.
    let (secret, _) = launch(&root, &["--", "sh", "-c", "true secret-task-text"]);
    expected.insert(secret.clone(), "complete");
    // A run launched for a tool call: its result is indexed by the call too.
    let tool_call_id = "call-for-compat";
    let (for_call, _) = launch(&root, &["--tool-call-id", tool_call_id, "--", "true"]);
    expected.insert(for_call.clone(), "complete");
    expected.insert(single.clone(), "complete");
    // 6,000 lines: over pi-subagents' 5,000-line bound of a summary.
    let (long, _) = launch(&root, &["--", "seq", "1", "6000"]);
    expected.insert(long.clone(), "complete");
    let (chain, _) = launch(
        &root,
        &[
            "--step",
            "echo a",
            "--step",
            "exit 3",
            "--step",
            "echo never",
        ],
    );
    expected.insert(chain.clone(), "failed");
    let (parallel, _) = launch(
        &root,
        &[
            "--mode", "parallel", "--step", "echo p1", "--step", "echo p2",
        ],
    );
    expected.insert(parallel.clone(), "complete");
    let (external, _) = launch(
        &root,
        &["--external-job", &format!("sh '{}'", provider.display())],
    );
    expected.insert(external, "complete");
    let (timed_out, _) = launch(&root, &["--timeout", "1s", "--", "sleep", "300"]);
    expected.insert(timed_out.clone(), "failed");
    let (idle, _) = launch(&root, &["--idle-timeout", "1s", "--", "sleep", "300"]);
    expected.insert(idle.clone(), "failed");
    // Interrupted while its second step runs: paused; then resumed by a run that runs that
    // step again (which, its marker there, ends at once) and completes.
    let marker = dir.path().join("paused.marker");
    let pausing = format!(
        "if [ -e '{0}' ]; then echo carried-on; exit 0; fi; touch '{0}'; echo ready; while true; do sleep 0.1; done",
        marker.display()
    );
    let (paused, _) = launch(&root, &["--step", "echo first", "--step", &pausing]);
    wait_printed(&root, &paused, 1, "ready");
    runjournal(&root)
        .args(["interrupt", &paused])
        .assert()
        .success();
    expected.insert(paused.clone(), "paused");
    // A step killed by a signal nobody asked for: pi-subagents' runner ends such a run
    // `stopped`, and says which signal.
    let (signalled, _) = launch(&root, &["--", "sh", "-c", "kill -9 $$"]);
    expected.insert(signalled.clone(), "stopped");
    let (stopped, _) = launch(&root, &["--", "sleep", "300"]);
    runjournal(&root)
        .args(["stop", &stopped])
        .assert()
        .success();
    expected.insert(stopped.clone(), "stopped");

    // A runner SIGKILLed mid-run, then reconciled: the run is failed by our reconciler, which
    // pi-subagents' must then leave alone.
    let (killed, runner_pid) = launch(&root, &["--", "sleep", "300"]);
    let pid = nix::unistd::Pid::from_raw(i32::try_from(runner_pid).expect("a pid"));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL).expect("kill the runner");
    let mut is_gone = false;
    for _ in 0..1200 {
        is_gone = runjournal::platform::process(runner_pid)
            .expect("read the process table")
            .is_none_or(|process| !process.is_alive());
        if is_gone {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(is_gone, "the killed runner {runner_pid} is gone");
    expected.insert(killed, "failed");

    // A quiet live run, kept fresh by a short heartbeat only: pi-subagents' reconciler is
    // given a stale bound shortened the same way (PI_COMPAT_STALE_ALIVE_MS).
    let (running, _) = launch(&root, &["--heartbeat", "200ms", "--", "sleep", "300"]);
    let _stop_running = StopOnDrop {
        root: &root,
        run: running.clone(),
    };
    for (run, _) in expected.iter() {
        wait(&root, run);
    }
    let resumed = runjournal(&root)
        .args(["resume", &paused, "--wait", "--json"])
        .assert()
        .success();
    let resumed: serde_json::Value =
        serde_json::from_slice(&resumed.get_output().stdout).expect("resume --json prints JSON");
    let resumed = resumed["runId"].as_str().expect("runId").to_string();
    expected.insert(resumed.clone(), "complete");
    expected.insert(running.clone(), "running");
    // Two runs waiting in a queue that admits none: `queued`, with no runner and no pid,
    // which pi-subagents' readers must read, list as active, and never repair.
    runjournal(&root)
        .args(["queue", "held", "--max-active", "0"])
        .assert()
        .success();
    let mut queued = Vec::new();
    for _ in 0..2 {
        let output = runjournal(&root)
            .args([
                "run",
                "--json",
                "--session-id",
                SESSION_ID,
                "--owner-id",
                OWNER_ID,
                "--queue",
                "held",
                "--",
                "true",
            ])
            .output()
            .expect("run");
        assert!(output.status.success(), "{output:?}");
        let launched: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
        assert_eq!(launched["state"], "queued", "{launched}");
        let run = launched["runId"].as_str().expect("runId").to_string();
        expected.insert(run.clone(), "queued");
        queued.push(run);
    }
    // A run waiting for its dependency (a run held in the queue): `queued` as well.
    let output = runjournal(&root)
        .args([
            "run",
            "--json",
            "--session-id",
            SESSION_ID,
            "--owner-id",
            OWNER_ID,
            "--after",
            &queued[0],
            "--",
            "true",
        ])
        .output()
        .expect("run");
    assert!(output.status.success(), "{output:?}");
    let launched: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    assert_eq!(launched["state"], "queued", "{launched}");
    assert_eq!(launched["waitingFor"][0], queued[0], "{launched}");
    let run = launched["runId"].as_str().expect("runId").to_string();
    expected.insert(run.clone(), "queued");
    queued.push(run);
    // A run delayed by an hour: `queued` too, with no runner, until its due time.
    let delayed = {
        let output = runjournal(&root)
            .args([
                "run",
                "--json",
                "--session-id",
                SESSION_ID,
                "--owner-id",
                OWNER_ID,
                "--delay",
                "1h",
                "--",
                "true",
            ])
            .output()
            .expect("run");
        assert!(output.status.success(), "{output:?}");
        let launched: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
        assert_eq!(launched["state"], "queued", "{launched}");
        launched["runId"].as_str().expect("runId").to_string()
    };
    expected.insert(delayed.clone(), "queued");
    queued.push(delayed.clone());
    // Our reconciler closes the killed runner's run, and makes sure every projection is
    // written before pi-subagents looks.
    runjournal(&root).arg("reconcile").assert().success();
    // A run's runner outlives its `Terminal` a little; prune keeps a run until it is seen to end.
    let to_prune_ids: Vec<runjournal::RunId> = to_prune
        .iter()
        .map(|run| run.parse().expect("a run id"))
        .collect();
    crate::support::reconcile_until_closed(
        &root.join("runjournal").join("journal.redb"),
        &to_prune_ids,
        || {
            runjournal(&root).arg("reconcile").assert().success();
        },
    );
    // Every ended run is past the count bound, but only those whose results were consumed may
    // go before their age.
    let pruned = runjournal(&root)
        .args(["prune", "--keep-runs", "0", "--json"])
        .assert()
        .success();
    let pruned: serde_json::Value =
        serde_json::from_slice(&pruned.get_output().stdout).expect("prune --json prints JSON");
    let mut pruned_ids: Vec<String> = pruned["runs"]
        .as_array()
        .expect("runs")
        .iter()
        .map(|run| run["runId"].as_str().expect("a run id").to_string())
        .collect();
    pruned_ids.sort();
    let mut wanted = to_prune.clone();
    wanted.sort();
    assert_eq!(pruned_ids, wanted, "{pruned}");
    for run in &to_prune {
        assert!(
            !root.join("async-subagent-runs").join(run).exists(),
            "{run}'s directory is gone"
        );
    }

    // The running run's last record is older than the stale bound given to pi-subagents:
    // only its heartbeat keeps its `lastUpdate` young enough.
    wait_quiet_for(&root, &running, STALE_ALIVE_MS * 3 / 2);

    let mut before = BTreeMap::new();
    files_under(&root.join("async-subagent-runs"), &mut before);
    files_under(&root.join("async-subagent-results"), &mut before);
    let stale_alive_ms = PathBuf::from(STALE_ALIVE_MS.to_string());
    let report = read_with_pi_subagents(
        &install,
        &[
            ("PI_SUBAGENTS_TEMP_ROOT", &root),
            ("PI_COMPAT_STALE_ALIVE_MS", &stale_alive_ms),
        ],
        &["--read", SESSION_ID],
    );
    let mut after = BTreeMap::new();
    files_under(&root.join("async-subagent-runs"), &mut after);
    files_under(&root.join("async-subagent-results"), &mut after);
    // The live run's heartbeat rewrites its status.json meanwhile: it is compared below by
    // what pi-subagents made of it, and must still say it runs.
    let live_status = root
        .join("async-subagent-runs")
        .join(&running)
        .join("status.json");
    let live_after: serde_json::Value =
        serde_json::from_slice(&after.remove(&live_status).expect("the live status"))
            .expect("JSON");
    assert_eq!(live_after["state"], "running", "{live_after}");
    before.remove(&live_status);

    assert_eq!(report["tempRoot"], root.display().to_string());
    let runs = report["runs"].as_object().expect("runs");
    assert_eq!(
        runs.keys().cloned().collect::<Vec<_>>(),
        expected.keys().cloned().collect::<Vec<_>>(),
        "every run directory, and nothing else, is a run to pi-subagents"
    );
    for (run, state) in &expected {
        let seen = &runs[run.as_str()];
        assert_eq!(seen["read"]["runId"], run.as_str(), "{run}: {seen}");
        assert_eq!(seen["read"]["state"], *state, "{run}: {seen}");
        assert_eq!(seen["read"]["sessionId"], SESSION_ID, "{run}: {seen}");
        assert_eq!(seen["read"]["hasPid"], *state != "queued", "{run}: {seen}");
        assert_eq!(seen["repaired"], false, "{run} was repaired: {seen}");
        assert_eq!(seen["reconciledState"], *state, "{run}: {seen}");
        let result = root
            .join("async-subagent-results")
            .join(format!("{run}.json"));
        let log = root
            .join("async-subagent-runs")
            .join(run)
            .join(format!("subagent-log-{run}.md"));
        if *state == "running" || *state == "queued" {
            assert_eq!(seen["resultPath"], serde_json::Value::Null, "{run}: {seen}");
            assert_eq!(seen["log"], serde_json::Value::Null, "{run}: {seen}");
        } else {
            assert_eq!(
                seen["log"],
                format!("Log: {}", log.display()),
                "{run}: pi-subagents' transcript view names the run's log: {seen}"
            );
            assert_eq!(
                seen["resultPath"],
                result.display().to_string(),
                "{run}: the session's result index leads to the result: {seen}"
            );
            assert_eq!(
                seen["indexedResultPath"],
                result.display().to_string(),
                "{run}: the run's own index entry leads to the result: {seen}"
            );
        }
    }
    // pi-subagents finds the run launched for a tool call by that call, and every ended run's
    // result publication left its staging directory empty, as pi-subagents' runner does.
    assert_eq!(
        report["toolCallResults"],
        serde_json::json!([format!("{for_call}.json")]),
        "{}",
        report["toolCallResults"]
    );
    let pending = root
        .join("async-subagent-results")
        .join("result-pending")
        .join(SESSION_ID);
    assert_eq!(
        std::fs::read_dir(&pending)
            .expect("results are staged in result-pending/")
            .count(),
        0,
        "nothing is left pending"
    );
    // The task's text is in the journal (and in the record lines `recover` reads,
    // `runjournal-events.jsonl`), never in a file of pi-subagents' layout.
    let mut layout_files = BTreeMap::new();
    files_under(&root.join("async-subagent-runs"), &mut layout_files);
    files_under(&root.join("async-subagent-results"), &mut layout_files);
    let showing: Vec<&PathBuf> = layout_files
        .iter()
        .filter(|(path, bytes)| {
            path.file_name()
                .is_some_and(|name| name != "runjournal-events.jsonl")
                && bytes
                    .windows(b"secret-task-text".len())
                    .any(|window| window == b"secret-task-text")
        })
        .map(|(path, _)| path)
        .collect();
    assert_eq!(showing, Vec::<&PathBuf>::new(), "files showing the task");
    assert_eq!(runs[secret.as_str()]["result"]["results"][0]["agent"], "sh");
    // The proof of a run whose runner's exit was seen (by its launcher, which waited) holds
    // that exit and each step's process as a writer whose process group was seen empty, as
    // pi-subagents' runner proves its own. Where nobody could see the runner's exit (its
    // launcher returned at once), the proof is unknown, with pi-subagents' reason.
    assert_eq!(
        runs[waited.as_str()]["proof"],
        serde_json::json!({
            "state": "observed",
            "reason": null,
            "kinds": ["runner", "pi-writer", "pi-writer"],
            "trees": ["observed", "observed"],
        }),
        "{waited}"
    );
    assert_eq!(
        runs[single.as_str()]["proof"],
        serde_json::json!({"state": "unknown", "reason": "observer-unavailable", "kinds": [], "trees": []})
    );
    // What pi-subagents hands the launching agent: each step's output.
    let result_of = |run: &str| runs[run]["result"].clone();
    let single_result = result_of(&single);
    assert_eq!(
        single_result["results"][0]["output"], "the-answer-is-42",
        "{single_result}"
    );
    assert_eq!(single_result["results"][0]["outputState"], "present");
    // Its agent is its program: the command's text, the task, is not shown (pi-subagents'
    // redaction).
    assert_eq!(single_result["summary"], "sh:\nthe-answer-is-42");
    // The markdown log pi-subagents' runner leaves of an ended run, in its layout.
    let log_of = |run: &str| {
        std::fs::read_to_string(
            root.join("async-subagent-runs")
                .join(run)
                .join(format!("subagent-log-{run}.md")),
        )
        .expect("the run's log")
    };
    let chain_log = log_of(&chain);
    for line in [
        format!("# Subagent run {chain}\n\n- **Mode:** chain\n").as_str(),
        "## Steps\n| Step | Agent | Status | Duration |\n| --- | --- | --- | --- |\n",
        "| 2 | sh | failed | ",
        "| 3 | sh | skipped | - |\n",
        "## Summary\n",
    ] {
        assert!(chain_log.contains(line), "{line:?} in:\n{chain_log}");
    }
    assert!(
        log_of(&long).contains("## Summary\n_Output truncated_\n\n[TRUNCATED: "),
        "{}",
        log_of(&long)
    );
    let chain_result = result_of(&chain);
    let chain_outputs: Vec<(&str, &str)> = chain_result["results"]
        .as_array()
        .expect("results")
        .iter()
        .map(|step| {
            (
                step["output"].as_str().expect("output"),
                step["outputState"].as_str().expect("outputState"),
            )
        })
        .collect();
    assert_eq!(
        chain_outputs,
        [("a", "present"), ("", "absent"), ("", "absent")],
        "{chain_result}"
    );
    let paused_result = result_of(&paused);
    assert_eq!(
        paused_result["summary"],
        "Paused after interrupt. Waiting for explicit next action."
    );
    assert_eq!(
        runs[paused.as_str()]["read"]["steps"],
        serde_json::json!(["complete", "paused"]),
        "{paused_result}"
    );
    // The paused run and the run that carries it on name each other in status.json.
    let status_of = |run: &str| -> serde_json::Value {
        let path = root
            .join("async-subagent-runs")
            .join(run)
            .join("status.json");
        serde_json::from_slice(&std::fs::read(path).expect("status.json")).expect("JSON")
    };
    assert_eq!(status_of(&paused)["resumedBy"], resumed.as_str());
    assert_eq!(status_of(&resumed)["resumedFrom"], paused.as_str());
    assert_eq!(
        runs[resumed.as_str()]["read"]["steps"],
        serde_json::json!(["complete"]),
        "the resumed run runs the interrupted step only"
    );
    // The directory the run ran in (the launcher's), and whether its summary was cut.
    assert_eq!(
        single_result["cwd"],
        std::env::current_dir()
            .expect("a current directory")
            .display()
            .to_string(),
        "{single_result}"
    );
    assert_eq!(single_result["truncated"], false, "{single_result}");
    let long_result = result_of(&long);
    assert_eq!(long_result["truncated"], true, "{long_result}");
    assert!(
        long_result["summary"]
            .as_str()
            .is_some_and(|summary| summary.starts_with("[TRUNCATED: showing first 5000 of ")),
        "{long_result}"
    );
    // pi-subagents' runner writes 1 for every end but a completed or paused run, and sums up
    // a stop and a timeout in its own words; each step keeps its own exit code.
    assert_eq!(single_result["exitCode"], 0, "{single_result}");
    assert_eq!(paused_result["exitCode"], 0, "{paused_result}");
    assert_eq!(chain_result["exitCode"], 1, "{chain_result}");
    assert_eq!(chain_result["results"][1]["exitCode"], 3, "{chain_result}");
    let stopped_result = result_of(&stopped);
    assert_eq!(
        (
            &stopped_result["exitCode"],
            &stopped_result["summary"],
            &stopped_result["error"],
            &stopped_result["stopped"],
        ),
        (
            &serde_json::json!(1),
            &serde_json::json!("Subagent stopped by user."),
            &serde_json::json!("Subagent stopped by user."),
            &serde_json::json!(true),
        ),
        "{stopped_result}"
    );
    let signalled_result = result_of(&signalled);
    assert_eq!(
        (
            &signalled_result["state"],
            &signalled_result["exitCode"],
            &signalled_result["summary"],
            &signalled_result["error"],
            &signalled_result["results"][0]["exitCode"],
        ),
        (
            &serde_json::json!("stopped"),
            &serde_json::json!(1),
            &serde_json::json!("Subagent process terminated by signal SIGKILL."),
            &serde_json::json!("Subagent process terminated by signal SIGKILL."),
            &serde_json::json!(137),
        ),
        "{signalled_result}"
    );
    let timed_out_result = result_of(&timed_out);
    assert_eq!(
        (
            &timed_out_result["exitCode"],
            &timed_out_result["summary"],
            &timed_out_result["error"],
            &timed_out_result["timedOut"],
        ),
        (
            &serde_json::json!(1),
            &serde_json::json!("Subagent timed out after 1000ms."),
            &serde_json::json!("Subagent timed out after 1000ms."),
            &serde_json::json!(true),
        ),
        "{timed_out_result}"
    );
    let idle_result = result_of(&idle);
    assert_eq!(idle_result["exitCode"], 1, "{idle_result}");
    assert_eq!(idle_result["results"][0]["exitCode"], 124, "{idle_result}");
    assert_eq!(idle_result["results"][0]["success"], false, "{idle_result}");
    assert!(
        idle_result["summary"]
            .as_str()
            .is_some_and(|summary| summary.contains("idle for 1s")),
        "{idle_result}"
    );
    let listed = |name: &str| -> BTreeMap<String, String> {
        report["listed"][name]
            .as_array()
            .unwrap_or_else(|| panic!("listing {name}: {}", report["listed"][name]))
            .iter()
            .map(|run| {
                (
                    run["id"].as_str().expect("id").to_string(),
                    run["state"].as_str().expect("state").to_string(),
                )
            })
            .collect()
    };
    let all: BTreeMap<String, String> = expected
        .iter()
        .map(|(run, state)| (run.clone(), state.to_string()))
        .collect();
    assert_eq!(listed("default"), all, "the default listing (its indexes)");
    assert_eq!(listed("session"), all, "the session's listing");
    assert_eq!(
        listed("repairScan"),
        all,
        "a full scan of the run directories"
    );
    let mut active = BTreeMap::from([(running.clone(), "running".to_string())]);
    active.extend(queued.iter().map(|run| (run.clone(), "queued".to_string())));
    assert_eq!(
        listed("activeForSession"),
        active,
        "what a restarted host restores"
    );
    let changed = changed_files(&before, &after);
    assert!(
        changed.is_empty(),
        "pi-subagents changed files, so it repaired something: {changed:?}"
    );
    // Nothing waits once the delayed run is stopped: the home's timer exits.
    runjournal(&root)
        .args(["stop", &delayed])
        .assert()
        .success();
}

#[test]
fn the_default_root_is_the_one_pi_subagents_computes() {
    let Some(install) = pi_subagents() else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    // macOS's per-user TMPDIR ends in a slash, which both must drop.
    let tmpdir = PathBuf::from(format!("{}/", dir.path().display()));
    let report = read_with_pi_subagents(&install, &[("TMPDIR", &tmpdir)], &["--temp-root"]);
    let theirs = PathBuf::from(report["tempRoot"].as_str().expect("tempRoot"));
    let uid = nix::unistd::getuid().as_raw();
    let ours = pi_subagents_default_root(
        |name| (name == "TMPDIR").then(|| tmpdir.clone().into_os_string()),
        uid,
    );
    assert_eq!(ours, theirs);
    // And the binary, given neither --home nor PI_SUBAGENTS_TEMP_ROOT, makes its home there.
    assert_cmd::cargo::cargo_bin_cmd!("runjournal")
        .env_remove("RUNJOURNAL_HOME")
        .env_remove("PI_SUBAGENTS_TEMP_ROOT")
        .env_remove("TMP")
        .env_remove("TEMP")
        .env("TMPDIR", &tmpdir)
        .env("RUNJOURNAL_LAYOUT", "pi-subagents")
        .env("RUNJOURNAL_RESERVE_BYTES", "0")
        .args(["list", "--json"])
        .timeout(Duration::from_secs(120))
        .assert()
        .success();
    assert!(theirs.join("runjournal/journal.redb").is_file());
    assert!(theirs.join("async-subagent-runs").is_dir());
}
