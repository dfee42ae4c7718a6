//! CPU and memory of the processes under test, read from `/proc` between two samples, so a
//! capacity step can say which resource ran out. Linux only; elsewhere every figure is absent.
//!
//! CPU is in percent of one core (200 % is both cores of a 2-core machine). PostgreSQL's CPU is
//! the postmaster's own and reaped children's time plus the time of its live children (the
//! backends), so backends that come and go between two samples are still counted.

use serde::Serialize;
use std::path::Path;
use std::time::Instant;

/// Linux's `USER_HZ`: the unit of the times in `/proc/<pid>/stat`. It is 100 on every
/// architecture Linux supports today; reading it would need `sysconf` (libc).
const TICKS_PER_SEC: f64 = 100.0;

/// What to watch besides the load tool itself.
#[derive(Debug, Clone, Copy, Default)]
pub struct Watched {
    pub server: Option<u32>,
    pub postgres: Option<u32>,
}

#[derive(Debug, Clone)]
pub struct Sample {
    at: Instant,
    own_ticks: Option<u64>,
    server_ticks: Option<u64>,
    pg_ticks: Option<u64>,
    /// Nanoseconds the server's and PostgreSQL's threads spent runnable but waiting for a core
    /// (`/proc/<pid>/task/*/schedstat`): CPU the machine owed them.
    server_wait_ns: Option<u64>,
    pg_wait_ns: Option<u64>,
    /// `/proc/stat`'s first line: (busy, iowait, total) jiffies of the whole machine.
    machine: Option<(u64, u64, u64)>,
}

/// Use of each resource between two samples.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Usage {
    pub load_tool_cpu_pct: Option<f64>,
    pub load_tool_rss_mb: Option<f64>,
    pub load_tool_open_fds: Option<u64>,
    pub server_cpu_pct: Option<f64>,
    pub server_rss_mb: Option<f64>,
    pub postgres_cpu_pct: Option<f64>,
    /// Time the server's threads waited for a core, in % of one core: above a few %, other
    /// processes (or each other) kept it from running.
    pub server_runqueue_wait_pct: Option<f64>,
    /// The same for PostgreSQL's live backends.
    pub postgres_runqueue_wait_pct: Option<f64>,
    /// Busy share of all cores (100 = every core busy), iowait counted as idle.
    pub machine_busy_pct: Option<f64>,
    /// Share of all cores waiting for I/O.
    pub machine_iowait_pct: Option<f64>,
    pub load_average_1m: Option<f64>,
}

pub fn sample(w: Watched) -> Sample {
    Sample {
        at: Instant::now(),
        own_ticks: proc_ticks("self", false),
        server_ticks: w.server.and_then(|p| proc_ticks(&p.to_string(), false)),
        pg_ticks: w.postgres.and_then(tree_ticks),
        server_wait_ns: w.server.map(|p| runqueue_wait_ns(&[p])),
        pg_wait_ns: w.postgres.map(|p| {
            let mut pids = children(p);
            pids.push(p);
            runqueue_wait_ns(&pids)
        }),
        machine: machine_jiffies(),
    }
}

/// What was used from `a` to `b`; the memory figures are `b`'s.
pub fn usage(w: Watched, a: &Sample, b: &Sample) -> Usage {
    let secs = b.at.duration_since(a.at).as_secs_f64();
    let pct = |x: Option<u64>, y: Option<u64>| match (x, y) {
        (Some(x), Some(y)) if secs > 0.0 => {
            Some(round1(y.saturating_sub(x) as f64 / TICKS_PER_SEC / secs * 100.0))
        }
        _ => None,
    };
    let share = |pick: fn((u64, u64, u64)) -> u64| match (a.machine, b.machine) {
        (Some(m0), Some(m1)) if m1.2 > m0.2 => {
            Some(round1(pick(m1).saturating_sub(pick(m0)) as f64 / (m1.2 - m0.2) as f64 * 100.0))
        }
        _ => None,
    };
    let wait = |x: Option<u64>, y: Option<u64>| match (x, y) {
        (Some(x), Some(y)) if secs > 0.0 => Some(round1(y.saturating_sub(x) as f64 / 1e9 / secs * 100.0)),
        _ => None,
    };
    Usage {
        server_runqueue_wait_pct: wait(a.server_wait_ns, b.server_wait_ns),
        postgres_runqueue_wait_pct: wait(a.pg_wait_ns, b.pg_wait_ns),
        load_tool_cpu_pct: pct(a.own_ticks, b.own_ticks),
        load_tool_rss_mb: rss_mb("self"),
        load_tool_open_fds: std::fs::read_dir("/proc/self/fd").ok().map(|d| d.count() as u64),
        server_cpu_pct: pct(a.server_ticks, b.server_ticks),
        server_rss_mb: w.server.and_then(|p| rss_mb(&p.to_string())),
        postgres_cpu_pct: pct(a.pg_ticks, b.pg_ticks),
        machine_busy_pct: share(|m| m.0),
        machine_iowait_pct: share(|m| m.1),
        load_average_1m: std::fs::read_to_string("/proc/loadavg")
            .ok()
            .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok())),
    }
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

/// Fields of `/proc/<pid>/stat` after the command name (which may contain spaces).
fn stat_fields(pid: &str) -> Option<Vec<u64>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &text[text.rfind(')')? + 1..];
    // The state letter is the first field after the name; keep numeric positions by mapping
    // it to 0.
    Some(rest.split_whitespace().map(|f| f.parse().unwrap_or(0)).collect())
}

/// utime + stime (+ cutime + cstime when `with_children`), in ticks. After the name, index 1 is
/// the parent pid, 11..=14 the four times.
fn proc_ticks(pid: &str, with_children: bool) -> Option<u64> {
    let f = stat_fields(pid)?;
    let own = f.get(11)? + f.get(12)?;
    Some(if with_children { own + f.get(13)? + f.get(14)? } else { own })
}

/// A process's time including reaped children, plus the time of its live children.
fn tree_ticks(root: u32) -> Option<u64> {
    let own = proc_ticks(&root.to_string(), true)?;
    let kids: u64 = children(root).iter().filter_map(|p| proc_ticks(&p.to_string(), false)).sum();
    Some(own + kids)
}

/// Live children of `parent`.
fn children(parent: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()))
        .filter(|pid| {
            stat_fields(&pid.to_string()).and_then(|f| f.get(1).copied()) == Some(u64::from(parent))
        })
        .collect()
}

/// Run-queue wait of every thread of `pids` since each started (the second field of
/// `schedstat`), in nanoseconds.
fn runqueue_wait_ns(pids: &[u32]) -> u64 {
    let mut total = 0;
    for pid in pids {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { continue };
        for t in tasks.flatten() {
            let text = std::fs::read_to_string(t.path().join("schedstat")).unwrap_or_default();
            total += text.split_whitespace().nth(1).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        }
    }
    total
}

/// (busy, iowait, total) jiffies of all cores since boot.
fn machine_jiffies() -> Option<(u64, u64, u64)> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    let line = text.lines().next()?;
    let v: Vec<u64> = line.split_whitespace().skip(1).filter_map(|x| x.parse().ok()).collect();
    // user nice system idle iowait irq softirq steal (guest times are inside user already).
    let total: u64 = v.iter().take(8).sum();
    let idle = v.get(3)? + v.get(4)?;
    Some((total.saturating_sub(idle), *v.get(4)?, total))
}

fn rss_mb(pid: &str) -> Option<f64> {
    let text = std::fs::read_to_string(Path::new("/proc").join(pid).join("status")).ok()?;
    let line = text.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(round1(kb / 1024.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_process_is_measured() {
        let w = Watched { server: Some(std::process::id()), postgres: None };
        let a = sample(w);
        // Burn a little CPU so the difference is visible.
        let mut x = 0u64;
        for i in 0..20_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        assert_ne!(x, 1);
        let b = sample(w);
        let u = usage(w, &a, &b);
        if cfg!(target_os = "linux") {
            assert!(u.load_tool_cpu_pct.is_some());
            assert!(u.server_rss_mb.is_some_and(|m| m > 0.0));
            assert!(u.machine_busy_pct.is_some());
            assert!(u.load_tool_open_fds.is_some_and(|n| n > 0));
        }
        assert_eq!(u.postgres_cpu_pct, None);
    }
}
