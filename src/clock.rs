//! The server's clock for everything that expires: access and refresh tokens, export-job files,
//! the per-user request bucket. One `Clock` per server, shared by the parts that ask the time.
//!
//! It is the system clock. Only a debug build (what `cargo test` builds) has [`Clock::advance`],
//! with which an in-process test moves one server's time forward instead of sleeping through a
//! lifetime; a release build has no way to move it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

#[derive(Clone, Debug, Default)]
pub struct Clock {
    /// Milliseconds added to the system clock: always 0 outside tests.
    offset_ms: Arc<AtomicU64>,
}

impl Clock {
    fn offset(&self) -> Duration {
        Duration::from_millis(self.offset_ms.load(Ordering::Relaxed))
    }

    /// The current time.
    pub fn now(&self) -> DateTime<Utc> {
        let offset = chrono::Duration::from_std(self.offset()).unwrap_or(chrono::Duration::zero());
        Utc::now() + offset
    }

    /// The current monotonic instant, for rates and intervals.
    pub fn instant(&self) -> Instant {
        Instant::now() + self.offset()
    }

    /// Test only: moves this clock (and every part sharing it) forward.
    #[cfg(debug_assertions)]
    pub fn advance(&self, by: Duration) {
        let ms = u64::try_from(by.as_millis()).unwrap_or(u64::MAX);
        self.offset_ms.fetch_add(ms, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advancing_moves_both_readings_and_every_clone() {
        let clock = Clock::default();
        let shared = clock.clone();
        let (wall, mono) = (clock.now(), clock.instant());
        shared.advance(Duration::from_secs(90));
        assert!(clock.now() - wall >= chrono::Duration::seconds(90));
        assert!(clock.instant() - mono >= Duration::from_secs(90));
    }
}
