//! Read scaling over PostgreSQL hot-standby replicas (docs/api.md §18.3): a pool per replica,
//! round robin among the healthy ones, a background checker, and monotonic reads.
//!
//! Every routed read returns the change head it saw in the same statement (and so the same
//! snapshot) as its rows. A replica whose head is below the cursor the client sent is polled for
//! up to `REPLICA_MAX_WAIT_MS`; then the primary answers. Because the change head is a row the
//! commit that allocated the change_ids writes, a replica that shows head `h` shows every change
//! at or below `h` (P1 holds on the replica as it holds on the primary), so the cursor check is
//! the only thing a replica adds to the no-skip argument.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use deadpool_postgres::{Object, Pool};
use tokio::time::Instant;

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
    /// For requests (`DB_POOL_SIZE`).
    pool: Pool,
    /// For exports (`EXPORT_MAX_CONCURRENT`): an export holds its connection for minutes, and must
    /// not take one requests are waiting for.
    export_pool: Pool,
    in_rotation: AtomicBool,
    last: Mutex<ReplicaReport>,
}

/// Whose connections a routed read uses.
#[derive(Clone, Copy)]
enum Lane {
    Requests,
    Exports,
}

impl Replica {
    fn pool(&self, lane: Lane) -> &Pool {
        match lane {
            Lane::Requests => &self.pool,
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
    /// `pool_size` connections for requests and `export_pool_size` for exports.
    pub fn new(
        primary: Pool,
        replica_conns: &[String],
        pool_size: usize,
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
                    export_pool: crate::db::create_pool(conn, export_pool_size)?,
                    in_rotation: AtomicBool::new(false),
                    last: Mutex::new(report),
                })
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let router = Arc::new(ReadRouter { primary, replicas, next: AtomicUsize::new(0), max_wait, max_lag });
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

    /// Runs `run` on a healthy replica, or on the primary. With a `cursor`, the answer's change
    /// head (`position`) is at least `min(cursor, primary head)`: a replica behind that is waited
    /// for up to `REPLICA_MAX_WAIT_MS`, then the primary answers. A replica failing is retried once
    /// on the primary; only the primary's own failure reaches the caller.
    pub async fn read<'a, T>(
        &self,
        cursor: Option<i64>,
        position: impl Fn(&T) -> i64,
        run: impl Fn(Object) -> ReadFuture<'a, T>,
    ) -> DbResult<Served<T>> {
        self.routed(Lane::Requests, &self.primary, cursor, &position, &run).await
    }

    async fn routed<'a, T>(
        &self,
        lane: Lane,
        primary: &Pool,
        cursor: Option<i64>,
        position: &impl Fn(&T) -> i64,
        run: &impl Fn(Object) -> ReadFuture<'a, T>,
    ) -> DbResult<Served<T>> {
        if let Some(value) = self.on_some_replica(lane, cursor, position, run).await {
            return Ok(Served { value, by: Target::Replica });
        }
        let value = run(connection(lane, primary).await?).await?;
        crate::monitoring::db_read(Target::Primary.as_str());
        Ok(Served { value, by: Target::Primary })
    }

    /// A connection for an export, which takes its own snapshot afterwards: from a replica whose
    /// change head has reached `cursor` (replay only moves forward, so the snapshot will show at
    /// least that), else from `primary`, the exports' own pool.
    pub async fn export_connection(&self, cursor: i64, primary: &Pool) -> DbResult<(Object, Target)> {
        let served = self
            .routed(Lane::Exports, primary, Some(cursor), &|(_, head): &(Object, i64)| *head, &|db| {
                Box::pin(async move {
                    let head = super::records::head(&db).await?;
                    Ok((db, head))
                })
            })
            .await?;
        Ok((served.value.0, served.by))
    }

    /// `None`: no replica in rotation, or the chosen one failed or stayed behind the cursor.
    async fn on_some_replica<'a, T>(
        &self,
        lane: Lane,
        cursor: Option<i64>,
        position: &impl Fn(&T) -> i64,
        run: &impl Fn(Object) -> ReadFuture<'a, T>,
    ) -> Option<T> {
        let replica = self.pick()?;
        match self.on_replica(lane, replica.pool(lane), cursor, position, run).await {
            Ok(Some(value)) => {
                crate::monitoring::db_read(Target::Replica.as_str());
                Some(value)
            }
            Ok(None) => {
                crate::monitoring::db_read_fallback("behind");
                None
            }
            Err(e) => {
                tracing::warn!(replica = %replica.name, error = %e, "read replica failed; retrying on the primary");
                if e.is_unavailable() {
                    replica.mark_unreachable();
                }
                crate::monitoring::db_read_fallback("error");
                None
            }
        }
    }

    /// `Ok(None)`: the replica did not reach the cursor in time.
    async fn on_replica<'a, T>(
        &self,
        lane: Lane,
        replica: &Pool,
        cursor: Option<i64>,
        position: &impl Fn(&T) -> i64,
        run: &impl Fn(Object) -> ReadFuture<'a, T>,
    ) -> DbResult<Option<T>> {
        let deadline = Instant::now() + self.max_wait;
        let value = run(connection(lane, replica).await?).await?;
        let Some(cursor) = cursor else { return Ok(Some(value)) };
        if position(&value) >= cursor {
            return Ok(Some(value));
        }
        // A cursor above the primary's head (P6, e.g. after a database restore) can never be
        // reached: the replica need only show what the primary would.
        // The primary failing here is not the replica's fault: then the cursor alone decides.
        let primary_head: DbResult<i64> =
            async { super::records::head(&self.primary.get().await?).await }.await;
        let target = primary_head.map_or(cursor, |head| cursor.min(head));
        if position(&value) >= target {
            return Ok(Some(value));
        }
        loop {
            let now = Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            tokio::time::sleep(POLL.min(deadline - now)).await;
            if super::records::head(&replica.get().await?).await? >= target {
                break;
            }
        }
        let value = run(connection(lane, replica).await?).await?;
        Ok((position(&value) >= target).then_some(value))
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

/// A connection of `pool` for a read in `lane`. A request's is preferably one that its own thread
/// drives (see `db::drivers`): a pull page's rows then reach its encoder without crossing threads.
async fn connection(lane: Lane, pool: &Pool) -> DbResult<Object> {
    Ok(match lane {
        Lane::Requests => super::drivers::get_near(pool).await?,
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
