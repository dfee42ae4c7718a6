//! Resident memory of the server processes under test (`--rss-pid`), sampled from
//! `/proc/PID/status` while a scenario runs: the evidence that streaming does not buffer whole
//! files. Several pids (the nodes of a cluster) are summed at each sample.

use std::sync::{Arc, Mutex};
use std::time::Duration;

const INTERVAL: Duration = Duration::from_millis(20);

/// A background sampler; phases are delimited by `mark`, which returns the phase's peak.
pub struct RssSampler {
    pids: Vec<u32>,
    peak: Arc<Mutex<u64>>,
    task: tokio::task::JoinHandle<()>,
}

impl RssSampler {
    /// None when no pid was given. A pid that cannot be read counts as 0 (it ended).
    pub fn start(pids: &[u32]) -> Option<RssSampler> {
        if pids.is_empty() {
            return None;
        }
        let pids = pids.to_vec();
        let peak = Arc::new(Mutex::new(total_kib(&pids)));
        let task = {
            let (pids, peak) = (pids.clone(), peak.clone());
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(INTERVAL).await;
                    let now = total_kib(&pids);
                    let mut p = peak.lock().unwrap_or_else(|e| e.into_inner());
                    *p = (*p).max(now);
                }
            })
        };
        Some(RssSampler { pids, peak, task })
    }

    /// The current resident memory, in MiB.
    pub fn now_mib(&self) -> f64 {
        total_kib(&self.pids) as f64 / 1024.0
    }

    /// The peak since the previous mark (or the start), in MiB; the next phase starts from now.
    pub fn mark(&self) -> f64 {
        let now = total_kib(&self.pids);
        let mut p = self.peak.lock().unwrap_or_else(|e| e.into_inner());
        let peak = (*p).max(now);
        *p = now;
        peak as f64 / 1024.0
    }
}

impl Drop for RssSampler {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn total_kib(pids: &[u32]) -> u64 {
    pids.iter().map(|&pid| vm_rss_kib(pid).unwrap_or(0)).sum()
}

fn vm_rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}
