//! The mark a scrub leaves beside a journal it found damaged (`crate::scrub`), and the look
//! every open takes at it: a stat of a file that is not there, in the common case.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::event::UnixMs;

/// The file beside the journal at `journal` that says a scrub found it damaged: while it names
/// that very file (its device and inode), every open refuses the journal as damage. A journal
/// rebuilt in its place (`recover --from-projections`) is another file, which it does not name.
pub fn damage_marker_path(journal: &Path) -> PathBuf {
    let mut name = journal
        .file_name()
        .map(OsString::from)
        .unwrap_or_else(|| OsString::from("journal"));
    name.push(".damaged");
    journal.with_file_name(name)
}

/// What a damage marker holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct DamageMarker {
    dev: u64,
    ino: u64,
    at_ms: UnixMs,
    problems: Vec<String>,
}

/// The most a damage marker is read of: its problems are a few lines.
const MARKER_MAX_BYTES: u64 = 64 << 10;

/// What the damage marker beside `journal` says of `file`, the journal opened: `Some(reason)`
/// when a scrub found that very file damaged. A missing, unreadable or stale marker (another
/// file's) says nothing: one failed `stat` in the common case.
pub(crate) fn marked_damage(journal: &Path, file: &std::fs::File) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let marker = damage_marker_path(journal);
    let bytes = match crate::durable_fs::read_file_bounded(&marker, MARKER_MAX_BYTES) {
        Ok(crate::durable_fs::Bounded::Whole(bytes)) => bytes,
        _ => return None,
    };
    let marker: DamageMarker = serde_json::from_slice(&bytes).ok()?;
    let metadata = file.metadata().ok()?;
    (metadata.dev() == marker.dev && metadata.ino() == marker.ino).then(|| {
        format!(
            "the home's scrub at {} found it damaged: {}",
            crate::duration::format_time_s(marker.at_ms),
            marker.problems.join("; ")
        )
    })
}

/// Marks the journal at `journal`, the file of device `dev` and inode `ino`, damaged as a scrub
/// at `at_ms` found it (`problems`): durably, before anything else is said of the damage.
pub fn mark_damaged(
    journal: &Path,
    dev: u64,
    ino: u64,
    at_ms: UnixMs,
    problems: &[String],
) -> std::io::Result<()> {
    let marker = damage_marker_path(journal);
    let content = DamageMarker {
        dev,
        ino,
        at_ms,
        problems: problems.to_vec(),
    };
    let bytes = serde_json::to_vec_pretty(&content).map_err(std::io::Error::other)?;
    crate::durable_fs::write_atomic(&marker, &bytes)?;
    crate::durable_fs::open_existing_read_only(&marker)?.sync_all()?;
    crate::durable_fs::sync_parent(&marker)
}
