//! Login attempts per (client IP, username) in a sliding 60 s window (API.md 15).

use std::collections::VecDeque;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use dashmap::DashMap;

const WINDOW: Duration = Duration::from_secs(60);

pub struct LoginLimiter {
    per_minute: u32,
    attempts: DashMap<(IpAddr, String), VecDeque<Instant>>,
}

impl LoginLimiter {
    pub fn new(per_minute: u32) -> Self {
        LoginLimiter { per_minute, attempts: DashMap::new() }
    }

    /// Counts an attempt, or says how many seconds until one is allowed (a refusal is not counted).
    pub fn try_attempt(&self, ip: IpAddr, username: &str) -> Result<(), u64> {
        if self.per_minute == 0 {
            return Ok(());
        }
        let now = Instant::now();
        if self.attempts.len() > 50_000 {
            self.attempts.retain(|_, q| q.back().is_some_and(|t| now.duration_since(*t) < WINDOW));
        }
        let mut entry = self.attempts.entry((ip, username.to_string())).or_default();
        while entry.front().is_some_and(|t| now.duration_since(*t) >= WINDOW) {
            entry.pop_front();
        }
        if entry.len() >= self.per_minute as usize {
            let oldest = entry.front().copied().unwrap_or(now);
            let wait = WINDOW.saturating_sub(now.duration_since(oldest));
            return Err(wait.as_secs_f64().ceil().max(1.0) as u64);
        }
        entry.push_back(now);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_per_ip_and_username() {
        let l = LoginLimiter::new(2);
        let ip: IpAddr = [127, 0, 0, 1].into();
        assert!(l.try_attempt(ip, "a").is_ok());
        assert!(l.try_attempt(ip, "a").is_ok());
        let wait = l.try_attempt(ip, "a").unwrap_err();
        assert!((1..=60).contains(&wait));
        assert!(l.try_attempt(ip, "b").is_ok());
    }

    #[test]
    fn zero_disables() {
        let l = LoginLimiter::new(0);
        for _ in 0..100 {
            assert!(l.try_attempt([10, 0, 0, 1].into(), "x").is_ok());
        }
    }
}
