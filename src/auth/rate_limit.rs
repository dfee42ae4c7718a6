//! Login attempts per (client IP, username) in a sliding 60 s window (docs/api.md §15), counted in
//! PostgreSQL so that the limit holds for every node sharing the database (§18.2).

use std::net::IpAddr;
use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::db::login_attempts::{self, Attempt};
use crate::db::DbResult;

/// How often rows whose attempts have all left the window are removed.
const SWEEP_EVERY: Duration = Duration::from_secs(60);

pub struct LoginLimiter {
    per_minute: u32,
    pool: deadpool_postgres::Pool,
}

impl LoginLimiter {
    /// `per_minute` 0 turns the limit off.
    pub fn new(per_minute: u32, pool: deadpool_postgres::Pool) -> Self {
        LoginLimiter { per_minute, pool }
    }

    /// Counts an attempt, or says how many seconds until one is allowed (a refusal is not counted).
    pub async fn try_attempt(&self, ip: IpAddr, username: &str) -> DbResult<Result<(), u64>> {
        if self.per_minute == 0 {
            return Ok(Ok(()));
        }
        let key = Sha256::digest(username.as_bytes());
        let db = self.pool.get().await?;
        Ok(match login_attempts::attempt(&db, ip, &key, self.per_minute).await? {
            Attempt::Counted => Ok(()),
            Attempt::Refused { seconds_left } => Err(retry_after(seconds_left)),
        })
    }

    /// Sweeps expired rows every minute, for as long as the server runs (every node does; a row
    /// deleted twice costs nothing).
    pub fn spawn_sweeper(&self, tasks: &crate::shutdown::Tasks) {
        if self.per_minute == 0 {
            return;
        }
        let pool = self.pool.clone();
        tasks.spawn(async move {
            let mut tick = tokio::time::interval(SWEEP_EVERY);
            loop {
                tick.tick().await;
                let Ok(db) = pool.get().await else { continue };
                if let Err(e) = login_attempts::sweep(&db).await {
                    tracing::warn!(error = %e, "sweeping old login attempts failed");
                }
            }
        });
    }
}

/// `Retry-After` in whole seconds, at least 1.
fn retry_after(seconds_left: f64) -> u64 {
    let seconds = seconds_left.ceil();
    if seconds.is_nan() {
        return 1;
    }
    seconds.clamp(1.0, 60.0) as u64
}

#[cfg(test)]
mod tests {
    use super::retry_after;

    #[test]
    fn retry_after_is_whole_seconds_within_the_window() {
        assert_eq!(retry_after(0.2), 1);
        assert_eq!(retry_after(-3.0), 1);
        assert_eq!(retry_after(59.01), 60);
        assert_eq!(retry_after(12.0), 12);
        assert_eq!(retry_after(f64::NAN), 1);
    }
}
