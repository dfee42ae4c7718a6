//! SQL of the change log's group commit (docs/architecture.md, "the commit path of a push"): the
//! inputs of the plan (stored transmissions and record states) and the writes of a plan
//! (revisions, current states, transmission results), all in the caller's transaction under the
//! change-log lock, or, for a group written ahead of the commit before it, partly before the lock
//! ([`read_ahead`], [`write_ahead`], [`try_lock_at`], [`finish_ahead`]). The plan itself is
//! `domain::sync::plan`.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use deadpool_postgres::{GenericClient, Transaction};
use serde_json::Value;
use tokio_postgres::types::{Json, ToSql};

use super::marks;
use super::record_row::{self, JsonColumn, Row, Rows};
use super::records::{self, raw_json};
use crate::db::scope::ScopeState;
use crate::db::{stats, DbError, DbResult};
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

/// Undoes [`INDEX_PROBES_ONLY_SQL`] within the transaction, for a caller that needs it for one
/// statement only.
pub const INDEX_PROBES_ONLY_RESET_SQL: &str =
    "RESET enable_seqscan; RESET enable_hashjoin; RESET enable_mergejoin";

/// The statements of a group commit that find rows of `records` or `transmissions` by key: their
/// plans must probe an index per key at any table size (a test holds them to it).
pub fn keyed_statements() -> [&'static str; 5] {
    [
        TRANSMISSIONS_SQL,
        STATES_SQL,
        &record_row::ARCHIVE_SQL,
        &record_row::UPDATE_SQL,
        &stats::COUNT_CHANGES_SQL,
    ]
}

type Param<'a> = dyn ToSql + Sync + 'a;

/// What a group commit plans from, read under the change-log lock: the head, the repository
/// generation, and the scope sets whose keys it writes (docs/api.md §20). A group written ahead
/// plans from the base its predecessor will commit, and commits only if it reads that same base
/// once it holds the lock (see [`try_lock_at`]): so everything else another commit could change
/// under a plan must move the base too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Base {
    pub head: i64,
    pub repository_generation: i64,
    pub scope: ScopeState,
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
#[tracing::instrument(name = "db.commit.lock_and_read", level = "debug", skip_all)]
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
    let (_, _, head, transmissions, states) = futures_util::try_join!(
        tx.execute(&probes_only, &[]),
        tx.execute(&lock, lock_params),
        tx.query_one(&head, &[]),
        tx.query(&transmissions, keys),
        read_states(tx, &states, ids, need_data),
    )?;
    Ok(PlanInputs {
        base: base_of(&head)?,
        transmissions: stored_transmissions(&transmissions)?,
        states: current_states(&states)?,
    })
}

/// Reads the stored state of `ids` (sorted), with the data of `need_data` among them, a slice of
/// ids per statement, all sent at once (one round trip). As one array, the ids of a push of
/// 300,000 records made a message of 6 MB, and the connection keeps the buffers it grew for its
/// largest message (some 21 MB) for as long as it lives (docs/api.md §18.4).
async fn read_states(
    tx: &Transaction<'_>,
    statement: &tokio_postgres::Statement,
    ids: &[&str],
    need_data: &[&str],
) -> Result<Vec<tokio_postgres::Row>, tokio_postgres::Error> {
    const IDS_PER_STATEMENT: usize = 4096;
    let mut need_data = need_data.to_vec();
    need_data.sort_unstable();
    // Those of `need_data` (among `ids`, both sorted) up to the last id of each slice.
    let mut rest = need_data.as_slice();
    let reads = ids.chunks(IDS_PER_STATEMENT).map(|chunk| {
        let upto = chunk.last().map_or(0, |last| rest.partition_point(|id| id <= last));
        let (wanted, after) = rest.split_at(upto);
        rest = after;
        async move {
            let params: &[&Param<'_>] = &[&chunk, &wanted];
            tx.query(statement, params).await
        }
    });
    Ok(futures_util::future::try_join_all(reads).await?.into_iter().flatten().collect())
}

/// The reads of a commit written ahead of the lock (see `actors::change_log`): what
/// [`lock_and_read`] reads, without the lock and the head, in one round trip. A row lock the
/// transaction would wait for longer than a second fails it instead: it may belong to a commit
/// that waits for this one's predecessor, a wait PostgreSQL cannot see.
#[tracing::instrument(name = "db.commit.read_ahead", level = "debug", skip_all)]
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
    let (_, _, transmissions, states) = futures_util::try_join!(
        tx.execute(&probes_only, &[]),
        tx.batch_execute("SET LOCAL lock_timeout = '1s'"),
        tx.query(&transmissions, keys),
        read_states(tx, &states, ids, need_data),
    )?;
    Ok((stored_transmissions(&transmissions)?, current_states(&states)?))
}

fn base_of(row: &tokio_postgres::Row) -> DbResult<Base> {
    Ok(Base {
        head: row.try_get(0)?,
        repository_generation: row.try_get(1)?,
        scope: ScopeState {
            revision: row.try_get(2)?,
            active_version: row.try_get(3)?,
            preparing_version: row.try_get(4)?,
        },
    })
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
                data: r.try_get::<_, Option<String>>(4)?.map(raw_json).transpose()?,
            };
            Ok((r.try_get::<_, String>(0)?, state))
        })
        .collect()
}

/// Takes the change-log lock if it is free, then reads the base, in one round trip (two
/// statements, so that the base is read in a snapshot taken after the lock). True when the lock
/// is held and the base is `expected`: nothing was committed since the commit this one wrote ahead
/// of.
#[tracing::instrument(name = "db.commit.try_lock_at", level = "debug", skip_all)]
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
#[tracing::instrument(name = "db.commit.write_ahead", level = "debug", skip_all)]
pub async fn write_ahead(
    db: &Transaction<'_>,
    pushes: &[&Push],
    plan: &Plan<'_>,
    synced_at: DateTime<Utc>,
    phases: &mut CommitPhases,
) -> DbResult<()> {
    if !plan.superseded_in_batch.is_empty() {
        insert_revision_rows(db, &rows_of(plan, &plan.superseded_in_batch, synced_at)).await?;
    }
    copy_rows_at(db, plan, &current_revisions(plan), synced_at).await?;
    phases.lap("copy");
    insert_transmissions(db, pushes, plan).await?;
    copy_big_results(db, pushes, plan).await?;
    phases.lap("transmissions");
    Ok(())
}

/// What a plan written ahead still has to write once it holds the lock: the kept statistics
/// and the pushers' write marks (rows every commit may update) and the head.
#[tracing::instrument(name = "db.commit.finish_ahead", level = "debug", skip_all)]
pub async fn finish_ahead(db: &Transaction<'_>, pushes: &[&Push], plan: &Plan<'_>) -> DbResult<()> {
    let counts = stats::count_changes(
        db,
        &[],
        current_revisions(plan).into_iter().map(|i| {
            let r = plan.revision(i);
            (r.record.form_type(), r.created_at, r.record.deleted)
        }),
    );
    let head = async {
        if plan.revision_count() > 0 {
            let statement = db.prepare_cached(records::SET_HEAD_SQL).await?;
            db.execute(&statement, &[&plan.head]).await?;
        }
        Ok(())
    };
    let pushers = pushers(pushes);
    let marks = marks::mark_changes(db, &pushers, plan.head);
    futures_util::try_join!(counts, head, marks)?;
    Ok(())
}

/// The users whose pushes a commit answers, sorted and each once: the group's head becomes their
/// write mark (src/db/marks.rs), since the whole group becomes visible at once. Marked with the
/// head, under the change-log lock, in the round trip that moves it.
fn pushers<'a>(pushes: &[&'a Push]) -> Vec<&'a str> {
    let mut users: Vec<&str> = pushes.iter().map(|p| p.pushed_by.as_str()).collect();
    users.sort_unstable();
    users.dedup();
    users
}

/// The revisions of a plan that become current states: every one no later revision replaces.
fn current_revisions(plan: &Plan<'_>) -> Vec<usize> {
    let mut superseded = vec![false; plan.revision_count()];
    for &i in &plan.superseded_in_batch {
        superseded[i] = true;
    }
    (0..plan.revision_count()).filter(|&i| !superseded[i]).collect()
}

/// The plan's revisions at `indexes` as record rows. Every value is borrowed from the pushes
/// being committed and the states read for them: a group commit of thousands of records copies
/// none of them. Only the revisions a statement sends are made columns (some 300 bytes a row): a
/// push of 300,000 new records is copied a chunk at a time ([`copy_rows_at`]), not as a second
/// copy of its plan (docs/api.md §18.4).
fn rows_of<'a>(plan: &Plan<'a>, indexes: &[usize], synced_at: DateTime<Utc>) -> Rows<'a> {
    let mut rows = Rows::with_capacity(indexes.len());
    for r in indexes.iter().map(|&i| plan.revision(i)) {
        let (rec, push) = (r.record, r.push);
        rows.push(Row {
            id: rec.id(),
            form_type: rec.form_type(),
            form_version: rec.form_version(),
            data: r.data,
            deleted: rec.deleted,
            created_at: r.created_at,
            updated_at: r.updated_at,
            synced_at,
            geolocation: rec.geolocation().map(JsonColumn::Text),
            author: rec.author(),
            device_id: rec.device_id(),
            tags: rec.tags().map(JsonColumn::Text),
            change_id: r.change_id,
            client_id: &push.client_id,
            transmission_id: push.transmission_id.as_deref(),
            pushed_by: &push.pushed_by,
            overwrote_version: r.overwrote,
            conflict: r.conflict,
            created_by: r.created_by,
        });
    }
    rows
}

/// Writes a plan: the current state of every record it overwrites moves to `record_revisions`
/// (copied inside the database), in-batch revisions that a later one replaces go there too, each
/// record's last revision becomes its current state, the kept statistics change by the same
/// records, the transmission results are stored and the head moves to `plan.head`.
///
/// Two round trips and the COPY whatever the batch: the statements are prepared once per
/// connection, and those that do not wait for each other are pipelined (PostgreSQL runs them in
/// the order sent; each group is sent only after the one before it has answered).
#[tracing::instrument(name = "db.commit.write_plan", level = "debug", skip_all)]
pub async fn write_plan(
    db: &Transaction<'_>,
    pushes: &[&Push],
    plan: &Plan<'_>,
    overwritten_ids: &[&str],
    synced_at: DateTime<Utc>,
    phases: &mut CommitPhases,
) -> DbResult<()> {
    let current = current_revisions(plan);
    // First what reads the stored state of the records this batch overwrites.
    let archive = async {
        if !overwritten_ids.is_empty() {
            let statement = db.prepare_cached(&record_row::ARCHIVE_SQL).await?;
            db.execute(&statement, &[&overwritten_ids]).await?;
        }
        Ok(())
    };
    let in_batch = async {
        if !plan.superseded_in_batch.is_empty() {
            insert_revision_rows(db, &rows_of(plan, &plan.superseded_in_batch, synced_at)).await?;
        }
        Ok(())
    };
    let counts = stats::count_changes(
        db,
        overwritten_ids,
        current.iter().map(|&i| {
            let r = plan.revision(i);
            (r.record.form_type(), r.created_at, r.record.deleted)
        }),
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
        current.into_iter().partition(|&i| stored.contains(plan.revision_id(i)));
    copy_rows_at(db, plan, &inserts, synced_at).await?;
    drop(inserts);
    copy_big_results(db, pushes, plan).await?;
    phases.lap("copy");
    let update = async {
        if !updates.is_empty() {
            let statement = db.prepare_cached(&record_row::UPDATE_SQL).await?;
            db.execute(&statement, &rows_of(plan, &updates, synced_at).params()).await?;
        }
        Ok(())
    };
    let head = async {
        // Every revision and refusal took an id: none means the head stays (a batch of replays).
        if plan.revision_count() > 0 || !plan.refusals.is_empty() {
            let statement = db.prepare_cached(records::SET_HEAD_SQL).await?;
            db.execute(&statement, &[&plan.head]).await?;
        }
        Ok(())
    };
    let pushers = pushers(pushes);
    let marks = marks::mark_changes(db, &pushers, plan.head);
    futures_util::try_join!(update, insert_transmissions(db, pushes, plan), head, marks)?;
    phases.lap("update_transmissions_head");
    Ok(())
}

/// New records go in through binary COPY: no parameter arrays to build and unnest, and the rows
/// stream to the server in small messages instead of one statement of many megabytes. (Sending
/// them in 256 KB messages instead was measured slower: PostgreSQL then waits for each chunk
/// instead of inserting rows while the next ones are encoded; docs/benchmarks-history.md,
/// "Push: where a group commit's time goes".) Only new records, each once, is the usual big push:
/// then every row goes, in order.
async fn copy_rows_at(
    db: &Transaction<'_>,
    plan: &Plan<'_>,
    indexes: &[usize],
    synced_at: DateTime<Utc>,
) -> DbResult<()> {
    /// Rows made columns at a time: enough to keep the COPY busy, small next to a big push.
    const CHUNK: usize = 4096;
    if indexes.is_empty() {
        return Ok(());
    }
    let statement = db.prepare_cached(&record_row::COPY_SQL).await?;
    let sink = db.copy_in(&statement).await?;
    record_row::copy_rows(sink, indexes.chunks(CHUNK).map(|chunk| rows_of(plan, chunk, synced_at))).await
}

async fn insert_revision_rows(db: &impl GenericClient, rows: &Rows<'_>) -> DbResult<()> {
    let statement = db.prepare_cached(&record_row::INSERT_REVISIONS_SQL).await?;
    db.execute(&statement, &rows.params()).await?;
    Ok(())
}

/// Stores the results of the plan's named transmissions, for idempotent replay; those of more
/// than [`COPIED_RESULT_ITEMS`] items are [`copy_big_results`]'s.
#[tracing::instrument(name = "db.commit.insert_transmissions", level = "debug", skip_all)]
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
        if result.items.len() > COPIED_RESULT_ITEMS {
            continue;
        }
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

/// A result of more items than this (some 0.5 MB of JSON) is stored by [`copy_big_results`].
const COPIED_RESULT_ITEMS: usize = 16_384;

/// The JSON of a result is sent in pieces of this size.
const RESULT_PIECE: usize = 64 * 1024;

const TRANSMISSION_COPY_SQL: &str =
    "COPY transmissions (client_id, transmission_id, fingerprint, result) FROM STDIN (FORMAT binary)";

/// Stores the big results of the plan's named transmissions through COPY, a row each, its JSON
/// written in pieces of 64 KiB. As a statement's parameter, the result of a push of 300,000
/// records (8 MB of JSON) was grown by doubling in the client's buffer, then copied whole into
/// the connection's: some 30 MB at the commit's peak, and the connection kept both buffers
/// (docs/api.md §18.4). Runs alone on the transaction: a COPY takes the connection until it ends.
#[tracing::instrument(name = "db.commit.copy_big_results", level = "debug", skip_all)]
async fn copy_big_results(db: &Transaction<'_>, pushes: &[&Push], plan: &Plan<'_>) -> DbResult<()> {
    use bytes::BufMut;
    use futures_util::SinkExt;

    for (push, transmission_id, result) in plan.transmissions(pushes) {
        if result.items.len() <= COPIED_RESULT_ITEMS {
            continue;
        }
        let mut json = Pieces { done: Vec::new(), current: bytes::BytesMut::with_capacity(RESULT_PIECE) };
        serde_json::to_writer(&mut json, result).map_err(|e| DbError::Other(e.into()))?;
        let json = json.finish();
        let json_len: usize = json.iter().map(bytes::Bytes::len).sum();
        // The binary COPY header, then one row of four fields, each its length then its bytes; a
        // jsonb field starts with its format version, 1.
        let mut head = bytes::BytesMut::new();
        head.put_slice(b"PGCOPY\n\xff\r\n\0");
        head.put_i32(0);
        head.put_i32(0);
        head.put_i16(4);
        for field in [push.client_id.as_bytes(), transmission_id.as_bytes(), &push.fingerprint] {
            head.put_i32(field_len(field.len())?);
            head.put_slice(field);
        }
        head.put_i32(field_len(json_len + 1)?);
        head.put_u8(1);
        let statement = db.prepare_cached(TRANSMISSION_COPY_SQL).await?;
        let sink = db.copy_in(&statement).await?;
        let mut sink = std::pin::pin!(sink);
        sink.send(head.freeze()).await?;
        for piece in json {
            sink.send(piece).await?;
        }
        sink.send(bytes::Bytes::from_static(&[0xff, 0xff])).await?;
        sink.as_mut().finish().await?;
    }
    Ok(())
}

fn field_len(len: usize) -> DbResult<i32> {
    i32::try_from(len)
        .map_err(|_| DbError::Other(format!("a field of {len} bytes is too long for COPY").into()))
}

/// JSON written in pieces of [`RESULT_PIECE`] bytes.
struct Pieces {
    done: Vec<bytes::Bytes>,
    current: bytes::BytesMut,
}

impl Pieces {
    fn finish(mut self) -> Vec<bytes::Bytes> {
        if !self.current.is_empty() {
            self.done.push(self.current.freeze());
        }
        self.done
    }
}

impl std::io::Write for Pieces {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if !self.current.is_empty() && self.current.len() + buf.len() > RESULT_PIECE {
            let full = std::mem::replace(&mut self.current, bytes::BytesMut::with_capacity(RESULT_PIECE));
            self.done.push(full.freeze());
        }
        self.current.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
