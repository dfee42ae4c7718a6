//! The `ScopeSets` actor owns changes of the scope set on this node (docs/api.md §20.2): it stores
//! a new version as the one being prepared, and runs the preparation, in batches that commit
//! their progress, then the switch that puts it in force on every node at once.
//!
//! Several nodes may run: a node prepares only while it holds the preparation lock (a session
//! advisory lock, released when its connection goes), so exactly one prepares at a time, and a
//! preparation whose node died is resumed by another within seconds, from its last batch.

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use deadpool_postgres::{Object, Pool};
use tokio::sync::Notify;
use tracing::Instrument;

use crate::clock::Clock;
use crate::db::scope::prepare::{self, ChunkWrite, Plan, PREPARATION_LOCK};
use crate::db::scope::{self, NewVersion};
use crate::db::{audit, DbError};
use crate::domain::audit::{Action, Origin};
use crate::domain::scope::ScopeRules;
use crate::error::{ApiError, ApiResult};

/// How often a node looks for a version to prepare or leftovers to remove, besides being woken.
const POLL: Duration = Duration::from_secs(2);
/// How long the scan first waits before reading again from a record an unfinished commit holds (a
/// group commit takes milliseconds), and at most.
const HELD_RECORD_RETRY: Duration = Duration::from_millis(5);
const HELD_RECORD_RETRY_MAX: Duration = Duration::from_secs(1);
/// Catch-up rounds stop and the switch takes the rest (under the change-log lock) once a round
/// finds fewer changed records than this.
const SWITCH_BELOW: i64 = 1_000;

/// What went wrong inside the actor; the handle maps it to an HTTP error once.
#[derive(Debug, thiserror::Error)]
pub enum ScopeError {
    #[error(transparent)]
    Db(#[from] DbError),
    #[error("no database connection: {0}")]
    Pool(#[from] deadpool_postgres::PoolError),
}

impl From<ScopeError> for ApiError {
    fn from(e: ScopeError) -> Self {
        match e {
            ScopeError::Db(e) => e.into(),
            ScopeError::Pool(e) => e.into(),
        }
    }
}

/// Store a new version of the set (`None`: back to no set) to be prepared.
#[derive(Message)]
#[rtype(result = "Result<NewVersion, ScopeError>")]
pub struct Replace {
    pub rules: Option<ScopeRules>,
    pub origin: Origin,
}

#[derive(Clone)]
pub struct ScopeSetsHandle(pub(super) Addr<ScopeSets>);

impl ScopeSetsHandle {
    pub async fn replace(&self, rules: Option<ScopeRules>, origin: Origin) -> ApiResult<NewVersion> {
        let answer = self.0.send(Replace { rules, origin }).await;
        let stored =
            answer.map_err(|source| ApiError::internal(super::NoAnswer { actor: "scope sets", source }))?;
        Ok(stored?)
    }
}

pub struct ScopeSets {
    pool: Pool,
    node: String,
    clock: Clock,
    wake: Arc<Notify>,
    /// The preparer, stopped with the server.
    tasks: crate::shutdown::Tasks,
}

impl ScopeSets {
    pub fn new(pool: Pool, node: &str, clock: Clock, tasks: crate::shutdown::Tasks) -> Self {
        ScopeSets { pool, node: node.to_owned(), clock, wake: Arc::new(Notify::new()), tasks }
    }
}

impl Actor for ScopeSets {
    type Context = Context<Self>;

    fn started(&mut self, _: &mut Context<Self>) {
        let preparer =
            Preparer { pool: self.pool.clone(), node: self.node.clone(), clock: self.clock.clone() };
        let wake = self.wake.clone();
        self.tasks.spawn(async move { preparer.run(wake).await });
    }
}

impl Handler<Replace> for ScopeSets {
    type Result = ResponseFuture<Result<NewVersion, ScopeError>>;

    fn handle(&mut self, msg: Replace, _: &mut Context<Self>) -> Self::Result {
        let pool = self.pool.clone();
        let wake = self.wake.clone();
        let now = self.clock.now();
        Box::pin(async move {
            let mut db = pool.get().await?;
            let tx = db.transaction().await.map_err(DbError::from)?;
            let actor = msg.origin.actor.clone().unwrap_or_default();
            let new = scope::create_version(&tx, msg.rules.as_ref(), &actor, now).await?;
            if new.version > 0 {
                let details = serde_json::json!({
                    "from_version": new.previous_active,
                    "to_version": new.version,
                    "replaced_preparing_version": new.replaced,
                    "rules": msg.rules.as_ref().map(ScopeRules::to_json),
                });
                audit::append(&tx, &msg.origin.entry(Action::ScopeSetChanged, None, details)).await?;
            }
            tx.commit().await.map_err(DbError::from)?;
            wake.notify_one();
            Ok(new)
        })
    }
}

/// The preparation loop of this node.
struct Preparer {
    pool: Pool,
    node: String,
    clock: Clock,
}

impl Preparer {
    async fn run(self, wake: Arc<Notify>) {
        loop {
            tokio::select! {
                _ = wake.notified() => {}
                _ = tokio::time::sleep(POLL) => {}
            }
            if let Err(e) = self.prepare_if_due().await {
                tracing::warn!(error = %e, "preparing the scope set failed; retrying");
                continue;
            }
            if let Err(e) = self.collect_leftovers().await {
                tracing::warn!(error = %e, "removing scope leftovers failed");
            }
        }
    }

    async fn prepare_if_due(&self) -> Result<(), ScopeError> {
        let mut db = self.pool.get().await?;
        let Some(version) = scope::state(&db).await?.preparing_version else { return Ok(()) };
        let locked: bool = db
            .query_one("SELECT pg_try_advisory_lock($1)", &[&PREPARATION_LOCK])
            .await
            .map_err(DbError::from)?
            .get(0);
        if !locked {
            return Ok(());
        }
        let result = self
            .prepare(&mut db, version)
            .instrument(tracing::info_span!("scope_preparation", version))
            .await;
        db.execute("SELECT pg_advisory_unlock($1)", &[&PREPARATION_LOCK]).await.map_err(DbError::from)?;
        result
    }

    async fn prepare(&self, db: &mut Object, version: i64) -> Result<(), ScopeError> {
        let Some(set) = scope::set_version(&*db, version).await? else { return Ok(()) };
        if set.state != "preparing" {
            return Ok(());
        }
        let state = scope::state(&*db).await?;
        let active = scope::rules_of(&*db, state.active_version).await?;
        let plan = Plan::new(&set, active.as_deref())?;
        prepare::begin(&*db, version).await?;
        tracing::info!(version, "preparing the scope set");
        let mut statistics = prepare::Statistics::default();
        let mut held_wait = HELD_RECORD_RETRY;
        while let Some(batch) = prepare::read_batch(&*db, &plan).await? {
            statistics.refresh_after(&*db, batch.records_read()).await?;
            for (after, chunk) in batch.chunks() {
                let tx = db.transaction().await.map_err(DbError::from)?;
                match prepare::write_chunk(&tx, &plan, chunk, after).await? {
                    ChunkWrite::Written(n) => {
                        tx.commit().await.map_err(DbError::from)?;
                        held_wait = HELD_RECORD_RETRY;
                        if n < chunk.len() {
                            break;
                        }
                        tokio::task::yield_now().await;
                    }
                    ChunkWrite::Held => {
                        tx.rollback().await.map_err(DbError::from)?;
                        // Read again once the commit holding the record has finished, waiting
                        // longer each time it has not (a lock held for long is no commit).
                        tokio::time::sleep(held_wait).await;
                        held_wait = (held_wait * 2).min(HELD_RECORD_RETRY_MAX);
                        break;
                    }
                    ChunkWrite::Moved => {
                        tx.rollback().await.map_err(DbError::from)?;
                        break;
                    }
                }
            }
        }
        loop {
            let tx = db.transaction().await.map_err(DbError::from)?;
            let changed = prepare::catch_up(&tx, &plan, Some(prepare::BATCH * 10)).await?;
            tx.commit().await.map_err(DbError::from)?;
            if changed < SWITCH_BELOW {
                break;
            }
        }
        let tx = db.transaction().await.map_err(DbError::from)?;
        let switched = prepare::switch(&tx, &plan, self.clock.now()).await?;
        if let Some(s) = &switched {
            let details = serde_json::json!({
                "from_version": s.previous, "to_version": s.version, "redelivered": s.redelivered,
                "users_affected": s.users_affected, "block_base": s.base,
            });
            audit::append(&tx, &Origin::server(&self.node).entry(Action::ScopeSetActivated, None, details))
                .await?;
        }
        tx.commit().await.map_err(DbError::from)?;
        if let Some(s) = switched {
            tracing::info!(
                version = s.version,
                redelivered = s.redelivered,
                users = s.users_affected,
                "scope set in force"
            );
        }
        Ok(())
    }

    async fn collect_leftovers(&self) -> Result<(), ScopeError> {
        let mut db = self.pool.get().await?;
        loop {
            let tx = db.transaction().await.map_err(DbError::from)?;
            let removed = scope::gc::collect(&tx).await?;
            tx.commit().await.map_err(DbError::from)?;
            if removed == 0 {
                return Ok(());
            }
            tokio::task::yield_now().await;
        }
    }
}
