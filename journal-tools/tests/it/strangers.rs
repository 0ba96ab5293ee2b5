//! Strangers for journal-tools: a home others may write is refused (exit 1, naming
//! the path and the fix), and hostile text from a run is shown escaped.

use crate::common;

use std::os::unix::fs::PermissionsExt;

use common::{run, tool, tool_at};
use runjournal::event::{Event, ExternalJobStatus, HostIds, JobState, Mode, RunSpec};
use runjournal::testkit::{identity, provider, runner_started, spec, step, step_running};
use runjournal::{Condition, Home, Store};

#[test]
fn a_home_others_may_write_is_refused_with_exit_1() {
    let fixture = common::fixture();
    for path in [
        fixture.root().to_path_buf(),
        fixture.root().join("runs"),
        fixture.journal_path(),
    ] {
        let mode = std::fs::metadata(&path).expect("stat").permissions().mode();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode | 0o022))
            .expect("chmod");
        for args in [
            &["inspect", "runs"][..],
            &["inspect", "verify"],
            &["replay"],
        ] {
            let ran = run(tool_at(&fixture, args));
            assert_eq!(ran.code, 1, "{args:?}: {}", ran.stderr);
            assert!(
                ran.stderr
                    .contains(&format!("chmod go-w {}", path.display())),
                "{args:?}: {}",
                ran.stderr
            );
        }
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).expect("chmod");
    }
    let ran = run(tool_at(&fixture, &["inspect", "runs"]));
    assert_eq!(ran.code, 0, "private again: {}", ran.stderr);
}

/// A directory above the home that others may write (and that is not sticky) is refused as
/// the home itself would be: whoever may write it could swap the home.
#[test]
fn a_home_under_a_directory_others_may_write_is_refused_with_exit_1() {
    let fixture = common::fixture();
    let parent = fixture.dir.path();
    let mode = std::fs::metadata(parent)
        .expect("stat")
        .permissions()
        .mode();
    std::fs::set_permissions(parent, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    for args in [
        &["inspect", "runs"][..],
        &["inspect", "verify"],
        &["replay"],
    ] {
        let ran = run(tool_at(&fixture, args));
        assert_eq!(ran.code, 1, "{args:?}: {}", ran.stderr);
        assert!(
            ran.stderr.contains(&format!(
                "{}, a directory above the home, is writable by its group and others",
                parent.display()
            )),
            "{args:?}: {}",
            ran.stderr
        );
    }
    std::fs::set_permissions(parent, std::fs::Permissions::from_mode(mode)).expect("chmod");
    let ran = run(tool_at(&fixture, &["inspect", "runs"]));
    assert_eq!(ran.code, 0, "private again: {}", ran.stderr);
}

#[test]
fn an_empty_home_is_a_usage_error() {
    let ran = run({
        let mut command = tool();
        command.args(["--home", "", "inspect", "runs"]);
        command
    });
    assert_eq!(ran.code, 2, "{}", ran.stderr);
}

/// A run whose name, step name, provider message and control request carry escape sequences
/// is shown with them escaped by every human output; JSON Lines stay serde's.
#[test]
fn hostile_text_is_shown_escaped() {
    let dir = tempfile::tempdir().expect("temp dir");
    let home = Home::at(dir.path().join("home"));
    let store = Store::open(home.clone()).expect("the home opens");
    let run = store
        .create_run(
            RunSpec {
                name: Some("\u{1b}]2;owned\u{7}".to_string()),
                ..spec(
                    Mode::Single,
                    vec![step("\u{1b}[2J wipe", provider("deployer"))],
                )
            },
            HostIds::default(),
        )
        .expect("create")
        .run;
    store
        .append(
            run,
            vec![
                runner_started(identity(7), "i"),
                step_running(0, Some(identity(7))),
                Event::ExternalJobUpdated {
                    step: 0,
                    job: ExternalJobStatus {
                        state: JobState::Running,
                        id: None,
                        progress: None,
                        message: Some("\u{9b}31m red \u{202e}desrever".to_string()),
                        url: None,
                    },
                },
                Event::ControlRequested {
                    action: runjournal::event::ControlAction::Stop,
                    by: "\u{1b}[1A".to_string(),
                    reason: "why\r\n".to_string(),
                },
            ],
            Condition::none(),
        )
        .expect("append");
    drop(store);
    let run_text = run.to_string();
    for args in [
        &["inspect", "runs"][..],
        &["inspect", "run", &run_text],
        &["inspect", "events"],
        &["inspect", "verify"],
    ] {
        let mut command = tool();
        command.arg("--home").arg(home.root()).args(args);
        let output = command.output().expect("runs");
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            !output.stdout.contains(&0x1b)
                && !output.stdout.contains(&0x07)
                && !output.stdout.contains(&b'\r')
                && !stdout.contains('\u{9b}')
                && !stdout.contains('\u{202e}'),
            "{args:?}: {stdout}"
        );
        match args[1] {
            "runs" | "run" => {
                assert!(
                    stdout.contains("\\x1b"),
                    "{args:?}: escaped visibly: {stdout}"
                );
            }
            // An event's fields are shown as JSON values, escaped as serde escapes them; what
            // JSON leaves raw (C1 controls, bidirectional overrides) is escaped on top.
            "events" => assert!(
                stdout.contains("\\u001b") && stdout.contains("\\u{202e}"),
                "{args:?}: {stdout}"
            ),
            _ => {}
        }
    }
    let mut command = tool();
    command
        .arg("--home")
        .arg(home.root())
        .args(["--json", "inspect", "events"]);
    let output = command.output().expect("runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains(r"\u001b]2;owned\u0007"),
        "JSON as serde writes it: {stdout}"
    );
}
