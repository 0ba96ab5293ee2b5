//! The home's scrub: every page checked on a schedule, not at every open. A byte flipped in a
//! page no command reads goes unnoticed by the commands and is found by the next scheduled
//! scrub, which a maintenance pass starts; from then on every command says the journal is
//! damaged (exit 4, naming `recover --from-projections`), and a rebuilt journal is used again.
//! A scrub's memory stays bounded whatever the journal's size.

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use runjournal::journal::{Creation, Journal};
use runjournal::run_env::{RunEnvironment, RunPrivate};
use runjournal::scrub::{ScrubOutcome, ScrubRecord, damage_marker_path};
use runjournal::testkit::{shell, spec};

use crate::support::TestHome;

/// A value no command shows or reads: the kept environment of a run that has ended.
const SECRET: &str = "scrub-test-secret-value-nobody-reads-0123456789abcdefghijklmnopqrstuvwxyz";

fn scrub_json(home: &TestHome) -> ScrubRecord {
    let output = home
        .cmd()
        .args(["scrub", "--json"])
        .output()
        .expect("scrub");
    assert!(output.status.success(), "{output:?}");
    serde_json::from_slice(&output.stdout).expect("a scrub record")
}

/// Flips one bit of every copy of `needle` in the file.
fn flip_every(path: &Path, needle: &[u8]) -> usize {
    let mut bytes = std::fs::read(path).expect("read the journal");
    let positions: Vec<usize> = bytes
        .windows(needle.len())
        .enumerate()
        .filter(|(_, window)| *window == needle)
        .map(|(at, _)| at + needle.len() / 2)
        .collect();
    for &at in &positions {
        bytes[at] ^= 0x01;
    }
    std::fs::write(path, &bytes).expect("write the damaged journal");
    positions.len()
}

fn list(home: &TestHome) -> Output {
    home.cmd().arg("list").output().expect("list")
}

#[test]
fn a_flipped_byte_no_command_reads_is_found_by_the_next_scheduled_scrub() {
    let home = TestHome::new();
    let launched = home
        .cmd()
        .env("SCRUB_SECRET", SECRET)
        .args(["run", "--wait", "--name", "kept", "--", "true"])
        .output()
        .expect("run");
    assert!(launched.status.success(), "{launched:?}");
    let first = scrub_json(&home);
    assert_eq!(first.outcome, ScrubOutcome::Clean, "{first:?}");
    assert!(first.bytes > 0, "it says what it covered: {first:?}");
    let journal = home.file("journal.redb");
    assert!(
        flip_every(&journal, SECRET.as_bytes()) > 0,
        "the value is in the journal"
    );

    // Commands never read that page: they answer as before. (No scrub is due: the last was
    // just now, and the interval is a day.)
    let before = list(&home);
    assert!(
        before.status.success(),
        "list does not read the flipped page (pick another): {before:?}"
    );
    assert!(!damage_marker_path(&journal).exists());

    // Due every second from now on: once due, the next command's maintenance starts the scrub,
    // which finds the page.
    let set = home
        .cmd()
        .args(["scrub", "--every", "1s"])
        .output()
        .expect("scrub --every");
    assert!(set.status.success(), "{set:?}");
    std::thread::sleep(Duration::from_millis(1100));
    let started = Instant::now();
    let damaged = loop {
        let output = list(&home);
        if output.status.code() == Some(4) {
            break output;
        }
        assert!(output.status.success(), "{output:?}");
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no scheduled scrub found the damage within 60 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let stderr = String::from_utf8_lossy(&damaged.stderr);
    assert!(
        stderr.contains("scrub") && stderr.contains("recover --from-projections"),
        "every command says the scrub found damage, and what to run: {stderr}"
    );
    assert!(damage_marker_path(&journal).exists());
    // The other commands say the same, without looking again.
    let status = home
        .cmd()
        .args(["status", "kept"])
        .output()
        .expect("status");
    assert_eq!(status.status.code(), Some(4), "{status:?}");
    // The finding is in the journal too (read around the marker, as the tools do on a copy).
    let copy = home.input("copy.redb");
    std::fs::copy(&journal, &copy).expect("copy the journal");
    let reader = Journal::open(&copy).expect("the copy opens");
    let view = reader.view().expect("view");
    let last = runjournal::scrub::last(&view)
        .expect("read")
        .expect("a record");
    assert!(
        matches!(last.outcome, ScrubOutcome::Damaged { .. }),
        "{last:?}"
    );

    // A journal rebuilt from the projections is another file: the marker names the old one.
    // (The library's recovery: what `journal-tools recover --from-projections` runs.)
    runjournal::recover::recover_from_projections(&runjournal::Home::at(home.path()))
        .expect("the journal is rebuilt from the projections");
    let after = list(&home);
    assert!(after.status.success(), "{after:?}");
    assert!(String::from_utf8_lossy(&after.stdout).contains("kept"));
}

/// The peak resident memory of `runjournal ARGS`, in KiB: measured by a parent of its own, so
/// that nothing else this test binary runs is counted.
fn peak_rss_kib(home: &Path, args: &[&str]) -> u64 {
    let script = "import resource, subprocess, sys\n\
                  code = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL).returncode\n\
                  print(code, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)";
    let output = Command::new("python3")
        .args(["-c", script, env!("CARGO_BIN_EXE_runjournal"), "--home"])
        .arg(home)
        .args(args)
        .env_remove("RUNJOURNAL_HOME")
        .env_remove("RUNJOURNAL_LAYOUT")
        .output()
        .expect("python3 runs");
    let text = String::from_utf8_lossy(&output.stdout);
    let mut fields = text.split_whitespace();
    let code: i32 = fields
        .next()
        .and_then(|f| f.parse().ok())
        .expect("an exit code");
    assert_eq!(code, 0, "runjournal {args:?}: {output:?}");
    fields.next().and_then(|f| f.parse().ok()).expect("a peak")
}

/// Runs of `vars` variables of `bytes` each, kept with each run (the journal's largest values).
fn big_runs(journal: &Journal, runs: usize, vars: usize, bytes: usize) {
    for index in 0..runs {
        let value = vec![b'a' + (index % 26) as u8; bytes];
        let env = RunEnvironment {
            vars: (0..vars)
                .map(|var| (format!("VAR{var}").into_bytes(), value.clone()))
                .collect(),
            cwd: None,
            umask: None,
        };
        journal
            .create(Creation {
                spec: spec(runjournal::event::Mode::Single, vec![shell("s", "true")]),
                hosts: Default::default(),
                more: Vec::new(),
                private: Some(RunPrivate {
                    env: Some(env),
                    on_exit: Vec::new(),
                }),
            })
            .expect("a run is created");
    }
}

/// The whole journal read into memory at every open, as a build did, would cost its size; the
/// scrub that replaced it costs a journal handle's cache whatever the size.
#[test]
fn a_scrub_of_a_large_journal_stays_within_64_mib_and_commands_do_not_grow_with_it() {
    const LIMIT_KIB: u64 = 64 << 10;
    let small = TestHome::new();
    let large = TestHome::new();
    for home in [&small, &large] {
        let output = home.cmd().arg("list").output().expect("list");
        assert!(output.status.success(), "{output:?}");
    }
    // The same runs in both homes, their kept environments of 240 KB each in the large one
    // (a journal of about 300 MB) and of 16 bytes in the small one.
    big_runs(&large.journal(), 640, 6, 40 << 10);
    big_runs(&small.journal(), 640, 1, 16);
    let size = std::fs::metadata(large.file("journal.redb"))
        .expect("journal")
        .len();
    assert!(size > 150 << 20, "a large journal: {size} bytes");

    let scrubbed = peak_rss_kib(large.path(), &["scrub"]);
    eprintln!("scrub of {size} bytes: peak {scrubbed} KiB");
    assert!(
        scrubbed <= LIMIT_KIB,
        "a scrub of {size} bytes peaked at {scrubbed} KiB, over {LIMIT_KIB} KiB"
    );
    // `list` costs what the runs cost, not the journal's bytes: the same in both homes, give or
    // take redb's bookkeeping of a larger file (a few MiB), never the 300 MB a read of the
    // whole file costs (the first list in each closes its runs, which never had a runner).
    for home in [&small, &large] {
        let output = home.cmd().arg("list").output().expect("list");
        assert!(output.status.success(), "{output:?}");
    }
    let listed_small = peak_rss_kib(small.path(), &["list"]);
    let listed_large = peak_rss_kib(large.path(), &["list"]);
    eprintln!("list: {listed_small} KiB small, {listed_large} KiB large");
    assert!(
        listed_large <= listed_small + (16 << 10),
        "list: {listed_large} KiB in a {size}-byte journal against {listed_small} KiB in a small one"
    );
}
