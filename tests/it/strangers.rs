//! Strangers (issue 13), with the real binary: a home someone else owns or may write, links
//! planted where runjournal writes, an empty `--home`. Tests that need root (a home of
//! another user) skip without it, and fail instead where `RUNJOURNAL_REQUIRE_ROOT_TESTS=1`.

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use common::{TestHome, run_id_of, wait_for, wait_terminal};
use runjournal::state::StepStatus;

const REQUIRE_ROOT_ENV: &str = "RUNJOURNAL_REQUIRE_ROOT_TESTS";

/// Whether this test may run as it needs root; prints why not, or fails when root tests are
/// required.
pub fn is_root(test: &str, why: &str) -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    assert!(
        std::env::var(REQUIRE_ROOT_ENV).as_deref() != Ok("1"),
        "{test} needs root and {REQUIRE_ROOT_ENV}=1 says root tests must run"
    );
    eprintln!("skipped {test}: needs root to {why}");
    false
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .unwrap_or_else(|error| panic!("chmod {mode:o} {}: {error}", path.display()));
}

/// A home with one finished run.
fn home_with_a_run() -> TestHome {
    let home = TestHome::new();
    let output = home
        .cmd()
        .args(["run", "--wait", "--json", "--step", "true"])
        .output()
        .expect("runs");
    assert!(output.status.success(), "{output:?}");
    home
}

/// Every command that opens the home refuses it with exit 1 and one line naming `path` and
/// `fix`.
fn every_command_refuses(home: &TestHome, path: &Path, fix: &str) {
    for args in [
        &["list"][..],
        &["status", "01ARZ3NDEKTSV4RRFFQ69G5FAV"],
        &["reconcile"],
        &["run", "--", "true"],
    ] {
        let output = home.cmd().args(args).output().expect("runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: one line: {stderr}");
        assert!(
            stderr.contains(&path.display().to_string()) && stderr.contains(fix),
            "{args:?}: {stderr} should name {} and say {fix:?}",
            path.display()
        );
    }
}

#[test]
fn a_home_others_may_write_is_refused_by_every_command() {
    let home = home_with_a_run();
    let runs = home.file("runs");
    let results = home.file("results");
    let journal = home.file("journal.redb");
    for (path, mode, private_mode) in [
        (home.path().to_path_buf(), 0o770, 0o700),
        (home.path().to_path_buf(), 0o707, 0o700),
        (runs, 0o777, 0o700),
        (results, 0o730, 0o700),
        (journal, 0o666, 0o600),
    ] {
        chmod(&path, mode);
        every_command_refuses(&home, &path, &format!("chmod go-w {}", path.display()));
        chmod(&path, private_mode);
    }
    let output = home.cmd().arg("list").output().expect("runs");
    assert!(
        output.status.success(),
        "private again, accepted: {output:?}"
    );
}

#[test]
fn a_refused_home_is_left_as_it_was() {
    let home = TestHome::new();
    chmod(home.path(), 0o777);
    let output = home
        .cmd()
        .args(["run", "--", "true"])
        .output()
        .expect("runs");
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let entries = std::fs::read_dir(home.path()).expect("list").count();
    assert_eq!(entries, 0, "nothing was made in a refused home");
    chmod(home.path(), 0o700);
}

#[test]
fn a_home_of_another_user_is_refused() {
    if !is_root(
        "a_home_of_another_user_is_refused",
        "give a home to another user",
    ) {
        return;
    }
    let home = home_with_a_run();
    // nobody
    let stranger = nix::unistd::Uid::from_raw(65534);
    for path in [home.file("runs"), home.file("journal.redb")] {
        nix::unistd::chown(&path, Some(stranger), None).expect("chown");
        every_command_refuses(&home, &path, "chown 0");
        nix::unistd::chown(&path, Some(nix::unistd::geteuid()), None).expect("chown back");
    }
    let output = home.cmd().arg("list").output().expect("runs");
    assert!(output.status.success(), "ours again, accepted: {output:?}");
}

#[test]
fn a_journal_that_is_a_link_is_refused() {
    let home = home_with_a_run();
    let elsewhere = home.file("elsewhere.redb");
    std::fs::rename(home.file("journal.redb"), &elsewhere).expect("move the journal");
    std::os::unix::fs::symlink(&elsewhere, home.file("journal.redb")).expect("link");
    every_command_refuses(&home, &home.file("journal.redb"), "symbolic link");
}

/// A link planted where a step's output log will be is not written through: the step fails
/// (its log cannot be opened), and the file the link points to is untouched.
#[test]
fn a_link_planted_as_a_step_log_is_not_written_through() {
    let home = TestHome::new();
    let victim = home.file("victim");
    std::fs::write(&victim, b"precious\n").expect("the victim file");
    let output = home
        .cmd()
        .args([
            "run",
            "--json",
            "--step",
            "sleep 2",
            "--step",
            "echo overwritten",
        ])
        .output()
        .expect("runs");
    assert!(output.status.success(), "{output:?}");
    let run = run_id_of(&output.stdout);
    let journal = home.journal();
    wait_for(&journal, run, "step 0 to run", |state| {
        state.steps[0].status == StepStatus::Running
    });
    let log = home.path().join(format!("runs/{run}/output-1.log"));
    std::os::unix::fs::symlink(&victim, &log).expect("plant a link");
    let state = wait_terminal(&journal, run);
    assert_eq!(std::fs::read(&victim).expect("read"), b"precious\n");
    assert!(
        std::fs::symlink_metadata(&log)
            .expect("lstat")
            .file_type()
            .is_symlink(),
        "the link is left for its owner to see"
    );
    assert_ne!(state.steps[1].status, StepStatus::Complete, "{state:?}");
}

#[test]
fn an_empty_home_is_bad_input_and_an_empty_variable_is_unset() {
    let cwd = tempfile::tempdir().expect("a directory to run in");
    let output = assert_cmd::cargo::cargo_bin_cmd!("runjournal")
        .current_dir(cwd.path())
        .env_remove("RUNJOURNAL_HOME")
        .args(["--home", "", "list"])
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--home"), "{stderr}");
    assert_eq!(
        std::fs::read_dir(cwd.path()).expect("list").count(),
        0,
        "nothing was made in the current directory"
    );

    let state = tempfile::tempdir().expect("XDG_STATE_HOME");
    let output = assert_cmd::cargo::cargo_bin_cmd!("runjournal")
        .current_dir(cwd.path())
        .env("RUNJOURNAL_HOME", "")
        .env("XDG_STATE_HOME", state.path())
        .arg("list")
        .output()
        .expect("runs");
    assert!(output.status.success(), "{output:?}");
    assert!(
        state.path().join("runjournal/journal.redb").is_file(),
        "an empty RUNJOURNAL_HOME counts as unset"
    );
    assert_eq!(std::fs::read_dir(cwd.path()).expect("list").count(), 0);
}
