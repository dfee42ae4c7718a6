//! The server supervises its embedded PostgreSQL cluster (docs/api.md §18.4): when the postmaster
//! exits while the server runs (a crash, `SIGKILL`, the OOM killer), it is started again after
//! 1, 2, 4 … at most 30 s. Meanwhile requests get 503 and `/health` says `"database": "down"`
//! (the pool fails fast); once the postmaster is back, PostgreSQL's crash recovery has replayed
//! every committed transaction and the pool reconnects by itself.

use std::time::Duration;

use anyhow::{anyhow, Context};
use tokio::process::Child;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::embedded::{EmbeddedPostgres, ServerClaim};

/// The first restart waits this long; each failed attempt doubles it, up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// A postmaster that ran this long before dying was healthy: the next restart starts at 1 s again.
const STABLE_AFTER: Duration = Duration::from_secs(60);
/// How long a starting postmaster (crash recovery included) may take to accept connections.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How often a postmaster that is not our child (adopted from an earlier run) is checked.
const ADOPTED_POLL: Duration = Duration::from_millis(500);

/// The running postmaster: our child, or one found running at start (left by a server that was
/// killed), which we can only watch by its pid.
enum Postmaster {
    Child(Child),
    Adopted(i32),
}

impl Postmaster {
    /// Resolves when the postmaster has exited (reaping it when it is our child).
    async fn exited(&mut self, cluster: &EmbeddedPostgres) -> String {
        match self {
            Postmaster::Child(child) => match child.wait().await {
                Ok(status) => status.to_string(),
                Err(e) => format!("cannot wait for it: {e}"),
            },
            Postmaster::Adopted(pid) => loop {
                tokio::time::sleep(ADOPTED_POLL).await;
                if cluster.postmaster_pid() != Some(*pid) {
                    return format!("pid {pid} is gone");
                }
            },
        }
    }
}

/// Owns the supervision task; [`Supervisor::shutdown`] stops the cluster for good.
pub struct Supervisor {
    stop: watch::Sender<bool>,
    task: JoinHandle<anyhow::Result<()>>,
    /// Released once the cluster is stopped (or with the process).
    claim: ServerClaim,
}

impl Supervisor {
    /// Creates the cluster on first use, starts it (or adopts the one already running), waits
    /// until it accepts connections, then watches it.
    pub async fn start(cluster: EmbeddedPostgres) -> anyhow::Result<Supervisor> {
        let claim = cluster.claim_for_server()?;
        let preparer = cluster.clone();
        tokio::task::spawn_blocking(move || preparer.prepare()).await??;
        let postmaster = match cluster.postmaster_pid() {
            Some(pid) => {
                tracing::info!(pid, "adopting the embedded PostgreSQL cluster already running");
                let mut adopted = Postmaster::Adopted(pid);
                wait_ready(&cluster, &mut adopted).await?;
                adopted
            }
            None => start_postmaster(&cluster).await?,
        };
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(supervise(cluster, postmaster, stopped));
        Ok(Supervisor { stop, task, claim })
    }

    /// Stops supervising, then stops the cluster (fast shutdown: open transactions roll back,
    /// committed data is safe).
    pub async fn shutdown(self) -> anyhow::Result<()> {
        let _ = self.stop.send(true);
        let stopped = self.task.await.context("the supervision task failed")?;
        drop(self.claim);
        stopped
    }
}

async fn supervise(
    cluster: EmbeddedPostgres,
    mut postmaster: Postmaster,
    mut stopped: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let mut backoff = FIRST_BACKOFF;
    loop {
        let up_since = Instant::now();
        // A dropped `Supervisor` counts as a stop request, so the cluster never outlives its owner.
        let exit = tokio::select! {
            status = postmaster.exited(&cluster) => Some(status),
            _ = stopped.wait_for(|stop| *stop) => None,
        };
        let Some(status) = exit else { return stop_cluster(&cluster, postmaster).await };
        if up_since.elapsed() >= STABLE_AFTER {
            backoff = FIRST_BACKOFF;
        }
        tracing::error!(%status, "the embedded PostgreSQL postmaster exited; starting it again");
        postmaster = loop {
            tracing::warn!(retry_in_s = backoff.as_secs(), "embedded PostgreSQL is down");
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = stopped.wait_for(|stop| *stop) => return Ok(()),
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
            match start_postmaster(&cluster).await {
                Ok(started) => break started,
                Err(error) => {
                    tracing::error!(error = format!("{error:#}"), "embedded PostgreSQL did not start")
                }
            }
        };
        tracing::info!("embedded PostgreSQL is running again");
    }
}

/// Spawns the postmaster as our child and waits until it accepts connections.
async fn start_postmaster(cluster: &EmbeddedPostgres) -> anyhow::Result<Postmaster> {
    let child = cluster.postmaster_command()?.spawn().context("cannot run postgres")?;
    let mut postmaster = Postmaster::Child(child);
    if let Err(error) = wait_ready(cluster, &mut postmaster).await {
        // A postmaster that never became ready must not linger: stop it before the next attempt.
        if let Postmaster::Child(child) = &mut postmaster {
            let _ = child.kill().await;
        }
        return Err(error);
    }
    Ok(postmaster)
}

/// Polls with real connections until one succeeds (crash recovery may take a while), failing
/// early when our child exits.
async fn wait_ready(cluster: &EmbeddedPostgres, postmaster: &mut Postmaster) -> anyhow::Result<()> {
    let deadline = Instant::now() + READY_TIMEOUT;
    let conn = cluster.connection_string("postgres");
    loop {
        if let Postmaster::Child(child) = postmaster {
            if let Some(status) = child.try_wait()? {
                return Err(anyhow!(
                    "embedded PostgreSQL exited during start-up ({status}): {}",
                    cluster.log_tail(5)
                ));
            }
        }
        let attempt = tokio::time::timeout(
            Duration::from_secs(2),
            tokio_postgres::connect(&conn, tokio_postgres::NoTls),
        )
        .await;
        if let Ok(Ok((client, connection))) = attempt {
            let driver = tokio::spawn(connection);
            let answered = client.simple_query("SELECT 1").await.is_ok();
            drop(client);
            let _ = driver.await;
            if answered {
                return Ok(());
            }
        }
        if Instant::now() >= deadline {
            return Err(anyhow!(
                "embedded PostgreSQL did not accept connections within {} s: {}",
                READY_TIMEOUT.as_secs(),
                cluster.log_tail(5)
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn stop_cluster(cluster: &EmbeddedPostgres, postmaster: Postmaster) -> anyhow::Result<()> {
    tracing::info!("stopping the embedded PostgreSQL cluster");
    let stopper = cluster.clone();
    tokio::task::spawn_blocking(move || stopper.stop()).await??;
    if let Postmaster::Child(mut child) = postmaster {
        child.wait().await?;
    }
    Ok(())
}
