//! Each user's newest acknowledged write (migration V16), so that a user's reads reflect their own
//! writes even when a read replica answers them (docs/api.md §18.3, docs/architecture.md "With
//! read replicas"). Marks are written by the transaction that makes the write, so a mark is never
//! ahead of what it marks, and read from the primary by the read router.

use deadpool_postgres::GenericClient;

use crate::db::DbResult;

/// What a read by one user must reflect besides its cursor.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriteMark {
    /// The change head of the user's newest change-numbered write (0: none).
    pub change_id: i64,
    /// How many other writes the user has made; a replica showing this count has replayed them.
    pub writes: i64,
}

/// The primary's view for a read: its change head and the reader's mark.
#[derive(Debug, Clone, Copy)]
pub struct PrimaryView {
    pub head: i64,
    pub mark: WriteMark,
}

/// Marks `usernames` (sorted, no duplicates: rows are locked in one order by every writer) with a
/// change-numbered write that committed at `change_id` or below. For the commit's transaction.
pub(crate) const MARK_CHANGES_SQL: &str = "INSERT INTO write_marks AS m (username, change_id)
     SELECT u, $2 FROM unnest($1::text[]) AS u
     ON CONFLICT (username) DO UPDATE SET change_id = greatest(m.change_id, excluded.change_id)";

/// One more other write of `$1`.
const MARK_WRITE_SQL: &str = "INSERT INTO write_marks AS m (username, writes) VALUES ($1, 1)
     ON CONFLICT (username) DO UPDATE SET writes = m.writes + 1";

/// The change head and `$1`'s mark, in one statement.
const VIEW_SQL: &str = "SELECT h.head, coalesce(m.change_id, 0), coalesce(m.writes, 0)
     FROM change_head h LEFT JOIN write_marks m ON m.username = $1";

/// Marks `usernames` with a change-numbered write at `change_id`; see [`MARK_CHANGES_SQL`].
#[tracing::instrument(name = "db.marks.mark_changes", level = "debug", skip_all)]
pub async fn mark_changes(db: &impl GenericClient, usernames: &[&str], change_id: i64) -> DbResult<()> {
    if usernames.is_empty() {
        return Ok(());
    }
    let statement = db.prepare_cached(MARK_CHANGES_SQL).await?;
    db.execute(&statement, &[&usernames, &change_id]).await?;
    Ok(())
}

/// Counts one write of `username` that is not change-numbered; call it in the write's transaction.
#[tracing::instrument(name = "db.marks.mark_write", level = "debug", skip_all)]
pub async fn mark_write(db: &impl GenericClient, username: &str) -> DbResult<()> {
    db.execute(MARK_WRITE_SQL, &[&username]).await?;
    Ok(())
}

/// The change head and `username`'s mark (zeros without one): on the primary, before a read by
/// `username` is served by a replica.
#[tracing::instrument(name = "db.marks.primary_view", level = "debug", skip_all)]
pub async fn primary_view(db: &impl GenericClient, username: &str) -> DbResult<PrimaryView> {
    let statement = db.prepare_cached(VIEW_SQL).await?;
    let row = db.query_one(&statement, &[&username]).await?;
    Ok(PrimaryView { head: row.get(0), mark: WriteMark { change_id: row.get(1), writes: row.get(2) } })
}

/// The change head and `username`'s count of other writes as a replica shows them, for a read
/// waiting for that replica to catch up.
#[tracing::instrument(name = "db.marks.replica_progress", level = "debug", skip_all)]
pub async fn replica_progress(db: &impl GenericClient, username: &str) -> DbResult<(i64, i64)> {
    let statement = db.prepare_cached(VIEW_SQL).await?;
    let row = db.query_one(&statement, &[&username]).await?;
    Ok((row.get(0), row.get(2)))
}
