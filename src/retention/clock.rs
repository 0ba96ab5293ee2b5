//! The clock retention judges ages by: the wall clock, held back to what the home has seen.
//!
//! A wall clock that jumps ahead (a bad RTC before NTP sets it, a VM resumed with skew, a
//! process under a faked clock) would make every ended run look older than the age bound at
//! the next pass, and prune them all, results not consumed included. So an age is judged
//! against [`Judged::now_ms`]: the wall clock, but never more than [`lead`] ahead of the later
//! of two things the jump cannot move:
//!
//! * the newest record's time in the journal (a record is committed at the time of its writer);
//! * the clock anchored in this boot: a wall time kept in the journal (meta `clock`) with the
//!   host's uptime when it was kept, advanced by the uptime since (`/proc/uptime`, which no
//!   change of the wall clock moves). The first pass of a boot anchors it, at its own judged
//!   time, so a jump before that anchor is held back too.
//!
//! A clock held back prunes later, never earlier: a home idle across a reboot counts its ended
//! runs' ages from its newest record until the next anchor has run on; one whose clock was
//! behind at boot and was then set forward judges by the anchor until new records catch up.
//!
//! Invariant: [`Judged::now_ms`] ≤ the wall clock, and ≤ [`lead`] past the later of the newest
//! record's time and the anchored clock.

use std::time::Duration;

use crate::event::UnixMs;
use crate::journal::{ClockAnchor as Anchor, ReadError, View};

/// The most the judged clock runs ahead of what the home has seen, for an age bound of
/// `keep_for_ms` (none: no age bound): an hour, or a quarter of the age bound when that is
/// less. A jump forward prunes at most the runs that the true clock would prune within it.
pub fn lead(keep_for_ms: Option<u64>) -> u64 {
    let most = Duration::from_secs(60 * 60).as_millis() as u64;
    keep_for_ms.map_or(most, |keep| most.min(keep / 4))
}

/// The time a pass judges ages by, and what it found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Judged {
    /// The wall clock, held back (see the module's docs).
    pub now_ms: UnixMs,
    /// The wall clock as read.
    pub wall_ms: UnixMs,
    /// An anchor for this boot to keep, when the journal has none of it yet.
    pub new_anchor: Option<Anchor>,
}

impl Judged {
    /// How far the wall clock ran ahead of what the home has seen: 0 when it was not held back.
    pub fn held_back_ms(&self) -> u64 {
        self.wall_ms.saturating_sub(self.now_ms)
    }
}

/// What the host tells of now: the wall clock, this boot's id and its uptime.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reading {
    pub wall_ms: UnixMs,
    pub boot_id: Option<String>,
    pub uptime_ms: Option<u64>,
}

impl Reading {
    /// Reads the host's clocks now.
    pub fn now() -> Reading {
        Reading {
            wall_ms: crate::event::now_ms(),
            boot_id: crate::liveness::boot_id().ok(),
            uptime_ms: crate::platform::uptime_ms(),
        }
    }
}

/// Judges now from `view` (its newest record's time, its anchor) and the host's clocks.
pub fn judge(view: &View, keep_for_ms: Option<u64>) -> Result<Judged, ReadError> {
    let anchor = view.clock_anchor()?;
    Ok(judge_from(
        &Reading::now(),
        view.latest_record_time()?,
        anchor.as_ref(),
        lead(keep_for_ms),
    ))
}

/// [`judge`], from what it read: the host's clocks, the newest record's time, the stored
/// anchor.
pub fn judge_from(
    reading: &Reading,
    latest_record_ms: Option<UnixMs>,
    anchor: Option<&Anchor>,
    lead_ms: u64,
) -> Judged {
    let anchored = match (anchor, &reading.boot_id, reading.uptime_ms) {
        (Some(anchor), Some(boot_id), Some(uptime_ms))
            if anchor.boot_id == *boot_id && uptime_ms >= anchor.uptime_ms =>
        {
            Some(anchor.wall_ms.saturating_add(uptime_ms - anchor.uptime_ms))
        }
        _ => None,
    };
    let seen = [latest_record_ms, anchored].into_iter().flatten().max();
    let now_ms = match seen {
        Some(seen) => reading.wall_ms.min(seen.saturating_add(lead_ms)),
        // Nothing seen: no record, no anchor of this boot. Nothing is old either.
        None => reading.wall_ms,
    };
    let new_anchor = match (anchored, &reading.boot_id, reading.uptime_ms) {
        (None, Some(boot_id), Some(uptime_ms)) => Some(Anchor {
            boot_id: boot_id.clone(),
            wall_ms: now_ms,
            uptime_ms,
        }),
        _ => None,
    };
    Judged {
        now_ms,
        wall_ms: reading.wall_ms,
        new_anchor,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: u64 = 60 * 60 * 1000;
    const DAY: u64 = 24 * HOUR;

    fn reading(wall_ms: u64, boot: &str, uptime_ms: u64) -> Reading {
        Reading {
            wall_ms,
            boot_id: Some(boot.to_string()),
            uptime_ms: Some(uptime_ms),
        }
    }

    #[test]
    fn a_jump_ahead_is_held_to_the_lead_past_the_newest_record() {
        let at = 1_800_000_000_000;
        let judged = judge_from(&reading(at + 365 * DAY, "b", 5_000), Some(at), None, HOUR);
        assert_eq!(judged.now_ms, at + HOUR);
        assert_eq!(judged.held_back_ms(), 365 * DAY - HOUR);
        assert_eq!(
            judged.new_anchor,
            Some(Anchor {
                boot_id: "b".to_string(),
                wall_ms: at + HOUR,
                uptime_ms: 5_000
            }),
            "the anchor is the judged time, not the jumped one"
        );
    }

    #[test]
    fn an_idle_home_keeps_time_by_its_anchor_in_the_same_boot() {
        let at = 1_800_000_000_000;
        let anchor = Anchor {
            boot_id: "b".to_string(),
            wall_ms: at,
            uptime_ms: 1_000,
        };
        // Forty days on, by the uptime as by the wall clock, and no record since.
        let later = reading(at + 40 * DAY, "b", 1_000 + 40 * DAY);
        let judged = judge_from(&later, Some(at), Some(&anchor), HOUR);
        assert_eq!(judged.now_ms, at + 40 * DAY, "the wall clock is believed");
        assert_eq!(judged.new_anchor, None, "anchored already");
        // The wall clock a year ahead of the uptime: held to the anchored clock's lead.
        let jumped = reading(at + 405 * DAY, "b", 1_000 + 40 * DAY);
        let judged = judge_from(&jumped, Some(at), Some(&anchor), HOUR);
        assert_eq!(judged.now_ms, at + 40 * DAY + HOUR);
    }

    #[test]
    fn an_anchor_of_another_boot_is_replaced_and_not_believed() {
        let at = 1_800_000_000_000;
        let old = Anchor {
            boot_id: "a".to_string(),
            wall_ms: at + 100 * DAY,
            uptime_ms: 0,
        };
        let judged = judge_from(
            &reading(at + 365 * DAY, "b", 10),
            Some(at),
            Some(&old),
            HOUR,
        );
        assert_eq!(judged.now_ms, at + HOUR);
        assert_eq!(
            judged.new_anchor.map(|anchor| anchor.boot_id),
            Some("b".to_string())
        );
    }

    #[test]
    fn a_clock_behind_is_taken_as_it_is() {
        let at = 1_800_000_000_000;
        let judged = judge_from(&reading(at - DAY, "b", 10), Some(at), None, HOUR);
        assert_eq!(judged.now_ms, at - DAY);
        assert_eq!(judged.held_back_ms(), 0);
    }

    #[test]
    fn the_lead_is_an_hour_or_a_quarter_of_the_age_bound() {
        assert_eq!(lead(None), HOUR);
        assert_eq!(lead(Some(30 * DAY)), HOUR);
        assert_eq!(lead(Some(HOUR)), HOUR / 4);
        assert_eq!(lead(Some(0)), 0);
    }
}
