//! The control inbox read as input: pi-subagents' request files parsed as its own reader
//! parses them, every other entry refused with its reason and never followed, and what each
//! asks decided from the run's state.

use super::*;
use crate::event::{FORMAT_VERSION, HostIds, Mode, Record, WriterId};
use crate::home::Layout;
use crate::testkit as kit;

const RUN: RunId = RunId::from_bytes([6; 16]);

fn home() -> (tempfile::TempDir, Home) {
    let dir = tempfile::tempdir().expect("temp dir");
    let home = Home::in_layout(dir.path(), Layout::PiSubagents);
    std::fs::create_dir_all(home.run_dir(RUN)).expect("the run's directory");
    (dir, home)
}

fn state_of(spec: crate::event::RunSpec, events: Vec<Event>) -> RunState {
    let all: Vec<Event> = std::iter::once(kit::created(spec, 1, HostIds::default()))
        .chain(events)
        .collect();
    let records: Vec<Record> = all
        .into_iter()
        .enumerate()
        .map(|(index, event)| Record {
            format_version: FORMAT_VERSION,
            run_id: RUN,
            seq: index as u64 + 1,
            time_ms: 10 + index as u64,
            writer: WriterId(1),
            writer_seq: index as u64 + 1,
            event,
        })
        .collect();
    crate::state::replay(&records)
        .expect("a legal life")
        .expect("records")
}

fn running_chain() -> RunState {
    state_of(
        kit::chain_spec(2),
        vec![
            kit::runner_started(kit::identity(7), "i1"),
            kit::step_running(0, None),
        ],
    )
}

fn parse_in(place: Place, name: &str, json: &str) -> Result<Request, String> {
    parse(place, OsStr::new(name), json.as_bytes())
}

/// What `requestAsyncStop`, `requestAsyncInterrupt`, `requestAsyncTimeout` and
/// `requestAsyncSteer` of pi-subagents 0.67 write (their payloads, pretty-printed as its
/// `writeAtomicJson` does) is what they mean here.
#[test]
fn pi_subagents_requests_read_as_what_they_ask() {
    let stop = parse_in(
        Place::StopRequests,
        "0001700000000000-u.json",
        "{\n  \"source\": \"tui\",\n  \"reason\": \"user pressed x\",\n  \"ts\": 1700000000000,\n  \"type\": \"stop\"\n}",
    );
    assert_eq!(
        stop,
        Ok(Request::Control {
            action: ControlAction::Stop,
            by: "tui through control/stop-requests/0001700000000000-u.json".to_string(),
            reason: "user pressed x (requested at 1700000000000, Unix ms)".to_string(),
        })
    );
    // With a targetIndex, as `requestAsyncStop` writes a stop of one child.
    let one_step = parse_in(
        Place::StopRequests,
        "0001700000000000-c.json",
        "{\n  \"targetIndex\": 1,\n  \"childId\": \"1\",\n  \"ts\": 1700000000000,\n  \"type\": \"stop\"\n}",
    );
    assert_eq!(
        one_step,
        Ok(Request::StepStop {
            step: 1,
            by: "a host through control/stop-requests/0001700000000000-c.json".to_string(),
            reason: "stop requested through the run's control inbox (requested at 1700000000000, Unix ms)".to_string(),
        })
    );
    let Ok(Request::Control { action, by, reason }) = parse_in(
        Place::Inbox,
        "interrupt.json",
        r#"{"ts": 5, "type": "interrupt"}"#,
    ) else {
        panic!("an interrupt");
    };
    assert_eq!(action, ControlAction::Interrupt);
    assert_eq!(by, "a host through control/interrupt.json");
    assert!(reason.contains("requested at 5"), "{reason}");
    assert!(matches!(
        parse_in(Place::Inbox, "timeout.json", r#"{"type": "timeout"}"#),
        Ok(Request::Control {
            action: ControlAction::Timeout,
            ..
        })
    ));
    let steer = parse_in(
        Place::SteerRequests,
        "0001700000000000-aWQ.json",
        r#"{"type":"steer","id":"id-1","ts":1700000000000,"message":"  look at the tests  ","mode":"follow_up","targetIndexes":[0,2],"source":"tui"}"#,
    );
    assert_eq!(
        steer,
        Ok(Request::Steer {
            id: "id-1".to_string(),
            steps: Some(vec![0, 2]),
            mode: SteerMode::FollowUp,
            message: "look at the tests".to_string(),
            source: "tui".to_string(),
        })
    );
    assert!(matches!(
        parse_in(
            Place::SteerRequests,
            "x.json",
            r#"{"type":"steer","id":"i","ts":1,"message":"m"}"#
        ),
        Ok(Request::Steer {
            steps: None,
            mode: SteerMode::Steer,
            ..
        })
    ));
}

#[test]
fn a_malformed_request_is_refused_saying_why() {
    let cases = [
        (Place::StopRequests, "a.json", "{not json", "not JSON"),
        (Place::StopRequests, "a.json", "[1]", "not a JSON object"),
        (
            Place::StopRequests,
            "a.json",
            r#"{"type":"interrupt"}"#,
            "type is not \"stop\"",
        ),
        (
            Place::StopRequests,
            "a.json",
            r#"{"type":"stop","targetIndex":-1}"#,
            "not a step index",
        ),
        (
            Place::StopRequests,
            "a.json",
            r#"{"type":"stop","targetIndex":1000001}"#,
            "not a step index",
        ),
        (
            Place::Inbox,
            "interrupt.json",
            r#"{"type":"interrupt","targetIndex":0}"#,
            "names no step",
        ),
        (
            Place::SteerRequests,
            "a.json",
            r#"{"type":"steer","id":"a b","ts":1,"message":"m"}"#,
            "no id",
        ),
        (
            Place::SteerRequests,
            "a.json",
            r#"{"type":"steer","id":"i","message":"m"}"#,
            "no time",
        ),
        (
            Place::SteerRequests,
            "a.json",
            r#"{"type":"steer","id":"i","ts":1,"message":"   "}"#,
            "no message",
        ),
        (
            Place::SteerRequests,
            "a.json",
            r#"{"type":"steer","id":"i","ts":1,"message":"m","mode":"loud"}"#,
            "mode",
        ),
        (
            Place::SteerRequests,
            "a.json",
            r#"{"type":"steer","id":"i","ts":1,"message":"m","targetIndexes":[]}"#,
            "malformed",
        ),
        (
            Place::SteerRequests,
            "a.json",
            r#"{"type":"steer","id":"i","ts":1,"message":"m","targetIndex":-1}"#,
            "no step",
        ),
    ];
    for (place, name, json, why) in cases {
        let error = parse_in(place, name, json).expect_err(json);
        assert!(error.contains(why), "{json}: {error}");
    }
    let long = format!(
        r#"{{"type":"steer","id":"i","ts":1,"message":"{}"}}"#,
        "x".repeat(crate::event::MAX_STEER_MESSAGE_BYTES + 1)
    );
    let error = parse_in(Place::SteerRequests, "a.json", &long).expect_err("too long");
    assert!(error.contains("over the limit"), "{error}");
}

/// A link, a directory, a FIFO, another user's file and an oversized file in the inbox are
/// each refused with a reason, none followed or waited on; a file being written (a dot file)
/// and a file of another name are left alone.
#[test]
fn what_is_not_a_request_file_is_refused_and_never_followed() {
    let (_dir, home) = home();
    prepare(&home, RUN);
    let stops = home.stop_requests_dir(RUN);
    let outside = home.root().join("outside.json");
    std::fs::write(&outside, r#"{"type":"stop"}"#).expect("write");
    std::os::unix::fs::symlink(&outside, stops.join("link.json")).expect("symlink");
    std::fs::create_dir(stops.join("dir.json")).expect("mkdir");
    nix::unistd::mkfifo(
        &stops.join("fifo.json"),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .expect("fifo");
    std::fs::write(
        stops.join("big.json"),
        vec![b' '; MAX_REQUEST_FILE_BYTES as usize + 1],
    )
    .expect("write");
    std::fs::write(stops.join("ok.json"), r#"{"type":"stop"}"#).expect("write");
    std::fs::write(stops.join(".ok.json.1.2.tmp"), "partial").expect("write");
    std::fs::write(stops.join("notes.txt"), "hello").expect("write");
    let is_root = nix::unistd::geteuid().is_root();
    if is_root {
        let theirs = stops.join("theirs.json");
        std::fs::write(&theirs, r#"{"type":"stop"}"#).expect("write");
        std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).expect("chown");
    }
    let found = scan(&home, RUN, &mut Settling::default());
    let outcome = |name: &str| -> Result<Request, String> {
        found
            .iter()
            .find(|found| found.name == name)
            .unwrap_or_else(|| panic!("{name} found: {found:?}"))
            .request
            .clone()
    };
    for (name, why) in [
        ("link.json", "symbolic link"),
        ("dir.json", "not a regular file"),
        ("fifo.json", "not a regular file"),
        ("big.json", "over the limit"),
    ] {
        let error = outcome(name).expect_err(name);
        assert!(error.contains(why), "{name}: {error}");
    }
    if is_root {
        let error = outcome("theirs.json").expect_err("another user's");
        assert!(error.contains("belongs to uid 65534"), "{error}");
    }
    assert!(outcome("ok.json").is_ok());
    assert!(
        found
            .iter()
            .all(|found| found.name != ".ok.json.1.2.tmp" && found.name != "notes.txt"),
        "{found:?}"
    );

    // Refused and moved aside: the link itself, never what it points to.
    let link = found
        .iter()
        .find(|found| found.name == "link.json")
        .expect("the link");
    settle(&home, RUN, link, Settle::Refused).expect("moved aside");
    assert!(outside.exists(), "what the link pointed to is untouched");
    assert!(!stops.join("link.json").exists());
    let aside: Vec<_> = std::fs::read_dir(home.control_refused_dir(RUN))
        .expect("refused/")
        .map(|entry| entry.expect("entry").file_name())
        .collect();
    assert_eq!(aside.len(), 1);
    assert!(
        aside[0].to_string_lossy().ends_with("link.json"),
        "{aside:?}"
    );
    let ok = found
        .iter()
        .find(|found| found.name == "ok.json")
        .expect("ok");
    settle(&home, RUN, ok, Settle::Taken).expect("removed");
    assert!(!stops.join("ok.json").exists());
    settle(&home, RUN, ok, Settle::Taken).expect("settled twice is fine");
}

#[test]
fn an_inbox_that_is_a_link_is_refused_whole_and_renamed_aside() {
    let (_dir, home) = home();
    let elsewhere = home.root().join("elsewhere");
    std::fs::create_dir_all(elsewhere.join("stop-requests")).expect("mkdir");
    std::fs::write(elsewhere.join("interrupt.json"), r#"{"type":"interrupt"}"#).expect("write");
    std::os::unix::fs::symlink(&elsewhere, home.control_dir(RUN)).expect("symlink");
    let found = scan(&home, RUN, &mut Settling::default());
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].file(), "control");
    assert!(
        found[0]
            .request
            .as_ref()
            .is_err_and(|why| why.contains("not followed")),
        "{found:?}"
    );
    settle(&home, RUN, &found[0], Settle::Refused).expect("renamed");
    assert!(home.control_dir(RUN).symlink_metadata().is_err());
    assert!(
        elsewhere.join("interrupt.json").exists(),
        "the link's target untouched"
    );
}

#[test]
fn refused_files_kept_aside_are_bounded() {
    let (_dir, home) = home();
    prepare(&home, RUN);
    let stops = home.stop_requests_dir(RUN);
    for index in 0..MAX_REFUSED_KEPT + 3 {
        std::fs::write(stops.join(format!("{index:03}.json")), "not json").expect("write");
    }
    for found in scan_settled(&home) {
        settle(&home, RUN, &found, Settle::Refused).expect("settled");
    }
    assert_eq!(std::fs::read_dir(&stops).expect("dir").count(), 0);
    assert_eq!(
        std::fs::read_dir(home.control_refused_dir(RUN))
            .expect("refused/")
            .count(),
        MAX_REFUSED_KEPT
    );
}

/// A look at the inbox made [`SETTLE_MS`] after now on the clock: what is not JSON and is no
/// longer written to is refused.
fn scan_settled(home: &Home) -> Vec<Found> {
    let later_ms = crate::event::now_ms() + SETTLE_MS;
    scan_at(
        home,
        RUN,
        &mut Settling::default(),
        later_ms,
        Instant::now(),
    )
}

/// A request written in place, as a shell's `>` writes it (the file made, then written in
/// pieces), is left where it is while it is not JSON, and read once it is whole: never
/// refused for being half written.
#[test]
fn a_request_written_in_place_is_left_until_it_is_whole() {
    use std::io::Write;
    let (_dir, home) = home();
    prepare(&home, RUN);
    let path = home.stop_requests_dir(RUN).join("in-place.json");
    let mut file = std::fs::File::create(&path).expect("made, empty");
    let mut settling = Settling::default();
    assert_eq!(scan(&home, RUN, &mut settling), Vec::<Found>::new());
    assert_eq!(
        settling.waiting_files(),
        ["control/stop-requests/in-place.json"]
    );
    file.write_all(br#"{"type":"st"#).expect("first piece");
    assert_eq!(scan(&home, RUN, &mut settling), Vec::<Found>::new());
    assert_eq!(settling.waiting(), 1);
    file.write_all(br#"op","reason":"in place"}"#)
        .expect("second piece");
    drop(file);
    let found = scan(&home, RUN, &mut settling);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        matches!(&found[0].request, Ok(Request::Control { reason, .. }) if reason == "in place"),
        "{found:?}"
    );
    assert_eq!(settling.waiting(), 0, "a whole file is not waited for");
}

/// A file that stays not JSON is refused once it has stayed unchanged for [`SETTLE_MS`]: by
/// its modification time, or, on a clock set back (the file seems to come from the future),
/// by what the taker saw of it on its monotonic clock. A change starts the wait again.
#[test]
fn a_file_that_stays_not_json_is_refused_once_settled() {
    let (_dir, home) = home();
    prepare(&home, RUN);
    let path = home.stop_requests_dir(RUN).join("broken.json");
    std::fs::write(&path, "{\"type\": nope").expect("write");
    let now_ms = crate::event::now_ms();
    let refused_as_not_json = |found: &[Found]| {
        found.len() == 1
            && found[0]
                .request
                .as_ref()
                .is_err_and(|why| why.starts_with("it is not JSON"))
    };
    // By its age on the clock.
    let mut settling = Settling::default();
    assert!(scan_at(&home, RUN, &mut settling, now_ms, Instant::now()).is_empty());
    let found = scan_at(
        &home,
        RUN,
        &mut settling,
        now_ms + SETTLE_MS,
        Instant::now(),
    );
    assert!(refused_as_not_json(&found), "{found:?}");

    // A clock an hour behind the file's time: the taker's own watch settles it.
    let behind_ms = now_ms - 3_600_000;
    let start = Instant::now();
    let settle = Duration::from_millis(SETTLE_MS);
    let mut settling = Settling::default();
    assert!(scan_at(&home, RUN, &mut settling, behind_ms, start).is_empty());
    let almost = start + settle - Duration::from_millis(1);
    assert!(scan_at(&home, RUN, &mut settling, behind_ms, almost).is_empty());
    let found = scan_at(&home, RUN, &mut settling, behind_ms, start + settle);
    assert!(refused_as_not_json(&found), "{found:?}");

    // Written again between two looks: its wait starts again from the look that saw it.
    let mut settling = Settling::default();
    assert!(scan_at(&home, RUN, &mut settling, behind_ms, start).is_empty());
    std::fs::write(&path, "{\"type\": still not").expect("write again");
    assert!(scan_at(&home, RUN, &mut settling, behind_ms, start + settle).is_empty());
    let found = scan_at(&home, RUN, &mut settling, behind_ms, start + settle * 2);
    assert!(refused_as_not_json(&found), "{found:?}");
}

/// A taker that cannot look again later (a resume) waits for a file being written: one its
/// writer finishes within the wait is taken; one still written to after it is named, untaken.
#[test]
fn a_taker_that_looks_once_waits_a_bounded_time_for_a_file_being_written() {
    use std::io::Write;
    use std::sync::atomic::{AtomicBool, Ordering};
    let (_dir, home) = home();
    prepare(&home, RUN);
    let appended = std::sync::Mutex::new(Vec::new());
    let append = |events: Vec<Event>, _: Condition| {
        appended.lock().expect("not poisoned").extend(events);
        Ok(Appended {
            run: RUN,
            first_seq: 3,
            last_seq: 3,
            state: running_chain(),
            was_duplicate: false,
        })
    };
    let path = home.steer_requests_dir(RUN).join("slow.json");
    let mut file = std::fs::File::create(&path).expect("made");
    file.write_all(br#"{"type":"steer","id":"slow","#)
        .expect("first piece");
    let writer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        file.write_all(br#""ts":5,"message":"at last"}"#)
            .expect("second piece");
    });
    let taken = take_whole(&home, RUN, || Ok(Some(running_chain())), append).expect("taken");
    writer.join().expect("the writer");
    assert_eq!((taken.recorded, taken.waiting.len()), (1, 0), "{taken:?}");
    assert!(!path.exists());
    assert!(
        matches!(&appended.lock().expect("not poisoned")[..], [Event::SteerRequested { id, .. }] if id == "slow")
    );

    let path = home.steer_requests_dir(RUN).join("endless.json");
    let mut file = std::fs::File::create(&path).expect("made");
    let is_done = std::sync::Arc::new(AtomicBool::new(false));
    let done = std::sync::Arc::clone(&is_done);
    let writer = std::thread::spawn(move || {
        file.write_all(b"[").expect("a piece");
        while !done.load(Ordering::Relaxed) {
            file.write_all(b"0,").expect("a piece");
            std::thread::sleep(Duration::from_millis(50));
        }
    });
    let taken = take_whole(
        &home,
        RUN,
        || Ok(Some(running_chain())),
        |_, _| panic!("nothing is appended for a file being written"),
    )
    .expect("taken");
    is_done.store(true, Ordering::Relaxed);
    writer.join().expect("the writer");
    assert_eq!(taken.waiting, ["control/steer-requests/endless.json"]);
    assert!(path.exists(), "left where it is");
}

fn found(place: Place, name: &str, request: Result<Request, String>) -> Found {
    Found {
        place,
        name: OsString::from(name),
        request,
    }
}

fn stop_request() -> Request {
    Request::Control {
        action: ControlAction::Stop,
        by: "tui".to_string(),
        reason: "enough".to_string(),
    }
}

fn steer_request(steps: Option<Vec<u32>>) -> Request {
    Request::Steer {
        id: "s1".to_string(),
        steps,
        mode: SteerMode::Steer,
        message: "look".to_string(),
        source: "tui".to_string(),
    }
}

/// Each request is journaled once: a request the run already holds is only removed; a paused
/// run refuses a control request but keeps messages for its resume; an ended run leaves its
/// files alone.
#[test]
fn what_a_request_records_follows_the_runs_state() {
    let running = running_chain();
    let stop = found(Place::StopRequests, "a.json", Ok(stop_request()));
    assert!(matches!(
        decide(&stop, &running),
        Decision::Record {
            settle: Settle::Taken,
            expect_head: None,
            ref events,
        } if matches!(events[..], [Event::ControlRequested { action: ControlAction::Stop, .. }])
    ));
    let stopped = state_of(
        kit::chain_spec(2),
        vec![
            kit::runner_started(kit::identity(7), "i1"),
            kit::control(ControlAction::Stop, "cli", "x"),
        ],
    );
    assert_eq!(decide(&stop, &stopped), Decision::AlreadyTaken);

    let steer = found(Place::SteerRequests, "b.json", Ok(steer_request(None)));
    let Decision::Record { events, .. } = decide(&steer, &running) else {
        panic!("recorded");
    };
    assert!(
        matches!(&events[..], [Event::SteerRequested { steps, .. }] if *steps == [0]),
        "to the running step: {events:?}"
    );
    let steered = state_of(
        kit::chain_spec(2),
        vec![
            kit::runner_started(kit::identity(7), "i1"),
            kit::step_running(0, None),
            kit::steer_requested("s1", &[0], "look"),
        ],
    );
    assert_eq!(decide(&steer, &steered), Decision::AlreadyTaken);

    let paused = state_of(
        kit::chain_spec(2),
        vec![
            kit::runner_started(kit::identity(7), "i1"),
            kit::step_running(0, None),
            kit::control(ControlAction::Interrupt, "cli", "x"),
            kit::step_finished(0, crate::event::StepEnd::Stopped, None, None),
            kit::terminal(TerminalState::Paused, 130, "paused", None),
        ],
    );
    let Decision::Record { events, .. } = decide(&steer, &paused) else {
        panic!("kept for the resume");
    };
    assert!(
        matches!(&events[..], [Event::SteerRequested { steps, .. }] if *steps == [0]),
        "the step the resume runs first: {events:?}"
    );
    assert!(matches!(
        decide(&stop, &paused),
        Decision::Record { settle: Settle::Refused, ref events, .. }
            if matches!(&events[..], [Event::ControlRefused { reason, .. }] if reason.contains("paused"))
    ));
    let bad = found(Place::StopRequests, "c.json", Err("not JSON".to_string()));
    assert!(matches!(
        decide(&bad, &running),
        Decision::Record { settle: Settle::Refused, ref events, .. }
            if matches!(&events[..], [Event::ControlRefused { file, reason }]
                if file == "control/stop-requests/c.json" && reason == "not JSON")
    ));
    let failed = state_of(
        kit::chain_spec(1),
        vec![kit::terminal(TerminalState::Failed, 1, "gave up", None)],
    );
    assert_eq!(decide(&bad, &failed), Decision::Leave);
    assert_eq!(decide(&stop, &failed), Decision::Leave);
}

#[test]
fn a_stop_of_a_run_waiting_in_its_queue_ends_it_in_the_same_batch() {
    let waiting = state_of(
        kit::spec(Mode::Single, vec![kit::echo_step("a")]),
        vec![Event::QueueJoined {
            queue: "gpu".to_string(),
            idle_timeout_ms: None,
            heartbeat_ms: None,
        }],
    );
    let stop = found(Place::StopRequests, "a.json", Ok(stop_request()));
    let Decision::Record {
        events,
        expect_head,
        ..
    } = decide(&stop, &waiting)
    else {
        panic!("recorded");
    };
    assert_eq!(expect_head, Some(waiting.head_seq));
    assert!(
        matches!(
            &events[..],
            [
                Event::ControlRequested { .. },
                Event::Terminal { state: TerminalState::Stopped, summary, exit_code: STOPPED_EXIT_CODE, .. }
            ] if summary.contains("queue gpu")
        ),
        "{events:?}"
    );
}

#[test]
fn a_steer_without_targets_goes_where_the_run_is() {
    let parallel = |events: Vec<Event>| {
        state_of(
            kit::spec(
                Mode::Parallel,
                vec![
                    kit::echo_step("a"),
                    kit::echo_step("b"),
                    kit::echo_step("c"),
                ],
            ),
            events,
        )
    };
    assert_eq!(steer_targets(&parallel(vec![])), [0, 1, 2], "not started");
    let one_running = parallel(vec![
        kit::runner_started(kit::identity(7), "i1"),
        kit::step_running(1, None),
    ]);
    assert_eq!(steer_targets(&one_running), [1]);
    assert_eq!(steer_targets(&running_chain()), [0]);
    assert_eq!(
        steer_targets(&state_of(kit::chain_spec(3), vec![])),
        [0],
        "a chain's first step"
    );
    let ended = state_of(
        kit::chain_spec(1),
        vec![kit::terminal(TerminalState::Failed, 1, "x", None)],
    );
    assert_eq!(steer_targets(&ended), Vec::<u32>::new());
    let steer = found(Place::SteerRequests, "b.json", Ok(steer_request(None)));
    assert_eq!(decide(&steer, &ended), Decision::Leave);
}

/// A stop of one step is journaled while the step is pending or running, once; a step that
/// ended, a step the run does not have and a paused run refuse it, saying why; an ended run
/// leaves the file alone.
#[test]
fn a_stop_of_one_step_records_while_the_step_is_open() {
    let stop_step = |step: u32| {
        found(
            Place::StopRequests,
            "s.json",
            Ok(Request::StepStop {
                step,
                by: "tui".to_string(),
                reason: "enough".to_string(),
            }),
        )
    };
    let refusal = |decision: Decision| match decision {
        Decision::Record {
            settle: Settle::Refused,
            events,
            ..
        } => match &events[..] {
            [Event::ControlRefused { reason, .. }] => reason.clone(),
            other => panic!("a refusal, not {other:?}"),
        },
        other => panic!("a refusal, not {other:?}"),
    };
    let running = running_chain();
    for step in [0, 1] {
        assert!(
            matches!(
                decide(&stop_step(step), &running),
                Decision::Record { settle: Settle::Taken, ref events, .. }
                    if matches!(&events[..], [Event::StepStopRequested { step: s, .. }] if *s == step)
            ),
            "step {step}, running or pending"
        );
    }
    let reason = refusal(decide(&stop_step(2), &running));
    assert!(reason.contains("no step 2"), "{reason}");
    let stopped_once = state_of(
        kit::chain_spec(2),
        vec![
            kit::runner_started(kit::identity(7), "i1"),
            kit::step_running(0, None),
            Event::StepStopRequested {
                step: 0,
                by: "cli".to_string(),
                reason: "x".to_string(),
            },
        ],
    );
    assert_eq!(decide(&stop_step(0), &stopped_once), Decision::AlreadyTaken);
    let first_done = state_of(
        kit::chain_spec(2),
        vec![
            kit::runner_started(kit::identity(7), "i1"),
            kit::step_running(0, None),
            kit::step_finished(0, crate::event::StepEnd::Complete, Some(0), None),
        ],
    );
    let reason = refusal(decide(&stop_step(0), &first_done));
    assert!(reason.contains("step 0 is complete"), "{reason}");
    let paused = state_of(
        kit::chain_spec(2),
        vec![
            kit::runner_started(kit::identity(7), "i1"),
            kit::step_running(0, None),
            kit::control(ControlAction::Interrupt, "cli", "x"),
            kit::step_finished(0, crate::event::StepEnd::Stopped, None, None),
            kit::terminal(TerminalState::Paused, 130, "paused", None),
        ],
    );
    assert!(refusal(decide(&stop_step(1), &paused)).contains("paused"));
    let failed = state_of(
        kit::chain_spec(1),
        vec![kit::terminal(TerminalState::Failed, 1, "gave up", None)],
    );
    assert_eq!(decide(&stop_step(0), &failed), Decision::Leave);
}
