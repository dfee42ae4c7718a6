//! The attachment manifests under a scope (docs/api.md §20.4): the attachments a user may
//! download, with the guarantees of their records. An attachment is the user's to download when
//! they uploaded it or a record they may see names it; it changes for them when it is uploaded,
//! and whenever a record naming it reaches them (a row of the scoped pull). So the manifest after
//! a cursor is: the attachments named by the records the user's pull would deliver after it (or
//! dropped by them after it), and the attachments uploaded after it; each listed as `download`
//! when the user may have it now, else, if a delivered record named it (the device may hold it),
//! as `delete`.

use std::sync::LazyLock;

use deadpool_postgres::GenericClient;

use crate::db::attachments::AttachmentRow;
use crate::db::scope::pull::{candidates, user_rows};
use crate::db::scope::read::{attachment_visible_sql, reads_scoped_sql};
use crate::db::DbResult;

/// `None` when the user is not scoped (no set in force, or an admin, and no redelivery pending):
/// the unscoped manifest applies. Otherwise the head and the operations after `after`, in order.
#[tracing::instrument(name = "db.scope.manifest.changes_after", level = "debug", skip_all)]
pub async fn changes_after(
    db: &impl GenericClient,
    (username, client_id): (&str, &str),
    after: i64,
) -> DbResult<Option<(i64, Vec<AttachmentRow>)>> {
    // Built once: devices ask for the manifest at every sync, and each statement is prepared once
    // per connection (near the head at 8.6M records, parsing and planning the manifest took 1.9 ms
    // of its 2.1).
    // The head read with the question is the answer's when nothing changed for the user: it is
    // at most the manifest's own, so the device asks again from no later than it should.
    static SCOPED_SQL: LazyLock<String> =
        LazyLock::new(|| format!("SELECT {}, (SELECT head FROM change_head)", reads_scoped_sql("$1", "$2")));
    static MANIFEST_SQL: LazyLock<String> = LazyLock::new(manifest_sql);
    let scoped = db.prepare_cached(&SCOPED_SQL).await?;
    let row = db.query_one(&scoped, &[&username, &after]).await?;
    if !row.get::<_, bool>(0) {
        return Ok(None);
    }
    let head: i64 = row.get(1);
    let manifest = db.prepare_cached(&MANIFEST_SQL).await?;
    let rows = db.query(&manifest, &[&after, &i64::MAX, &username, &client_id]).await?;
    let head = rows.first().map_or(head, |row| row.get(0));
    let operations = rows
        .iter()
        .filter_map(|row| {
            let visible: bool = row.get(9);
            let named: bool = row.get(10);
            (visible || named).then(|| AttachmentRow {
                id: row.get(1),
                sha256: row.get(2),
                size: row.get(3),
                content_type: row.get(4),
                uploaded_by: row.get(5),
                client_id: row.get(6),
                created_at: row.get(7),
                change_id: row.get(8),
                deleted: !visible,
            })
        })
        .collect();
    Ok(Some((head, operations)))
}

/// The manifest after `$1` for the user `$3` on the device `$4`; `$2` bounds each source of the
/// scoped pull's candidates and of the keys' uploads (here, no bound: written as a bound, a
/// source can only be read along its index, whatever the generic plan guessed of the tables'
/// sizes when it was made).
///
/// The uploads after the cursor that the user may download are their own and those named by a
/// record they may see. Named by a record whose row reaches them after the cursor, an upload is
/// among `named`. Named by one they already hold (its row at or below the cursor), it was written
/// under that record's keys as it committed (`scope_uploads`, see `write::note_upload`), provided
/// the user's keys have not changed since the cursor (`scope_user_keys.since`): a live row at or
/// below the cursor in one of their buckets was live when the upload came, with its reference,
/// since any change of the record or of its keys moves its row. When the keys changed after the
/// cursor (a set switched, the user's attributes or role changed), every upload after it is
/// checked instead, once per device. Every listed upload is checked (`visible`) either way. Read
/// by keys, a manifest costs what the user receives; checking every upload, it cost what the
/// fleet uploads, for each device (at 7,500 devices, a third of PostgreSQL's work).
///
/// The attachments the candidates name are looked up record by record (the `OFFSET 0` keeps the
/// lateral lookup from being flattened into a join): unbounded, the candidates look many to the
/// planner, which joined them to every reference by hashing the whole table (at 504,000
/// references, 74 ms for a manifest of 2,000 changes, now 2.1; from cursor 0, 154 ms, now 104).
fn manifest_sql() -> String {
    let (user_rows, candidates) = (user_rows(), candidates(false));
    format!(
        "WITH {user_rows}{candidates}
         ), named AS (
             SELECT ar.attachment_id AS id, max(c.at) AS at FROM cand c CROSS JOIN LATERAL (
                 SELECT ar.attachment_id FROM attachment_refs ar
                  WHERE ar.record_id = c.record_id AND (ar.left_at IS NULL OR ar.left_at > $1) OFFSET 0) ar
              GROUP BY ar.attachment_id
         ), keyed AS (
             SELECT $1 > 0 AND coalesce((SELECT since <= $1 FROM scope_user_keys WHERE username = $3), false) AS by_keys
         ), uploaded AS (
             SELECT a.id, a.change_id AS at FROM attachments a, h
              WHERE a.change_id > $1 AND a.change_id <= h.head AND $1 > 0 AND NOT (SELECT by_keys FROM keyed)
             UNION ALL
             SELECT a.id, a.change_id FROM attachments a, h
              WHERE (a.uploaded_by, a.change_id) > ($3, $1) AND (a.uploaded_by, a.change_id) <= ($3, h.head)
                AND ($1 = 0 OR (SELECT by_keys FROM keyed))
             UNION ALL
             SELECT u.attachment_id, u.change_id FROM h, k, unnest(k.keys) AS b(key) CROSS JOIN LATERAL (
                 SELECT u.attachment_id, u.change_id FROM scope_uploads u
                  WHERE u.key = b.key AND u.change_id > $1 AND u.change_id <= h.head
                  ORDER BY u.change_id LIMIT $2) u
              WHERE (SELECT by_keys FROM keyed)
         ), ops AS (
             SELECT id, max(at) AS at, bool_or(named) AS named FROM (
                 SELECT id, at, true AS named FROM named UNION ALL SELECT id, at, false FROM uploaded) x
              GROUP BY id
         )
         SELECT h.head, a.id, a.sha256, a.size, a.content_type, a.uploaded_by, a.client_id, a.created_at,
                o.at, (h.sees_all OR {visible}) AS visible, o.named
           FROM ops o JOIN attachments a ON a.id = o.id, h
          ORDER BY o.at",
        visible = attachment_visible_sql("a", "$3")
    )
}
