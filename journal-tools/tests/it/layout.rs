//! journal-tools on a home in the pi-subagents layout (`--layout`, `RUNJOURNAL_LAYOUT`).

use runjournal::home::Layout;

use crate::common::{fixture_in, tool, tool_at};

#[test]
fn a_pi_subagents_home_is_inspected_verified_and_replayed_under_its_layout() {
    let fixture = fixture_in(Layout::PiSubagents);
    assert!(
        fixture.root().join("runjournal/journal.redb").is_file(),
        "the journal is under runjournal/"
    );
    tool_at(&fixture, &["--layout", "pi-subagents", "inspect", "verify"])
        .assert()
        .success();
    tool_at(
        &fixture,
        &["--layout", "pi-subagents", "replay", "--all", "--check"],
    )
    .assert()
    .success();
    let output = tool_at(&fixture, &["inspect", "runs"])
        .env("RUNJOURNAL_LAYOUT", "pi-subagents")
        .output()
        .expect("runs");
    assert!(output.status.success(), "{output:?}");
    let listed = String::from_utf8_lossy(&output.stdout);
    for run in [fixture.failed, fixture.complete, fixture.running] {
        assert!(listed.contains(&run.to_string()), "{listed}");
    }
}

#[test]
fn the_wrong_layout_is_refused_and_names_the_right_one() {
    let fixture = fixture_in(Layout::PiSubagents);
    let output = tool_at(&fixture, &["inspect", "runs"])
        .output()
        .expect("runs");
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--layout pi-subagents"), "{stderr}");
    assert!(
        !fixture.root().join("journal.redb").exists(),
        "nothing is made under the wrong layout"
    );
    let output = tool()
        .args(["--layout", "pi"])
        .arg("--home")
        .arg(fixture.root())
        .args(["inspect", "runs"])
        .output()
        .expect("runs");
    assert_eq!(
        output.status.code(),
        Some(2),
        "an unknown layout is bad usage"
    );
}

#[test]
fn replay_out_writes_a_directory_in_the_sources_layout() {
    let fixture = fixture_in(Layout::PiSubagents);
    let out = tempfile::tempdir().expect("temp dir");
    let target = out.path().join("copy");
    tool_at(
        &fixture,
        &["--layout", "pi-subagents", "replay", "--all", "--out"],
    )
    .arg(&target)
    .assert()
    .success();
    for run in [fixture.failed, fixture.complete, fixture.running] {
        let status = target
            .join("async-subagent-runs")
            .join(run.to_string())
            .join("status.json");
        assert!(status.is_file(), "{}", status.display());
    }
    assert!(
        target
            .join("async-subagent-results")
            .join(format!("{}.json", fixture.complete))
            .is_file()
    );
}
