//! The runner's watch on its run's control inbox (`crate::control_inbox`): a thread that
//! waits on the inbox's directories — an inotify watch where there is one — and wakes the
//! runner's loop when a file changes there. The loop takes the inbox at each wake-up and at
//! each poll (every [`super::RunnerConfig::poll_interval`], 250 ms by default), so a request
//! is taken within a poll even where no watch can be made.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::Notify;

use crate::event::RunId;
use crate::home::Home;

/// How long the watching thread waits at a time before it looks whether it should stop.
const WAIT_SLICE: Duration = Duration::from_secs(1);

/// The inbox watch of a runner; stops its thread when dropped.
#[derive(Debug)]
pub struct InboxWatch {
    stop: Arc<AtomicBool>,
}

impl Drop for InboxWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Watches `run`'s inbox (`control/`, `control/stop-requests/`, `control/steer-requests/`,
/// made first) and notifies `wake` of each change. `None` when no watch could be made (no
/// inotify, a directory that could not be made): the loop's poll takes the inbox then.
pub fn watch(home: &Home, run: RunId, wake: Arc<Notify>) -> Option<InboxWatch> {
    crate::control_inbox::prepare(home, run);
    // Through the home's held directory, as every file of the home is reached.
    let held = |dir: &std::path::Path| crate::durable_fs::held_path(dir).ok();
    let watch = crate::platform::watch_dir(held(&home.control_dir(run))?.path(), &[]).ok()?;
    if !watch.is_woken_by_changes() {
        return None;
    }
    for dir in [home.stop_requests_dir(run), home.steer_requests_dir(run)] {
        watch.watch_also(held(&dir)?.path()).ok()?;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let stopped = Arc::clone(&stop);
    std::thread::Builder::new()
        .name("control-inbox".to_string())
        .spawn(move || {
            while !stopped.load(Ordering::Relaxed) {
                match watch.wait(WAIT_SLICE) {
                    Ok(true) => wake.notify_one(),
                    Ok(false) => {}
                    // The watch broke: the poll goes on taking the inbox.
                    Err(_) => return,
                }
            }
        })
        .ok()?;
    Some(InboxWatch { stop })
}
