//! Commit sharing within one process: handles of one journal find its leader, hand it their
//! batches, get the answers they would have had alone, and hand the leadership on. (Across
//! processes, with kills and a full disk: `tests/it/commit_leader.rs`.)

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use tempfile::TempDir;

use crate::event::{Event, HostIds, Mode, RunId, TerminalState, now_ms};
use crate::journal::{AppendError, Appended, CommitSharing, Condition, Journal, WriterOptions};
use crate::state::TransitionError;
use crate::testkit;

fn created() -> Event {
    testkit::created(
        testkit::spec(
            Mode::Single,
            vec![testkit::step("build", testkit::argv(&["true"]))],
        ),
        now_ms(),
        HostIds::default(),
    )
}

fn runner_started() -> Event {
    testkit::runner_started(testkit::identity(4242), "instance")
}

fn step_finished() -> Event {
    testkit::step_complete(0)
}

fn failed() -> Event {
    testkit::terminal(TerminalState::Failed, 1, "", Some("gave up"))
}

fn journal_in(dir: &Path) -> PathBuf {
    dir.join("journal.redb")
}

/// A handle that may lead even if the tests run in a terminal.
fn open(path: &Path) -> Journal {
    let options = WriterOptions {
        commit_sharing: CommitSharing::Lead,
        ..WriterOptions::default()
    };
    Journal::open_with(super::Location::Path(path.to_path_buf()), options)
        .expect("the journal opens")
}

fn create(journal: &Journal) -> Appended {
    journal
        .append(
            RunId::generate(),
            vec![created()],
            Condition::expect_head(0),
        )
        .expect("a run is created")
}

fn through_leader(journal: &Journal) -> u64 {
    journal
        .writer_stats()
        .through_leader
        .load(Ordering::Relaxed)
}

fn for_others(journal: &Journal) -> u64 {
    journal.writer_stats().for_others.load(Ordering::Relaxed)
}

/// A leader and a client of one journal in `dir`; the leader has committed once.
fn leader_and_client(dir: &TempDir) -> (Journal, Journal) {
    let leader = open(&journal_in(dir.path()));
    create(&leader);
    let client = open(&journal_in(dir.path()));
    (leader, client)
}

#[test]
fn a_second_handle_commits_through_the_first_under_its_own_writer() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (leader, client) = leader_and_client(&dir);
    let appended = create(&client);
    assert_eq!(
        through_leader(&client),
        1,
        "the client's batch went to the leader"
    );
    assert_eq!(for_others(&leader), 1, "the leader committed it");
    assert_eq!(client.writer_stats().commits.load(Ordering::Relaxed), 0);
    let view = leader.view().expect("view");
    let records = view.records(appended.run).expect("records");
    assert_eq!(records.len(), 1);
    assert_eq!(
        records[0].writer,
        client.writer(),
        "recorded as the client's"
    );
    assert_eq!(records[0].writer_seq, 1, "numbered by the client");
    assert_eq!(view.writer_mark(client.writer()).expect("mark"), Some(1));
    assert_eq!(
        appended.state,
        view.snapshot(appended.run).expect("snapshot").expect("run"),
        "the client is answered the state the batch left"
    );
    let lock = crate::home::commit_lock_path(&journal_in(dir.path()));
    assert_eq!(
        std::fs::read_to_string(&lock).expect("the lock names its holder"),
        format!("{}\n", std::process::id())
    );
    assert!(crate::home::commit_socket_path(&journal_in(dir.path())).exists());
}

/// A run created through the leader keeps what its client's creation batch carried for the
/// home only (its environment, its hooks): the leader writes them in the same transaction.
#[test]
fn a_run_created_through_the_leader_keeps_its_environment_and_hooks() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (leader, client) = leader_and_client(&dir);
    let environment = crate::run_env::RunEnvironment::of(
        [(b"TOKEN".to_vec(), b"from-the-client".to_vec())],
        &[],
        Some(Path::new("/client")),
        Some(0o022),
    )
    .expect("small");
    let appended = client
        .create(crate::journal::Creation {
            spec: crate::testkit::chain_spec(1),
            hosts: crate::event::HostIds::default(),
            more: Vec::new(),
            private: Some(crate::run_env::RunPrivate {
                env: Some(environment.clone()),
                on_exit: vec!["echo done".to_string()],
            }),
        })
        .expect("created");
    assert_eq!(
        through_leader(&client),
        1,
        "the creation went to the leader"
    );
    let view = leader.view().expect("view");
    assert_eq!(
        view.run_env(appended.run).expect("reads"),
        Some(environment)
    );
    assert_eq!(
        view.run_hooks(appended.run).expect("reads").own,
        vec!["echo done".to_string()]
    );
}

/// Every refusal a client gets through the leader is worded exactly as the leader's own
/// caller would have had it for the same batch on the same state.
#[test]
fn a_refusal_through_the_leader_is_the_refusal_of_committing_alone() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (leader, client) = leader_and_client(&dir);
    let run = create(&leader).run;
    let ended = create(&leader).run;
    leader
        .append(ended, vec![failed()], Condition::none())
        .expect("ended");
    let cases: Vec<(RunId, Vec<Event>, Condition)> = vec![
        (run, vec![runner_started()], Condition::expect_head(7)),
        (run, vec![step_finished()], Condition::none()),
        (
            run,
            vec![runner_started(), step_finished()],
            Condition::none(),
        ),
        (RunId::generate(), vec![runner_started()], Condition::none()),
        (run, vec![created()], Condition::none()),
        (run, Vec::new(), Condition::none()),
        (ended, vec![failed()], Condition::expect_not_terminal()),
        (ended, vec![failed()], Condition::none()),
    ];
    for (run, events, condition) in cases {
        let alone = leader
            .append(run, events.clone(), condition)
            .expect_err("refused alone");
        let shared = client
            .append(run, events, condition)
            .expect_err("refused through the leader");
        assert_eq!(format!("{shared:?}"), format!("{alone:?}"));
    }
    assert!(
        through_leader(&client) >= 8,
        "every case went to the leader"
    );
    assert!(matches!(
        client.append(run, vec![step_finished()], Condition::none()),
        Err(AppendError::Transition {
            index: 0,
            source: TransitionError::StepNotRunning { .. }
        })
    ));
}

#[test]
fn a_dropped_leader_hands_the_leadership_to_the_next_handle_with_a_batch() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (leader, client) = leader_and_client(&dir);
    let run = create(&client).run;
    drop(leader);
    assert!(
        !crate::home::commit_socket_path(&journal_in(dir.path())).exists(),
        "a leader that stops removes its socket"
    );
    client
        .append(run, vec![runner_started()], Condition::expect_head(1))
        .expect("the client commits without its leader");
    assert_eq!(through_leader(&client), 1, "the second batch was its own");
    let third = open(&journal_in(dir.path()));
    create(&third);
    assert_eq!(through_leader(&third), 1);
    assert_eq!(for_others(&client), 1, "the client leads now");
}

#[test]
fn many_threads_of_many_handles_each_land_once_in_their_order() {
    let dir = tempfile::tempdir().expect("temp dir");
    let handles: Vec<Journal> = (0..4).map(|_| open(&journal_in(dir.path()))).collect();
    std::thread::scope(|scope| {
        for handle in &handles {
            for _ in 0..4 {
                scope.spawn(move || {
                    let run = create(handle).run;
                    for head in 1..=10u64 {
                        let events = vec![Event::ControlRequested {
                            action: crate::event::ControlAction::Stop,
                            by: format!("caller {head}"),
                            reason: "test".to_string(),
                        }];
                        let appended = handle
                            .append(run, events, Condition::expect_head(head))
                            .map(|appended| appended.last_seq);
                        // A second stop request is refused; the first lands at head 2.
                        match head {
                            1 => assert_eq!(appended.expect("first stop"), 2),
                            _ => assert!(appended.is_err()),
                        }
                    }
                });
            }
        }
    });
    let shared: u64 = handles.iter().map(through_leader).sum();
    let served: u64 = handles.iter().map(for_others).sum();
    assert_eq!(
        shared, served,
        "every batch handed over was committed by a leader"
    );
    assert!(shared > 0, "three handles had a leader to hand batches to");
    let view = handles[0].view().expect("view");
    assert_eq!(view.run_count().expect("runs"), 16);
    for handle in &handles {
        let mark = view.writer_mark(handle.writer()).expect("mark");
        assert!(mark.is_some_and(|mark| mark >= 8), "{mark:?}");
    }
}

#[test]
fn a_stale_socket_of_a_gone_leader_is_replaced() {
    let dir = tempfile::tempdir().expect("temp dir");
    let socket = crate::home::commit_socket_path(&journal_in(dir.path()));
    drop(std::os::unix::net::UnixListener::bind(&socket).expect("bind"));
    assert!(socket.exists(), "a socket file nobody serves");
    let (leader, client) = leader_and_client(&dir);
    create(&client);
    assert_eq!(
        through_leader(&client),
        1,
        "served on the stale socket's path"
    );
    assert_eq!(for_others(&leader), 1);
}

#[test]
fn a_file_that_is_no_socket_at_the_path_is_left_alone_and_each_handle_commits_alone() {
    let dir = tempfile::tempdir().expect("temp dir");
    let socket = crate::home::commit_socket_path(&journal_in(dir.path()));
    std::fs::write(&socket, b"not ours to remove").expect("write");
    let (leader, client) = leader_and_client(&dir);
    create(&client);
    create(&leader);
    assert_eq!(through_leader(&client) + for_others(&leader), 0);
    assert_eq!(
        std::fs::read(&socket).expect("still there"),
        b"not ours to remove"
    );
    assert_eq!(leader.view().expect("view").run_count().expect("runs"), 3);
}

#[test]
fn a_socket_of_another_user_is_refused() {
    if !crate::testkit::skip::needs_root(
        "a_socket_of_another_user_is_refused",
        "give a socket to another user",
    ) {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let socket = crate::home::commit_socket_path(&journal_in(dir.path()));
    let stranger = std::os::unix::net::UnixListener::bind(&socket).expect("bind");
    nix::unistd::chown(&socket, Some(nix::unistd::Uid::from_raw(65534)), None).expect("chown");
    let (leader, client) = leader_and_client(&dir);
    create(&client);
    assert_eq!(through_leader(&client) + for_others(&leader), 0);
    assert!(
        stranger.set_nonblocking(true).is_ok() && stranger.accept().is_err(),
        "nobody connected to the stranger's socket"
    );
    assert!(socket.exists(), "the stranger's socket is not removed");
}

#[test]
fn a_path_too_long_for_a_socket_shares_through_the_private_socket_directory() {
    let dir = tempfile::tempdir().expect("temp dir");
    let deep = dir.path().join("d".repeat(100)).join("e".repeat(20));
    std::fs::create_dir_all(&deep).expect("mkdir");
    let path = journal_in(&deep);
    assert!(
        crate::home::commit_socket_path(&path).as_os_str().len()
            > crate::platform::MAX_SOCKET_PATH_BYTES
    );
    let leader = open(&path);
    create(&leader);
    let client = open(&path);
    create(&client);
    assert_eq!(through_leader(&client), 1);
    assert!(
        !crate::home::commit_socket_path(&path).exists(),
        "no socket beside the journal"
    );
    let private = super::private_socket_dir().expect("a private socket directory");
    let rendezvous = super::Rendezvous::of(&path).expect("a rendezvous");
    assert_eq!(rendezvous.socket.parent(), Some(private.as_path()));
    assert!(
        crate::durable_fs::inspect_socket_path(&rendezvous.socket)
            .is_ok_and(|found| matches!(found, crate::durable_fs::SocketPath::OurSocket)),
        "the leader listens in the private directory"
    );
    #[cfg(target_os = "linux")]
    {
        let table = std::fs::read_to_string("/proc/net/unix").expect("/proc/net/unix");
        assert!(
            !table.contains("@runjournal"),
            "no abstract socket name: {table}"
        );
    }
}

#[test]
fn a_handle_that_opts_out_commits_alone_and_leads_nobody() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = journal_in(dir.path());
    let alone = Journal::open_with(
        super::Location::Path(path.clone()),
        WriterOptions {
            commit_sharing: CommitSharing::Alone,
            ..WriterOptions::default()
        },
    )
    .expect("opens");
    create(&alone);
    let shared = open(&path);
    create(&shared);
    create(&alone);
    assert_eq!(through_leader(&alone) + through_leader(&shared), 0);
    assert_eq!(for_others(&alone) + for_others(&shared), 0);
}

#[test]
fn two_journals_in_one_directory_never_share_a_leader() {
    let dir = tempfile::tempdir().expect("temp dir");
    let one = open(&dir.path().join("one.redb"));
    let two = open(&dir.path().join("two.redb"));
    create(&one);
    create(&two);
    assert_eq!(for_others(&one) + for_others(&two), 0);
    assert_eq!(one.view().expect("view").run_count().expect("runs"), 1);
    assert_eq!(two.view().expect("view").run_count().expect("runs"), 1);
}

/// A peer that listens at the socket's path, says welcome, takes a group and never answers,
/// while nobody holds the commit lock: no leader. The client notices the free lock, leads, and
/// commits its batch itself.
#[test]
fn a_silent_peer_that_holds_no_lock_is_left_and_the_batch_committed_here() {
    use super::wire::{self, ToClient, ToLeader};
    let dir = tempfile::tempdir().expect("temp dir");
    let path = journal_in(dir.path());
    let socket = crate::home::commit_socket_path(&path);
    let listener = std::os::unix::net::UnixListener::bind(&socket).expect("bind");
    let (done, is_done) = std::sync::mpsc::channel::<()>();
    let silent = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().expect("accept");
        let mut reader = std::io::BufReader::new(stream.try_clone().expect("clone"));
        assert!(matches!(
            wire::read::<ToLeader>(&mut reader),
            Ok(Some(ToLeader::Hello(_)))
        ));
        let welcome = wire::frame(&ToClient::Welcome { leader_pid: 1 }).expect("frame");
        std::io::Write::write_all(&mut stream, &welcome).expect("welcome");
        assert!(matches!(
            wire::read::<ToLeader>(&mut reader),
            Ok(Some(ToLeader::Group { batches: 1 }))
        ));
        // Keeps the connection open, answering nothing, until the test is over.
        let _ = is_done.recv();
    });
    let journal = open(&path);
    let appended = create(&journal);
    assert_eq!(
        through_leader(&journal),
        0,
        "the silent peer answered nothing"
    );
    assert_eq!(
        journal
            .view()
            .expect("view")
            .records(appended.run)
            .expect("records")
            .len(),
        1
    );
    assert_eq!(
        std::fs::read_to_string(crate::home::commit_lock_path(&path)).expect("lock"),
        format!("{}\n", std::process::id()),
        "the client leads now"
    );
    drop(done);
    silent.join().expect("the silent peer");
}

/// The default mode leads only from a process without a controlling terminal (as runners
/// are, and as CI runs tests); from a terminal it joins a leader or commits alone.
#[test]
fn by_default_a_process_without_a_terminal_leads_and_one_with_a_terminal_does_not() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = journal_in(dir.path());
    let first = Journal::open(&path).expect("opens");
    create(&first);
    let second = Journal::open(&path).expect("opens");
    create(&second);
    let expected = u64::from(!super::has_controlling_terminal());
    assert_eq!(through_leader(&second), expected);
    assert_eq!(for_others(&first), expected);
}

/// A step's process as a runner records it on Linux: with the PID namespace its pid was read in.
fn step_running_in_a_namespace() -> Event {
    testkit::step_running(0, Some(testkit::namespaced_identity(4343)))
}

/// What a client hands a leader is what the leader commits: a process identity keeps its PID
/// namespace on the way (the wire once dropped it, as a record's postcard fields do not hold
/// it), so the record equals the client's event.
#[test]
fn a_batch_committed_through_the_leader_is_recorded_as_the_client_made_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (leader, client) = leader_and_client(&dir);
    let run = create(&client).run;
    client
        .append(run, vec![runner_started()], Condition::expect_head(1))
        .expect("started");
    let appended = client
        .append(
            run,
            vec![step_running_in_a_namespace()],
            Condition::expect_head(2),
        )
        .expect("the step is running");
    assert_eq!(through_leader(&client), 3, "every batch went to the leader");
    let records = leader.view().expect("view").records(run).expect("records");
    assert_eq!(records[2].event, step_running_in_a_namespace());
    assert_eq!(
        appended.state.steps[0].process,
        step_running_in_a_namespace().process_identity().cloned(),
        "the state answered holds the identity as recorded"
    );
}

/// A handle of the test's own that never shares, to commit as a fake leader would.
fn alone(path: &Path) -> Journal {
    Journal::open_with(
        super::Location::Path(path.to_path_buf()),
        WriterOptions {
            commit_sharing: CommitSharing::Alone,
            ..WriterOptions::default()
        },
    )
    .expect("opens")
}

/// A fake leader's side of one connection: accepts, welcomes the hello, and reads a group of
/// one batch, which it returns with the connection, unanswered.
fn take_one_batch(
    listener: &std::os::unix::net::UnixListener,
) -> (
    std::os::unix::net::UnixStream,
    std::io::BufReader<std::os::unix::net::UnixStream>,
    crate::journal::Batch,
) {
    use super::wire::{self, ToClient, ToLeader};
    let (mut stream, _) = listener.accept().expect("accept");
    let mut reader = std::io::BufReader::new(stream.try_clone().expect("clone"));
    let Ok(Some(ToLeader::Hello(hello))) = wire::read::<ToLeader>(&mut reader) else {
        panic!("a hello first");
    };
    let welcome = wire::frame(&ToClient::Welcome { leader_pid: 1 }).expect("frame");
    std::io::Write::write_all(&mut stream, &welcome).expect("welcome");
    assert!(matches!(
        wire::read::<ToLeader>(&mut reader),
        Ok(Some(ToLeader::Group { batches: 1 }))
    ));
    let Ok(Some(ToLeader::Batch(batch))) = wire::read::<ToLeader>(&mut reader) else {
        panic!("the group's batch");
    };
    let batch = batch.into_batch(hello.writer).expect("a well-formed batch");
    (stream, reader, batch)
}

/// A leader takes a client's conditional batch, commits it and dies before answering (a
/// SIGKILL between the commit and the answer). The client, finding the lock free, commits the
/// batch itself under the same writer seq: the batch landed, so it is answered as committed
/// (a duplicate), never refused because its condition no longer holds — and it is in the
/// journal once. (A runner once got a head mismatch here for its `StepRunning`, and, appending
/// it again, a lifecycle refusal.)
#[test]
fn a_batch_a_dying_leader_committed_without_answering_is_answered_as_committed() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = journal_in(dir.path());
    // The dying leader commits through a handle of its own, which never shares.
    let committer = alone(&path);
    let run = create(&committer).run;
    committer
        .append(run, vec![runner_started()], Condition::expect_head(1))
        .expect("started");
    let lock = crate::durable_fs::FileLock::try_acquire(&crate::home::commit_lock_path(&path))
        .expect("lock file")
        .expect("nobody else leads");
    let listener = std::os::unix::net::UnixListener::bind(crate::home::commit_socket_path(&path))
        .expect("bind");
    let dying = std::thread::spawn(move || {
        let (stream, reader, batch) = take_one_batch(&listener);
        let committed = committer
            .commit_batches_for_tests(&[batch])
            .expect("the commit lands");
        assert!(committed[0].is_ok(), "{committed:?}");
        // Dies: the lock and the connection go at once, nothing answered.
        drop(lock);
        drop((stream, reader, listener));
        committer
    });
    let client = open(&path);
    let appended = client
        .append(
            run,
            vec![step_running_in_a_namespace()],
            Condition::expect_head(2),
        )
        .expect("a batch that landed is answered as committed");
    let committer = dying.join().expect("the dying leader");
    assert!(appended.was_duplicate, "it was the dying leader's commit");
    assert_eq!((appended.first_seq, appended.last_seq), (3, 3));
    let records = committer
        .view()
        .expect("view")
        .records(run)
        .expect("records");
    assert_eq!(records.len(), 3, "the batch is in the journal once");
    assert_eq!(records[2].writer, client.writer());
    assert_eq!(records[2].event, step_running_in_a_namespace());
}

/// A leader that stopped (SIGSTOP, a frozen cgroup) after taking batches says nothing to its
/// clients, which leave it after the leader timeout: one takes the lead over, and each batch
/// is judged again, under the same writer seq, by its own handle. When the stopped leader runs
/// again and commits its copies, the writers' marks decide: a batch its client had refused
/// meanwhile is not committed though it would now pass (its seq is spent), and one its client
/// committed is recognised, not applied twice.
#[test]
fn a_stopped_leader_that_runs_again_commits_nothing_its_clients_have_since_judged() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = journal_in(dir.path());
    let committer = alone(&path);
    let run = create(&committer).run;
    let lock = crate::durable_fs::FileLock::try_acquire(&crate::home::commit_lock_path(&path))
        .expect("lock file")
        .expect("nobody else leads");
    let listener = std::os::unix::net::UnixListener::bind(crate::home::commit_socket_path(&path))
        .expect("bind");
    let (resume, resumed) = std::sync::mpsc::channel::<()>();
    let stopped = std::thread::spawn(move || {
        // Two connections, one batch each: one the client will have refused, one it will
        // commit. Stopped: it says nothing, and keeps the connections and its lock.
        let copies: Vec<_> = (0..2).map(|_| take_one_batch(&listener)).collect();
        let _ = resumed.recv();
        drop(lock);
        copies
            .into_iter()
            .map(|(_, _, batch)| batch)
            .collect::<Vec<_>>()
    });
    let client = || {
        Journal::open_with(
            super::Location::Path(path.clone()),
            WriterOptions {
                commit_sharing: CommitSharing::Lead,
                leader_timeout: std::time::Duration::from_millis(200),
                ..WriterOptions::default()
            },
        )
        .expect("opens")
    };
    let (refusing, committing) = (client(), client());
    // The head is 1, and 2 once the other client's batch lands, in whichever order the two are
    // judged: a batch expecting 3 is refused, one expecting 1 lands.
    let (refused, appended) = std::thread::scope(|scope| {
        let refused =
            scope.spawn(|| refusing.append(run, vec![step_finished()], Condition::expect_head(3)));
        let appended = scope
            .spawn(|| committing.append(run, vec![runner_started()], Condition::expect_head(1)));
        (
            refused.join().expect("a client"),
            appended.join().expect("a client"),
        )
    });
    assert!(
        matches!(refused, Err(AppendError::HeadMismatch { .. })),
        "{refused:?}"
    );
    let appended = appended.expect("committed by a client itself");
    assert_eq!(appended.last_seq, 2);
    assert_eq!(
        through_leader(&refusing) + through_leader(&committing),
        0,
        "the stopped leader answered nothing"
    );
    drop(resume);
    let copies = stopped.join().expect("the stopped leader");
    committer
        .append(
            run,
            vec![step_running_in_a_namespace()],
            Condition::expect_head(2),
        )
        .expect("the step runs");
    // Runs again: the refused batch's copy would pass now (the head is 3), the committed one
    // is in already.
    let late = committer
        .commit_batches_for_tests(&copies)
        .expect("the late commit lands");
    for (copy, answer) in copies.iter().zip(&late) {
        if copy.writer == refusing.writer() {
            assert!(
                matches!(answer, Err(AppendError::WriterSeqReused { .. })),
                "a seq its client judged is never judged again: {answer:?}"
            );
        } else {
            assert!(
                matches!(answer, Ok(appended) if appended.was_duplicate),
                "a batch its client committed is recognised: {answer:?}"
            );
        }
    }
    let records = committer
        .view()
        .expect("view")
        .records(run)
        .expect("records");
    assert_eq!(records.len(), 3, "nothing landed twice or late");
}

/// A client that finds its leader silent takes the lead over from it, though the stopped
/// leader still holds its lock: the next handle reaches the new leader at once, instead of
/// paying the silent one's timeout. The stopped leader, once it runs again, finds it was
/// deposed, serves nobody, and leaves its successor's socket alone when it stops.
#[test]
fn a_silent_leader_loses_the_lead_and_once_running_again_leaves_its_successor_alone() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = journal_in(dir.path());
    let committer = alone(&path);
    let run = create(&committer).run;
    // The stopped leader, as a fake: it holds the lock and listens, and answers nothing.
    let lock_path = crate::home::commit_lock_path(&path);
    let socket_path = crate::home::commit_socket_path(&path);
    let stopped_lock = super::lease::Lease::try_take(&lock_path)
        .expect("lock file")
        .expect("nobody else leads");
    let listener = std::os::unix::net::UnixListener::bind(&socket_path).expect("bind");
    let silent = std::thread::spawn(move || take_one_batch(&listener));
    let options = WriterOptions {
        commit_sharing: CommitSharing::Lead,
        leader_timeout: std::time::Duration::from_millis(200),
        ..WriterOptions::default()
    };
    let first =
        Journal::open_with(super::Location::Path(path.clone()), options.clone()).expect("opens");
    first
        .append(run, vec![runner_started()], Condition::expect_head(1))
        .expect("committed by the client that took the lead over");
    let (_stream, _reader, _copy) = silent.join().expect("the silent leader took the batch");
    assert!(
        super::lease::is_deposed(&lock_path, stopped_lock.id()),
        "the lock path names another lock file"
    );
    assert_eq!(
        std::fs::read_to_string(&lock_path).expect("lock"),
        format!("{}\n", std::process::id()),
        "the client leads now"
    );
    // A second handle reaches the new leader, and waits for no timeout.
    let second = Journal::open_with(super::Location::Path(path.clone()), options).expect("opens");
    second
        .append(run, vec![failed()], Condition::expect_head(2))
        .expect("committed through the new leader");
    assert_eq!(through_leader(&second), 1, "through the new leader");
    assert_eq!(
        for_others(&first),
        1,
        "committed by the client that took over"
    );
    drop(stopped_lock);
    assert!(socket_path.exists(), "the new leader's socket is in place");
}

/// A leader whose lead was taken over while it was stopped stops serving once it runs again,
/// and when it stops it removes no socket but its own.
#[test]
fn a_deposed_leader_serves_nobody_and_removes_no_socket_but_its_own() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = journal_in(dir.path());
    let leader = open(&path);
    create(&leader);
    let lock_path = crate::home::commit_lock_path(&path);
    let socket_path = crate::home::commit_socket_path(&path);
    let from = super::lease::file_id(&lock_path).expect("looks");
    // Another process takes the lead over: a fresh lock, and its own socket in place.
    let successor = super::lease::Lease::take_over(&lock_path, from)
        .expect("takes over")
        .expect("from the leader");
    std::fs::remove_file(&socket_path).expect("the old socket goes");
    let successor_socket = std::os::unix::net::UnixListener::bind(&socket_path).expect("bind");
    let socket_id = super::lease::file_id(&socket_path).expect("looks");
    // It looks at least this often.
    std::thread::sleep(super::leader::DEPOSED_CHECK_INTERVAL * 3);
    drop(leader);
    assert_eq!(
        super::lease::file_id(&socket_path).expect("looks"),
        socket_id,
        "the successor's socket was left alone"
    );
    assert!(
        !super::lease::is_deposed(&lock_path, successor.id()),
        "and its lock"
    );
    drop(successor_socket);
}

// Queues: the admission is judged where the batch is committed, so sharing commits cannot let
// two handles take the same last slot.

fn joined() -> Event {
    Event::QueueJoined {
        queue: "q".to_string(),
        idle_timeout_ms: None,
        heartbeat_ms: None,
    }
}

fn admitted() -> Event {
    Event::QueueAdmitted {
        by: "test".to_string(),
    }
}

fn create_waiting(journal: &Journal) -> RunId {
    journal
        .append(
            RunId::generate(),
            vec![created(), joined()],
            Condition::expect_head(0),
        )
        .expect("a run joins the queue")
        .run
}

#[test]
fn a_queue_refusal_through_the_leader_is_the_refusal_of_committing_alone() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (leader, client) = leader_and_client(&dir);
    let no_queue = client
        .append(
            RunId::generate(),
            vec![created(), joined()],
            Condition::expect_head(0),
        )
        .expect_err("a queue without a limit is refused");
    assert!(matches!(
        no_queue,
        AppendError::Queue {
            refusal: crate::journal::QueueRefusal::NoSuchQueue { .. },
            ..
        }
    ));
    leader.set_queue_limit("q", 1).expect("limit set");
    let first = create_waiting(&leader);
    let second = create_waiting(&leader);
    let third = create_waiting(&leader);
    let not_first = client
        .append(second, vec![admitted()], Condition::none())
        .expect_err("only the first waiting run is admitted");
    assert!(
        matches!(
            &not_first,
            AppendError::Queue {
                refusal: crate::journal::QueueRefusal::NotFirst { first: found, .. },
                ..
            } if *found == first
        ),
        "{not_first:?}"
    );
    client
        .append(first, vec![admitted()], Condition::none())
        .expect("the first takes the free slot through the leader");
    let alone = leader
        .append(second, vec![admitted()], Condition::none())
        .expect_err("full");
    let shared = client
        .append(second, vec![admitted()], Condition::none())
        .expect_err("full through the leader");
    assert_eq!(format!("{shared:?}"), format!("{alone:?}"));
    assert!(matches!(
        shared,
        AppendError::Queue {
            refusal: crate::journal::QueueRefusal::Full {
                active: 1,
                max_active: 1,
                ..
            },
            ..
        }
    ));
    assert!(
        through_leader(&client) >= 4,
        "every case went to the leader"
    );
    let view = leader.view().expect("view");
    assert_eq!(view.queue_active("q").expect("active"), vec![first]);
    assert_eq!(
        view.queue_waiting("q", 10).expect("waiting"),
        vec![second, third]
    );
}

/// Many threads of many handles (sharing commits through one leader) race to admit a
/// queue's first waiting run while two slots are free: exactly two runs are ever admitted,
/// and the journal's indexes agree.
#[test]
fn handles_racing_for_the_last_slots_through_the_leader_take_each_once() {
    let dir = tempfile::tempdir().expect("temp dir");
    let handles: Vec<Journal> = (0..4).map(|_| open(&journal_in(dir.path()))).collect();
    handles[0].set_queue_limit("q", 2).expect("limit set");
    let waiting: Vec<RunId> = (0..12).map(|_| create_waiting(&handles[0])).collect();
    let barrier = std::sync::Barrier::new(16);
    let wins = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for handle in &handles {
            for _ in 0..4 {
                let (barrier, wins) = (&barrier, &wins);
                scope.spawn(move || {
                    barrier.wait();
                    for _ in 0..8 {
                        let view = handle.view().expect("view");
                        let Some(first) = view.queue_waiting("q", 1).expect("waiting").pop() else {
                            return;
                        };
                        drop(view);
                        match handle.append(first, vec![admitted()], Condition::none()) {
                            Ok(_) => {
                                wins.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(AppendError::Queue { .. } | AppendError::Transition { .. }) => {}
                            Err(error) => panic!("unexpected: {error}"),
                        }
                    }
                });
            }
        }
    });
    assert_eq!(wins.load(Ordering::Relaxed), 2, "two slots, two admissions");
    let shared: u64 = handles.iter().map(through_leader).sum();
    assert!(shared > 0, "handles had a leader to hand batches to");
    let view = handles[0].view().expect("view");
    let mut active = view.queue_active("q").expect("active");
    active.sort_unstable();
    let mut expected = waiting[..2].to_vec();
    expected.sort_unstable();
    assert_eq!(active, expected, "the first two in, first in first");
    assert_eq!(view.queue_waiting("q", 100).expect("waiting"), waiting[2..]);
}
