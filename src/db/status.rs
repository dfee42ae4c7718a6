//! Counters for `GET /status`.

use deadpool_postgres::GenericClient;

use crate::db::DbResult;

pub struct Counts {
    pub observations: i64,
    pub attachments: i64,
    pub head: i64,
    pub active_bundle_version: Option<String>,
}

pub async fn counts(db: &impl GenericClient) -> DbResult<Counts> {
    let row =
        db.query_one("SELECT (SELECT count(*) FROM records), (SELECT head FROM change_head), (SELECT version FROM bundle_active)", &[]).await?;
    Ok(Counts {
        observations: row.get(0),
        attachments: 0,
        head: row.get(1),
        active_bundle_version: row.get(2),
    })
}
