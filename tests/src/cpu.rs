//! CPU time from `/proc` (Linux), for the load harness: how much of the machine pixgate,
//! the fleet and everything else (the broker, the kernel's writeback) used over a phase.
//! On a 2-core machine the drain is CPU-bound, so CPU per record is the steadier figure
//! when neighbours make wall-clock rates noisy.

use std::time::Duration;

/// Clock ticks per second of `/proc` times (`USER_HZ`): 100 on every mainstream Linux
/// architecture (`getconf CLK_TCK`).
const USER_HZ: u64 = 100;

fn ticks(t: u64) -> Duration {
    Duration::from_millis(t * 1000 / USER_HZ)
}

/// User + system time a process has used so far (`utime` + `stime`, fields 14 and 15 of
/// `/proc/PID/stat`), its threads included; `None` if it is gone or this is not Linux.
pub fn process(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: count after it.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut f = rest.split_whitespace().skip(11);
    let (user, system): (u64, u64) = (f.next()?.parse().ok()?, f.next()?.parse().ok()?);
    Some(ticks(user + system))
}

/// Machine-wide CPU time so far, all cores summed (the `cpu` line of `/proc/stat`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Machine {
    /// Time not idle (user, nice, system, irq, softirq, steal).
    pub busy: Duration,
    /// Busy plus idle and I/O wait.
    pub total: Duration,
}

impl Machine {
    /// Now; `None` if `/proc/stat` cannot be read.
    pub fn now() -> Option<Machine> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let line = stat.lines().find(|l| l.starts_with("cpu "))?;
        let v: Vec<u64> = line.split_whitespace().skip(1).filter_map(|x| x.parse().ok()).collect();
        // user nice system idle iowait irq softirq steal (guest time is inside user).
        let (idle, total) = (v.get(3)? + v.get(4)?, v.iter().take(8).sum::<u64>());
        Some(Machine { busy: ticks(total - idle), total: ticks(total) })
    }

    /// What was used between `earlier` and `self`.
    pub fn since(self, earlier: Machine) -> Machine {
        Machine { busy: self.busy.saturating_sub(earlier.busy), total: self.total.saturating_sub(earlier.total) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Spinning until this process has used 300 ms of CPU (as `process` says) ends, and
    /// the machine-wide busy time grew by about as much: at least 80% of it, because
    /// `/proc/stat` charges whole ticks to whatever ran when each tick fell, while a
    /// process's own times come from its measured run time (the full 300 ms fell short
    /// once while the whole test suite loaded a 2-core machine).
    #[test]
    fn a_busy_loop_is_counted() {
        let me = std::process::id();
        let (p0, m0) = (process(me).unwrap(), Machine::now().unwrap());
        let give_up = std::time::Instant::now() + Duration::from_secs(60);
        let mut x = 0u64;
        while process(me).unwrap() - p0 < Duration::from_millis(300) {
            assert!(std::time::Instant::now() < give_up, "process time stuck at {:?}", process(me).unwrap() - p0);
            for _ in 0..100_000 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
            }
        }
        let used = Machine::now().unwrap().since(m0);
        assert!(used.busy >= Duration::from_millis(240) && used.total >= used.busy, "{used:?}");
    }
}
