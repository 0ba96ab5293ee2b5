//! Steering a running step: the step's inbox, a directory its processes find in
//! `RUNJOURNAL_INBOX`, holding one JSON file per message for the step, `{id, ts, message, mode,
//! source}`, written atomically (a dot-named temporary file renamed into place) under a name
//! that sorts in arrival order (the seq of the message's record). The step takes a message by
//! removing its file; the runner, which wrote it, sees it gone and journals the delivery
//! (`SteerDelivered`). What the step never took when it ends is undelivered: its
//! `StepFinished` says so (docs/design.md, "Control and steering").
//!
//! Once a message is in the inbox the runner notes it beside the inbox, in `inbox-<i>.written/`
//! (an empty file of the same name). A runner that dies leaves that note: the reconciler then
//! judges what the step took by it (`control_inbox::steers_taken_without_runner`), a message
//! noted and gone from the inbox delivered, and only the rest undelivered.
//!
//! Invariants:
//! * a message's file is written only once its `SteerRequested` is durable, and its
//!   delivery is journaled only once its file was seen gone;
//! * a message is noted as written only once its file is in the inbox, so a note never
//!   claims a message the step could not have taken;
//! * the inbox is looked at for the last time only after the step's process group was
//!   verified empty, so no taking is missed between that look and the step's end.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::durable_fs;
use crate::event::{Event, Record, SteerMode, UnixMs};
use crate::home::Home;
use crate::state::{RunState, SteerDelivery};

/// The variable naming a step's inbox, set for every step.
pub const ENV_INBOX: &str = "RUNJOURNAL_INBOX";

/// One message in a step's inbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct InboxMessage<'a> {
    pub id: &'a str,
    /// When it was requested (its record's time), Unix ms.
    pub ts: UnixMs,
    pub message: &'a str,
    /// `steer` or `follow-up`.
    pub mode: &'static str,
    pub source: &'a str,
}

/// A running step's inbox and the messages the runner put there.
#[derive(Debug)]
pub struct StepInbox {
    step: u32,
    dir: PathBuf,
    /// Where each message written is noted (`Home::step_inbox_written_dir`).
    written_dir: PathBuf,
    /// Each message written, by its request id: its file.
    written: BTreeMap<String, PathBuf>,
}

impl StepInbox {
    /// Makes step `step`'s inbox of `run` (0700) and the directory its messages are noted in,
    /// both empty: what an earlier attempt left there is no message of this step's life.
    pub fn make(home: &Home, run: crate::event::RunId, step: u32) -> io::Result<StepInbox> {
        let index = step as usize;
        let dir = home.step_inbox_dir(run, index);
        let written_dir = home.step_inbox_written_dir(run, index);
        for dir in [&dir, &written_dir] {
            durable_fs::remove_tree(dir)?;
            durable_fs::ensure_private_dir(dir)?;
        }
        Ok(StepInbox {
            step,
            dir,
            written_dir,
            written: BTreeMap::new(),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The messages waiting for this step in `state` that are not in its inbox yet: their ids
    /// and the seqs of the records holding them.
    pub fn unwritten(&self, state: &RunState) -> Vec<(String, u64)> {
        state
            .steers
            .iter()
            .filter(|steer| !self.written.contains_key(&steer.id))
            .filter(|steer| {
                steer.targets.iter().any(|target| {
                    target.step == self.step && target.delivery == SteerDelivery::Queued
                })
            })
            .map(|steer| (steer.id.clone(), steer.seq))
            .collect()
    }

    /// Writes the message of `record`, a `SteerRequested`, into the inbox.
    pub fn write(&mut self, record: &Record) -> io::Result<()> {
        let Event::SteerRequested {
            id,
            mode,
            message,
            source,
            ..
        } = &record.event
        else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("record {} is no steer request", record.seq),
            ));
        };
        let document = InboxMessage {
            id,
            ts: record.time_ms,
            message,
            mode: match mode {
                SteerMode::Steer => "steer",
                SteerMode::FollowUp => "follow-up",
            },
            source,
        };
        let bytes = serde_json::to_vec(&document).map_err(io::Error::other)?;
        let name = crate::control_inbox::step_message_file_name(record.seq);
        let path = self.dir.join(&name);
        durable_fs::write_atomic(&path, &bytes)?;
        self.written.insert(id.clone(), path);
        // Best effort, as the runner's other files: a note that cannot be made costs only the
        // proof of this message's taking should the runner die, which then counts it untaken.
        let _ = durable_fs::touch(&self.written_dir.join(name));
        Ok(())
    }

    /// The messages the step took since the last look (their files are gone), now counted as
    /// delivered by this inbox: the `SteerDelivered` events to journal. An inbox whose
    /// directory is gone took nothing (the step removed more than its messages).
    pub fn taken(&mut self) -> Vec<Event> {
        if !durable_fs::is_directory(&self.dir) {
            return Vec::new();
        }
        let taken: Vec<String> = self
            .written
            .iter()
            .filter(|(_, path)| matches!(durable_fs::look(path), Ok(None)))
            .map(|(id, _)| id.clone())
            .collect();
        taken
            .into_iter()
            .map(|id| {
                self.written.remove(&id);
                Event::SteerDelivered {
                    id,
                    step: self.step,
                }
            })
            .collect()
    }

    /// Removes the inbox and what the step left in it, and the notes of what was written there;
    /// its end is recorded.
    pub fn close(self) {
        let _ = durable_fs::remove_tree(&self.dir);
        let _ = durable_fs::remove_tree(&self.written_dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{FORMAT_VERSION, HostIds, RunId, WriterId};
    use crate::testkit as kit;

    const RUN: RunId = RunId::from_bytes([2; 16]);

    fn record(seq: u64, event: Event) -> Record {
        Record {
            format_version: FORMAT_VERSION,
            run_id: RUN,
            seq,
            time_ms: 1_000 + seq,
            writer: WriterId(1),
            writer_seq: seq,
            event,
        }
    }

    /// Messages land as files that sort in arrival order; one the step removed is delivered,
    /// once; the inbox is emptied of what an earlier attempt left.
    #[test]
    fn a_step_takes_a_message_by_removing_its_file() {
        let dir = tempfile::tempdir().expect("temp dir");
        let home = Home::at(dir.path());
        let inbox_dir = home.step_inbox_dir(RUN, 0);
        std::fs::create_dir_all(&inbox_dir).expect("mkdir");
        std::fs::write(inbox_dir.join("stale.json"), "{}").expect("write");
        let mut inbox = StepInbox::make(&home, RUN, 0).expect("made");
        assert_eq!(std::fs::read_dir(&inbox_dir).expect("dir").count(), 0);

        let events = [
            kit::created(kit::chain_spec(1), 1, HostIds::default()),
            kit::runner_started(kit::identity(7), "i1"),
            kit::step_running(0, None),
            kit::steer_requested("b-later", &[0], "second"),
            kit::steer_requested("a-first", &[0], "first"),
        ];
        let records: Vec<Record> = events
            .into_iter()
            .enumerate()
            .map(|(index, event)| record(index as u64 + 1, event))
            .collect();
        let state = crate::state::replay(&records)
            .expect("legal")
            .expect("a run");
        let unwritten = inbox.unwritten(&state);
        assert_eq!(
            unwritten,
            [("b-later".to_string(), 4), ("a-first".to_string(), 5)]
        );
        for (_, seq) in &unwritten {
            inbox.write(&records[*seq as usize - 1]).expect("written");
        }
        assert!(inbox.unwritten(&state).is_empty());
        let mut names: Vec<String> = std::fs::read_dir(&inbox_dir)
            .expect("dir")
            .map(|entry| {
                entry
                    .expect("entry")
                    .file_name()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        names.sort();
        assert_eq!(
            names,
            ["00000000000000000004.json", "00000000000000000005.json"],
            "in arrival order, whatever the ids"
        );
        let first: serde_json::Value =
            serde_json::from_slice(&std::fs::read(inbox_dir.join(&names[0])).expect("read"))
                .expect("JSON");
        assert_eq!(
            first,
            serde_json::json!({"id": "b-later", "ts": 1004, "message": "second", "mode": "steer", "source": "cli"})
        );
        assert!(inbox.taken().is_empty(), "nothing taken yet");
        std::fs::remove_file(inbox_dir.join(&names[0])).expect("the step takes it");
        assert_eq!(inbox.taken(), [kit::steer_delivered("b-later", 0)]);
        assert!(inbox.taken().is_empty(), "delivered once");
        inbox.close();
        assert!(!inbox_dir.exists());
        assert!(!home.step_inbox_written_dir(RUN, 0).exists());
    }

    /// With its runner dead, what the step took is judged by the runner's notes: a message
    /// noted as written and gone from the inbox was taken; one still there, or one never
    /// written (its runner died first), was not.
    #[test]
    fn what_a_step_took_after_its_runner_died_is_judged_by_the_runners_notes() {
        let dir = tempfile::tempdir().expect("temp dir");
        let home = Home::at(dir.path());
        let mut inbox = StepInbox::make(&home, RUN, 0).expect("made");
        let events = [
            kit::created(kit::chain_spec(1), 1, HostIds::default()),
            kit::runner_started(kit::identity(7), "i1"),
            kit::step_running(0, None),
            kit::steer_requested("taken", &[0], "one"),
            kit::steer_requested("left", &[0], "two"),
            kit::steer_requested("unwritten", &[0], "three"),
            kit::steer_requested("delivered-before", &[0], "four"),
        ];
        let mut records: Vec<Record> = events
            .into_iter()
            .enumerate()
            .map(|(index, event)| record(index as u64 + 1, event))
            .collect();
        for seq in [4, 5, 7] {
            inbox.write(&records[seq - 1]).expect("written");
        }
        std::fs::remove_file(
            inbox
                .dir()
                .join(crate::control_inbox::step_message_file_name(4)),
        )
        .expect("the step takes it");
        std::fs::remove_file(
            inbox
                .dir()
                .join(crate::control_inbox::step_message_file_name(7)),
        )
        .expect("the step takes it");
        records.push(record(8, kit::steer_delivered("delivered-before", 0)));
        let state = crate::state::replay(&records)
            .expect("legal")
            .expect("a run");
        // The runner dies here, with the inbox as it is.
        let taken = crate::control_inbox::steers_taken_without_runner(&home, &state);
        assert_eq!(taken, [kit::steer_delivered("taken", 0)]);

        // An inbox the step removed whole took nothing that can be told.
        std::fs::remove_dir_all(inbox.dir()).expect("removed");
        assert!(crate::control_inbox::steers_taken_without_runner(&home, &state).is_empty());
    }
}
