//! CPU time the machine's processes use, from `/proc`: for telling a
//! measurement that timed a busy machine from one that timed what it meant
//! to (`rocev2 lab collective` on rated links needs the CPUs to itself).

use std::{collections::HashMap, io};

/// The machine's CPU time so far and every user process's, in clock ticks.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CpuSnapshot {
    /// Every CPU's time, idle included (`/proc/stat`'s first line).
    pub total: u64,
    /// User plus system time of each user process (threads included),
    /// by pid. Kernel threads are left out: they run the network stack's
    /// softirqs, which is work of whatever sends, not of another program.
    pub processes: HashMap<u32, u64>,
}

impl CpuSnapshot {
    /// Reads `/proc/stat` and every `/proc/<pid>/stat` now.
    pub fn take() -> io::Result<Self> {
        let total = total_ticks(&std::fs::read_to_string("/proc/stat")?)
            .ok_or_else(|| io::Error::other("/proc/stat has no cpu line"))?;
        let mut processes = HashMap::new();
        for entry in std::fs::read_dir("/proc")? {
            let Ok(entry) = entry else { continue };
            let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
            // A process may end between the listing and the read.
            let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
            if let Some(ticks) = process_ticks(&stat) {
                processes.insert(pid, ticks);
            }
        }
        Ok(Self { total, processes })
    }

    /// The share of the machine's CPU time between `before` and this
    /// snapshot that user processes other than `ours` used (0 to 1).
    pub fn others_share(&self, before: &CpuSnapshot, ours: &[u32]) -> f64 {
        let elapsed = self.total.saturating_sub(before.total);
        if elapsed == 0 {
            return 0.0;
        }
        let used: u64 = self
            .processes
            .iter()
            .filter(|(pid, _)| !ours.contains(pid))
            .map(|(pid, &t)| t.saturating_sub(before.processes.get(pid).copied().unwrap_or(0)))
            .sum();
        (used as f64 / elapsed as f64).min(1.0)
    }
}

/// All CPUs' ticks from `/proc/stat`'s first line: user, nice, system,
/// idle, iowait, irq, softirq, steal (guest time is inside user and nice).
fn total_ticks(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    Some(line.split_whitespace().skip(1).take(8).filter_map(|v| v.parse::<u64>().ok()).sum())
}

/// A user process's utime + stime from its `/proc/<pid>/stat`, or `None`
/// for a kernel thread (flag `PF_KTHREAD`).
fn process_ticks(stat: &str) -> Option<u64> {
    // The command name is in parentheses and may hold spaces or ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state(0) ppid(1) ... flags(6) ... utime(11) stime(12).
    const PF_KTHREAD: u64 = 0x0020_0000;
    let flags: u64 = fields.get(6)?.parse().ok()?;
    if flags & PF_KTHREAD != 0 {
        return None;
    }
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_totals_and_process_times_parse() {
        let stat = "cpu  100 20 30 400 5 0 45 0 7 0\ncpu0 50 10 15 200 2 0 20 0 0 0\n";
        assert_eq!(total_ticks(stat), Some(600));
        // A name with a space and a parenthesis; utime 17, stime 4.
        let user = "4242 (my (odd) prog) S 1 4242 4242 0 -1 4194560 100 0 0 0 17 4 0 0 20 0 3 0 1 2 3";
        assert_eq!(process_ticks(user), Some(21));
        let kthread = "15 (ksoftirqd/1) S 2 0 0 0 -1 69238848 0 0 0 0 0 9 0 0 20 0 1 0 5 0 0";
        assert_eq!(process_ticks(kthread), None, "a kernel thread is not another program");
    }

    #[test]
    fn cpu_others_share_leaves_out_ours_and_counts_newcomers() {
        let before = CpuSnapshot { total: 1000, processes: HashMap::from([(1, 100), (2, 50), (3, 10)]) };
        let after = CpuSnapshot { total: 1400, processes: HashMap::from([(1, 300), (2, 90), (3, 10), (4, 20)]) };
        // Of 400 ticks: pid 2 used 40 and pid 4 (started meanwhile) 20; pid 1 is ours.
        assert!((after.others_share(&before, &[1]) - 0.15).abs() < 1e-12);
        assert!((after.others_share(&before, &[1, 2, 4]) - 0.0).abs() < 1e-12);
        assert_eq!(after.others_share(&after, &[]), 0.0, "no time passed");
    }
}
