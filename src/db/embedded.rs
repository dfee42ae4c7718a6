//! The embedded default database: a private PostgreSQL cluster under `DATA_ROOT/postgres`, run
//! with the system's binaries, reachable only through a Unix socket inside the data root.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use anyhow::{anyhow, bail, Context};

/// The cluster superuser the server connects as (trust auth over the private socket).
const SUPERUSER: &str = "synkronus";
/// Unix socket paths are limited to 107 bytes; beyond this we move the socket to /tmp.
const MAX_SOCKET_DIR_LEN: usize = 90;
/// What a new cluster gets besides PostgreSQL's defaults. A push storm or a scope set's
/// preparation writes 30-40 MB of WAL a second, so with the default 1 GB between checkpoints they
/// came every 5-19 s (PostgreSQL logged "checkpoints are occurring too frequently" 56 times in a
/// 10M run), and after each one the next write of every page logs the page whole again. With
/// 4 GB the push p99 during a preparation at 10M was 146-150 ms against 175-226
/// (docs/benchmarks-history.md, "Scoped sync's cost: eleventh measurement"); pg_wal may grow to
/// about that size.
const CLUSTER_SETTINGS: &str = "
# Set by synkronus when it created this cluster (docs/operations.md, \"The embedded database's
# settings\"); ALTER SYSTEM overrides it.
max_wal_size = 4GB
";

#[derive(Debug, Clone)]
pub struct EmbeddedPostgres {
    data_dir: PathBuf,
    socket_dir: PathBuf,
    bin_dir: PathBuf,
    /// Set when we run as root: PostgreSQL refuses to run as root, so it runs as this user.
    run_as: Option<(nix::unistd::Uid, nix::unistd::Gid)>,
    extra_settings: Vec<String>,
}

impl EmbeddedPostgres {
    /// Finds the binaries and decides who runs the cluster; does not start anything yet.
    pub fn new(data_dir: PathBuf, bin_dir: Option<PathBuf>, run_as: &str) -> anyhow::Result<Self> {
        let bin_dir = match bin_dir {
            Some(dir) => dir,
            None => find_bin_dir().ok_or_else(|| {
                anyhow!(
                    "no PostgreSQL binaries (initdb, pg_ctl) found on PATH or under /usr/lib/postgresql; \
                     install them (apt-get install postgresql) or set DB_CONNECTION"
                )
            })?,
        };
        for tool in ["initdb", "pg_ctl", "postgres"] {
            if !bin_dir.join(tool).is_file() {
                bail!("PG_BIN_DIR: {} has no {tool}", bin_dir.display());
            }
        }
        let run_as = if nix::unistd::geteuid().is_root() {
            let user =
                nix::unistd::User::from_name(run_as).context("PG_RUN_AS: cannot look up user")?.ok_or_else(
                    || anyhow!("PG_RUN_AS: no system user named '{run_as}' (PostgreSQL cannot run as root)"),
                )?;
            Some((user.uid, user.gid))
        } else {
            None
        };
        let socket_dir = if data_dir.as_os_str().len() > MAX_SOCKET_DIR_LEN {
            let digest = sha2_hex(data_dir.to_string_lossy().as_bytes());
            PathBuf::from(format!("/tmp/synkronus-pg-{}", &digest[..12]))
        } else {
            data_dir.clone()
        };
        Ok(EmbeddedPostgres { data_dir, socket_dir, bin_dir, run_as, extra_settings: Vec::new() })
    }

    /// Adds a `-c name=value` server setting (tests trade durability for speed with these).
    pub fn with_setting(mut self, setting: &str) -> Self {
        self.extra_settings.push(setting.to_string());
        self
    }

    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// Where the PostgreSQL binaries were found (tests run `pg_basebackup` from there).
    pub fn bin_dir(&self) -> &Path {
        &self.bin_dir
    }

    /// A libpq connection string for a database of this cluster.
    pub fn connection_string(&self, dbname: &str) -> String {
        format!("host={} user={SUPERUSER} dbname={dbname}", self.socket_dir.display())
    }

    /// Makes this process the cluster's only server until the claim is dropped (or the process
    /// exits, however it exits). A second `synkronus serve` on the same data root would otherwise
    /// adopt the running cluster as if it had been left by a dead server, then stop it when its
    /// own start failed (its port taken, say), under the server that was using it.
    pub fn claim_for_server(&self) -> anyhow::Result<ServerClaim> {
        let path = self.data_dir.with_extension("lock");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .with_context(|| format!("DATA_ROOT: cannot open {}", path.display()))?;
        match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) {
            Ok(lock) => Ok(ServerClaim { _lock: lock }),
            Err((_, nix::errno::Errno::EWOULDBLOCK)) => bail!(
                "DATA_ROOT {} is in use by another synkronus server on this machine: its embedded database \
                 serves one server at a time (stop that one, or give this one another DATA_ROOT; several \
                 nodes share a database through DB_CONNECTION: docs/deploy.md)",
                self.data_dir.parent().unwrap_or(&self.data_dir).display()
            ),
            Err((_, errno)) => Err(anyhow!("DATA_ROOT: cannot lock {}: {errno}", path.display())),
        }
    }

    /// Creates the cluster on first use, then starts it unless it is already running (for example
    /// left over by a server that was killed). A stale pid file is handled by PostgreSQL itself.
    /// Returns true when this call started it.
    pub fn start(&self) -> anyhow::Result<bool> {
        self.prepare()?;
        if self.is_running() {
            return Ok(false);
        }
        let mut options = format!("-c listen_addresses='' -k {}", self.socket_dir.display());
        for s in &self.extra_settings {
            options.push_str(&format!(" -c {s}"));
        }
        let log = self.data_dir.join("server.log");
        let out = self.run(
            self.pg_ctl()
                .arg("start")
                .arg("-w")
                .arg("-t")
                .arg("60")
                .arg("-D")
                .arg(&self.data_dir)
                .arg("-l")
                .arg(&log)
                .arg("-o")
                .arg(options),
        )?;
        if !out.status.success() && !self.is_running() {
            bail!(
                "embedded PostgreSQL failed to start: {} {}",
                String::from_utf8_lossy(&out.stderr).trim(),
                self.log_tail(5)
            );
        }
        Ok(true)
    }

    /// For a one-off command: starts the cluster unless it runs already (a server owns it then),
    /// and returns the guard that stops it when this process started it.
    pub async fn start_for_command(&self) -> anyhow::Result<StartedCluster> {
        let starter = self.clone();
        let started_here = tokio::task::spawn_blocking(move || starter.start()).await??;
        Ok(StartedCluster { cluster: started_here.then(|| self.clone()) })
    }

    /// Fast shutdown: open transactions roll back, committed data is safe.
    pub fn stop(&self) -> anyhow::Result<()> {
        if !self.is_running() {
            return Ok(());
        }
        let out = self
            .run(self.pg_ctl().arg("stop").arg("-w").arg("-m").arg("fast").arg("-D").arg(&self.data_dir))?;
        if !out.status.success() {
            bail!("embedded PostgreSQL did not stop: {}", String::from_utf8_lossy(&out.stderr).trim());
        }
        Ok(())
    }

    /// Immediate shutdown, as after a power cut: used by crash tests.
    pub fn kill(&self) -> anyhow::Result<()> {
        self.run(
            self.pg_ctl().arg("stop").arg("-w").arg("-m").arg("immediate").arg("-D").arg(&self.data_dir),
        )?;
        Ok(())
    }

    pub fn is_running(&self) -> bool {
        self.run(self.pg_ctl().arg("status").arg("-D").arg(&self.data_dir))
            .map(|o| o.status.success())
            .unwrap_or(false)
    }

    /// Creates the cluster on first use and the socket folder; starts nothing.
    pub fn prepare(&self) -> anyhow::Result<()> {
        if !self.data_dir.join("PG_VERSION").is_file() {
            self.init()?;
        }
        self.prepare_socket_dir()
    }

    /// The postmaster run directly rather than through `pg_ctl` (which detaches it), so that the
    /// server is its parent: it learns at once when the postmaster dies, reaps it, and starts it
    /// again (docs/api.md §18.4). It gets a process group of its own, so a Ctrl-C meant for the
    /// server does not stop the database under requests still draining.
    pub fn postmaster_command(&self) -> anyhow::Result<tokio::process::Command> {
        let log_path = self.data_dir.join("server.log");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .with_context(|| format!("cannot open {}", log_path.display()))?;
        let mut cmd = tokio::process::Command::new(self.bin_dir.join("postgres"));
        cmd.arg("-D").arg(&self.data_dir).arg("-c").arg("listen_addresses=").arg("-k").arg(&self.socket_dir);
        for s in &self.extra_settings {
            cmd.arg("-c").arg(s);
        }
        cmd.current_dir("/")
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .env_remove("PGDATA")
            .env_remove("PGHOST")
            .env_remove("PGPORT")
            .process_group(0)
            .kill_on_drop(false);
        if let Some((uid, gid)) = self.run_as {
            cmd.uid(uid.as_raw()).gid(gid.as_raw());
        }
        Ok(cmd)
    }

    /// The pid of the running postmaster, from its lock file; `None` when none is alive.
    pub fn postmaster_pid(&self) -> Option<i32> {
        let text = std::fs::read_to_string(self.data_dir.join("postmaster.pid")).ok()?;
        let pid: i32 = text.lines().next()?.trim().parse().ok()?;
        (pid > 0 && process_exists(pid)).then_some(pid)
    }

    /// The last lines of the cluster's log, for error messages.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(self.data_dir.join("server.log")).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(lines).collect();
        tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
    }

    fn init(&self) -> anyhow::Result<()> {
        std::fs::create_dir_all(&self.data_dir)
            .with_context(|| format!("cannot create {}", self.data_dir.display()))?;
        std::fs::set_permissions(&self.data_dir, std::fs::Permissions::from_mode(0o700))?;
        self.give_to_cluster_user(&self.data_dir)?;
        let out = self.run(
            Command::new(self.bin_dir.join("initdb"))
                .arg("-D")
                .arg(&self.data_dir)
                .arg("-U")
                .arg(SUPERUSER)
                .arg("-A")
                .arg("trust")
                .arg("-E")
                .arg("UTF8")
                .arg("--locale=C"),
        )?;
        if !out.status.success() {
            bail!(
                "initdb failed for {} (the directory and its parents must be reachable by the cluster user): {}",
                self.data_dir.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        // In postgresql.conf, not on the command line: `ALTER SYSTEM` (postgresql.auto.conf)
        // overrides it, as docs/operations.md tells operators to change a setting.
        let conf = self.data_dir.join("postgresql.conf");
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(&conf)
            .with_context(|| format!("cannot open {}", conf.display()))?;
        std::io::Write::write_all(&mut file, CLUSTER_SETTINGS.as_bytes())
            .with_context(|| format!("cannot write {}", conf.display()))?;
        Ok(())
    }

    fn prepare_socket_dir(&self) -> anyhow::Result<()> {
        if self.socket_dir != self.data_dir {
            std::fs::create_dir_all(&self.socket_dir)?;
            std::fs::set_permissions(&self.socket_dir, std::fs::Permissions::from_mode(0o700))?;
            self.give_to_cluster_user(&self.socket_dir)?;
        }
        Ok(())
    }

    fn give_to_cluster_user(&self, path: &Path) -> anyhow::Result<()> {
        if let Some((uid, gid)) = self.run_as {
            nix::unistd::chown(path, Some(uid), Some(gid))
                .with_context(|| format!("cannot hand {} to the PG_RUN_AS user", path.display()))?;
        }
        Ok(())
    }

    fn pg_ctl(&self) -> Command {
        Command::new(self.bin_dir.join("pg_ctl"))
    }

    fn run(&self, cmd: &mut Command) -> anyhow::Result<Output> {
        // The cluster user may not be able to enter our working directory.
        cmd.current_dir("/");
        if let Some((uid, gid)) = self.run_as {
            cmd.uid(uid.as_raw()).gid(gid.as_raw());
        }
        cmd.env_remove("PGDATA").env_remove("PGHOST").env_remove("PGPORT");
        cmd.output().with_context(|| format!("cannot run {:?}", cmd.get_program()))
    }
}

/// Held by the server that runs the embedded cluster, for as long as it runs
/// ([`EmbeddedPostgres::claim_for_server`]). The lock file is opened close-on-exec, so the
/// postmaster the server starts does not inherit it and keep it past the server's death.
pub struct ServerClaim {
    _lock: nix::fcntl::Flock<std::fs::File>,
}

/// The embedded cluster as a one-off command holds it: stopped by [`StartedCluster::stop`] when
/// the command is done, or, on a path that never gets there (an early error return, a panic, a
/// cancelled future), when dropped. Holds nothing when the cluster was running already.
#[must_use = "the cluster is stopped when the guard is dropped"]
pub struct StartedCluster {
    cluster: Option<EmbeddedPostgres>,
}

impl StartedCluster {
    /// Nothing to stop: the database is not one this process started.
    pub fn none() -> Self {
        StartedCluster { cluster: None }
    }

    pub async fn stop(mut self) -> anyhow::Result<()> {
        match self.cluster.take() {
            Some(cluster) => tokio::task::spawn_blocking(move || cluster.stop()).await?,
            None => Ok(()),
        }
    }
}

impl Drop for StartedCluster {
    fn drop(&mut self) {
        // Blocking, on whatever thread drops it: only a command that is ending gets here.
        if let Some(cluster) = self.cluster.take() {
            if let Err(error) = cluster.stop() {
                eprintln!("synkronus: the embedded database could not be stopped: {error:#}");
            }
        }
    }
}

fn find_bin_dir() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            if dir.join("initdb").is_file() && dir.join("pg_ctl").is_file() {
                // Debian links initdb into PATH; resolve to the real bin dir so pg_ctl finds postgres.
                let real = std::fs::canonicalize(dir.join("initdb")).ok();
                return Some(real.and_then(|p| p.parent().map(Path::to_path_buf)).unwrap_or(dir));
            }
        }
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let v: u32 = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").is_file().then_some((v, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin)
}

/// Signal 0 probes a pid; EPERM means it exists but belongs to another user (the cluster user).
fn process_exists(pid: i32) -> bool {
    match nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None) {
        Ok(()) => true,
        Err(e) => e == nix::errno::Errno::EPERM,
    }
}

fn sha2_hex(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(Sha256::digest(bytes))
}

impl EmbeddedPostgres {
    /// Creates the application database on first start (initdb only makes `postgres`).
    pub async fn ensure_database(&self, name: &str) -> anyhow::Result<()> {
        let (client, connection) =
            tokio_postgres::connect(&self.connection_string("postgres"), tokio_postgres::NoTls).await?;
        let driver = tokio::spawn(connection);
        let exists = client.query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&name]).await?;
        if exists.is_none() {
            let ident = name.replace('"', "\"\"");
            match client.batch_execute(&format!("CREATE DATABASE \"{ident}\"")).await {
                Ok(()) => {}
                // Another process created it at the same moment.
                Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::DUPLICATE_DATABASE) => {}
                Err(e) => return Err(e.into()),
            }
        }
        drop(client);
        let _ = driver.await;
        Ok(())
    }
}
