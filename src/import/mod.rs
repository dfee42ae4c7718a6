//! `synkronus import go-synkronus` (docs/api.md §19.2): takes over a Go Synkronus deployment's
//! database and folders so that devices carry on from the cursors and passwords they hold.
//!
//! The source is read in one `REPEATABLE READ` snapshot; the target is written in one
//! transaction (under the change-log and bundle locks), so a failure, or Ctrl-C, leaves it as it
//! was. Files are written before the commit (attachment blobs, bundle version folders) and
//! removed again when the import does not commit. Not a domain rule and not an actor: a one-off
//! operator command that drives `db::go_source`, `db::go_import` and the file stores in order.

mod bundles;
mod files;
mod report;
mod steps;

use std::path::PathBuf;

use anyhow::Context as _;

use crate::actors::attachment_store::BlobPaths;
use crate::config::Config;
use crate::db;
use crate::domain::go_import::base_head;
use report::{Progress, Report};
use steps::{Ctx, Done};

/// `synkronus import go-synkronus …`
#[derive(clap::Args, Debug, Clone)]
pub struct GoSynkronusArgs {
    /// The Go server's database (`postgres://…` URL or libpq `key=value` string); only read.
    #[arg(long = "source-db", env = "SYNKRONUS_IMPORT_SOURCE_DB", hide_env_values = true)]
    pub source_db: String,
    /// The Go server's attachment folder (one file per attachment id).
    #[arg(long)]
    pub attachments: Option<PathBuf>,
    /// The Go server's bundle versions folder (`app-bundle-versions/`, or `<data>/app-bundle/`).
    #[arg(long = "bundle-versions")]
    pub bundle_versions: Option<PathBuf>,
    /// Read everything and print the report; write nothing.
    #[arg(long = "dry-run")]
    pub dry_run: bool,
}

/// Runs the import into the configured target (the embedded cluster or `DB_CONNECTION`).
pub async fn run(config: &Config, args: GoSynkronusArgs) -> anyhow::Result<()> {
    crate::startup::with_database(config, async |conn| {
        let pool = db::create_pool(conn, 2)?;
        db::wait_until_reachable(&pool).await?;
        // A dry run writes nothing, not even the schema.
        if !args.dry_run {
            db::migrate(&pool).await.context("migrations failed")?;
        }
        import(config, &pool, &args).await
    })
    .await
}

async fn import(
    config: &Config,
    pool: &deadpool_postgres::Pool,
    args: &GoSynkronusArgs,
) -> anyhow::Result<()> {
    let mut source_client =
        db::go_source::connect(&args.source_db).await.context("cannot connect to the source database")?;
    let snapshot = db::go_source::snapshot(&mut source_client).await?;
    let facts = db::go_source::schema_facts(&snapshot).await?;
    let generation = facts.generation().map_err(anyhow::Error::msg)?;
    let (counter, repository_generation) = db::go_source::counter(&snapshot, &facts).await?;
    let counts = db::go_source::counts(&snapshot, &facts).await.context("counting the source")?;

    let mut report = Report::default();
    report.header.push(format!(
        "source: Go Synkronus, {generation} schema; counter {counter}, repository generation {repository_generation}"
    ));
    let (files, go_bundles) = folders(args, &counts, &mut report)?;
    let total_rows = counts.users + counts.observations + counts.attachments + counts.deleted_attachments;
    let progress = Progress::new(
        u64::try_from(total_rows + counts.presence).unwrap_or(0),
        files.sizes.len() as u64,
        files.total_bytes(),
    );

    let mut target_client = pool.get().await?;
    let tx = target_client.transaction().await?;
    check_target(config, &tx, args.dry_run).await?;
    let mut ctx = Ctx {
        source: &snapshot,
        target: &tx,
        facts: &facts,
        blobs: (!args.dry_run).then(|| BlobPaths::new(&config.attachments_path)),
        bundle_root: (!args.dry_run).then(|| config.app_bundle_path.clone()),
        files,
        report,
        progress,
        written: files::Written::default(),
        done: Done::default(),
    };
    let outcome = tokio::select! {
        outcome = all_steps(&mut ctx, &go_bundles, counter, repository_generation) => outcome,
        _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
    };
    ctx.progress.done();
    let (report, done, mut written) = (ctx.report, ctx.done, ctx.written);
    let storage = crate::storage::Storage::open(&config.storage())?;
    let mut staged_only = false;
    let result = match outcome {
        Ok(head) if !args.dry_run => match written.publish(&storage, config).await {
            Ok(staged) => {
                staged_only = staged;
                Ok(head)
            }
            Err(e) => Err(e),
        },
        other => other,
    };
    let result = match result {
        Ok(head) => {
            let expected = Expected {
                counts,
                orphans: done.orphans,
                bundle_folders: go_bundles.folders,
                head,
                repository_generation,
                counter,
                active_bundle: go_bundles.active.clone(),
            };
            conclude(args, tx, report, &done, &expected, &facts).await
        }
        Err(error) => Err(error),
    };
    match result {
        Ok(report) => {
            if staged_only {
                // Committed: the local copies were only the way into the object store.
                written.remove_all();
            }
            println!("{}", report.render());
            finish(&report, args.dry_run)
        }
        Err(error) => {
            let left = written.remove_all();
            Err(error.context(failure_note(&left)))
        }
    }
}

/// The attachment and bundle folders, when given.
fn folders(
    args: &GoSynkronusArgs,
    counts: &db::go_source::SourceCounts,
    report: &mut Report,
) -> anyhow::Result<(files::SourceFiles, bundles::GoBundles)> {
    let files = match &args.attachments {
        Some(dir) => {
            let (files, warnings) = files::SourceFiles::scan(dir)?;
            warnings.into_iter().for_each(|w| report.warn("attachment folder", w));
            files
        }
        None => {
            if counts.attachments > 0 {
                report.header.push(format!(
                    "no --attachments given: the {} current attachments cannot be imported",
                    counts.attachments
                ));
            }
            files::SourceFiles::default()
        }
    };
    let go_bundles = match &args.bundle_versions {
        Some(dir) => {
            let (found, warnings) = bundles::discover(dir)?;
            warnings.into_iter().for_each(|w| report.warn("bundle folder", w));
            found
        }
        None => {
            report.header.push("no --bundle-versions given: no app bundle version is imported".to_string());
            bundles::GoBundles::default()
        }
    };
    Ok((files, go_bundles))
}

/// Counts the target, checks the source did not move (on a connection of its own: the snapshot
/// would not see it), then commits, or in a dry run rolls back.
async fn conclude(
    args: &GoSynkronusArgs,
    tx: deadpool_postgres::Transaction<'_>,
    mut report: Report,
    done: &Done,
    expected: &Expected,
    facts: &crate::domain::go_import::SchemaFacts,
) -> anyhow::Result<Report> {
    let target =
        if args.dry_run { dry_run_counts(done, expected) } else { db::go_import::counts(&tx).await? };
    fill_report(&mut report, expected, &target);
    let fresh = db::go_source::connect(&args.source_db).await.context("reconnecting to the source")?;
    let (counter_after, _) = db::go_source::counter(&fresh, facts).await?;
    if counter_after != expected.counter {
        report.warn(
            "source moved",
            format!(
                "the source's counter went from {} to {counter_after} during the import: the Go server is still \
                 running; stop it and import again into a new database",
                expected.counter
            ),
        );
    }
    if !args.dry_run {
        tx.commit().await.context("committing the import")?;
    }
    Ok(report)
}

/// Everything in order; returns the head.
async fn all_steps(
    ctx: &mut Ctx<'_>,
    go: &bundles::GoBundles,
    counter: i64,
    generation: i64,
) -> anyhow::Result<i64> {
    if ctx.blobs.is_some() {
        db::records::lock_change_log(ctx.target).await?;
        db::bundles::lock(ctx.target).await?;
        db::go_import::remove_users(ctx.target).await?;
    }
    steps::users(ctx).await?;
    steps::observations(ctx).await?;
    steps::attachments(ctx).await?;
    let head = steps::orphans(ctx, base_head(counter, ctx.done.highest_version)).await?;
    steps::presence(ctx).await?;
    steps::bundle_versions(ctx, go).await?;
    if ctx.blobs.is_some() {
        db::go_import::finish(ctx.target, head, generation).await?;
        let twice = db::go_import::duplicate_change_ids(ctx.target, 10).await?;
        if !twice.is_empty() {
            anyhow::bail!(
                "the source uses these versions more than once, so cursors cannot be kept: {twice:?}"
            );
        }
    }
    Ok(head)
}

/// Refuses a target holding anything but the bootstrap admin.
async fn check_target(
    config: &Config,
    tx: &deadpool_postgres::Transaction<'_>,
    dry_run: bool,
) -> anyhow::Result<()> {
    let Some(state) = db::go_import::target_state(tx).await? else {
        return if dry_run {
            Ok(())
        } else {
            Err(anyhow::anyhow!("the target has no schema after migrating"))
        };
    };
    let mut held = Vec::new();
    for (n, what) in [
        (state.records, "observations"),
        (state.revisions, "observation revisions"),
        (state.attachments, "attachments"),
        (state.tombstones, "deleted attachments"),
        (state.bundle_versions, "bundle versions"),
        (state.scope_versions, "scope set versions (import first, then set the scope rules)"),
    ] {
        if n > 0 {
            held.push(format!("{n} {what}"));
        }
    }
    if state.head > 0 {
        held.push(format!("change head {}", state.head));
    }
    if !(state.usernames.is_empty() || state.usernames == [config.admin_username.clone()]) {
        held.push(format!("users {}", state.usernames.join(", ")));
    }
    if !held.is_empty() {
        anyhow::bail!(
            "refused: the target database is not empty ({}); import only into a new database (its bootstrap admin alone is allowed)",
            held.join(", ")
        );
    }
    Ok(())
}

struct Expected {
    counts: db::go_source::SourceCounts,
    orphans: i64,
    bundle_folders: i64,
    head: i64,
    repository_generation: i64,
    counter: i64,
    active_bundle: Option<String>,
}

fn dry_run_counts(done: &Done, expected: &Expected) -> db::go_import::TargetCounts {
    db::go_import::TargetCounts {
        users: done.users.len() as i64,
        records: done.records,
        attachments: done.attachments,
        tombstones: done.tombstones,
        bundle_versions: done.bundle_versions,
        presence: done.presence,
        head: expected.head,
        generation: expected.repository_generation,
        active_bundle: expected.active_bundle.clone(),
    }
}

fn fill_report(report: &mut Report, e: &Expected, t: &db::go_import::TargetCounts) {
    report.line("users", e.counts.users, t.users);
    report.line("observations", e.counts.observations, t.records);
    report.line("attachments", e.counts.attachments + e.orphans, t.attachments);
    report.line("deleted attachments", e.counts.deleted_attachments, t.tombstones);
    report.line("bundle versions", e.bundle_folders, t.bundle_versions);
    report.line("presence rows", e.counts.presence, t.presence);
    report.line("change head", e.head, t.head);
    report.line("repository generation", e.repository_generation, t.generation);
    if let Some(active) = &t.active_bundle {
        report.header.push(format!("active bundle version: {active}"));
    }
}

fn failure_note(left: &[String]) -> String {
    if left.is_empty() {
        "the import failed; nothing was written to the target".to_string()
    } else {
        format!(
            "the import failed; the target database is unchanged, but these files could not be removed: {}",
            left.join(", ")
        )
    }
}

fn finish(report: &Report, dry_run: bool) -> anyhow::Result<()> {
    let differ: Vec<&str> = report.differences().iter().map(|l| l.kind).collect();
    match (differ.is_empty(), dry_run) {
        (true, true) => {
            println!("dry run: nothing written; an import would match the source");
            Ok(())
        }
        (true, false) => {
            println!("imported: every count matches; start the server on this configuration");
            Ok(())
        }
        (false, true) => {
            anyhow::bail!("dry run: the counts would differ for {} (see the warnings)", differ.join(", "))
        }
        (false, false) => {
            anyhow::bail!(
                "imported, but the counts differ for {} (see the warnings above)",
                differ.join(", ")
            )
        }
    }
}
