//! The app factory, used by `main` and by the tests: database, migrations, bootstrap, actors,
//! then the HTTP listener (docs/api.md §2, "Startup order").

use std::net::TcpListener;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

use actix_web::dev::Server;
use actix_web::middleware::{from_fn, NormalizePath, TrailingSlash};
use actix_web::{web, App, HttpServer};
use anyhow::Context;
use secrecy::{ExposeSecret, SecretSlice};

use crate::auth::rate_limit::LoginLimiter;
use crate::auth::AuthService;
use crate::clock::Clock;
use crate::config::{Config, DatabaseConfig};
use crate::db;
use crate::db::embedded::{EmbeddedPostgres, StartedCluster};
use crate::db::supervision::Supervisor;
use crate::domain::audit::{Action, Origin};
use crate::domain::role::Role;
use crate::domain::user::{DEFAULT_ADMIN_PASSWORD, DEFAULT_ADMIN_USERNAME};
use crate::http;
use crate::shutdown::{InFlight, Signals, Tasks, CLOSE_DEADLINE, DRAIN_DEADLINE, TASKS_DEADLINE};
use crate::state::AppState;

/// The database name inside the embedded cluster.
const EMBEDDED_DB_NAME: &str = "synkronus";

pub struct Application {
    port: u16,
    server: Server,
    /// The embedded cluster, supervised while the server runs (docs/api.md §18.4).
    embedded: Option<Supervisor>,
    state: AppState,
    /// The METRICS_PORT listener and its port.
    metrics: Option<(Server, u16)>,
    /// The server's background tasks, stopped after the listener.
    tasks: Tasks,
    /// The requests being answered, drained before the listener closes.
    in_flight: InFlight,
}

/// `/metrics` alone, without authentication, on its own port (docs/api.md §14).
fn metrics_server(config: &Config, port: u16, state: web::Data<AppState>) -> anyhow::Result<(Server, u16)> {
    let listener = TcpListener::bind((config.bind_address, port))
        .with_context(|| format!("METRICS_PORT: cannot listen on {}:{port}", config.bind_address))?;
    let port = listener.local_addr()?.port();
    let server = HttpServer::new(move || {
        App::new()
            .app_data(state.clone())
            .route("/metrics", http::routing::get().to(http::metrics::exposition))
    })
    .workers(1)
    .disable_signals()
    .listen(listener)?
    .run();
    tracing::info!(port, "metrics listening");
    Ok((server, port))
}

/// The embedded cluster of this configuration (not started), or the `DB_CONNECTION` string.
fn database_target(config: &Config) -> anyhow::Result<Result<EmbeddedPostgres, String>> {
    match &config.database {
        DatabaseConfig::External(conn) => Ok(Err(conn.expose_secret().to_string())),
        DatabaseConfig::Embedded { pg_run_as, pg_bin_dir } => {
            let pg = EmbeddedPostgres::new(config.data_root.join("postgres"), pg_bin_dir.clone(), pg_run_as)?;
            std::fs::create_dir_all(&config.data_root)
                .with_context(|| format!("DATA_ROOT: cannot create {}", config.data_root.display()))?;
            Ok(Ok(pg))
        }
    }
}

/// Runs a one-off command on the configured database, given its connection string: the embedded
/// cluster is started first if it is not running, and stopped afterwards if this call started it,
/// whether `command` succeeded, failed or panicked.
pub async fn with_database<T>(
    config: &Config,
    command: impl AsyncFnOnce(&str) -> anyhow::Result<T>,
) -> anyhow::Result<T> {
    let (conn, started) = match database_target(config)? {
        Err(conn) => (conn, StartedCluster::none()),
        Ok(pg) => {
            let started = pg.start_for_command().await?;
            // `started` stops the cluster if this fails.
            pg.ensure_database(EMBEDDED_DB_NAME).await?;
            (pg.connection_string(EMBEDDED_DB_NAME), started)
        }
    };
    let result = command(&conn).await;
    let stopped = started.stop().await;
    let value = result?;
    stopped?;
    Ok(value)
}

/// [`with_database`] for commands that work on the current schema: connected (with retries) and
/// migrated first.
pub async fn with_migrated_database<T>(
    config: &Config,
    command: impl AsyncFnOnce(&deadpool_postgres::Pool) -> anyhow::Result<T>,
) -> anyhow::Result<T> {
    with_database(config, async |conn: &str| {
        let pool = connect_migrate(config, conn).await?;
        command(&pool).await
    })
    .await
}

/// For the server: the embedded cluster is started (or adopted) and supervised.
async fn server_database_connection(config: &Config) -> anyhow::Result<(String, Option<Supervisor>)> {
    match database_target(config)? {
        Err(conn) => Ok((conn, None)),
        Ok(pg) => {
            let supervisor = Supervisor::start(pg.clone()).await?;
            match pg.ensure_database(EMBEDDED_DB_NAME).await {
                Ok(()) => Ok((pg.connection_string(EMBEDDED_DB_NAME), Some(supervisor))),
                Err(error) => {
                    stop_after_failed_start(Some(supervisor)).await;
                    Err(error)
                }
            }
        }
    }
}

/// A server that cannot start stops the cluster it supervises before it exits, as it does when
/// it stops: nobody else would.
async fn stop_after_failed_start(embedded: Option<Supervisor>) {
    if let Some(supervisor) = embedded {
        if let Err(error) = supervisor.shutdown().await {
            tracing::error!(
                error = format!("{error:#}"),
                "the embedded PostgreSQL cluster could not be stopped"
            );
        }
    }
}

async fn connect_migrate(config: &Config, conn: &str) -> anyhow::Result<deadpool_postgres::Pool> {
    let pool = db::create_pool(conn, config.request_connections().others)?;
    db::wait_until_reachable(&pool).await?;
    db::migrate(&pool).await.context("migrations failed")?;
    Ok(pool)
}

impl Application {
    pub async fn build(config: Config) -> anyhow::Result<Self> {
        let config = Arc::new(config);
        // Before anything starts: without a key (DB_CONNECTION and no JWT_SECRET) nothing should.
        let (key, key_source) = config.signing_key()?;
        key_source.log();
        let (conn, embedded) = server_database_connection(&config).await?;
        match Self::build_on(config, &key, &conn).await {
            Ok(app) => Ok(Application { embedded, ..app }),
            Err(error) => {
                stop_after_failed_start(embedded).await;
                Err(error)
            }
        }
    }

    /// Everything after the database is up: migrations, bootstrap, actors, listeners.
    async fn build_on(config: Arc<Config>, key: &SecretSlice<u8>, conn: &str) -> anyhow::Result<Self> {
        let pool = connect_migrate(&config, conn).await?;
        let clock = Clock::default();
        let auth = Arc::new(AuthService::from_config(&config, key.expose_secret(), clock.clone())?);
        bootstrap_admin(&config, &pool, &auth, &config.node_id).await?;
        check_data_root(&config)?;
        let storage = Arc::new(crate::storage::Storage::open(&config.storage())?);
        storage.check_at_start().await?;
        let replicas: Vec<String> =
            config.db_read_replicas.iter().map(|r| r.expose_secret().to_string()).collect();
        let reads = crate::db::replicas::ReadRouter::new(
            (pool.clone(), db::create_sync_pool(conn, config.request_connections().sync)?),
            &replicas,
            (config.request_connections().others, config.request_connections().sync),
            config.export_max_concurrent,
            config.replica_max_wait,
            config.replica_max_lag,
        )?;
        let tasks = Tasks::default();
        let actors = crate::actors::start(&config, &pool, conn, &reads, &clock, &storage, &tasks).await?;
        let login_limiter = Arc::new(LoginLimiter::new(config.rate_limit_login_per_min, pool.clone()));
        login_limiter.spawn_sweeper(&tasks);
        crate::memory::spawn_purge_tick(&tasks);

        let state = AppState {
            config: config.clone(),
            pool,
            reads,
            scoped_readers: Arc::default(),
            auth,
            login_limiter,
            user_limiter: Arc::new(crate::auth::user_rate::UserLimiter::new(
                config.rate_limit_per_user_per_sec,
                clock.clone(),
            )),
            started_at: Instant::now(),
            ready: Arc::new(AtomicBool::new(true)),
            actors,
            storage,
            schemas: Arc::new(crate::schema_check::SchemaCache::default()),
            clock,
            body_budget: crate::http::body_budget::BodyBudget::new(config.max_inflight_body_bytes),
        };

        let listener = TcpListener::bind((config.bind_address, config.port))
            .with_context(|| format!("cannot listen on {}:{}", config.bind_address, config.port))?;
        let port = listener.local_addr()?.port();
        let app_state = web::Data::new(state.clone());
        let in_flight = InFlight::default();
        let counted = web::Data::new(in_flight.clone());
        let cors_origins = config.cors_allowed_origins.clone();
        let server = HttpServer::new(move || {
            App::new()
                .app_data(app_state.clone())
                .app_data(counted.clone())
                .configure(http::configure)
                .default_service(web::to(http::routing::not_found))
                .wrap(from_fn(http::metrics::record))
                .wrap(http::cors::cors(&cors_origins))
                .wrap(NormalizePath::new(TrailingSlash::Trim))
                .wrap(from_fn(http::context::request_context))
                .wrap(from_fn(crate::shutdown::count_in_flight))
        })
        // A streamed answer (a pull page, an export) is written a chunk at a time; with Nagle's
        // algorithm each chunk's last, short segment waited for the client's delayed ACK of the
        // previous one: 40 ms per pull page on a kept-alive connection.
        .tcp_nodelay(true)
        .listen(listener)?
        // Signals are handled by `run_until_stopped`, which drains before it stops the listener.
        .disable_signals()
        .shutdown_timeout(CLOSE_DEADLINE.as_secs())
        .run();
        tracing::info!(port, "listening");
        record_start(&state).await?;
        crate::monitoring::handle();
        let metrics = match config.metrics_port {
            Some(metrics_port) => Some(metrics_server(&config, metrics_port, web::Data::new(state.clone()))?),
            None => None,
        };
        Ok(Application { port, server, embedded: None, state, metrics, tasks, in_flight })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The METRICS_PORT listener's actual port (differs from the setting when that was 0).
    pub fn metrics_port(&self) -> Option<u16> {
        self.metrics.as_ref().map(|(_, port)| *port)
    }

    pub fn state(&self) -> &AppState {
        &self.state
    }

    /// A handle that stops the server gracefully (used by tests and signal handling).
    pub fn handle(&self) -> actix_web::dev::ServerHandle {
        self.server.handle()
    }

    /// Serves until SIGTERM or SIGINT, then stops in order (docs/operations.md, "Stopping"):
    /// `/ready` answers 503 at once while the requests in flight are answered (new ones too, for
    /// at most [`DRAIN_DEADLINE`]); the listener closes; the background tasks stop (at most
    /// [`TASKS_DEADLINE`]); the embedded cluster stops last. A second signal skips the wait.
    pub async fn run_until_stopped(self) -> anyhow::Result<()> {
        let Application { server, embedded, state, metrics, tasks, in_flight, .. } = self;
        let mut signals = Signals::listen()?;
        let metrics = metrics.map(|(server, _)| {
            let handle = server.handle();
            actix_web::rt::spawn(server);
            handle
        });
        let handle = server.handle();
        let mut serving = actix_web::rt::spawn(server);
        let served = tokio::select! {
            served = &mut serving => served,
            signal = signals.next() => {
                drain(&state, &in_flight, &handle, signal, &mut signals).await;
                serving.await
            }
        };
        if let Some(handle) = metrics {
            handle.stop(true).await;
        }
        if !tasks.stop(TASKS_DEADLINE).await {
            tracing::warn!(
                tasks = tasks.running(),
                "background tasks did not stop within {} s; exiting anyway",
                TASKS_DEADLINE.as_secs()
            );
        }
        // A cluster adopted from a crashed run is ours too: nobody else will stop it.
        if let Some(supervisor) = embedded {
            supervisor.shutdown().await?;
        }
        tracing::info!("stopped");
        served.context("the HTTP server task failed")?.map_err(Into::into)
    }
}

/// From the signal until the listener is closed: not ready, the requests in flight answered,
/// then a graceful stop of the listener.
async fn drain(
    state: &AppState,
    in_flight: &InFlight,
    handle: &actix_web::dev::ServerHandle,
    signal: &str,
    signals: &mut Signals,
) {
    state.ready.store(false, std::sync::atomic::Ordering::Release);
    tracing::info!(
        signal,
        in_flight = in_flight.count(),
        "stopping: /ready answers 503, answering the requests in flight"
    );
    tokio::select! {
        drained = in_flight.drained(DRAIN_DEADLINE) => {
            if !drained {
                tracing::warn!(
                    in_flight = in_flight.count(),
                    "requests still in flight after {} s; closing the listener",
                    DRAIN_DEADLINE.as_secs()
                );
            }
            handle.stop(true).await;
        }
        signal = signals.next() => {
            tracing::warn!(signal, in_flight = in_flight.count(), "stopping now, without waiting for the requests in flight");
            handle.stop(false).await;
        }
    }
}

/// The audit log's `server.start` entry: version, node and the configuration without secrets.
async fn record_start(state: &AppState) -> anyhow::Result<()> {
    let details = serde_json::json!({
        "version": env!("CARGO_PKG_VERSION"),
        "commit": env!("SYNKRONUS_GIT_COMMIT"),
        "config": state.config.without_secrets(),
    });
    let entry = Origin::server(&state.config.node_id).entry(Action::ServerStarted, None, details);
    db::audit::append(&state.pool.get().await?, &entry).await.context("cannot write the audit log")?;
    Ok(())
}

/// Creates the initial admin when the user table is empty, and warns while the default password
/// works: here, once per start, and nowhere else (the portal tells that admin on every page).
async fn bootstrap_admin(
    config: &Config,
    pool: &deadpool_postgres::Pool,
    auth: &AuthService,
    node: &str,
) -> anyhow::Result<()> {
    let mut db = pool.get().await?;
    let users = db::users::count(&db).await?;
    let mut created = false;
    if users == 0 {
        let hash = auth.hash_password(config.admin_password.expose_secret().to_string()).await?;
        let origin = Origin::server(node);
        match db::users::create(&mut db, &config.admin_username, None, &hash, Role::Admin, &origin).await {
            Ok(_) => {
                created = true;
                // Known without a bcrypt run: the hash was just made from the configured password.
                let is_default = config.admin_password.expose_secret() == DEFAULT_ADMIN_PASSWORD;
                auth.remember_default_password(&hash, is_default);
                tracing::info!(username = %config.admin_username, "created the initial admin")
            }
            // Another process bootstrapped at the same moment.
            Err(db::DbError::Conflict(db::Conflict::UsernameTaken(_))) => {}
            Err(e) => return Err(anyhow::Error::new(e).context("cannot create the initial admin")),
        }
    }
    let default_works = if created {
        config.uses_default_admin_password()
    } else {
        match db::users::find_by_username(&db, DEFAULT_ADMIN_USERNAME).await? {
            Some(admin) => auth.is_default_password(&admin.password_hash).await.unwrap_or(false),
            None => false,
        }
    };
    if default_works {
        tracing::warn!("SECURITY: the 'admin' account still has the default password 'admin'; change it now");
    }
    Ok(())
}

fn check_data_root(config: &Config) -> anyhow::Result<()> {
    for dir in [&config.data_root, &config.app_bundle_path, &config.attachments_path] {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("DATA_ROOT: cannot create {}", dir.display()))?;
    }
    let probe = config.data_root.join(".write-probe");
    std::fs::write(&probe, b"ok")
        .with_context(|| format!("DATA_ROOT: {} is not writable", config.data_root.display()))?;
    let _ = std::fs::remove_file(probe);
    Ok(())
}
