//! SQL for observations: pull pages, the group commit's writes, and read access.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use deadpool_postgres::GenericClient;
use deadpool_postgres::Transaction;
use serde_json::value::RawValue;
use serde_json::Value;
use tokio_postgres::binary_copy::BinaryCopyInWriter;
use tokio_postgres::types::{Json, ToSql, Type};
use tokio_postgres::Row;

use crate::db::{stats, DbResult};
use crate::domain::sync::{PushResult, StoredRecord};

/// Serialises change_id allocation across server processes sharing one database.
const CHANGELOG_LOCK: i64 = 0x5359_4e4b_0010;

/// The JSON columns are read as text and kept raw (see `StoredRecord`).
const RECORD_COLUMNS: &str = "id, form_type, form_version, data::text, deleted, created_at, updated_at, \
     synced_at, geolocation::text, author, device_id, tags::text, change_id";

/// Stored JSON text is valid JSON: PostgreSQL checked it on the way in.
fn raw_json(text: String) -> Box<RawValue> {
    RawValue::from_string(text).unwrap_or_else(|_| RawValue::NULL.to_owned())
}

fn record_from_row(row: &Row, offset: usize) -> StoredRecord {
    StoredRecord {
        id: row.get(offset),
        form_type: row.get(offset + 1),
        form_version: row.get(offset + 2),
        data: raw_json(row.get(offset + 3)),
        deleted: row.get(offset + 4),
        created_at: row.get(offset + 5),
        updated_at: row.get(offset + 6),
        synced_at: row.get(offset + 7),
        geolocation: row.get::<_, Option<String>>(offset + 8).map(raw_json),
        author: row.get(offset + 9),
        device_id: row.get(offset + 10),
        tags: row.get::<_, Option<String>>(offset + 11).map(raw_json),
        change_id: row.get(offset + 12),
    }
}

/// One pull page: the snapshot head S, the repository generation, and up to `limit + 1` records
/// with `after < change_id <= S`, read by one statement so all come from one snapshot (API.md 8.2).
pub async fn pull_page(
    db: &impl GenericClient,
    after: i64,
    types: &[String],
    limit: i64,
) -> DbResult<(Head, Vec<StoredRecord>)> {
    // With a type filter, each type is read in change_id order from (form_type, change_id) and
    // the short lists are merged. Written as `form_type = ANY(...)`, the planner picks a bitmap
    // scan of every matching row plus a sort whenever its statistics lag behind a burst of
    // pushes (measured: 250 ms instead of 2 ms per page right after 250,000 new records).
    let page = if types.is_empty() {
        format!(
            "SELECT {RECORD_COLUMNS} FROM records WHERE change_id > $1 AND change_id <= h.head
             ORDER BY change_id LIMIT $2"
        )
    } else {
        format!(
            "SELECT x.* FROM unnest($3::text[]) AS t(ft) CROSS JOIN LATERAL (
                 SELECT {RECORD_COLUMNS} FROM records
                 WHERE form_type = t.ft AND change_id > $1 AND change_id <= h.head
                 ORDER BY change_id LIMIT $2
             ) x ORDER BY x.change_id LIMIT $2"
        )
    };
    let sql = format!(
        "WITH h AS (SELECT head, repository_generation FROM change_head)
         SELECT h.head, h.repository_generation, r.* FROM h LEFT JOIN LATERAL ({page}) r ON true"
    );
    let mut distinct_types: Vec<&str> = types.iter().map(String::as_str).collect();
    distinct_types.sort_unstable();
    distinct_types.dedup();
    // Devices pull page after page: the statement is prepared once per connection.
    let statement = db.prepare_cached(&sql).await?;
    let rows = if distinct_types.is_empty() {
        db.query(&statement, &[&after, &(limit + 1)]).await?
    } else {
        db.query(&statement, &[&after, &(limit + 1), &distinct_types]).await?
    };
    let head = rows
        .first()
        .map(|r| Head { change_id: r.get(0), repository_generation: r.get(1) })
        .unwrap_or(Head { change_id: 0, repository_generation: 1 });
    let records = rows
        .iter()
        .filter(|r| r.get::<_, Option<String>>(2).is_some())
        .map(|r| record_from_row(r, 2))
        .collect();
    Ok((head, records))
}

/// The change-log head and the repository generation, read together.
#[derive(Debug, Clone, Copy)]
pub struct Head {
    pub change_id: i64,
    pub repository_generation: i64,
}

/// Takes the change log's transaction-scoped advisory lock: every commit that allocates change_ids
/// holds it, so ids are assigned in commit order across every process sharing the database.
pub async fn lock_change_log(db: &impl GenericClient) -> DbResult<()> {
    db.execute("SELECT pg_advisory_xact_lock($1)", &[&CHANGELOG_LOCK]).await?;
    Ok(())
}

pub async fn head(db: &impl GenericClient) -> DbResult<i64> {
    Ok(db.query_one("SELECT head FROM change_head", &[]).await?.get(0))
}

pub async fn head_and_generation(db: &impl GenericClient) -> DbResult<Head> {
    let row = db.query_one("SELECT head, repository_generation FROM change_head", &[]).await?;
    Ok(Head { change_id: row.get(0), repository_generation: row.get(1) })
}

/// Empties the repository in the caller's transaction (API.md 17.3): observations, their history,
/// transmission results and attachment records go; the change sequence continues; the generation
/// rises. Returns the new head state.
pub async fn reset_repository(db: &impl GenericClient) -> DbResult<Head> {
    db.batch_execute(
        "DELETE FROM record_revisions; DELETE FROM records; DELETE FROM transmissions; DELETE FROM attachments;",
    )
    .await?;
    stats::clear(db).await?;
    let row = db
        .query_one(
            "UPDATE change_head SET repository_generation = repository_generation + 1
             RETURNING head, repository_generation",
            &[],
        )
        .await?;
    Ok(Head { change_id: row.get(0), repository_generation: row.get(1) })
}

/// What the commit needs to know about a record that already exists.
#[derive(Debug, Clone)]
pub struct CurrentState {
    pub change_id: i64,
    pub created_at: Option<DateTime<Utc>>,
    pub created_by: String,
    /// Loaded only for records a deletion without data will touch.
    pub data: Option<Box<RawValue>>,
}

pub async fn current_states(
    db: &impl GenericClient,
    ids: &[&str],
    need_data: &[&str],
) -> DbResult<HashMap<String, CurrentState>> {
    let rows = db
        .query(
            "SELECT id, change_id, created_at, created_by, CASE WHEN id = ANY($2) THEN data::text END
             FROM records WHERE id = ANY($1)",
            &[&ids, &need_data],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| {
            (
                r.get::<_, String>(0),
                CurrentState {
                    change_id: r.get(1),
                    created_at: r.get(2),
                    created_by: r.get(3),
                    data: r.get::<_, Option<String>>(4).map(raw_json),
                },
            )
        })
        .collect())
}

/// A stored transmission result, for replay or mismatch detection.
pub struct StoredTransmission {
    pub client_id: String,
    pub transmission_id: String,
    pub fingerprint: Vec<u8>,
    pub result: PushResult,
}

pub async fn find_transmissions(
    db: &impl GenericClient,
    client_ids: &[String],
    transmission_ids: &[String],
) -> DbResult<Vec<StoredTransmission>> {
    if client_ids.is_empty() {
        return Ok(Vec::new());
    }
    let rows = db
        .query(
            "SELECT t.client_id, t.transmission_id, t.fingerprint, t.result
             FROM transmissions t
             JOIN unnest($1::text[], $2::text[]) AS k(c, i) ON t.client_id = k.c AND t.transmission_id = k.i",
            &[&client_ids, &transmission_ids],
        )
        .await?;
    Ok(rows
        .iter()
        .filter_map(|r| {
            let result: Value = r.get(3);
            Some(StoredTransmission {
                client_id: r.get(0),
                transmission_id: r.get(1),
                fingerprint: r.get(2),
                result: serde_json::from_value(result).ok()?,
            })
        })
        .collect())
}

/// Column arrays for one set-based insert of revisions (and, from the last revision of each id,
/// the records' new current state). The values are borrowed from the pushes being committed and
/// the states read for them: a group commit of thousands of records copies none of them.
#[derive(Default)]
pub struct RevisionBatch<'a> {
    pub change_id: Vec<i64>,
    pub record_id: Vec<&'a str>,
    pub form_type: Vec<&'a str>,
    pub form_version: Vec<&'a str>,
    pub data: Vec<Json<&'a RawValue>>,
    pub deleted: Vec<bool>,
    pub created_at: Vec<Option<DateTime<Utc>>>,
    pub updated_at: Vec<Option<DateTime<Utc>>>,
    pub geolocation: Vec<Option<&'a Value>>,
    pub author: Vec<Option<&'a str>>,
    pub device_id: Vec<Option<&'a str>>,
    pub tags: Vec<Option<Json<&'a [String]>>>,
    pub client_id: Vec<&'a str>,
    pub transmission_id: Vec<Option<&'a str>>,
    pub pushed_by: Vec<&'a str>,
    pub created_by: Vec<&'a str>,
    pub overwrote_version: Vec<Option<i64>>,
    pub conflict: Vec<bool>,
}

/// A batch's revision columns as rows `u(...)`, from the parameters of `revision_params`.
const REVISION_UNNEST: &str =
    "unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::json[], $6::bool[],
         $7::timestamptz[], $8::timestamptz[], $9::json[], $10::text[], $11::text[], $12::json[],
         $13::text[], $14::text[], $15::text[], $16::bigint[], $17::bool[])
     AS u(c, r, ft, fv, d, del, ca, ua, g, au, dv, tg, cl, tr, pb, ov, cf)";

impl<'a> RevisionBatch<'a> {
    /// `$1..$17` for `REVISION_UNNEST`, then `$18` the commit time.
    fn revision_params<'s>(&'s self, synced_at: &'s DateTime<Utc>) -> [&'s (dyn ToSql + Sync); 18] {
        [
            &self.change_id,
            &self.record_id,
            &self.form_type,
            &self.form_version,
            &self.data,
            &self.deleted,
            &self.created_at,
            &self.updated_at,
            &self.geolocation,
            &self.author,
            &self.device_id,
            &self.tags,
            &self.client_id,
            &self.transmission_id,
            &self.pushed_by,
            &self.overwrote_version,
            &self.conflict,
            synced_at,
        ]
    }

    pub fn with_capacity(n: usize) -> Self {
        RevisionBatch {
            change_id: Vec::with_capacity(n),
            record_id: Vec::with_capacity(n),
            form_type: Vec::with_capacity(n),
            form_version: Vec::with_capacity(n),
            data: Vec::with_capacity(n),
            deleted: Vec::with_capacity(n),
            created_at: Vec::with_capacity(n),
            updated_at: Vec::with_capacity(n),
            geolocation: Vec::with_capacity(n),
            author: Vec::with_capacity(n),
            device_id: Vec::with_capacity(n),
            tags: Vec::with_capacity(n),
            client_id: Vec::with_capacity(n),
            transmission_id: Vec::with_capacity(n),
            pushed_by: Vec::with_capacity(n),
            created_by: Vec::with_capacity(n),
            overwrote_version: Vec::with_capacity(n),
            conflict: Vec::with_capacity(n),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.change_id.is_empty()
    }

    /// The rows at `indexes`, in order.
    fn select(&self, indexes: &[usize]) -> RevisionBatch<'a> {
        let mut out = RevisionBatch::with_capacity(indexes.len());
        for &i in indexes {
            out.change_id.push(self.change_id[i]);
            out.record_id.push(self.record_id[i]);
            out.form_type.push(self.form_type[i]);
            out.form_version.push(self.form_version[i]);
            out.data.push(Json(self.data[i].0));
            out.deleted.push(self.deleted[i]);
            out.created_at.push(self.created_at[i]);
            out.updated_at.push(self.updated_at[i]);
            out.geolocation.push(self.geolocation[i]);
            out.author.push(self.author[i]);
            out.device_id.push(self.device_id[i]);
            out.tags.push(self.tags[i].as_ref().map(|t| Json(t.0)));
            out.client_id.push(self.client_id[i]);
            out.transmission_id.push(self.transmission_id[i]);
            out.pushed_by.push(self.pushed_by[i]);
            out.created_by.push(self.created_by[i]);
            out.overwrote_version.push(self.overwrote_version[i]);
            out.conflict.push(self.conflict[i]);
        }
        out
    }
}

/// Commits a batch's revisions: the current state of every record it overwrites moves to
/// `record_revisions` (copied inside the database), in-batch revisions that a later one replaces go
/// there too, and each record's last revision becomes its current state.
pub async fn write_revisions(
    db: &Transaction<'_>,
    b: &RevisionBatch<'_>,
    superseded_in_batch: &[usize],
    overwritten_ids: &[&str],
    synced_at: DateTime<Utc>,
) -> DbResult<()> {
    if b.is_empty() {
        return Ok(());
    }
    if !overwritten_ids.is_empty() {
        db.execute(
            "INSERT INTO record_revisions (change_id, record_id, form_type, form_version, data, deleted, created_at,
                 updated_at, synced_at, geolocation, author, device_id, tags, client_id, transmission_id, pushed_by,
                 overwrote_version, conflict)
             SELECT change_id, id, form_type, form_version, data, deleted, created_at, updated_at, synced_at,
                    geolocation, author, device_id, tags, client_id, transmission_id, pushed_by, overwrote_version,
                    conflict
             FROM records WHERE id = ANY($1)",
            &[&overwritten_ids],
        )
        .await?;
    }
    if !superseded_in_batch.is_empty() {
        insert_revision_rows(db, &b.select(superseded_in_batch), synced_at).await?;
    }
    // Each record's last revision in the batch becomes its current state: a plain insert for new
    // ids and an update for stored ones. Under the change-log lock nobody else writes records, so
    // neither needs ON CONFLICT's speculative insertion, nor a sort to keep one row per id.
    let mut superseded = vec![false; b.change_id.len()];
    for &i in superseded_in_batch {
        superseded[i] = true;
    }
    let current = (0..b.change_id.len()).filter(|&i| !superseded[i]);
    stats::count_changes(
        db,
        overwritten_ids,
        current.map(|i| (b.form_type[i], b.created_at[i], b.deleted[i])),
    )
    .await?;
    let stored: std::collections::HashSet<&str> = overwritten_ids.iter().copied().collect();
    let (updates, inserts): (Vec<usize>, Vec<usize>) =
        (0..b.change_id.len()).filter(|&i| !superseded[i]).partition(|&i| stored.contains(b.record_id[i]));
    if !inserts.is_empty() {
        copy_current_rows(db, &b.select(&inserts), synced_at).await?;
    }
    if !updates.is_empty() {
        update_current_rows(db, &b.select(&updates), synced_at).await?;
    }
    Ok(())
}

/// New records go in through binary COPY: no parameter arrays to build and unnest, and the rows
/// stream to the server in small messages instead of one statement of many megabytes.
async fn copy_current_rows(
    tx: &Transaction<'_>,
    b: &RevisionBatch<'_>,
    synced_at: DateTime<Utc>,
) -> DbResult<()> {
    let sink = tx
        .copy_in(
            "COPY records (id, form_type, form_version, data, deleted, created_at, updated_at, synced_at,
                 geolocation, author, device_id, tags, change_id, created_by, client_id, transmission_id,
                 pushed_by, overwrote_version, conflict) FROM STDIN (FORMAT binary)",
        )
        .await?;
    let writer = BinaryCopyInWriter::new(
        sink,
        &[
            Type::TEXT,
            Type::TEXT,
            Type::TEXT,
            Type::JSON,
            Type::BOOL,
            Type::TIMESTAMPTZ,
            Type::TIMESTAMPTZ,
            Type::TIMESTAMPTZ,
            Type::JSON,
            Type::TEXT,
            Type::TEXT,
            Type::JSON,
            Type::INT8,
            Type::TEXT,
            Type::TEXT,
            Type::TEXT,
            Type::TEXT,
            Type::INT8,
            Type::BOOL,
        ],
    );
    let mut writer = std::pin::pin!(writer);
    for i in 0..b.change_id.len() {
        writer
            .as_mut()
            .write(&[
                &b.record_id[i],
                &b.form_type[i],
                &b.form_version[i],
                &b.data[i],
                &b.deleted[i],
                &b.created_at[i],
                &b.updated_at[i],
                &synced_at,
                &b.geolocation[i],
                &b.author[i],
                &b.device_id[i],
                &b.tags[i],
                &b.change_id[i],
                &b.created_by[i],
                &b.client_id[i],
                &b.transmission_id[i],
                &b.pushed_by[i],
                &b.overwrote_version[i],
                &b.conflict[i],
            ])
            .await?;
    }
    writer.finish().await?;
    Ok(())
}

/// `created_by` stays: the record keeps the owner of its first revision.
async fn update_current_rows(
    db: &impl GenericClient,
    b: &RevisionBatch<'_>,
    synced_at: DateTime<Utc>,
) -> DbResult<()> {
    let sql = format!(
        "UPDATE records SET
             form_type = u.ft, form_version = u.fv, data = u.d, deleted = u.del, created_at = u.ca,
             updated_at = u.ua, synced_at = $18, geolocation = u.g, author = u.au, device_id = u.dv, tags = u.tg,
             change_id = u.c, client_id = u.cl, transmission_id = u.tr, pushed_by = u.pb,
             overwrote_version = u.ov, conflict = u.cf
         FROM {REVISION_UNNEST}
         WHERE records.id = u.r"
    );
    db.execute(&sql, &b.revision_params(&synced_at)).await?;
    Ok(())
}

async fn insert_revision_rows(
    db: &impl GenericClient,
    b: &RevisionBatch<'_>,
    synced_at: DateTime<Utc>,
) -> DbResult<()> {
    let sql = format!(
        "INSERT INTO record_revisions (change_id, record_id, form_type, form_version, data, deleted, created_at,
             updated_at, synced_at, geolocation, author, device_id, tags, client_id, transmission_id, pushed_by,
             overwrote_version, conflict)
         SELECT c, r, ft, fv, d, del, ca, ua, $18, g, au, dv, tg, cl, tr, pb, ov, cf
         FROM {REVISION_UNNEST}"
    );
    db.execute(&sql, &b.revision_params(&synced_at)).await?;
    Ok(())
}

pub async fn insert_transmissions(
    db: &impl GenericClient,
    client_ids: &[&str],
    transmission_ids: &[&str],
    fingerprints: &[&[u8]],
    results: &[Json<&PushResult>],
) -> DbResult<()> {
    if client_ids.is_empty() {
        return Ok(());
    }
    db.execute(
        "INSERT INTO transmissions (client_id, transmission_id, fingerprint, result)
         SELECT * FROM unnest($1::text[], $2::text[], $3::bytea[], $4::jsonb[])",
        &[&client_ids, &transmission_ids, &fingerprints, &results],
    )
    .await?;
    Ok(())
}

pub async fn set_head(db: &impl GenericClient, head: i64) -> DbResult<()> {
    db.execute("UPDATE change_head SET head = $1", &[&head]).await?;
    Ok(())
}

pub async fn purge_transmissions(db: &impl GenericClient, retention_days: u32) -> DbResult<u64> {
    Ok(db
        .execute(
            "DELETE FROM transmissions WHERE created_at < now() - make_interval(days => $1)",
            &[&(retention_days as i32)],
        )
        .await?)
}

// ---- read access (API.md 12) ----

/// A record with its owner, for `/observations`.
pub struct OwnedRecord {
    pub record: StoredRecord,
    pub created_by: String,
}

/// Which records `/observations` lists.
pub enum Owner<'a> {
    All,
    User(&'a str),
}

pub async fn list_observations(
    db: &impl GenericClient,
    owner: Owner<'_>,
    form_types: &[String],
    include_deleted: bool,
    after: i64,
    limit: i64,
) -> DbResult<(i64, Vec<OwnedRecord>)> {
    let owner_filter: Option<&str> = match owner {
        Owner::All => None,
        Owner::User(u) => Some(u),
    };
    let sql = format!(
        "WITH h AS (SELECT head FROM change_head)
         SELECT h.head, r.* FROM h LEFT JOIN LATERAL (
             SELECT {RECORD_COLUMNS}, created_by FROM records
             WHERE change_id > $1 AND change_id <= h.head
               AND ($2::text IS NULL OR created_by = $2)
               AND (cardinality($3::text[]) = 0 OR form_type = ANY($3))
               AND ($4 OR NOT deleted)
             ORDER BY change_id LIMIT $5
         ) r ON true"
    );
    let rows = db.query(&sql, &[&after, &owner_filter, &form_types, &include_deleted, &(limit + 1)]).await?;
    let head: i64 = rows.first().map(|r| r.get(0)).unwrap_or(0);
    let records = rows
        .iter()
        .filter(|r| r.get::<_, Option<String>>(1).is_some())
        .map(|r| OwnedRecord { record: record_from_row(r, 1), created_by: r.get(14) })
        .collect();
    Ok((head, records))
}

pub async fn find_observation(db: &impl GenericClient, id: &str) -> DbResult<Option<OwnedRecord>> {
    let sql = format!("SELECT {RECORD_COLUMNS}, created_by FROM records WHERE id = $1");
    Ok(db
        .query_opt(&sql, &[&id])
        .await?
        .map(|r| OwnedRecord { record: record_from_row(&r, 0), created_by: r.get(13) }))
}

/// One stored revision with its provenance (API.md 12.3).
pub struct Revision {
    pub record: StoredRecord,
    pub client_id: String,
    pub transmission_id: Option<String>,
    pub pushed_by: String,
    pub overwrote_version: Option<i64>,
    pub conflict: bool,
}

/// Revisions newest first (the current state, then the superseded ones), strictly older than
/// `before` when given, at most `limit + 1`.
pub async fn history(
    db: &impl GenericClient,
    id: &str,
    before: Option<i64>,
    limit: i64,
) -> DbResult<Vec<Revision>> {
    let rows = db
        .query(
            "SELECT * FROM (
                 SELECT id, form_type, form_version, data::text, deleted, created_at, updated_at, synced_at,
                        geolocation::text, author, device_id, tags::text, change_id,
                        client_id, transmission_id, pushed_by, overwrote_version, conflict
                 FROM records WHERE id = $1
                 UNION ALL
                 SELECT record_id, form_type, form_version, data::text, deleted, created_at, updated_at, synced_at,
                        geolocation::text, author, device_id, tags::text, change_id,
                        client_id, transmission_id, pushed_by, overwrote_version, conflict
                 FROM record_revisions WHERE record_id = $1
             ) h
             WHERE $2::bigint IS NULL OR change_id < $2
             ORDER BY change_id DESC LIMIT $3",
            &[&id, &before, &(limit + 1)],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| Revision {
            record: record_from_row(r, 0),
            client_id: r.get(13),
            transmission_id: r.get(14),
            pushed_by: r.get(15),
            overwrote_version: r.get(16),
            conflict: r.get(17),
        })
        .collect())
}

pub async fn record_exists(db: &impl GenericClient, id: &str) -> DbResult<bool> {
    Ok(db.query_opt("SELECT 1 FROM records WHERE id = $1", &[&id]).await?.is_some())
}
