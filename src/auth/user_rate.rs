//! The optional per-user request rate (docs/api.md §15): a token bucket per user that refills at R per
//! second up to 2R.

use std::time::Instant;

use dashmap::DashMap;
use uuid::Uuid;

use crate::clock::Clock;

struct Bucket {
    tokens: f64,
    at: Instant,
}

pub struct UserLimiter {
    per_sec: f64,
    buckets: DashMap<Uuid, Bucket>,
    clock: Clock,
}

impl UserLimiter {
    /// `per_sec` 0 turns the limit off.
    pub fn new(per_sec: u32, clock: Clock) -> Self {
        UserLimiter { per_sec: f64::from(per_sec), buckets: DashMap::new(), clock }
    }

    /// Takes one token for `user`; false when the bucket is empty.
    pub fn try_take(&self, user: Uuid) -> bool {
        self.try_take_at(user, self.clock.instant())
    }

    fn try_take_at(&self, user: Uuid, now: Instant) -> bool {
        if self.per_sec <= 0.0 {
            return true;
        }
        let capacity = 2.0 * self.per_sec;
        let mut bucket = self.buckets.entry(user).or_insert(Bucket { tokens: capacity, at: now });
        let elapsed = now.saturating_duration_since(bucket.at).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * self.per_sec).min(capacity);
        bucket.at = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn burst_of_two_r_then_refill_at_r() {
        let limiter = UserLimiter::new(5, Clock::default());
        let (user, other) = (Uuid::new_v4(), Uuid::new_v4());
        let t0 = Instant::now();
        assert_eq!((0..12).filter(|_| limiter.try_take_at(user, t0)).count(), 10);
        assert!(limiter.try_take_at(other, t0), "buckets are per user");
        let t1 = t0 + Duration::from_millis(400);
        assert_eq!((0..5).filter(|_| limiter.try_take_at(user, t1)).count(), 2);
        // A long pause fills the bucket to capacity, not beyond.
        let t2 = t1 + Duration::from_secs(60);
        assert_eq!((0..20).filter(|_| limiter.try_take_at(user, t2)).count(), 10);
    }

    #[test]
    fn zero_disables() {
        let limiter = UserLimiter::new(0, Clock::default());
        let user = Uuid::new_v4();
        assert!((0..1000).all(|_| limiter.try_take(user)));
    }
}
