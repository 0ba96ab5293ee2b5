//! The descendant sweep: ending what a step (or a hook) left running outside its process
//! group.
//!
//! A step's group is ended as a whole ([`crate::process_group`]), but a process can leave it:
//! `setsid` puts it in a session of its own, and a double fork orphans it as well. As the
//! child subreaper of its steps, the runner inherits such orphans, so every process a step
//! started is still a descendant of the runner: once no step is running (a step's group is
//! gone and none other runs, on stop, on timeout, and when the runner exits), whatever is
//! left below the runner was left behind by a step, and is ended here — SIGTERM, the grace,
//! SIGKILL — and named.
//!
//! With steps running in parallel, what one of them left cannot be told from what another
//! still running left (an orphan's first parent is gone): the sweep waits until no step runs,
//! and names what it ended in the error of the step whose end it followed.
//!
//! Invariant: a process is signalled only when it was found by walking the runner's children
//! ([`platform::children`]) and, just before the signal, its pid is still held by the process
//! found (same start time), through a pidfd opened and checked
//! ([`crate::process_group::signal_process`]).
//! Invariant: a zombie is reaped only when it is the runner's child and not a step's leader,
//! whose exit status its own waiter collects.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use nix::sys::wait::{WaitPidFlag, waitpid};
use nix::unistd::Pid;

use super::KILL_VERIFY_TIMEOUT;
use crate::event::ProcessIdentity;
use crate::platform;

/// How often the descendants are looked at while waiting for them to go.
const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// The most processes a message names; the rest are counted.
pub const MAX_NAMED: usize = 8;

/// A process the sweep found, as a message names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Named {
    pub pid: u32,
    /// Its command name, when the platform tells it.
    pub name: Option<String>,
}

/// What a sweep did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Swept {
    /// Every process it found and signalled, in pid order.
    pub ended: Vec<Named>,
    /// SIGKILL was needed.
    pub was_killed: bool,
    /// Those still alive [`KILL_VERIFY_TIMEOUT`] after SIGKILL.
    pub survivors: Vec<Named>,
}

impl Swept {
    pub fn is_empty(&self) -> bool {
        self.ended.is_empty()
    }

    /// The sentence a step's error gets: `ended 2 processes it left outside its process
    /// group: 4242 (sleep), 4250 (sh)`, and the survivors if any. Empty when nothing was found.
    pub fn describe(&self) -> String {
        if self.ended.is_empty() {
            return String::new();
        }
        let count = self.ended.len();
        let noun = if count == 1 { "process" } else { "processes" };
        let how = if self.was_killed {
            " (SIGKILL was needed)"
        } else {
            ""
        };
        let mut text = format!(
            "ended {count} {noun} it left outside its process group{how}: {}",
            name_list(&self.ended)
        );
        if !self.survivors.is_empty() {
            text.push_str(&format!(
                "; still alive {} after SIGKILL: {}",
                crate::duration::format_duration(KILL_VERIFY_TIMEOUT),
                name_list(&self.survivors)
            ));
        }
        text
    }
}

/// `4242 (sleep), 4250 (sh), and 3 more`: at most [`MAX_NAMED`] processes.
pub fn name_list(processes: &[Named]) -> String {
    let mut parts: Vec<String> = processes
        .iter()
        .take(MAX_NAMED)
        .map(|process| match &process.name {
            Some(name) => format!("{} ({name})", process.pid),
            None => process.pid.to_string(),
        })
        .collect();
    if processes.len() > MAX_NAMED {
        parts.push(format!("and {} more", processes.len() - MAX_NAMED));
    }
    parts.join(", ")
}

/// A live descendant: its pid and the start time that tells it from a later holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Found {
    pid: u32,
    start_time: u64,
}

/// Ends every live descendant of `root` (this process, the runner): SIGTERM, up to `grace` for
/// them to go, SIGKILL, up to [`KILL_VERIFY_TIMEOUT`]. Processes born meanwhile (a descendant
/// forking as it ends) are found by walking again, and ended too. Zombies that are `root`'s
/// children are reaped, except the pids in `never_reap` (step leaders, whose waiters reap
/// them). Blocks the calling thread while it waits.
pub fn sweep(root: u32, never_reap: &BTreeSet<u32>, grace: Duration) -> io::Result<Swept> {
    let mut ended: BTreeMap<u32, Named> = BTreeMap::new();
    let mut was_killed = false;
    let mut signal = Signal::SIGTERM;
    let mut deadline = Instant::now() + grace;
    loop {
        let found = walk(root, never_reap)?;
        if found.is_empty() {
            return Ok(Swept {
                ended: ended.into_values().collect(),
                was_killed,
                survivors: Vec::new(),
            });
        }
        for process in &found {
            let is_new = !ended.contains_key(&process.pid);
            if is_new {
                let name = platform::command_name(process.pid).ok().flatten();
                ended.insert(
                    process.pid,
                    Named {
                        pid: process.pid,
                        name,
                    },
                );
            }
            // Each process gets SIGTERM once, when first found; SIGKILL at every look.
            if is_new || signal == Signal::SIGKILL {
                send(process, signal);
            }
        }
        if Instant::now() >= deadline {
            if signal == Signal::SIGKILL {
                let survivors = found
                    .iter()
                    .filter_map(|process| ended.get(&process.pid).cloned())
                    .collect();
                return Ok(Swept {
                    ended: ended.into_values().collect(),
                    was_killed,
                    survivors,
                });
            }
            signal = Signal::SIGKILL;
            was_killed = true;
            deadline = Instant::now() + KILL_VERIFY_TIMEOUT;
            for process in &found {
                send(process, signal);
            }
        }
        std::thread::sleep(POLL_INTERVAL);
    }
}

/// The live descendants of `root` now, reaping what may be reaped on the way. A process whose
/// start time this user may not read is not ours (ours run as this user): it is left alone,
/// and so is what is below it.
fn walk(root: u32, never_reap: &BTreeSet<u32>) -> io::Result<Vec<Found>> {
    let mut found = Vec::new();
    let mut parents = vec![root];
    let mut seen = BTreeSet::from([root]);
    while let Some(parent) = parents.pop() {
        for child in platform::children(parent)? {
            if !seen.insert(child.pid) {
                continue;
            }
            if !child.is_alive() {
                if parent == root && !never_reap.contains(&child.pid) {
                    reap(child.pid);
                }
                // A zombie's children were handed to the subreaper: they are the root's now.
                continue;
            }
            let Some(start_time) = child.start_time else {
                continue;
            };
            found.push(Found {
                pid: child.pid,
                start_time,
            });
            parents.push(child.pid);
        }
    }
    Ok(found)
}

/// Sends `signal` to `process` if its pid still names it, through the one signaller of
/// recorded processes ([`crate::process_group::signal_process`]: a pidfd checked against its
/// identity, so the signal reaches that process or nobody).
fn send(process: &Found, signal: Signal) {
    if process.pid <= 1 {
        return;
    }
    let (Ok(boot_id), Ok(pid_namespace)) = (platform::boot_id(), platform::pid_namespace()) else {
        return;
    };
    let identity = ProcessIdentity {
        pid: process.pid,
        start_time: process.start_time,
        boot_id,
        pid_namespace,
    };
    // Gone meanwhile is what we want; a failure to look leaves it for the next look.
    let _ = crate::process_group::signal_process(&identity, signal);
}

/// Reaps `pid` if it is a zombie child of this process; anything else is left as it is.
fn reap(pid: u32) {
    if let Ok(raw) = i32::try_from(pid) {
        let _ = waitpid(Pid::from_raw(raw), Some(WaitPidFlag::WNOHANG));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(pid: u32, name: &str) -> Named {
        Named {
            pid,
            name: Some(name.to_string()),
        }
    }

    #[test]
    fn a_sweep_that_found_nothing_says_nothing() {
        assert_eq!(Swept::default().describe(), "");
    }

    #[test]
    fn the_description_names_each_process_and_bounds_the_list() {
        let swept = Swept {
            ended: vec![
                named(4242, "sleep"),
                Named {
                    pid: 4250,
                    name: None,
                },
            ],
            was_killed: false,
            survivors: Vec::new(),
        };
        assert_eq!(
            swept.describe(),
            "ended 2 processes it left outside its process group: 4242 (sleep), 4250"
        );
        let many: Vec<Named> = (0..20).map(|pid| named(100 + pid, "sh")).collect();
        let listed = name_list(&many);
        assert!(listed.ends_with(", and 12 more"), "{listed}");
        assert_eq!(listed.matches("(sh)").count(), MAX_NAMED);
        let swept = Swept {
            ended: vec![named(7, "stuck")],
            was_killed: true,
            survivors: vec![named(7, "stuck")],
        };
        assert_eq!(
            swept.describe(),
            "ended 1 process it left outside its process group (SIGKILL was needed): 7 (stuck); \
             still alive 5s after SIGKILL: 7 (stuck)"
        );
    }

    /// A process that left its shell's group (`setsid`) below a root of its own (not the
    /// test process: sweeping the test process would reach other tests' children) is ended
    /// and named; the root itself is not touched.
    #[test]
    fn a_descendant_in_a_session_of_its_own_is_ended_and_named() {
        let dir = tempfile::tempdir().expect("temp dir");
        let pid_file = dir.path().join("pid");
        let mut root = std::process::Command::new("sh")
            .arg("-c")
            .arg(r#"setsid sleep 300 & echo $! > "$0.tmp" && mv "$0.tmp" "$0"; exec sleep 300"#)
            .arg(&pid_file)
            .spawn()
            .expect("spawn the root");
        let mut escapee = None;
        for _ in 0..3000 {
            if let Ok(text) = std::fs::read_to_string(&pid_file) {
                let pid: u32 = text.trim().parse().expect("a pid");
                if platform::command_name(pid).expect("read").as_deref() == Some("sleep") {
                    escapee = Some(pid);
                    break;
                }
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let escapee = escapee.expect("the escapee started");
        let escapee_info = platform::process(escapee).expect("read").expect("alive");
        assert_ne!(
            escapee_info.group_id,
            root.id(),
            "the escapee is not in its parent's group"
        );
        let swept = sweep(root.id(), &BTreeSet::new(), Duration::from_secs(30));
        let root_is_alive = platform::process(root.id())
            .expect("read")
            .is_some_and(|info| info.is_alive());
        root.kill().expect("kill the root");
        root.wait().expect("reap the root");
        let swept = swept.expect("the sweep ran");
        assert!(root_is_alive, "the root is not swept");
        assert_eq!(swept.ended, vec![named(escapee, "sleep")]);
        assert!(!swept.was_killed && swept.survivors.is_empty(), "{swept:?}");
        // The escapee was the root's child: a zombie until the root is reaped, then gone.
        let is_gone = platform::process(escapee)
            .expect("read")
            .is_none_or(|info| !info.is_alive());
        assert!(is_gone, "the escapee was ended");
    }
}
