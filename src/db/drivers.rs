//! Which thread drives each pooled connection, so that work reading many rows from one runs there.
//!
//! A tokio-postgres connection is a task of the runtime that opened it (an HTTP worker, or the
//! main thread for what start-up and the actors opened), and the rows it reads reach the client
//! through a channel. Read from another thread, every few kilobytes of rows cost a cross-thread
//! wake-up on each side: a third of the server's CPU in an initial sync went to them
//! (docs/benchmarks-history.md, "Pull pages streamed"). A reader spawned beside the connection gets its rows
//! without one.

use std::sync::{Arc, LazyLock, Weak};
use std::thread::ThreadId;

use dashmap::DashMap;
use deadpool_postgres::{ClientWrapper, Object, StatementCache};
use tokio::runtime::Handle;

/// The runtime that drives a connection, keyed by the address of the connection's statement
/// cache: one per connection, alive exactly as long as it. An address reused by a later
/// connection is overwritten when that connection is recorded.
struct Driver {
    runtime: Handle,
    thread: ThreadId,
    connection: Weak<StatementCache>,
}

static DRIVERS: LazyLock<DashMap<usize, Driver>> = LazyLock::new(DashMap::new);

fn key(cache: &Arc<StatementCache>) -> usize {
    Arc::as_ptr(cache) as usize
}

/// Records that `client`, just opened, is driven by the current runtime and thread: the pool's
/// `post_create` hook, which runs in the task that opened the connection and spawned its driver.
pub(super) fn record(client: &ClientWrapper) {
    let Ok(runtime) = Handle::try_current() else { return };
    DRIVERS.retain(|_, d| d.connection.strong_count() > 0);
    let driver = Driver {
        runtime,
        thread: std::thread::current().id(),
        connection: Arc::downgrade(&client.statement_cache),
    };
    DRIVERS.insert(key(&client.statement_cache), driver);
}

/// Spawns `job(db)` on the runtime that drives `db`'s connection, or on the current one when
/// that is it or is not known.
pub fn spawn_beside<F>(db: Object, job: impl FnOnce(Object) -> F)
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    let elsewhere = DRIVERS
        .get(&key(&db.statement_cache))
        .filter(|d| d.thread != std::thread::current().id())
        .map(|d| d.runtime.clone());
    match elsewhere {
        Some(runtime) => drop(runtime.spawn(job(db))),
        None => drop(tokio::spawn(job(db))),
    }
}

/// Whether `db`'s connection is driven by the current thread.
fn is_local(db: &Object) -> bool {
    DRIVERS.get(&key(&db.statement_cache)).is_some_and(|d| d.thread == std::thread::current().id())
}

/// A connection from `pool`, preferably one driven by the current thread. Every idle connection
/// is looked at (taking one does no I/O: the pool only checks that it is open); when none is this
/// thread's and the pool has room, the next one is opened here, and is found the next time. The
/// others go back to the pool.
pub async fn get_near(pool: &deadpool_postgres::Pool) -> Result<Object, deadpool_postgres::PoolError> {
    let first = pool.get().await?;
    if is_local(&first) {
        return Ok(first);
    }
    let no_wait = deadpool_postgres::Timeouts { wait: Some(std::time::Duration::ZERO), ..pool.timeouts() };
    let mut others = Vec::new();
    while let Ok(next) = pool.timeout_get(&no_wait).await {
        if is_local(&next) {
            return Ok(next);
        }
        others.push(next);
    }
    Ok(first)
}
