//! SQL of the change log's group commit (docs/architecture.md, "the commit path of a push"): the
//! inputs of the plan (stored transmissions and record states) and the writes of a plan
//! (revisions, current states, transmission results), all in the caller's transaction under the
//! change-log lock, or, for a group written ahead of the commit before it, partly before the lock
//! ([`read_ahead`], [`write_ahead`], [`try_lock_at`], [`finish_ahead`]). The plan itself is
//! `domain::sync::plan`.

use std::collections::HashMap;
use std::sync::LazyLock;

use chrono::{DateTime, Utc};
use deadpool_postgres::{GenericClient, Transaction};
use serde_json::Value;
use tokio_postgres::types::{Json, ToSql, Type};

use tokio_postgres::binary_copy::BinaryCopyInWriter;

use super::records::{self, raw_json};
use crate::db::{stats, DbResult};
use crate::domain::sync::plan::{CurrentState, Plan, Push, StoredTransmission, Unreadable};
use crate::monitoring::CommitPhases;

const STATES_SQL: &str = "SELECT id, change_id, created_at, created_by, CASE WHEN id = ANY($2) THEN data END
     FROM records WHERE id = ANY($1)";

/// One index probe per key, whatever the planner thinks of the table's size: a lateral subquery
/// with a `LIMIT` cannot be turned into a join that reads the table first.
const TRANSMISSIONS_SQL: &str = "SELECT t.client_id, t.transmission_id, t.fingerprint, t.result
     FROM unnest($1::text[], $2::text[]) AS k(c, i)
     CROSS JOIN LATERAL (
         SELECT * FROM transmissions t WHERE t.client_id = k.c AND t.transmission_id = k.i LIMIT 1
     ) AS t";

/// A connection caches its plan of each commit statement, and the first plans are made while the
/// tables are small, when reading a table whole is the cheapest way. Such a plan is kept as the
/// table grows, until autovacuum next analyses it (a minute or more): the lookup of transmissions
/// went on scanning every stored one, under the change-log lock, 3 ms of every group commit 20 s
/// into a push storm (docs/benchmarks-history.md, "Round 4, third pass"). Every lookup of a commit is by key,
/// so its plans are made with whole-table reads and hash or merge joins priced out. `SET LOCAL`:
/// the connection's other work is planned as before.
pub const INDEX_PROBES_ONLY_SQL: &str = "SELECT set_config('enable_seqscan', 'off', true),
     set_config('enable_hashjoin', 'off', true), set_config('enable_mergejoin', 'off', true)";

/// The statements of a group commit that find rows of `records` or `transmissions` by key: their
/// plans must probe an index per key at any table size (a test holds them to it).
pub fn keyed_statements() -> [&'static str; 5] {
    [TRANSMISSIONS_SQL, STATES_SQL, ARCHIVE_SQL, &UPDATE_CURRENT_SQL, &stats::COUNT_CHANGES_SQL]
}

type Param<'a> = dyn ToSql + Sync + 'a;

/// What a group commit plans from, read under the change-log lock: the head and the repository
/// generation. A group written ahead plans from the base its predecessor will commit, and commits
/// only if it reads that same base once it holds the lock (see [`try_lock_at`]): so everything
/// else another commit could change under a plan must move the base too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Base {
    pub head: i64,
    pub repository_generation: i64,
}

/// What a group commit reads under the change-log lock before it plans.
pub struct PlanInputs {
    pub base: Base,
    /// The stored results of the transmissions the batch names, for replay or mismatch detection.
    pub transmissions: Vec<StoredTransmission>,
    /// The stored state of the records asked for (see `plan::records_to_read`).
    pub states: HashMap<String, CurrentState>,
}

/// Takes the change-log lock and reads the plan's inputs in one round trip: the statements are
/// prepared once per connection and pipelined, and PostgreSQL runs them in the order sent, so every
/// read happens after the lock is held, each in a snapshot taken after it, and every statement of
/// the transaction is planned under [`INDEX_PROBES_ONLY_SQL`].
pub async fn lock_and_read(
    tx: &Transaction<'_>,
    client_ids: &[String],
    transmission_ids: &[String],
    ids: &[&str],
    need_data: &[&str],
) -> DbResult<PlanInputs> {
    let (probes_only, lock, head, transmissions, states) = futures_util::try_join!(
        tx.prepare_cached(INDEX_PROBES_ONLY_SQL),
        tx.prepare_cached(records::LOCK_SQL),
        tx.prepare_cached(records::HEAD_SQL),
        tx.prepare_cached(TRANSMISSIONS_SQL),
        tx.prepare_cached(STATES_SQL),
    )?;
    // try_join! polls in argument order, and a prepared statement is sent on its first poll.
    let lock_params: &[&Param<'_>] = &[&records::CHANGELOG_LOCK];
    let keys: &[&Param<'_>] = &[&client_ids, &transmission_ids];
    let wanted: &[&Param<'_>] = &[&ids, &need_data];
    let (_, _, head, transmissions, states) = futures_util::try_join!(
        tx.execute(&probes_only, &[]),
        tx.execute(&lock, lock_params),
        tx.query_one(&head, &[]),
        tx.query(&transmissions, keys),
        tx.query(&states, wanted),
    )?;
    Ok(PlanInputs {
        base: base_of(&head)?,
        transmissions: stored_transmissions(&transmissions)?,
        states: current_states(&states)?,
    })
}

/// The reads of a commit written ahead of the lock (see `actors::change_log`): what
/// [`lock_and_read`] reads, without the lock and the head, in one round trip. A row lock the
/// transaction would wait for longer than a second fails it instead: it may belong to a commit
/// that waits for this one's predecessor, a wait PostgreSQL cannot see.
pub async fn read_ahead(
    tx: &Transaction<'_>,
    client_ids: &[String],
    transmission_ids: &[String],
    ids: &[&str],
    need_data: &[&str],
) -> DbResult<(Vec<StoredTransmission>, HashMap<String, CurrentState>)> {
    let (probes_only, transmissions, states) = futures_util::try_join!(
        tx.prepare_cached(INDEX_PROBES_ONLY_SQL),
        tx.prepare_cached(TRANSMISSIONS_SQL),
        tx.prepare_cached(STATES_SQL),
    )?;
    let keys: &[&Param<'_>] = &[&client_ids, &transmission_ids];
    let wanted: &[&Param<'_>] = &[&ids, &need_data];
    let (_, _, transmissions, states) = futures_util::try_join!(
        tx.execute(&probes_only, &[]),
        tx.batch_execute("SET LOCAL lock_timeout = '1s'"),
        tx.query(&transmissions, keys),
        tx.query(&states, wanted),
    )?;
    Ok((stored_transmissions(&transmissions)?, current_states(&states)?))
}

fn base_of(row: &tokio_postgres::Row) -> DbResult<Base> {
    Ok(Base { head: row.try_get(0)?, repository_generation: row.try_get(1)? })
}

/// The stored results as read back; one that does not read as a push result stays in the list,
/// as unreadable, so that its retry fails instead of being planned as a new push.
fn stored_transmissions(rows: &[tokio_postgres::Row]) -> DbResult<Vec<StoredTransmission>> {
    rows.iter()
        .map(|r| {
            let result: Value = r.try_get(3)?;
            Ok(StoredTransmission {
                client_id: r.try_get(0)?,
                transmission_id: r.try_get(1)?,
                fingerprint: r.try_get(2)?,
                result: serde_json::from_value(result).map_err(|e| Unreadable(e.to_string())),
            })
        })
        .collect()
}

fn current_states(rows: &[tokio_postgres::Row]) -> DbResult<HashMap<String, CurrentState>> {
    rows.iter()
        .map(|r| {
            let state = CurrentState {
                change_id: r.try_get(1)?,
                created_at: r.try_get(2)?,
                created_by: r.try_get(3)?,
                data: r.try_get::<_, Option<String>>(4)?.map(raw_json),
            };
            Ok((r.try_get::<_, String>(0)?, state))
        })
        .collect()
}

/// Takes the change-log lock if it is free, then reads the base, in one round trip (two
/// statements, so that the base is read in a snapshot taken after the lock). True when the lock
/// is held and the base is `expected`: nothing was committed since the commit this one wrote ahead
/// of.
pub async fn try_lock_at(tx: &Transaction<'_>, expected: Base) -> DbResult<bool> {
    let (try_lock, head) = futures_util::try_join!(
        tx.prepare_cached(records::TRY_LOCK_SQL),
        tx.prepare_cached(records::HEAD_SQL)
    )?;
    let lock_params: &[&Param<'_>] = &[&records::CHANGELOG_LOCK];
    let (locked, head) =
        futures_util::try_join!(tx.query_one(&try_lock, lock_params), tx.query_one(&head, &[]))?;
    Ok(locked.try_get::<_, bool>(0)? && base_of(&head)? == expected)
}

/// The writes of a plan made ahead of the lock, for a batch of new records only: revisions, the
/// records' rows and the transmission results, none of which another commit of this process
/// writes (the change log only writes ahead a batch disjoint from the commit before it).
pub async fn write_ahead(
    db: &Transaction<'_>,
    pushes: &[&Push],
    plan: &Plan<'_>,
    synced_at: DateTime<Utc>,
    phases: &mut CommitPhases,
) -> DbResult<()> {
    let b = RevisionBatch::from_plan(plan);
    if !plan.superseded_in_batch.is_empty() {
        insert_revision_rows(db, &b.select(&plan.superseded_in_batch), synced_at).await?;
    }
    copy_rows_at(db, &b, &current_revisions(plan), synced_at).await?;
    phases.lap("copy");
    insert_transmissions(db, pushes, plan).await?;
    phases.lap("transmissions");
    Ok(())
}

/// What a plan written ahead still has to write once it holds the lock: the kept statistics
/// (rows every commit updates) and the head.
pub async fn finish_ahead(db: &Transaction<'_>, plan: &Plan<'_>) -> DbResult<()> {
    let counts = stats::count_changes(
        db,
        &[],
        current_revisions(plan).into_iter().map(|i| {
            let r = &plan.revisions[i];
            (r.record.form_type.as_str(), r.created_at, r.record.deleted)
        }),
    );
    let head = async {
        if !plan.revisions.is_empty() {
            let statement = db.prepare_cached(records::SET_HEAD_SQL).await?;
            db.execute(&statement, &[&plan.head]).await?;
        }
        Ok(())
    };
    futures_util::try_join!(counts, head)?;
    Ok(())
}

/// The revisions of a plan that become current states: every one no later revision replaces.
fn current_revisions(plan: &Plan<'_>) -> Vec<usize> {
    let mut superseded = vec![false; plan.revisions.len()];
    for &i in &plan.superseded_in_batch {
        superseded[i] = true;
    }
    (0..plan.revisions.len()).filter(|&i| !superseded[i]).collect()
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
    pub data: Vec<&'a str>,
    pub deleted: Vec<bool>,
    pub created_at: Vec<Option<DateTime<Utc>>>,
    pub updated_at: Vec<Option<DateTime<Utc>>>,
    pub geolocation: Vec<Option<records::JsonText<'a>>>,
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
    "unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::text[], $6::bool[],
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

    /// The plan's revisions as columns, borrowing every value.
    pub fn from_plan(plan: &Plan<'a>) -> Self {
        let mut b = RevisionBatch::with_capacity(plan.revisions.len());
        for r in &plan.revisions {
            let rec = r.record;
            b.change_id.push(r.change_id);
            b.record_id.push(&rec.id);
            b.form_type.push(&rec.form_type);
            b.form_version.push(&rec.form_version);
            b.data.push(r.data.get());
            b.deleted.push(rec.deleted);
            b.created_at.push(r.created_at);
            b.updated_at.push(r.updated_at);
            b.geolocation.push(rec.geolocation.as_deref().map(|g| records::JsonText(g.get())));
            b.author.push(rec.author.as_deref());
            b.device_id.push(rec.device_id.as_deref());
            b.tags.push(rec.tags.as_deref().map(Json));
            b.client_id.push(&r.push.client_id);
            b.transmission_id.push(r.push.transmission_id.as_deref());
            b.pushed_by.push(&r.push.pushed_by);
            b.created_by.push(r.created_by);
            b.overwrote_version.push(r.overwrote);
            b.conflict.push(r.conflict);
        }
        b
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
            out.data.push(self.data[i]);
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

const ARCHIVE_SQL: &str =
    "INSERT INTO record_revisions (change_id, record_id, form_type, form_version, data, deleted, created_at,
         updated_at, synced_at, geolocation, author, device_id, tags, client_id, transmission_id, pushed_by,
         overwrote_version, conflict)
     SELECT change_id, id, form_type, form_version, data, deleted, created_at, updated_at, synced_at,
            geolocation, author, device_id, tags, client_id, transmission_id, pushed_by, overwrote_version,
            conflict
     FROM records WHERE id = ANY($1)";

/// Writes a plan: the current state of every record it overwrites moves to `record_revisions`
/// (copied inside the database), in-batch revisions that a later one replaces go there too, each
/// record's last revision becomes its current state, the kept statistics change by the same
/// records, the transmission results are stored and the head moves to `plan.head`.
///
/// Two round trips and the COPY whatever the batch: the statements are prepared once per
/// connection, and those that do not wait for each other are pipelined (PostgreSQL runs them in
/// the order sent; each group is sent only after the one before it has answered).
pub async fn write_plan(
    db: &Transaction<'_>,
    pushes: &[&Push],
    plan: &Plan<'_>,
    overwritten_ids: &[&str],
    synced_at: DateTime<Utc>,
    phases: &mut CommitPhases,
) -> DbResult<()> {
    let b = RevisionBatch::from_plan(plan);
    let current = current_revisions(plan);
    // First what reads the stored state of the records this batch overwrites.
    let archive = async {
        if !overwritten_ids.is_empty() {
            let statement = db.prepare_cached(ARCHIVE_SQL).await?;
            db.execute(&statement, &[&overwritten_ids]).await?;
        }
        Ok(())
    };
    let in_batch = async {
        if !plan.superseded_in_batch.is_empty() {
            insert_revision_rows(db, &b.select(&plan.superseded_in_batch), synced_at).await?;
        }
        Ok(())
    };
    let counts = stats::count_changes(
        db,
        overwritten_ids,
        current.iter().map(|&i| (b.form_type[i], b.created_at[i], b.deleted[i])),
    );
    futures_util::try_join!(archive, in_batch, counts)?;
    phases.lap("revisions_stats");
    // Each record's last revision in the batch becomes its current state: a plain insert for new
    // ids and an update for stored ones. Under the change-log lock nobody else commits records, so
    // neither needs ON CONFLICT's speculative insertion, nor a sort to keep one row per id. (A
    // group another process writes ahead may hold an uncommitted row of the same new id; the
    // insert then waits for it to roll back, which it does, not getting the lock this one holds.)
    let stored: std::collections::HashSet<&str> = overwritten_ids.iter().copied().collect();
    let (updates, inserts): (Vec<usize>, Vec<usize>) =
        current.into_iter().partition(|&i| stored.contains(b.record_id[i]));
    copy_rows_at(db, &b, &inserts, synced_at).await?;
    phases.lap("copy");
    let update = async {
        if !updates.is_empty() {
            update_current_rows(db, &b.select(&updates), synced_at).await?;
        }
        Ok(())
    };
    let head = async {
        // Every revision took an id: none means the head stays (a batch of replays).
        if !plan.revisions.is_empty() {
            let statement = db.prepare_cached(records::SET_HEAD_SQL).await?;
            db.execute(&statement, &[&plan.head]).await?;
        }
        Ok(())
    };
    futures_util::try_join!(update, insert_transmissions(db, pushes, plan), head)?;
    phases.lap("update_transmissions_head");
    Ok(())
}

/// Copies the rows at `indexes` of `b` into `records`. Only new records, each once, is the usual
/// big push: then the batch itself goes, not a copy of it.
async fn copy_rows_at(
    db: &Transaction<'_>,
    b: &RevisionBatch<'_>,
    indexes: &[usize],
    synced_at: DateTime<Utc>,
) -> DbResult<()> {
    if indexes.len() == b.change_id.len() && !indexes.is_empty() {
        copy_current_rows(db, b, synced_at).await
    } else if !indexes.is_empty() {
        copy_current_rows(db, &b.select(indexes), synced_at).await
    } else {
        Ok(())
    }
}

/// New records go in through binary COPY: no parameter arrays to build and unnest, and the rows
/// stream to the server in small messages instead of one statement of many megabytes. (Sending
/// them in 256 KB messages instead was measured slower: PostgreSQL then waits for each chunk
/// instead of inserting rows while the next ones are encoded; docs/benchmarks-history.md,
/// "Push: where a group commit's time goes".)
async fn copy_current_rows(
    tx: &Transaction<'_>,
    b: &RevisionBatch<'_>,
    synced_at: DateTime<Utc>,
) -> DbResult<()> {
    let statement = format!(
        "COPY records ({}, client_id, transmission_id, pushed_by, overwrote_version, conflict) \
         FROM STDIN (FORMAT binary)",
        records::COPY_COLUMNS
    );
    let statement = tx.prepare_cached(&statement).await?;
    let sink = tx.copy_in(&statement).await?;
    let provenance = [Type::TEXT, Type::TEXT, Type::TEXT, Type::INT8, Type::BOOL];
    let types = [records::COPY_TYPES.as_slice(), &provenance].concat();
    let writer = BinaryCopyInWriter::new(sink, &types);
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

/// `created_by` stays: the record keeps the owner of its first revision. Each row is found by one
/// index probe (as in `TRANSMISSIONS_SQL`) and updated where that probe found it: sound because
/// every writer that updates `records` holds the change-log lock (a group written ahead only
/// inserts new ids), so no row moves between probe and update.
static UPDATE_CURRENT_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "UPDATE records SET
             form_type = u.ft, form_version = u.fv, data = u.d, deleted = u.del, created_at = u.ca,
             updated_at = u.ua, synced_at = $18, geolocation = u.g, author = u.au, device_id = u.dv, tags = u.tg,
             change_id = u.c, client_id = u.cl, transmission_id = u.tr, pushed_by = u.pb,
             overwrote_version = u.ov, conflict = u.cf
         FROM {REVISION_UNNEST}
         CROSS JOIN LATERAL (SELECT ctid AS tid FROM records r WHERE r.id = u.r LIMIT 1) AS found
         WHERE records.ctid = found.tid"
    )
});

async fn update_current_rows(
    db: &impl GenericClient,
    b: &RevisionBatch<'_>,
    synced_at: DateTime<Utc>,
) -> DbResult<()> {
    let statement = db.prepare_cached(&UPDATE_CURRENT_SQL).await?;
    db.execute(&statement, &b.revision_params(&synced_at)).await?;
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
    let statement = db.prepare_cached(&sql).await?;
    db.execute(&statement, &b.revision_params(&synced_at)).await?;
    Ok(())
}

/// Stores the results of the plan's named transmissions, for idempotent replay.
pub async fn insert_transmissions(
    db: &impl GenericClient,
    pushes: &[&Push],
    plan: &Plan<'_>,
) -> DbResult<()> {
    let mut clients = Vec::new();
    let mut ids = Vec::new();
    let mut prints = Vec::new();
    let mut results = Vec::new();
    for (push, transmission_id, result) in plan.transmissions(pushes) {
        clients.push(push.client_id.as_str());
        ids.push(transmission_id);
        prints.push(push.fingerprint.as_slice());
        results.push(Json(result));
    }
    if clients.is_empty() {
        return Ok(());
    }
    let statement = db
        .prepare_cached(
            "INSERT INTO transmissions (client_id, transmission_id, fingerprint, result)
             SELECT * FROM unnest($1::text[], $2::text[], $3::bytea[], $4::jsonb[])",
        )
        .await?;
    db.execute(&statement, &[&clients, &ids, &prints, &results]).await?;
    Ok(())
}
