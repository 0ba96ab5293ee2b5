//! The snapshot codec: a run's folded state as the `runs` table stores it.

use serde::{Deserialize, Serialize};

use super::error::CorruptError;
use crate::event::{
    self, DecodeError, EncodeError, FORMAT_VERSION, RunId, decode_checked, encode_checked,
};
use crate::state::RunState;

#[derive(Serialize)]
struct SnapshotRef<'a> {
    format_version: u16,
    state: &'a RunState,
}

#[derive(Deserialize)]
struct SnapshotOwned {
    format_version: u16,
    state: RunState,
}

pub(crate) fn encode_snapshot(state: &RunState) -> Result<Vec<u8>, EncodeError> {
    let bytes = encode_checked(&SnapshotRef {
        format_version: FORMAT_VERSION,
        state,
    })
    .map_err(|error| EncodeError::Serialize {
        reason: error.to_string(),
    })?;
    if bytes.len() > event::MAX_SNAPSHOT_BYTES {
        return Err(EncodeError::TooLarge {
            event: "snapshot",
            bytes: bytes.len(),
        });
    }
    Ok(bytes)
}

pub(crate) fn decode_snapshot(run: RunId, bytes: &[u8]) -> Result<RunState, CorruptError> {
    let snapshot: SnapshotOwned = decode_checked(bytes, event::MAX_SNAPSHOT_BYTES)
        .map_err(|source| CorruptError::Snapshot { run, source })?;
    debug_assert_eq!(snapshot.format_version, FORMAT_VERSION);
    let state = &snapshot.state;
    let reason = if state.run_id != run {
        Some(format!("it holds the state of run {}", state.run_id))
    } else if state.steps.len() != state.spec.steps.len() {
        Some(format!(
            "it has {} step states for {} steps",
            state.steps.len(),
            state.spec.steps.len()
        ))
    } else {
        None
    };
    if let Some(reason) = reason {
        return Err(CorruptError::Snapshot {
            run,
            source: DecodeError::Malformed { reason },
        });
    }
    Ok(snapshot.state)
}

/// The snapshot bytes of `state`, as the `runs` table stores them. For tests that edit a
/// journal behind the library's back (to check that `verify` notices); never needed otherwise.
#[doc(hidden)]
pub fn encode_snapshot_for_tests(state: &RunState) -> Result<Vec<u8>, EncodeError> {
    encode_snapshot(state)
}
