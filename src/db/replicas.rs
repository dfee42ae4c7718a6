//! Read scaling over PostgreSQL hot-standby replicas (docs/api.md §18.3): a pool per replica,
//! round robin among the healthy ones, a background checker, and monotonic reads.
//!
//! Every routed read returns the change head it saw in the same statement (and so the same
//! snapshot) as its rows. A replica whose head is below the cursor the client sent is polled for
//! up to `REPLICA_MAX_WAIT_MS`; then the primary answers. Because the change head is a row the
//! commit that allocated the change_ids writes, a replica that shows head `h` shows every change
//! at or below `h` (P1 holds on the replica as it holds on the primary), so the cursor check is
//! the only thing a replica adds to the no-skip argument.
//!
//! Every read also reflects its reader's own acknowledged writes (read your writes): the reader's
//! write mark (src/db/marks.rs) is read from the primary together with the primary's head while
//! the replica runs the read, and raises the cursor; the reader's other writes (users, bundles,
//! a reset) must show in the replica's copy of the mark before it may answer.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use dashmap::DashMap;
use deadpool_postgres::{Object, Pool};
use tokio::time::Instant;

use super::marks::{self, PrimaryView};
use crate::db::DbResult;

/// A replica out of rotation is probed again after this long (docs/api.md §18.3).
const RECHECK_DOWN: Duration = Duration::from_secs(5);
/// Healthy replicas are probed this often, so lag is noticed well within `REPLICA_MAX_LAG_SECONDS`.
const RECHECK_UP: Duration = Duration::from_secs(1);
/// How often a read waiting for a replica to reach its cursor asks for the replica's head.
const POLL: Duration = Duration::from_millis(10);
/// A probe that takes longer than this counts as unreachable.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// Which database answered a read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    Primary,
    Replica,
}

impl Target {
    pub fn as_str(self) -> &'static str {
        match self {
            Target::Primary => "primary",
            Target::Replica => "replica",
        }
    }
}

/// A read's result and where it came from.
pub struct Served<T> {
    pub value: T,
    pub by: Target,
}

/// The work of one read, run on whichever connection the router picks (possibly more than once).
pub type ReadFuture<'a, T> = Pin<Box<dyn Future<Output = DbResult<T>> + 'a>>;

/// What the checker last saw of a replica.
#[derive(Debug, Clone, PartialEq)]
pub enum ReplicaState {
    /// Not probed yet.
    Starting,
    Healthy,
    /// Replay further behind than `REPLICA_MAX_LAG_SECONDS`.
    Lagging,
    Unreachable,
}

impl ReplicaState {
    pub fn as_str(&self) -> &'static str {
        match self {
            ReplicaState::Starting => "starting",
            ReplicaState::Healthy => "healthy",
            ReplicaState::Lagging => "lagging",
            ReplicaState::Unreachable => "unreachable",
        }
    }
}

/// One replica's state for `/health`.
#[derive(Debug, Clone)]
pub struct ReplicaReport {
    pub name: String,
    pub state: ReplicaState,
    pub lag_seconds: Option<f64>,
    pub replay_lsn: Option<String>,
}

struct Replica {
    /// Host, port and database of the connection string: never its password.
    name: String,
    /// For requests other than sync reads (`DB_POOL_SIZE`, shared out by
    /// `Config::request_connections`).
    pool: Pool,
    /// For sync reads (`crate::db::create_sync_pool`).
    sync_pool: Pool,
    /// For exports (`EXPORT_MAX_CONCURRENT`): an export holds its connection for minutes, and must
    /// not take one requests are waiting for.
    export_pool: Pool,
    in_rotation: AtomicBool,
    last: Mutex<ReplicaReport>,
    /// Per user, the count of other writes (src/db/marks.rs) this replica has been seen to show.
    /// Replay only moves forward, so what it showed once it shows to every later snapshot: a
    /// user's reads check the replica's copy of their mark once per write, not once per read.
    writes_seen: DashMap<String, i64>,
}

/// Whose connections a routed read uses.
#[derive(Clone, Copy)]
enum Lane {
    Requests,
    Sync,
    Exports,
}

impl Replica {
    fn pool(&self, lane: Lane) -> &Pool {
        match lane {
            Lane::Requests => &self.pool,
            Lane::Sync => &self.sync_pool,
            Lane::Exports => &self.export_pool,
        }
    }

    fn report(&self) -> ReplicaReport {
        self.last.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn set(&self, state: ReplicaState, lag_seconds: Option<f64>, replay_lsn: Option<String>) {
        let healthy = state == ReplicaState::Healthy;
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if last.state != state {
            tracing::info!(replica = %self.name, from = last.state.as_str(), to = state.as_str(), lag_seconds,
                "read replica state changed");
        }
        *last = ReplicaReport { name: self.name.clone(), state, lag_seconds, replay_lsn };
        drop(last);
        self.in_rotation.store(healthy, Ordering::Release);
        crate::monitoring::replica_state(&self.name, healthy, lag_seconds);
    }

    fn shows_writes(&self, username: &str, writes: i64) -> bool {
        writes == 0 || self.writes_seen.get(username).is_some_and(|seen| *seen >= writes)
    }

    fn saw_writes(&self, username: &str, writes: i64) {
        if writes > 0 {
            let mut seen = self.writes_seen.entry(username.to_owned()).or_default();
            *seen = (*seen).max(writes);
        }
    }

    /// Taken out of rotation at once when a request finds it broken; the checker brings it back.
    fn mark_unreachable(&self) {
        let lsn = self.report().replay_lsn;
        self.set(ReplicaState::Unreachable, None, lsn);
    }
}

/// Routes reads to the primary or a replica. One per process: requests and exports share the
/// replicas' health (one checker), each with connections of its own.
pub struct ReadRouter {
    primary: Pool,
    primary_sync: Pool,
    replicas: Vec<Replica>,
    next: AtomicUsize,
    max_wait: Duration,
    max_lag: Duration,
}

/// The `host:port/dbname` of a connection string, for logs, metrics and `/health`.
fn display_name(conn: &str) -> String {
    let Ok(config) = crate::db::parse_connection(conn) else { return "replica".into() };
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        Some(tokio_postgres::config::Host::Unix(p)) => p.display().to_string(),
        None => "localhost".into(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    format!("{host}:{port}/{}", config.get_dbname().unwrap_or(""))
}

impl ReadRouter {
    /// Pools are created lazily: an unreachable replica does not delay start-up. Each replica gets
    /// `pool_size` connections for requests other than sync reads, `sync_pool_size` for those and
    /// `export_pool_size` for exports.
    pub fn new(
        (primary, primary_sync): (Pool, Pool),
        replica_conns: &[String],
        (pool_size, sync_pool_size): (usize, usize),
        export_pool_size: usize,
        max_wait: Duration,
        max_lag: Duration,
    ) -> anyhow::Result<Arc<Self>> {
        let replicas = replica_conns
            .iter()
            .map(|conn| {
                let name = display_name(conn);
                let report = ReplicaReport {
                    name: name.clone(),
                    state: ReplicaState::Starting,
                    lag_seconds: None,
                    replay_lsn: None,
                };
                Ok(Replica {
                    name,
                    pool: crate::db::create_pool(conn, pool_size)?,
                    sync_pool: crate::db::create_sync_pool(conn, sync_pool_size)?,
                    export_pool: crate::db::create_pool(conn, export_pool_size)?,
                    in_rotation: AtomicBool::new(false),
                    last: Mutex::new(report),
                    writes_seen: DashMap::new(),
                })
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let router = Arc::new(ReadRouter {
            primary,
            primary_sync,
            replicas,
            next: AtomicUsize::new(0),
            max_wait,
            max_lag,
        });
        if !router.replicas.is_empty() {
            spawn_checker(Arc::downgrade(&router));
        }
        Ok(router)
    }

    /// Each replica's last known state, in configuration order (empty without replicas).
    pub fn reports(&self) -> Vec<ReplicaReport> {
        self.replicas.iter().map(Replica::report).collect()
    }

    /// The next healthy replica in round-robin order.
    fn pick(&self) -> Option<&Replica> {
        let n = self.replicas.len();
        if n == 0 {
            return None;
        }
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        (0..n).map(|i| &self.replicas[(start + i) % n]).find(|r| r.in_rotation.load(Ordering::Acquire))
    }

    /// Runs `run` for `reader` on a healthy replica, or on the primary. The answer's change head
    /// (`position`) is at least `min(floor, primary head)`, where the floor is the highest of
    /// `cursor` and the reader's own newest change-numbered write, and a replica answers only once
    /// it shows the reader's other writes too: a replica behind that is waited for up to
    /// `REPLICA_MAX_WAIT_MS`, then the primary answers. A replica failing is retried once on the
    /// primary; only the primary's own failure reaches the caller.
    pub async fn read<'a, T>(
        &self,
        reader: &str,
        cursor: Option<i64>,
        position: impl Fn(&T) -> i64,
        run: impl Fn(Object) -> ReadFuture<'a, T>,
    ) -> DbResult<Served<T>> {
        self.routed(Lane::Requests, &self.primary, reader, cursor, &position, &run).await
    }

    /// [`ReadRouter::read`] for a read every device sync makes (a pull page, an attachment
    /// manifest), on connections that plan generically (`crate::db::create_sync_pool`).
    pub async fn read_for_sync<'a, T>(
        &self,
        reader: &str,
        cursor: Option<i64>,
        position: impl Fn(&T) -> i64,
        run: impl Fn(Object) -> ReadFuture<'a, T>,
    ) -> DbResult<Served<T>> {
        self.routed(Lane::Sync, &self.primary_sync, reader, cursor, &position, &run).await
    }

    async fn routed<'a, T>(
        &self,
        lane: Lane,
        primary: &Pool,
        reader: &str,
        cursor: Option<i64>,
        position: &impl Fn(&T) -> i64,
        run: &impl Fn(Object) -> ReadFuture<'a, T>,
    ) -> DbResult<Served<T>> {
        if let Some(value) = self.on_some_replica(lane, reader, cursor, position, run).await {
            return Ok(Served { value, by: Target::Replica });
        }
        let value = run(connection(lane, primary).await?).await?;
        crate::monitoring::db_read(Target::Primary.as_str());
        Ok(Served { value, by: Target::Primary })
    }

    /// A connection for an export by `reader`, which takes its own snapshot afterwards: from a
    /// replica whose change head has reached `cursor` and the reader's own writes (replay only
    /// moves forward, so the snapshot will show at least that), else from `primary`, the exports'
    /// own pool.
    pub async fn export_connection(
        &self,
        reader: &str,
        cursor: i64,
        primary: &Pool,
    ) -> DbResult<(Object, Target)> {
        let served = self
            .routed(Lane::Exports, primary, reader, Some(cursor), &|(_, head): &(Object, i64)| *head, &|db| {
                Box::pin(async move {
                    let head = super::records::head(&db).await?;
                    Ok((db, head))
                })
            })
            .await?;
        Ok((served.value.0, served.by))
    }

    /// `None`: no replica in rotation, or the chosen one failed or stayed behind.
    async fn on_some_replica<'a, T>(
        &self,
        lane: Lane,
        reader: &str,
        cursor: Option<i64>,
        position: &impl Fn(&T) -> i64,
        run: &impl Fn(Object) -> ReadFuture<'a, T>,
    ) -> Option<T> {
        let replica = self.pick()?;
        match self.on_replica(lane, replica, reader, cursor, position, run).await {
            Ok(Some(value)) => {
                crate::monitoring::db_read(Target::Replica.as_str());
                Some(value)
            }
            Ok(None) => {
                crate::monitoring::db_read_fallback("behind");
                None
            }
            Err(ReplicaError::Primary(e)) => {
                // Without the reader's mark no replica may answer; the primary's own answer (or
                // its error) is the request's.
                tracing::debug!(error = %e, "the primary did not give the reader's write mark");
                crate::monitoring::db_read_fallback("behind");
                None
            }
            Err(ReplicaError::Replica(e)) => {
                tracing::warn!(replica = %replica.name, error = %e, "read replica failed; retrying on the primary");
                if e.is_unavailable() {
                    replica.mark_unreachable();
                }
                crate::monitoring::db_read_fallback("error");
                None
            }
        }
    }

    /// `Ok(None)`: the replica did not reach the floor in time.
    async fn on_replica<'a, T>(
        &self,
        lane: Lane,
        replica: &Replica,
        reader: &str,
        cursor: Option<i64>,
        position: &impl Fn(&T) -> i64,
        run: &impl Fn(Object) -> ReadFuture<'a, T>,
    ) -> Result<Option<T>, ReplicaError> {
        let deadline = Instant::now() + self.max_wait;
        let pool = replica.pool(lane);
        // The primary's head and the reader's mark while the replica answers: the lookup is one
        // index probe, and waiting for it costs the read nothing.
        let view = async {
            let db = super::drivers::get_near(&self.primary).await?;
            marks::primary_view(&db, reader).await
        };
        let first = async { run(connection(lane, pool).await?).await };
        let (view, first) = tokio::join!(view, first);
        let PrimaryView { head: primary_head, mark } = view.map_err(ReplicaError::Primary)?;
        let value = first.map_err(ReplicaError::Replica)?;
        let floor = match (cursor, mark.change_id) {
            (None, 0) => None,
            (cursor, mark) => Some(cursor.unwrap_or(0).max(mark)),
        };
        // A floor above the primary's head (P6, e.g. after a database restore) can never be
        // reached: the replica need only show what the primary would.
        let target = floor.map(|f| f.min(primary_head));
        let reached = |value: &T| target.is_none_or(|t| position(value) >= t);
        if replica.shows_writes(reader, mark.writes) && reached(&value) {
            return Ok(Some(value));
        }
        // Wait until the replica shows the target head and the reader's other writes; the read
        // then runs again, on a snapshot taken after that.
        loop {
            let db = pool.get().await.map_err(|e| ReplicaError::Replica(e.into()))?;
            let (head, writes) = marks::replica_progress(&db, reader).await.map_err(ReplicaError::Replica)?;
            drop(db);
            if target.is_none_or(|t| head >= t) && writes >= mark.writes {
                replica.saw_writes(reader, writes);
                break;
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            tokio::time::sleep(POLL.min(deadline - now)).await;
        }
        let value = run(connection(lane, pool).await.map_err(ReplicaError::Replica)?)
            .await
            .map_err(ReplicaError::Replica)?;
        Ok(reached(&value).then_some(value))
    }

    /// One probe of one replica: reachable, replaying, and how far behind.
    async fn check(&self, replica: &Replica) {
        let probe = async {
            let db = replica.pool.get().await?;
            super::status::replica_position(&db).await
        };
        match tokio::time::timeout(PROBE_TIMEOUT, probe).await {
            Ok(Ok(pos)) => {
                let lag = pos.lag_seconds.max(0.0);
                let state = if lag > self.max_lag.as_secs_f64() {
                    ReplicaState::Lagging
                } else {
                    ReplicaState::Healthy
                };
                replica.set(state, Some(lag), pos.replay_lsn);
            }
            Ok(Err(e)) => {
                tracing::debug!(replica = %replica.name, error = %e, "read replica probe failed");
                replica.mark_unreachable();
            }
            Err(_) => replica.mark_unreachable(),
        }
    }
}

/// Why a read left its replica: the reader's mark could not be read from the primary, or the
/// replica failed.
enum ReplicaError {
    Primary(super::DbError),
    Replica(super::DbError),
}

/// A connection of `pool` for a read in `lane`. A request's is preferably one that its own thread
/// drives (see `db::drivers`): a pull page's rows then reach its encoder without crossing threads.
async fn connection(lane: Lane, pool: &Pool) -> DbResult<Object> {
    Ok(match lane {
        Lane::Requests | Lane::Sync => super::drivers::get_near(pool).await?,
        Lane::Exports => pool.get().await?,
    })
}

/// Probes every replica in the background: healthy ones every second, the others every 5 s.
/// Stops when the router is dropped.
fn spawn_checker(router: Weak<ReadRouter>) {
    tokio::spawn(async move {
        let mut last_checked: Vec<Option<Instant>> = Vec::new();
        loop {
            let Some(router) = router.upgrade() else { return };
            last_checked.resize(router.replicas.len(), None);
            for (i, replica) in router.replicas.iter().enumerate() {
                let every =
                    if replica.in_rotation.load(Ordering::Acquire) { RECHECK_UP } else { RECHECK_DOWN };
                let due = match last_checked[i] {
                    None => true,
                    Some(at) => at.elapsed() >= every,
                };
                if due {
                    router.check(replica).await;
                    last_checked[i] = Some(Instant::now());
                }
            }
            drop(router);
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    });
}
