//! SQL for observations: pull pages, the change-log head, and read access. The group commit's
//! writes are in `db::commit`.

use std::pin::Pin;
use std::sync::LazyLock;
use std::task::{ready, Context, Poll};

use dashmap::DashSet;
use deadpool_postgres::{GenericClient, Object};
use futures_util::{Stream, StreamExt};
use serde_json::value::RawValue;
use tokio_postgres::types::{FromSql, ToSql, Type};
use tokio_postgres::{Row, RowStream};

use crate::db::record_row::{select_through, Col, Table, STATE_COLUMNS};
use crate::db::{stats, DbError, DbResult};
use crate::domain::sync::page::PulledRecord;
use crate::domain::sync::StoredRecord;
use crate::domain::time::UnixMicros;

/// Serialises change_id allocation across server processes sharing one database.
pub const CHANGELOG_LOCK: i64 = 0x5359_4e4b_0010;
pub(super) const LOCK_SQL: &str = "SELECT pg_advisory_xact_lock($1)";
pub(super) const TRY_LOCK_SQL: &str = "SELECT pg_try_advisory_xact_lock($1)";
/// The head and generation, and the scope state a commit plans with (`commit::Base`).
pub(super) const HEAD_SQL: &str = "SELECT c.head, c.repository_generation, s.revision, s.active_version, \
     s.preparing_version FROM change_head c, scope_state s";
pub(super) const SET_HEAD_SQL: &str = "UPDATE change_head SET head = $1";

/// A record's state as readers select it (`record_row::select_through`): JSON columns as text,
/// kept raw (see `StoredRecord`), each column at its position in `record_row::Col`.
static RECORD_COLUMNS: LazyLock<String> = LazyLock::new(|| select_through(Col::change_id, Table::Records));

/// Stored JSON text as it is. It is valid JSON (the server parsed `data` before storing it, and
/// PostgreSQL checked the `json` columns on the way in), so text that is not is a database in a
/// state the server did not leave it in: an error, not a `null`.
pub(super) fn raw_json(text: String) -> DbResult<Box<RawValue>> {
    RawValue::from_string(text).map_err(|e| DbError::Other(format!("stored JSON does not parse: {e}").into()))
}

/// The record state selected by [`RECORD_COLUMNS`] from position `offset` of `row` on.
fn record_from_row(row: &Row, offset: usize) -> DbResult<StoredRecord> {
    let at = |c: Col| offset + c as usize;
    Ok(StoredRecord {
        id: row.get(at(Col::id)),
        form_type: row.get(at(Col::form_type)),
        form_version: row.get(at(Col::form_version)),
        data: raw_json(row.get(at(Col::data)))?,
        deleted: row.get(at(Col::deleted)),
        created_at: row.get(at(Col::created_at)),
        updated_at: row.get(at(Col::updated_at)),
        synced_at: row.get(at(Col::synced_at)),
        geolocation: row.get::<_, Option<String>>(at(Col::geolocation)).map(raw_json).transpose()?,
        author: row.get(at(Col::author)),
        device_id: row.get(at(Col::device_id)),
        tags: row.get::<_, Option<String>>(at(Col::tags)).map(raw_json).transpose()?,
        change_id: row.get(at(Col::change_id)),
    })
}

/// One pull page as PostgreSQL sends it: the snapshot head S and the repository generation came
/// with the first row, the records (up to `limit + 1`, with `after < change_id <= S`, all from that
/// one snapshot: docs/api.md §8.2) follow as they arrive.
pub struct PageRows {
    pub head: Head,
    /// Whether the page was read as a scoped one (see [`ScopedReaders`]).
    pub read_scoped: bool,
    /// The first record's row, until it is taken; `None` for an empty page.
    first: Option<Row>,
    /// The change_id of the last row given out (at first the cursor): each row must be above it.
    last: i64,
    rest: Pin<Box<RowStream>>,
    /// Held until the page is dropped, so the connection is not lent out while rows still arrive.
    _db: Object,
}

impl Stream for PageRows {
    type Item = DbResult<Row>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let next = match self.first.take() {
            Some(row) => Some(Ok(row)),
            None => ready!(self.rest.as_mut().poll_next(cx)).map(|row| row.map_err(DbError::from)),
        };
        Poll::Ready(next.map(|row| row.and_then(|row| self.in_order(row))))
    }
}

impl PageRows {
    /// A page after `after` whose first row has arrived: it carries the head and the
    /// [`READS_SCOPED_COLUMN`]; a first row without a record is not one of the page's records.
    pub(crate) fn new(after: i64, first: Row, rest: Pin<Box<RowStream>>, db: Object) -> DbResult<PageRows> {
        let head = Head { change_id: first.try_get(0)?, repository_generation: first.try_get(1)? };
        let read_scoped = first.try_get(READS_SCOPED_COLUMN)?;
        let first = first.try_get::<_, Option<&str>>(2)?.is_some().then_some(first);
        Ok(PageRows { head, read_scoped, first, last: after, rest, _db: db })
    }

    /// Each row moves the page forward within its snapshot (docs/api.md §8.2): a row that does
    /// not is a broken invariant (of a statement as intricate as the scoped page's, say), and the
    /// page fails rather than go out wrong to a device that would keep it.
    fn in_order(&mut self, row: Row) -> DbResult<Row> {
        let change_id: Option<i64> = row.try_get(2 + Col::change_id as usize)?;
        match change_id {
            Some(at) if at > self.last && at <= self.head.change_id => {
                self.last = at;
                Ok(row)
            }
            _ => Err(DbError::Other(
                format!(
                    "a page row at {change_id:?} came after {} (head {})",
                    self.last, self.head.change_id
                )
                .into(),
            )),
        }
    }
}

/// The page statement of [`pull_page`], with or without a type filter.
fn page_sql(typed: bool) -> String {
    // With a type filter, each type is read in change_id order from (form_type, change_id) and
    // the short lists are merged. Written as `form_type = ANY(...)`, the planner picks a bitmap
    // scan of every matching row plus a sort whenever its statistics lag behind a burst of
    // pushes (measured: 250 ms instead of 2 ms per page right after 250,000 new records).
    // Written as `form_type = t.ft AND change_id > $1`, it walks the change_id index and filters
    // by type, which reads the whole table for a type with few records (1.2 s at 1M records,
    // for a form nobody has filled in yet); the row comparison can only be served by
    // (form_type, change_id), so a page costs the same at any size (docs/benchmarks-history.md,
    // "Scale curve").
    let columns = RECORD_COLUMNS.as_str();
    let page = if !typed {
        format!(
            "SELECT {columns} FROM records WHERE change_id > $1 AND change_id <= h.head AND NOT h.scoped
             ORDER BY change_id LIMIT $2"
        )
    } else {
        format!(
            "SELECT x.* FROM unnest($3::text[]) AS t(ft) CROSS JOIN LATERAL (
                 SELECT {columns} FROM records
                 WHERE (form_type, change_id) > (t.ft, $1) AND (form_type, change_id) <= (t.ft, h.head)
                       AND NOT h.scoped
                 ORDER BY form_type, change_id LIMIT $2
             ) x ORDER BY x.change_id LIMIT $2"
        )
    };
    // A page that must be read scoped reads no record here: PostgreSQL would send every row of
    // it, to be dropped. The username is the last parameter: $3 without a type filter, $4 with
    // one.
    let user = if typed { "$4" } else { "$3" };
    let scoped = crate::db::scope::read::reads_scoped_sql(user, "$1");
    format!(
        "WITH h AS (
             SELECT c.head, c.repository_generation, {scoped} AS scoped FROM change_head c
         )
         SELECT h.head, h.repository_generation, r.*, h.scoped FROM h LEFT JOIN LATERAL ({page}) r ON true"
    )
}

/// The users whose last page was read as a scoped one, on this node. Their next page starts on
/// the scoped statement, which reads any user's page rightly (a user who sees everything gets the
/// whole change log), so the hint saves the unscoped statement's round trip and is never a
/// reason for a wrong page; a page that finds the user sees everything drops it.
#[derive(Default)]
pub struct ScopedReaders(DashSet<String>);

impl ScopedReaders {
    pub fn knows(&self, username: &str) -> bool {
        self.0.contains(username)
    }

    /// Keeps what a page found out about `username` (`PageRows::read_scoped`).
    pub fn learn(&self, username: &str, read_scoped: bool) {
        if read_scoped {
            if !self.0.contains(username) {
                self.0.insert(username.to_owned());
            }
        } else {
            self.0.remove(username);
        }
    }
}

/// Starts reading `username`'s page after `after` (see [`PageRows`]) and waits for its first row,
/// which carries the head. While no scope set is in force (and for admins) that is every change;
/// otherwise, or while the user has redeliveries to receive, the statement says so in its last
/// column and the page is read as `scope::pull` reads it, in a snapshot of its own. A user
/// known to read scoped (`known_scoped`, see [`ScopedReaders`]) starts there.
#[tracing::instrument(name = "db.records.pull_page", level = "debug", skip_all)]
pub async fn pull_page(
    db: Object,
    (username, client_id): (&str, &str),
    after: i64,
    types: &[String],
    (limit, known_scoped): (i64, bool),
) -> DbResult<PageRows> {
    // Built once: every pull looks its statement up by this text.
    static PAGE_SQL: LazyLock<[String; 2]> = LazyLock::new(|| [page_sql(false), page_sql(true)]);
    let mut distinct_types: Vec<&str> = types.iter().map(String::as_str).collect();
    distinct_types.sort_unstable();
    distinct_types.dedup();
    if known_scoped {
        return crate::db::scope::pull::page(db, (username, client_id), after, &distinct_types, limit).await;
    }
    // Devices pull page after page: the statement is prepared once per connection.
    let statement = db.prepare_cached(&PAGE_SQL[usize::from(!types.is_empty())]).await?;
    let limit = limit + 1;
    let mut rest = Box::pin(if distinct_types.is_empty() {
        db.query_raw(&statement, [&after as &(dyn ToSql + Sync), &limit, &username]).await?
    } else {
        db.query_raw(&statement, [&after as &(dyn ToSql + Sync), &limit, &distinct_types, &username]).await?
    });
    // The LEFT JOIN gives exactly one row, its record columns NULL, when the page is empty.
    let Some(first) = rest.next().await.transpose()? else {
        return Err(DbError::Other("the page statement returned no row".into()));
    };
    if first.try_get::<_, bool>(READS_SCOPED_COLUMN)? {
        drop(rest);
        return crate::db::scope::pull::page(db, (username, client_id), after, &distinct_types, limit - 1)
            .await;
    }
    PageRows::new(after, first, rest, db)
}

/// Both page statements' last column, after the head, the generation and the record's state:
/// whether the user reads scoped. In the unscoped statement's first row it says to read the page
/// with `scope::pull` instead; in the scoped one's, that the user does not see everything.
pub(crate) const READS_SCOPED_COLUMN: usize = 2 + STATE_COLUMNS;

/// A row of [`PageRows`] as the page writer takes it, borrowed from the row's bytes: the head and
/// the generation, then the record's state.
pub fn pulled_record(row: &Row) -> DbResult<PulledRecord<'_>> {
    let at = |c: Col| 2 + c as usize;
    Ok(PulledRecord {
        id: row.try_get(at(Col::id))?,
        form_type: row.try_get(at(Col::form_type))?,
        form_version: row.try_get(at(Col::form_version))?,
        data: row.try_get(at(Col::data))?,
        deleted: row.try_get(at(Col::deleted))?,
        created_at: row.try_get::<_, Option<DbTime>>(at(Col::created_at))?.map(|t| t.0),
        updated_at: row.try_get::<_, Option<DbTime>>(at(Col::updated_at))?.map(|t| t.0),
        synced_at: row.try_get::<_, DbTime>(at(Col::synced_at))?.0,
        geolocation: row.try_get(at(Col::geolocation))?,
        author: row.try_get(at(Col::author))?,
        device_id: row.try_get(at(Col::device_id))?,
        tags: row.try_get(at(Col::tags))?,
        change_id: row.try_get(at(Col::change_id))?,
    })
}

/// A `timestamptz` as the page writer takes it. PostgreSQL sends microseconds since 2000-01-01;
/// values that `DateTime<Utc>` cannot hold are refused, as when the row was read as one.
struct DbTime(UnixMicros);

/// 2000-01-01T00:00:00Z in microseconds since 1970-01-01T00:00:00Z.
const POSTGRES_EPOCH_MICROS: i64 = 946_684_800_000_000;

impl<'a> FromSql<'a> for DbTime {
    fn from_sql(_: &Type, raw: &'a [u8]) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        let since_2000 = i64::from_be_bytes(raw.try_into().map_err(|_| "invalid message length")?);
        let micros = since_2000.checked_add(POSTGRES_EPOCH_MICROS).and_then(UnixMicros::new);
        micros.map(DbTime).ok_or_else(|| "value too large to decode".into())
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::TIMESTAMPTZ
    }
}

/// The change-log head and the repository generation, read together.
#[derive(Debug, Clone, Copy)]
pub struct Head {
    pub change_id: i64,
    pub repository_generation: i64,
}

/// Takes the change log's transaction-scoped advisory lock: every commit that allocates change_ids
/// holds it, so ids are assigned in commit order across every process sharing the database.
#[tracing::instrument(name = "db.records.lock_change_log", level = "debug", skip_all)]
pub async fn lock_change_log(db: &impl GenericClient) -> DbResult<()> {
    db.execute(LOCK_SQL, &[&CHANGELOG_LOCK]).await?;
    Ok(())
}

#[tracing::instrument(name = "db.records.head", level = "debug", skip_all)]
pub async fn head(db: &impl GenericClient) -> DbResult<i64> {
    Ok(db.query_one("SELECT head FROM change_head", &[]).await?.get(0))
}

#[tracing::instrument(name = "db.records.head_and_generation", level = "debug", skip_all)]
pub async fn head_and_generation(db: &impl GenericClient) -> DbResult<Head> {
    let row = db.query_one(&db.prepare_cached(HEAD_SQL).await?, &[]).await?;
    Ok(Head { change_id: row.get(0), repository_generation: row.get(1) })
}

/// Empties the repository in the caller's transaction (docs/api.md §17.3): observations, their history,
/// transmission results and attachment records go; the change sequence continues; the generation
/// rises. Returns the new head state.
#[tracing::instrument(name = "db.records.reset_repository", level = "debug", skip_all)]
pub async fn reset_repository(db: &impl GenericClient) -> DbResult<Head> {
    db.batch_execute(
        "DELETE FROM record_revisions; DELETE FROM records; DELETE FROM transmissions; DELETE FROM attachments;
         DELETE FROM attachment_tombstones;",
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

#[tracing::instrument(name = "db.records.set_head", level = "debug", skip_all)]
pub async fn set_head(db: &impl GenericClient, head: i64) -> DbResult<()> {
    db.execute(SET_HEAD_SQL, &[&head]).await?;
    Ok(())
}

#[tracing::instrument(name = "db.records.purge_transmissions", level = "debug", skip_all)]
pub async fn purge_transmissions(db: &impl GenericClient, retention_days: u32) -> DbResult<u64> {
    Ok(db
        .execute(
            "DELETE FROM transmissions WHERE created_at < now() - make_interval(days => $1)",
            &[&(retention_days as i32)],
        )
        .await?)
}

// ---- read access (docs/api.md §12) ----

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

#[tracing::instrument(name = "db.records.list_observations", level = "debug", skip_all)]
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
    // One statement per filter, each written so that only the index that serves it can: with the
    // filters as optional conditions on a walk of change_id, a rare form type or a user with few
    // records made PostgreSQL read the whole table (as pull_page's typed pages did, above).
    // $1 after, $2 limit, $3 include deleted, then the filters.
    let limit = limit + 1;
    let columns = RECORD_COLUMNS.as_str();
    let (page, filter): (String, Option<&(dyn ToSql + Sync)>) = match (&owner_filter, form_types.is_empty()) {
        (None, true) => (
            format!(
                "SELECT {columns}, created_by FROM records
                 WHERE change_id > $1 AND change_id <= h.head AND ($3 OR NOT deleted)
                 ORDER BY change_id LIMIT $2"
            ),
            None,
        ),
        (Some(user), true) => (
            format!(
                "SELECT {columns}, created_by FROM records
                 WHERE (created_by, change_id) > ($4::text, $1) AND (created_by, change_id) <= ($4::text, h.head)
                   AND ($3 OR NOT deleted)
                 ORDER BY created_by, change_id LIMIT $2"
            ),
            Some(user),
        ),
        (_, false) => (
            format!(
                "SELECT x.* FROM unnest($4::text[]) AS t(ft) CROSS JOIN LATERAL (
                     SELECT {columns}, created_by FROM records
                     WHERE (form_type, change_id) > (t.ft, $1) AND (form_type, change_id) <= (t.ft, h.head)
                       AND ($5::text IS NULL OR created_by = $5) AND ($3 OR NOT deleted)
                     ORDER BY form_type, change_id LIMIT $2
                 ) x ORDER BY x.change_id LIMIT $2"
            ),
            Some(&form_types),
        ),
    };
    let sql = format!(
        "WITH h AS (SELECT head FROM change_head)
         SELECT h.head, r.* FROM h LEFT JOIN LATERAL ({page}) r ON true"
    );
    let mut params: Vec<&(dyn ToSql + Sync)> = vec![&after, &limit, &include_deleted];
    params.extend(filter);
    if !form_types.is_empty() {
        params.push(&owner_filter);
    }
    let rows = db.query(&sql, &params).await?;
    let head: i64 = rows.first().map(|r| r.get(0)).unwrap_or(0);
    let records = rows
        .iter()
        .filter(|r| r.get::<_, Option<String>>(1).is_some())
        .map(|r| Ok(OwnedRecord { record: record_from_row(r, 1)?, created_by: r.get(1 + STATE_COLUMNS) }))
        .collect::<DbResult<_>>()?;
    Ok((head, records))
}

#[tracing::instrument(name = "db.records.find_observation", level = "debug", skip_all)]
pub async fn find_observation(db: &impl GenericClient, id: &str) -> DbResult<Option<OwnedRecord>> {
    let sql = format!("SELECT {}, created_by FROM records WHERE id = $1", RECORD_COLUMNS.as_str());
    db.query_opt(&sql, &[&id])
        .await?
        .map(|r| Ok(OwnedRecord { record: record_from_row(&r, 0)?, created_by: r.get(STATE_COLUMNS) }))
        .transpose()
}

/// One stored revision with its provenance (docs/api.md §12.3).
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
#[tracing::instrument(name = "db.records.history", level = "debug", skip_all)]
pub async fn history(
    db: &impl GenericClient,
    id: &str,
    before: Option<i64>,
    limit: i64,
) -> DbResult<Vec<Revision>> {
    // A record's state, then the revision's provenance: a prefix of the record row's columns,
    // which both tables have.
    static HISTORY_SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            "SELECT * FROM (
                 SELECT {} FROM records WHERE id = $1
                 UNION ALL
                 SELECT {} FROM record_revisions WHERE record_id = $1
             ) h
             WHERE $2::bigint IS NULL OR change_id < $2
             ORDER BY change_id DESC LIMIT $3",
            select_through(Col::conflict, Table::Records),
            select_through(Col::conflict, Table::Revisions),
        )
    });
    let rows = db.query(HISTORY_SQL.as_str(), &[&id, &before, &(limit + 1)]).await?;
    rows.iter()
        .map(|r| {
            Ok(Revision {
                record: record_from_row(r, 0)?,
                client_id: r.get(Col::client_id as usize),
                transmission_id: r.get(Col::transmission_id as usize),
                pushed_by: r.get(Col::pushed_by as usize),
                overwrote_version: r.get(Col::overwrote_version as usize),
                conflict: r.get(Col::conflict as usize),
            })
        })
        .collect()
}

#[tracing::instrument(name = "db.records.record_exists", level = "debug", skip_all)]
pub async fn record_exists(db: &impl GenericClient, id: &str) -> DbResult<bool> {
    Ok(db.query_opt("SELECT 1 FROM records WHERE id = $1", &[&id]).await?.is_some())
}
