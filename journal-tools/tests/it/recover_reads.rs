//! `recover --from-projections` reads each run's events.jsonl as every file of a home is read:
//! a FIFO, a link or a file larger than the recovery's bound in its place is reported as the
//! reason that run is not rebuilt, at once, and the other runs are rebuilt.

use std::time::Duration;

use runjournal::recover::MAX_EVENTS_FILE_BYTES;

use crate::common::{Fixture, fixture, run, tool_at};

/// A bound on the whole command, so that a recovery that hangs fails the test (the command's
/// output cannot be had) instead of hanging it. Not a measure of speed.
const HANG_BOUND: Duration = Duration::from_secs(120);

/// The fixture with its journal emptied (lost) and `damage` done to the complete run's
/// events.jsonl; returns what `recover --from-projections` printed.
fn recover_with(fixture: &Fixture, damage: impl FnOnce(&std::path::Path)) -> crate::common::Ran {
    damage(&fixture.home.events_path(fixture.complete));
    std::fs::write(fixture.journal_path(), b"").expect("empty the journal");
    let mut command = tool_at(fixture, &["recover", "--from-projections"]);
    command.timeout(HANG_BOUND);
    run(command)
}

fn assert_only_complete_not_rebuilt(fixture: &Fixture, ran: &crate::common::Ran, reason: &str) {
    assert_eq!(ran.code, 1, "{}{}", ran.stdout, ran.stderr);
    assert!(
        ran.stdout
            .contains(&format!("not rebuilt: run {}: ", fixture.complete))
            && ran.stdout.contains(reason)
            && ran.stdout.contains("rebuilt 2 runs"),
        "{}{}",
        ran.stdout,
        ran.stderr
    );
}

#[test]
fn a_fifo_at_events_jsonl_is_refused_at_once_instead_of_hanging_recover() {
    let fixture = fixture();
    let ran = recover_with(&fixture, |events| {
        std::fs::remove_file(events).expect("remove events.jsonl");
        // Nobody ever opens it for writing: a blocking open for reading would wait forever.
        nix::unistd::mkfifo(events, nix::sys::stat::Mode::S_IRWXU).expect("mkfifo");
    });
    assert_only_complete_not_rebuilt(&fixture, &ran, "is a FIFO, not a regular file");
    let events = fixture.home.events_path(fixture.complete);
    assert!(
        std::fs::symlink_metadata(&events)
            .map(|metadata| {
                use std::os::unix::fs::FileTypeExt;
                metadata.file_type().is_fifo()
            })
            .expect("still there"),
        "the FIFO is left as it is"
    );
}

#[test]
fn a_link_at_events_jsonl_is_not_followed_by_recover() {
    let fixture = fixture();
    let ran = recover_with(&fixture, |events| {
        let elsewhere = events.with_file_name("elsewhere.jsonl");
        std::fs::rename(events, &elsewhere).expect("move events.jsonl away");
        std::os::unix::fs::symlink(&elsewhere, events).expect("a link in its place");
    });
    assert_only_complete_not_rebuilt(&fixture, &ran, "is a symbolic link");
}

/// A sparse file, so the test writes nothing near the bound. Its first lines are the run's
/// own, so it is the bound that refuses it, not a bad line.
#[test]
fn an_events_jsonl_over_the_bound_is_refused_before_it_is_read() {
    let fixture = fixture();
    let ran = recover_with(&fixture, |events| {
        std::fs::OpenOptions::new()
            .write(true)
            .open(events)
            .and_then(|file| file.set_len(MAX_EVENTS_FILE_BYTES + 1))
            .expect("grow events.jsonl past the bound");
    });
    assert_only_complete_not_rebuilt(
        &fixture,
        &ran,
        &format!("events.jsonl is larger than the {MAX_EVENTS_FILE_BYTES} bytes recovery reads"),
    );
}
