//! What a live step's processes use, through the `sysinfo` crate: CPU and resident memory of
//! a process group and every descendant of its members. Not journaled: only shown.

use std::collections::{BTreeSet, HashMap};
use std::io;

use serde::Serialize;
use sysinfo::{Pid, ProcessRefreshKind, ProcessesToUpdate, System};

/// What a set of processes uses now.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Usage {
    /// The processes counted, in pid order.
    pub pids: Vec<u32>,
    /// CPU over the measuring window, in percent of one core (several cores: over 100).
    pub cpu_percent: f64,
    /// CPU time the processes have used since they started, in milliseconds.
    pub cpu_time_ms: u64,
    /// Resident memory, in bytes.
    pub resident_bytes: u64,
}

/// A look at every process, refreshed twice [`sysinfo::MINIMUM_CPU_UPDATE_INTERVAL`] apart so
/// CPU percentages mean something. Blocks the calling thread for that long.
pub struct ProcessTable {
    system: System,
}

impl ProcessTable {
    /// Looks at every process (blocking, about 200 ms).
    pub fn look() -> io::Result<ProcessTable> {
        let mut system = System::new().map_err(|error| io::Error::other(error.to_string()))?;
        let kind = ProcessRefreshKind::nothing().with_cpu().with_memory();
        system.refresh_processes_specifics(ProcessesToUpdate::All, true, kind);
        std::thread::sleep(sysinfo::MINIMUM_CPU_UPDATE_INTERVAL);
        system.refresh_processes_specifics(ProcessesToUpdate::All, true, kind);
        Ok(ProcessTable { system })
    }

    /// The usage of `members` (a step's process group) and of every descendant of theirs.
    pub fn usage_of(&self, members: &[u32]) -> Usage {
        let processes = self.system.processes();
        let mut children: HashMap<Pid, Vec<Pid>> = HashMap::new();
        for (pid, process) in processes {
            if let Some(parent) = process.parent() {
                children.entry(parent).or_default().push(*pid);
            }
        }
        let mut counted: BTreeSet<Pid> = BTreeSet::new();
        let mut to_visit: Vec<Pid> = members.iter().map(|&pid| Pid::from_u32(pid)).collect();
        while let Some(pid) = to_visit.pop() {
            if !processes.contains_key(&pid) || !counted.insert(pid) {
                continue;
            }
            if let Some(kids) = children.get(&pid) {
                to_visit.extend(kids.iter().copied());
            }
        }
        let mut usage = Usage {
            pids: counted.iter().map(|pid| pid.as_u32()).collect(),
            cpu_percent: 0.0,
            cpu_time_ms: 0,
            resident_bytes: 0,
        };
        for pid in &counted {
            if let Some(process) = processes.get(pid) {
                usage.cpu_percent += f64::from(process.cpu_usage());
                usage.cpu_time_ms = usage
                    .cpu_time_ms
                    .saturating_add(process.accumulated_cpu_time());
                usage.resident_bytes = usage.resident_bytes.saturating_add(process.memory());
            }
        }
        usage
    }
}
