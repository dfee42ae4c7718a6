//! Devices that started from cursor 0. A redelivery (docs/architecture.md, "Scoped sync") tells
//! devices about records that entered or left their user's set below their cursor; a device that
//! started from 0 after it never held what it changes, and reading it would cost an initial sync
//! every record the redelivery covers (every record of the repository, when a set is first put in
//! force). So a pull from 0 notes the head here, and the scoped page skips older redeliveries for
//! that device. The note is only ever an optimisation in the safe direction: without it (a replica
//! that has not replayed it yet, a device from before it existed) a device reads every redelivery
//! after its cursor, which is what correctness needs.

use deadpool_postgres::GenericClient;

use crate::db::DbResult;

/// Notes that `client_id` of `username` started over from cursor 0 with a page read at snapshot
/// head `head`: that page already reflects every redelivery committed at or below it (their
/// `base` is below `head`), and none above. The page's head, not the primary's head now, which is
/// ahead of it when a replica answered: a redelivery between the two would be skipped although
/// the device never read it. A deployment that never had a scope set has no redelivery to skip,
/// and writes nothing.
#[tracing::instrument(name = "db.scope.devices.started_fresh", level = "debug", skip_all)]
pub async fn started_fresh(
    db: &impl GenericClient,
    username: &str,
    client_id: &str,
    head: i64,
) -> DbResult<()> {
    db.execute(
        "INSERT INTO scope_devices (username, client_id, fresh_since)
         SELECT $1, $2, $3 WHERE EXISTS (SELECT 1 FROM scope_sets)
         ON CONFLICT (username, client_id) DO UPDATE SET fresh_since = EXCLUDED.fresh_since",
        &[&username, &client_id, &head],
    )
    .await?;
    Ok(())
}
