//! The counts behind `GET /stats/observations` and `GET /status` (docs/api.md §17.8, §18.4).
//!
//! Counting 10 million records takes seconds, so the counts are kept in tables (migration V8)
//! that every writer of `records` and `attachments` updates in the same transaction, under the
//! change-log lock: the change log's commit calls `count_changes` before it overwrites records,
//! the repository reset calls `clear`, an attachment insert `count_attachment`. Reads then sum a
//! few thousand rows (form types × days) and are exact at every moment.

use std::collections::HashMap;
use std::sync::LazyLock;

use chrono::{DateTime, NaiveDate, Utc};
use deadpool_postgres::GenericClient;

use crate::db::DbResult;

/// The UTC day of a creation time, as the counts key it (`'-infinity'` stands for none).
const DAY_OF_CREATED_AT: &str = "coalesce((created_at AT TIME ZONE 'UTC')::date, '-infinity')";

/// `$1` the ids of the records replaced, `$2..$5` the counts added (form type, day, deleted, n);
/// answers the keys whose count reached zero.
pub(crate) static COUNT_CHANGES_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "WITH delta AS (
             SELECT ft, d, del, sum(n)::bigint AS n FROM (
                 SELECT form_type, {DAY_OF_CREATED_AT}, deleted, -1::bigint FROM records WHERE id = ANY($1)
                 UNION ALL
                 SELECT ft, coalesce(d, '-infinity'), del, n
                 FROM unnest($2::text[], $3::date[], $4::bool[], $5::bigint[]) AS a(ft, d, del, n)
             ) AS c(ft, d, del, n)
             GROUP BY ft, d, del
             HAVING sum(n) <> 0
         ), counted AS (
             INSERT INTO observation_counts AS o (form_type, day, deleted, n)
             SELECT ft, d, del, n FROM delta
             ON CONFLICT (form_type, day, deleted) DO UPDATE SET n = o.n + excluded.n
             RETURNING form_type, day, deleted, n
         )
         SELECT form_type, day::text, deleted FROM counted WHERE n = 0"
    )
});

/// Moves the counts from the stored state of `replaced_ids` to `new_states` (form type, creation
/// time, deleted) in one statement. Call it before the records are written: the replaced records'
/// counted state is read from their rows.
#[tracing::instrument(name = "db.stats.count_changes", level = "debug", skip_all)]
pub async fn count_changes<'a>(
    db: &impl GenericClient,
    replaced_ids: &[&str],
    new_states: impl IntoIterator<Item = (&'a str, Option<DateTime<Utc>>, bool)>,
) -> DbResult<()> {
    // A group commit of thousands of records touches a handful of keys: they travel summed.
    let mut added: HashMap<(&str, Option<NaiveDate>, bool), i64> = HashMap::new();
    for (form_type, created_at, deleted) in new_states {
        *added.entry((form_type, created_at.map(|t| t.date_naive()), deleted)).or_default() += 1;
    }
    if added.is_empty() && replaced_ids.is_empty() {
        return Ok(());
    }
    let mut form_types = Vec::with_capacity(added.len());
    let mut days = Vec::with_capacity(added.len());
    let mut deleted = Vec::with_capacity(added.len());
    let mut counts = Vec::with_capacity(added.len());
    for ((form_type, day, del), n) in added {
        form_types.push(form_type);
        days.push(day);
        deleted.push(del);
        counts.push(n);
    }
    let statement = db.prepare_cached(&COUNT_CHANGES_SQL).await?;
    let emptied = db.query(&statement, &[&replaced_ids, &form_types, &days, &deleted, &counts]).await?;
    if !emptied.is_empty() {
        // Keeps the table as small as the live keys, and the timeline's span honest.
        let form_types: Vec<String> = emptied.iter().map(|r| r.get(0)).collect();
        let days: Vec<String> = emptied.iter().map(|r| r.get(1)).collect();
        let deleted: Vec<bool> = emptied.iter().map(|r| r.get(2)).collect();
        db.execute(
            "DELETE FROM observation_counts o
             USING unnest($1::text[], $2::text[]::date[], $3::bool[]) AS k(ft, d, del)
             WHERE o.form_type = k.ft AND o.day = k.d AND o.deleted = k.del AND o.n = 0",
            &[&form_types, &days, &deleted],
        )
        .await?;
    }
    Ok(())
}

/// The repository reset (docs/api.md §17.3) empties every count with the rows.
#[tracing::instrument(name = "db.stats.clear", level = "debug", skip_all)]
pub async fn clear(db: &impl GenericClient) -> DbResult<()> {
    db.batch_execute("DELETE FROM observation_counts; UPDATE attachment_count SET n = 0;").await?;
    Ok(())
}

/// One more attachment row.
#[tracing::instrument(name = "db.stats.count_attachment", level = "debug", skip_all)]
pub async fn count_attachment(db: &impl GenericClient) -> DbResult<()> {
    db.execute("UPDATE attachment_count SET n = n + 1", &[]).await?;
    Ok(())
}

/// Counts everything again from the rows, under the change-log lock the caller's transaction
/// holds: for an operator who changed rows by hand, and for benchmarks that seed rows with SQL.
/// Returns the number of records counted.
#[tracing::instrument(name = "db.stats.recount", level = "debug", skip_all)]
pub async fn recount(db: &impl GenericClient) -> DbResult<i64> {
    db.batch_execute(&format!(
        "DELETE FROM observation_counts;
         INSERT INTO observation_counts (form_type, day, deleted, n)
         SELECT form_type, {DAY_OF_CREATED_AT}, deleted, count(*) FROM records GROUP BY 1, 2, 3;
         UPDATE attachment_count SET n = (SELECT count(*) FROM attachments);"
    ))
    .await?;
    Ok(db.query_one("SELECT coalesce(sum(n), 0)::bigint FROM observation_counts", &[]).await?.get(0))
}

/// The raw figures behind `GET /stats/observations` (docs/api.md §17.8).
#[derive(Debug, Clone, Default)]
pub struct ObservationStats {
    pub total: i64,
    /// (form type, count), largest first.
    pub by_form_type: Vec<(String, i64)>,
    /// `"day"` or `"week"`.
    pub bucket_unit: String,
    /// (bucket start, label, count), dense and ascending.
    pub buckets: Vec<(DateTime<Utc>, String, i64)>,
    pub computed_at: Option<DateTime<Utc>>,
    /// The change head of the statement's snapshot: the counts include every change up to it.
    pub head: i64,
}

/// One statement, one snapshot: per-type counts, the bucket unit, and the dense zero-filled
/// timeline (UTC days, or ISO weeks when the span is at least 365 days) of non-deleted records,
/// with the change head they count up to on the always present 'unit' row.
const STATS_SQL: &str = r#"
WITH live AS (
    SELECT form_type, day, n FROM observation_counts WHERE NOT deleted AND n > 0
),
dated AS (
    SELECT day::timestamp AS ts, sum(n) AS n FROM live WHERE isfinite(day) GROUP BY day
),
span AS (
    SELECT CASE WHEN max(ts) - min(ts) >= interval '365 days' THEN 'week' ELSE 'day' END AS unit,
           min(ts) AS lo, max(ts) AS hi
    FROM dated
),
counted AS (
    SELECT date_trunc(span.unit, dated.ts) AS bucket, sum(dated.n) AS n
    FROM dated, span GROUP BY 1
),
dense AS (
    SELECT b AS bucket, span.unit
    FROM span, generate_series(date_trunc(span.unit, span.lo), date_trunc(span.unit, span.hi),
                               ('1 ' || span.unit)::interval) AS b
    WHERE span.lo IS NOT NULL
)
SELECT 'type' AS kind, form_type AS label, NULL::timestamptz AS bucket, sum(n)::bigint AS n,
       (SELECT unit FROM span) AS unit, now() AS computed_at, NULL::bigint AS head
FROM live GROUP BY form_type
UNION ALL
SELECT 'bucket', CASE WHEN dense.unit = 'week' THEN to_char(dense.bucket, 'IYYY-"W"IW')
                      ELSE to_char(dense.bucket, 'YYYY-MM-DD') END,
       dense.bucket AT TIME ZONE 'UTC', coalesce(counted.n, 0)::bigint, dense.unit, now(), NULL
FROM dense LEFT JOIN counted ON counted.bucket = dense.bucket
UNION ALL
SELECT 'unit', NULL, NULL, 0, (SELECT unit FROM span), now(), (SELECT head FROM change_head)
"#;

#[tracing::instrument(name = "db.stats.observation_stats", level = "debug", skip_all)]
pub async fn observation_stats(db: &impl GenericClient) -> DbResult<ObservationStats> {
    let rows = db.query(STATS_SQL, &[]).await?;
    let mut stats = ObservationStats { bucket_unit: "day".into(), ..Default::default() };
    for row in &rows {
        let kind: &str = row.get("kind");
        let n: i64 = row.get("n");
        stats.computed_at = Some(row.get("computed_at"));
        match kind {
            "type" => {
                stats.total += n;
                stats.by_form_type.push((row.get("label"), n));
            }
            "bucket" => stats.buckets.push((row.get("bucket"), row.get("label"), n)),
            _ => {
                if let Some(unit) = row.get::<_, Option<String>>("unit") {
                    stats.bucket_unit = unit;
                }
                stats.head = row.get::<_, Option<i64>>("head").unwrap_or_default();
            }
        }
    }
    stats.by_form_type.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    stats.buckets.sort_by_key(|b| b.0);
    Ok(stats)
}
