//! The home's watcher at rest (group `watcher`): the CPU it spends while 100 runs are active and
//! nothing happens, measured from the kernel's count of its time on a CPU over a quiet spell,
//! and stated per hour.

use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::felt::binary;

/// What the watcher spent at rest.
#[derive(Debug, Clone)]
pub struct Watched {
    /// Runs active (each a runner and its `sleep`).
    pub runs: usize,
    /// How long it was watched.
    pub spell: Duration,
    /// Its CPU time over the spell, and the times it was put on a CPU.
    pub cpu: Duration,
    pub wakeups: u64,
}

impl Watched {
    /// Its CPU per hour, as the spell's.
    pub fn cpu_per_hour(&self) -> Duration {
        self.cpu.mul_f64(3600.0 / self.spell.as_secs_f64())
    }
}

/// The CPU time (ns) a process spent on a CPU, and the times it was put on one, from
/// `/proc/<pid>/schedstat`.
fn schedstat(pid: u32) -> (u64, u64) {
    let text = std::fs::read_to_string(format!("/proc/{pid}/schedstat"))
        .expect("the watcher's schedstat reads");
    let fields: Vec<u64> = text
        .split_whitespace()
        .map(|field| field.parse().expect("a number"))
        .collect();
    (fields[0], fields[2])
}

/// Launches `runs` runs that sleep an hour in a home of their own, waits until the watcher
/// leads and has read them, then counts its CPU over `spell`; stops the runs after.
pub fn measure(scratch: &Path, runs: usize, spell: Duration) -> Watched {
    let home = scratch.join("watcher");
    let mut ids = Vec::with_capacity(runs);
    for _ in 0..runs {
        let output = binary()
            .arg("--home")
            .arg(&home)
            .args(["run", "--json", "--", "sleep", "3600"])
            .stdout(std::process::Stdio::piped())
            .output()
            .expect("runjournal runs");
        assert!(output.status.success(), "run: {output:?}");
        let printed: serde_json::Value =
            serde_json::from_slice(&output.stdout).expect("run --json prints JSON");
        ids.push(printed["runId"].as_str().expect("a run id").to_string());
    }
    let lock = home.join("timer.lock");
    let deadline = Instant::now() + Duration::from_secs(60);
    let pid = loop {
        let note = std::fs::read_to_string(&lock).unwrap_or_default();
        if let Ok(pid) = note.trim().parse::<u32>() {
            break pid;
        }
        assert!(Instant::now() < deadline, "no watcher leads the home");
        std::thread::sleep(Duration::from_millis(20));
    };
    // Its first looks read every run; what is measured is the rest after them.
    std::thread::sleep(Duration::from_secs(2));
    let (cpu_before, wakeups_before) = schedstat(pid);
    std::thread::sleep(spell);
    let (cpu_after, wakeups_after) = schedstat(pid);
    for id in &ids {
        let _ = binary()
            .arg("--home")
            .arg(&home)
            .args(["stop", id])
            .output();
    }
    Watched {
        runs,
        spell,
        cpu: Duration::from_nanos(cpu_after.saturating_sub(cpu_before)),
        wakeups: wakeups_after.saturating_sub(wakeups_before),
    }
}

/// The row of the watcher at rest.
pub fn render(watched: &Watched) -> String {
    let mut out = String::new();
    let spell = watched.spell.as_secs_f64();
    let _ = writeln!(
        out,
        "\n**The home's watcher at rest.** {} runs active (each a runner and a `sleep 3600`), \
         nothing happening: the watcher's CPU time over {spell:.0} s, from the kernel's count \
         (`/proc/PID/schedstat`), stated per hour, and how often it was put on a CPU.\n",
        watched.runs
    );
    let mut table = crate::report::Table::new(&["what", "figure"]);
    table.row(&[
        "CPU per hour".into(),
        format!("{:.2} s", watched.cpu_per_hour().as_secs_f64()),
    ]);
    table.row(&[
        "CPU over the spell".into(),
        format!("{:.1} ms", watched.cpu.as_secs_f64() * 1e3),
    ]);
    table.row(&[
        "put on a CPU, per second".into(),
        format!("{:.1}", watched.wakeups as f64 / spell),
    ]);
    out.push_str(&table.text);
    out
}
