//! Command line: `serve` (default), `migrate`, and operator commands that work with the server stopped
//! (users, statistics, the import of a Go Synkronus deployment). Each command reads only the
//! configuration it needs: `backup --verify` none (it checks a copy kept where the server's
//! environment is not set), `healthcheck` the listen address, the others all of it.

use std::time::Duration;

use clap::{Parser, Subcommand};

use crate::config::{Config, ConfigError};
use crate::domain::audit::{Action, Origin};
use crate::domain::role::Role;
use crate::startup::{with_migrated_database, Application};
use crate::storage::ops::StorageCommand;

/// `synkronus --version`: the release and the commit it was built from, as `GET /version` reports.
const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("SYNKRONUS_GIT_COMMIT"), ")");

#[derive(Parser)]
#[command(name = "synkronus", version = VERSION, about = "Offline-first sync server (Synkronus-compatible)")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Subcommand)]
pub enum Command {
    /// Run the HTTP server (the default).
    Serve,
    /// Apply database migrations and exit.
    Migrate,
    /// Manage users directly in the database.
    #[command(subcommand)]
    User(UserCommand),
    /// Statistics kept for `GET /stats/observations` and `GET /status`.
    #[command(subcommand)]
    Stats(StatsCommand),
    /// File storage: copy to another STORAGE_URL, remove orphaned files (docs/storage.md).
    #[command(subcommand)]
    Storage(StorageCommand),
    /// Write a backup archive (safe while the server runs), or check one with --verify.
    Backup {
        #[arg(long, required_unless_present = "verify", conflicts_with = "verify")]
        output: Option<std::path::PathBuf>,
        #[arg(long)]
        verify: Option<std::path::PathBuf>,
    },
    /// Restore a backup archive into an empty database and storage (stop the server first).
    Restore {
        #[arg(long)]
        input: std::path::PathBuf,
        /// Replace whatever the target holds.
        #[arg(long)]
        force: bool,
    },
    /// Take over another server's data.
    #[command(subcommand)]
    Import(ImportCommand),
    /// Exit 0 when the server on this machine (PORT, BIND_ADDRESS) answers GET /health with 200,
    /// else 1: a container's HEALTHCHECK, without curl.
    Healthcheck,
}

/// `/health` answers within 2 s by itself (its database and storage probes are bounded so).
const HEALTHCHECK_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Subcommand)]
pub enum ImportCommand {
    /// Import a Go Synkronus deployment (database, attachments, bundle versions) into this
    /// server's empty database; devices keep their cursors and users their passwords.
    GoSynkronus(crate::import::GoSynkronusArgs),
}

#[derive(Subcommand)]
pub enum StatsCommand {
    /// Count the statistics again from the rows: after rows were changed with SQL by hand (the
    /// server keeps them exact itself). Safe while the server runs.
    Recount,
}

#[derive(Subcommand)]
pub enum UserCommand {
    /// Create a user.
    Create {
        #[arg(long)]
        username: String,
        #[arg(long, env = "SYNKRONUS_NEW_PASSWORD", hide_env_values = true)]
        password: String,
        #[arg(long, default_value = "read-write")]
        role: String,
        #[arg(long)]
        email: Option<String>,
    },
    /// Set a user's password (revokes their tokens).
    ResetPassword {
        #[arg(long)]
        username: String,
        #[arg(long, env = "SYNKRONUS_NEW_PASSWORD", hide_env_values = true)]
        password: String,
    },
    /// Replace a user's attributes, which scope rules compare record fields with (docs/api.md
    /// §20.1): a JSON object of name → array of strings, `{}` for none. Audited; the user's next
    /// sync follows, as after `PUT /users/{username}`.
    SetAttributes {
        #[arg(long)]
        username: String,
        /// For example '{"district": ["north", "east"]}'.
        #[arg(long)]
        attributes: String,
    },
}

/// Runs the command line; returns the process's exit status: 0, 1 when the command failed, 2
/// when the configuration is invalid.
pub async fn run(cli: Cli) -> i32 {
    let command = match cli.command.unwrap_or(Command::Serve) {
        Command::Healthcheck => return healthcheck().await,
        // Without --output, clap has required --verify.
        Command::Backup { output: None, verify } => {
            return exit_status(crate::backup::verify::run(&verify.unwrap_or_default()).await)
        }
        command => command,
    };
    let config = match Config::from_env() {
        Ok(config) => config,
        Err(e) => return invalid_configuration(&e),
    };
    let telemetry = crate::telemetry::init(&config);
    let result = with_config(command, config).await;
    // Sends the spans still queued for the collector before the process ends.
    drop(telemetry);
    exit_status(result)
}

fn invalid_configuration(error: &ConfigError) -> i32 {
    eprintln!("synkronus: invalid configuration: {error}");
    2
}

fn exit_status(result: anyhow::Result<()>) -> i32 {
    match result {
        Ok(()) => 0,
        Err(e) => match e.downcast_ref::<ConfigError>() {
            // Found once the command knew what it needed (the signing key of `serve`).
            Some(error) => invalid_configuration(error),
            None => {
                eprintln!("synkronus: {e:#}");
                1
            }
        },
    }
}

async fn with_config(command: Command, config: Config) -> anyhow::Result<()> {
    match command {
        Command::Serve => Application::build(config).await?.run_until_stopped().await,
        Command::Migrate => {
            with_migrated_database(&config, async |_| Ok(())).await?;
            println!("migrations applied");
            Ok(())
        }
        Command::Stats(StatsCommand::Recount) => {
            let counted = with_migrated_database(&config, async |pool| recount(pool).await).await?;
            println!("counted {counted} observations");
            Ok(())
        }
        Command::Backup { output: Some(output), .. } => crate::backup::create::run(&config, &output).await,
        Command::Restore { input, force } => crate::backup::restore::run(&config, &input, force).await,
        Command::Import(ImportCommand::GoSynkronus(args)) => crate::import::run(&config, args).await,
        Command::Storage(StorageCommand::Copy { to }) => crate::storage::ops::copy(&config, &to).await,
        Command::Storage(StorageCommand::Gc) => {
            with_migrated_database(&config, async |pool| crate::storage::ops::gc(&config, pool).await).await
        }
        Command::User(cmd) => {
            with_migrated_database(&config, async |pool| user_command(cmd, &config, pool).await).await
        }
        // Run before the configuration is read.
        Command::Healthcheck | Command::Backup { output: None, .. } => Ok(()),
    }
}

/// `GET /health` on this machine's server; a line on stderr says why it is not healthy.
async fn healthcheck() -> i32 {
    let address = match crate::config::probe_address(crate::config::environment()) {
        Ok(address) => address,
        Err(e) => {
            eprintln!("synkronus healthcheck: invalid configuration: {e}");
            return 1;
        }
    };
    let url = format!("http://{address}/health");
    // A proxy from the environment would probe some other machine.
    let client = match reqwest::Client::builder().timeout(HEALTHCHECK_TIMEOUT).no_proxy().build() {
        Ok(client) => client,
        Err(e) => {
            eprintln!("synkronus healthcheck: {e}");
            return 1;
        }
    };
    match client.get(&url).send().await {
        Ok(res) if res.status() == reqwest::StatusCode::OK => 0,
        Ok(res) => {
            eprintln!("synkronus healthcheck: {url} answered {}", res.status());
            1
        }
        Err(e) => {
            eprintln!("synkronus healthcheck: {url}: {e}");
            1
        }
    }
}

/// Under the change-log lock, so that no commit runs between the count and its storing.
async fn recount(pool: &deadpool_postgres::Pool) -> anyhow::Result<i64> {
    let mut db = pool.get().await?;
    let tx = db.transaction().await?;
    crate::db::records::lock_change_log(&tx).await?;
    let counted = crate::db::stats::recount(&tx).await?;
    tx.commit().await?;
    Ok(counted)
}

async fn user_command(
    cmd: UserCommand,
    config: &Config,
    pool: &deadpool_postgres::Pool,
) -> anyhow::Result<()> {
    use crate::db::users;
    use crate::domain::user as rules;
    // An operator at the console: the server itself, as far as the audit log can tell.
    let origin = Origin::server(&config.node_id);
    match cmd {
        UserCommand::Create { username, password, role, email } => {
            rules::validate_username(&username).map_err(|p| anyhow::anyhow!(p.0))?;
            let role = Role::parse(&role).ok_or_else(|| anyhow::anyhow!("unknown role '{role}'"))?;
            if !rules::is_strong_enough(&password) {
                anyhow::bail!("password must be 8 to 72 bytes long");
            }
            let hash = crate::auth::hash_password(password, config.password_hash_cost).await?;
            let mut db = pool.get().await?;
            users::create(&mut db, &username, email.as_deref(), &hash, role, &origin).await?;
            println!("created user '{username}' ({role})");
        }
        UserCommand::ResetPassword { username, password } => {
            if !rules::is_strong_enough(&password) {
                anyhow::bail!("password must be 8 to 72 bytes long");
            }
            let mut db = pool.get().await?;
            let user = users::find_by_username(&db, &username)
                .await?
                .ok_or_else(|| anyhow::anyhow!("no user named '{username}'"))?;
            let hash = crate::auth::hash_password(password, config.password_hash_cost).await?;
            let entry =
                origin.entry(Action::PasswordReset, Some(&username), serde_json::json!({"via": "cli"}));
            users::set_password(&mut db, user.id, &hash, &entry).await?;
            println!("password of '{username}' reset; their tokens are revoked");
        }
        UserCommand::SetAttributes { username, attributes } => {
            let attributes = parse_attributes(&attributes)?;
            let change = users::UserUpdate {
                role: None,
                email: None,
                password_hash: None,
                attributes: Some(attributes),
            };
            let mut db = pool.get().await?;
            let user = users::update(&mut db, &username, change, &origin)
                .await?
                .ok_or_else(|| anyhow::anyhow!("no user named '{username}'"))?;
            println!("attributes of '{username}' set to {}", user.attributes);
        }
    }
    Ok(())
}

/// `--attributes` as `PUT /users/{username}` checks them, every problem on a line of its own.
fn parse_attributes(raw: &str) -> anyhow::Result<crate::domain::scope::UserAttributes> {
    let json: serde_json::Value =
        serde_json::from_str(raw).map_err(|e| anyhow::anyhow!("--attributes is not valid JSON: {e}"))?;
    crate::domain::scope::UserAttributes::parse(&json).map_err(|problems| {
        let lines: Vec<String> = problems.iter().map(|p| format!("\n  {}: {}", p.path, p.message)).collect();
        anyhow::anyhow!("--attributes has {} problem(s):{}", problems.len(), lines.concat())
    })
}
