//! `examples/host.rs`, the host the README points a library user to, run as a user would run
//! it (`cargo run --example host`), against this build's `runjournal` binary.

use std::path::Path;
use std::process::Command;

#[test]
fn the_host_example_launches_follows_consumes_and_sees_its_run_pruned_by_maintain_alone() {
    let runjournal = Path::new(env!("CARGO_BIN_EXE_runjournal"));
    // The profile this suite was built in: the example is built in the same one, so it links
    // the library these tests built (no second build of it).
    let is_release = runjournal
        .parent()
        .and_then(Path::file_name)
        .is_some_and(|profile| profile == "release");
    let mut cargo = Command::new(env!("CARGO"));
    cargo
        .args(["run", "--quiet", "--example", "host", "--manifest-path"])
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"))
        .env("RUNJOURNAL_BIN", runjournal);
    // What cargo set for this test process describes this crate; a build script that asked to
    // be run again when such a variable changes (ring's does) would make the inner cargo
    // rebuild it, and the next outer build rebuild it again.
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        if name.starts_with("CARGO_PKG_")
            || name.starts_with("CARGO_BIN_EXE_")
            || [
                "CARGO_MANIFEST_DIR",
                "CARGO_MANIFEST_PATH",
                "CARGO_CRATE_NAME",
                "CARGO_PRIMARY_PACKAGE",
                "CARGO_TARGET_TMPDIR",
                "CARGO_RUSTC_CURRENT_DIR",
                "OUT_DIR",
            ]
            .contains(&name.as_ref())
        {
            cargo.env_remove(name.as_ref());
        }
    }
    if is_release {
        cargo.arg("--release");
    }
    let output = cargo.output().expect("running cargo");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the example failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    assert!(
        stdout.contains("ended complete") && stdout.contains("pruned by the policy after"),
        "the example said:\n{stdout}"
    );
}
