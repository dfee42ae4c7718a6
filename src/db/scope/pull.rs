//! The scoped pull page (docs/api.md §20.3; the argument: docs/architecture.md, "Scoped sync").
//!
//! A page is every row a user may read with `after < id <= S`, in id order: the rows of their
//! buckets (`scope_rows`, each at the change that put the record in or took it out), their own
//! records (by `created_by`), and the slots of redeliveries addressed to them
//! (`scope_event_slots`, at `base + slot`); or, for a user who sees everything but still has
//! redeliveries to receive (an admin who was not one, a set that was removed), the whole change
//! log and those slots. Each row is written with the record's current state when the user may see
//! it now, else as a tombstone (`deleted: true`, `data: {}`). The id a row is read at is the
//! record's `version` on the wire, so the page keeps every rule of §8.2: ids unique and
//! increasing, `change_cutoff` the last one, nothing at or below the cursor.
//!
//! Everything comes from one statement, hence one snapshot: the head, the user's role, keys and
//! redeliveries, and the rows. Each source is read along its own index from the cursor and cut at
//! `limit + 1` rows before the merge, so a page costs the same at any repository size (S5).
//!
//! The statement is written so that no plan can read the whole repository, since it is planned
//! generically (parameters unknown: `db::create_sync_pool`) and the state tables
//! are too small for the planner's statistics: `h` is one row by construction, the page's ids are
//! merged and cut before any record is read, and the author's rows are bounded by row comparisons
//! only the `(created_by, change_id)` index serves. (Written with a join and `created_by = $3`, a
//! 1 % user's page at 3.3M records took 3 s in the custom plan and 71 s in the generic one: a hash
//! join over every record, then a walk of the change-id index filtering by author. Now 2-30 ms in
//! both.)
//!
//! Each record is fetched by its change_id first, then by its key. A live bucket row and an own
//! record are read at the record's change_id, and a page's change_ids are increasing, so the walks
//! of that index share their pages; random ids make each walk of the key index its own (1 µs
//! against 3 a record, measured). A row read at another change (a record that left the bucket, a
//! redelivery) misses the first lookup and takes the second, so the record is found either way.

use std::sync::LazyLock;

use deadpool_postgres::Object;
use futures_util::StreamExt;
use tokio_postgres::types::ToSql;

use crate::db::records::PageRows;
use crate::db::scope::read::sees_all_sql;
use crate::db::{DbError, DbResult};

/// The bucket rows, own records and redelivery slots after the cursor, as (id, record, known_live)
/// rows: `known_live` when the row alone proves the user may see the record now (a live row of one
/// of their buckets is the record's current state there; their own records; everything for a
/// user who sees everything), so that only the other rows are checked against their keys.
/// With a type filter (`$5`), each source filters before its own `LIMIT`: filtered after it, a
/// source whose first rows were all of other types would hide its later matching rows behind
/// another source's, and the page would skip them.
pub(super) fn candidates(typed: bool) -> String {
    let (join, of_type) = if typed {
        ("JOIN records t ON t.id = {row}.record_id AND t.form_type = ANY($5)", "AND r.form_type = ANY($5)")
    } else {
        ("", "")
    };
    let join_rows = join.replace("{row}", "s");
    let join_slots = join.replace("{row}", "e");
    format!(
        "
    SELECT x.change_id AS at, x.record_id, x.live AS known_live FROM h, k, unnest(k.keys) AS b(key)
    CROSS JOIN LATERAL (
        SELECT s.change_id, s.record_id, s.live FROM scope_rows s {join_rows}
         WHERE s.key = b.key AND s.change_id > $1 AND s.change_id <= h.head
         ORDER BY s.change_id LIMIT $2) x
     WHERE NOT h.sees_all
    UNION ALL
    SELECT o.change_id, o.id, true FROM h CROSS JOIN LATERAL (
        SELECT r.change_id, r.id FROM records r
         WHERE (r.created_by, r.change_id) > ($3, $1) AND (r.created_by, r.change_id) <= ($3, h.head)
               {of_type}
         ORDER BY r.created_by, r.change_id LIMIT $2) o
     WHERE NOT h.sees_all
    UNION ALL
    SELECT a.change_id, a.id, true FROM h CROSS JOIN LATERAL (
        SELECT r.change_id, r.id FROM records r
         WHERE r.change_id > $1 AND r.change_id <= h.head {of_type}
         ORDER BY r.change_id LIMIT $2) a
     WHERE h.sees_all
    UNION ALL
    SELECT ev.base + y.slot, y.record_id, false FROM h, ev, unnest(ev.keys) AS b(key) CROSS JOIN LATERAL (
        SELECT e.slot, e.record_id FROM scope_event_slots e {join_slots}
         WHERE e.event_id = ev.id AND e.key = b.key AND e.slot > $1 - ev.base AND e.slot <= h.head - ev.base
         ORDER BY e.slot LIMIT $2) y"
    )
}

/// The page's records in the columns of `records::pull_page`, the ones the user may not see now
/// as tombstones that tell nothing but the id, form and times.
const RENDERED: &str = "p.id, p.form_type, p.form_version,
    CASE WHEN p.visible THEN p.data ELSE '{}' END, p.deleted OR NOT p.visible,
    p.created_at, p.updated_at, p.synced_at,
    CASE WHEN p.visible THEN p.geolocation::text END, CASE WHEN p.visible THEN p.author END,
    CASE WHEN p.visible THEN p.device_id END, CASE WHEN p.visible THEN p.tags::text END, p.at";

/// The head, whether the user `$3` sees everything, their keys and the redeliveries after `$1` that
/// concern their device `$4`; then `cand`, the rows they may read after `$1` (at most `$2` from
/// each source). A device pulling from 0 holds nothing, and one that started from 0 after a
/// redelivery never held what it changes: neither reads it (see `devices::started_fresh`).
pub(super) fn user_rows() -> String {
    let sees_all = sees_all_sql("$3");
    format!(
        "
    h AS (
        SELECT c.head, c.repository_generation, {sees_all} AS sees_all
          FROM (SELECT head, repository_generation FROM change_head LIMIT 1) c
    ), k AS (
        SELECT coalesce((SELECT keys FROM scope_user_keys WHERE username = $3),
                        ARRAY['@' || $3]::text[]) AS keys
    ), ev AS (
        SELECT e.id, e.base, eu.keys FROM scope_event_users eu JOIN scope_events e ON e.id = eu.event_id, h
         WHERE eu.username = $3 AND e.base IS NOT NULL AND e.base + e.size > $1 AND e.base < h.head
           AND $1 > 0 AND e.base >= coalesce(
               (SELECT fresh_since FROM scope_devices WHERE username = $3 AND client_id = $4), 0)
    ), cand AS ("
    )
}

/// The rows leave in the order the ids were merged in, each record fetched as its turn comes, so
/// the page writer encodes the first records while PostgreSQL fetches the rest. The `ORDER BY`
/// sits inside the lateral join, where the merged ids already satisfy it, and not over the join,
/// where it sorted the whole page before its first row left (as the unscoped page, whose rows
/// come the same way; `PageRows` checks the order of every row).
fn page_sql(typed: bool) -> String {
    let (user_rows, candidates) = (user_rows(), candidates(typed));
    format!(
        "WITH {user_rows}{candidates}
         ), ids AS (
             SELECT DISTINCT ON (c.at) c.at, c.record_id, c.known_live FROM cand c
              ORDER BY c.at, c.known_live DESC LIMIT $2
         ), page AS (
             SELECT c.at, r.*,
                    c.known_live OR h.sees_all OR r.created_by = $3 OR EXISTS (
                        SELECT 1 FROM scope_rows v, k WHERE v.key = ANY(k.keys) AND v.record_id = r.id AND v.live
                    ) AS visible
               FROM ids c CROSS JOIN h CROSS JOIN LATERAL (
                   (SELECT * FROM records r WHERE r.change_id = c.at AND r.id = c.record_id)
                   UNION ALL
                   (SELECT * FROM records r WHERE r.id = c.record_id)
                   LIMIT 1) r
         )
         SELECT h.head, h.repository_generation, {RENDERED}, NOT h.sees_all
           FROM h LEFT JOIN LATERAL (SELECT * FROM page ORDER BY at) p ON true"
    )
}

/// The page after `after` for `username`, in the layout of `records::pull_page` (whose rows the
/// page writer reads), with every record the user may not see now written as a tombstone.
#[tracing::instrument(name = "db.scope.pull.page", level = "debug", skip_all)]
pub async fn page(
    db: Object,
    (username, client_id): (&str, &str),
    after: i64,
    types: &[&str],
    limit: i64,
) -> DbResult<PageRows> {
    let typed = !types.is_empty();
    // Built once: every scoped pull looks its statement up by this text.
    static PAGE_SQL: LazyLock<[String; 2]> = LazyLock::new(|| [page_sql(false), page_sql(true)]);
    let statement = db.prepare_cached(&PAGE_SQL[usize::from(typed)]).await?;
    let limit = limit + 1;
    let params: Vec<&(dyn ToSql + Sync)> = if typed {
        vec![&after, &limit, &username, &client_id, &types]
    } else {
        vec![&after, &limit, &username, &client_id]
    };
    let rest = db.query_raw(&statement, params).await?;
    let mut rest = Box::pin(rest);
    let Some(first) = rest.next().await.transpose()? else {
        return Err(DbError::Other("the scoped page statement returned no row".into()));
    };
    PageRows::new(after, first, rest, db)
}
