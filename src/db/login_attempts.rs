//! SQL for the login rate limit (docs/api.md §15, §18.2): one row per (client IP, username) holding
//! the counted attempts of the last 60 s, shared by every node on the database. Times are the
//! database's, so the nodes' clocks need not agree.

use std::net::IpAddr;

use deadpool_postgres::GenericClient;

use crate::db::DbResult;

/// What one attempt found.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Attempt {
    /// Counted: the attempt may go on.
    Counted,
    /// Refused: the window is full; the oldest counted attempt leaves it in this many seconds.
    Refused { seconds_left: f64 },
}

/// Counts an attempt if fewer than `per_minute` were counted in the last 60 s. One statement:
/// concurrent attempts on any node queue on the row's lock, so the limit is exact.
#[tracing::instrument(name = "db.login_attempts.attempt", level = "debug", skip_all)]
pub async fn attempt(
    db: &impl GenericClient,
    ip: IpAddr,
    username_hash: &[u8],
    per_minute: u32,
) -> DbResult<Attempt> {
    let limit = i64::from(per_minute);
    let row = db
        .query_one(
            "INSERT INTO login_attempts AS a (client_ip, username_hash, attempts, counted)
             VALUES ($1, $2, ARRAY[now()], true)
             ON CONFLICT (client_ip, username_hash) DO UPDATE SET (attempts, counted) = (
                 SELECT CASE WHEN count(*) < $3
                             THEN coalesce(array_agg(t ORDER BY t), '{}') || now()
                             ELSE array_agg(t ORDER BY t) END,
                        count(*) < $3
                 FROM unnest(a.attempts) AS t
                 WHERE t > now() - interval '60 seconds')
             RETURNING counted,
                 extract(epoch FROM a.attempts[1] + interval '60 seconds' - now())::float8",
            &[&ip, &username_hash, &limit],
        )
        .await?;
    Ok(if row.get(0) { Attempt::Counted } else { Attempt::Refused { seconds_left: row.get(1) } })
}

/// Removes the rows whose newest attempt has left the window; returns how many went.
#[tracing::instrument(name = "db.login_attempts.sweep", level = "debug", skip_all)]
pub async fn sweep(db: &impl GenericClient) -> DbResult<u64> {
    Ok(db
        .execute(
            "DELETE FROM login_attempts
             WHERE attempts[cardinality(attempts)] <= now() - interval '60 seconds'",
            &[],
        )
        .await?)
}
