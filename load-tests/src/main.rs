//! synkronus-load: drives any Synkronus-compatible server over its real wire format and
//! reports throughput, latency percentiles, errors and correctness violations.

mod api;
mod bundle;
mod cli;
mod payload;
mod progress;
mod report;
mod rss;
mod scenarios;
mod stats;
mod sysmon;
mod target;

use anyhow::Result;
use clap::Parser;
use cli::{Cli, Cmd};
use report::{Report, ReportMeta};
use scenarios::Ctx;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(2);
        }
    };
    match rt.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// Exit codes: 0 all good, 1 correctness violations, 2 the run could not complete.
async fn run(cli: Cli) -> Result<ExitCode> {
    let common = cli.common.clone();
    let base = target::check_base_url(&common.base_url, common.allow_remote)?;
    let stats = Arc::new(stats::Stats::new());
    let api = Arc::new(api::Api::new(
        base.clone(),
        common.username.clone(),
        common.password.clone(),
        stats.clone(),
        cli.cmd.concurrency() + 4,
        Duration::from_secs(common.request_timeout),
    )?);
    let started_at = chrono::Utc::now();
    let scenario = cli.cmd.name();
    let params = cli.cmd.params();
    let progress = progress::Progress::new(!common.no_progress, stats.clone());
    let ctx = Arc::new(Ctx::new(api.clone(), stats.clone(), common.clone(), progress));

    // db-ceiling talks to PostgreSQL only, `attachments --direct` to an object store.
    let needs_login =
        !matches!(&cli.cmd, Cmd::DbCeiling(_) | Cmd::Attachments(cli::AttachmentArgs { direct: true, .. }));
    let work = {
        let ctx = ctx.clone();
        async move {
            if needs_login {
                ctx.api.login().await?;
            }
            dispatch(ctx, cli.cmd).await
        }
    };
    let outcome = tokio::time::timeout(Duration::from_secs(common.max_time), work).await;
    ctx.progress.finish();
    let incomplete = match outcome {
        Err(_) => Some(format!("stopped at --max-time {} s", common.max_time)),
        Ok(Err(e)) => Some(format!("{e:#}")),
        Ok(Ok(())) => None,
    };
    let taken = ctx.take_results();
    let report = Report::build(
        ReportMeta {
            scenario: scenario.to_string(),
            started_at,
            base_url: base.as_str().to_string(),
            params,
            results: taken.results,
            details: taken.details,
            sections: taken.sections,
            correctness_checked: taken.correctness,
            notes: taken.notes,
            incomplete: incomplete.clone(),
        },
        stats.snapshot(),
    );
    println!("{}", report.to_markdown());
    let (json, md) = report.write(&common.out)?;
    eprintln!("report written: {} and {}", json.display(), md.display());
    Ok(if incomplete.is_some() {
        ExitCode::from(2)
    } else if report.violations_total > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

async fn dispatch(ctx: Arc<Ctx>, cmd: Cmd) -> Result<()> {
    match cmd {
        Cmd::PushStorm(a) => scenarios::push_storm::run(ctx, a).await,
        Cmd::InitialSync(a) => scenarios::initial_sync::run(ctx, a).await,
        Cmd::Fleet(a) => scenarios::fleet::run(ctx, a).await,
        Cmd::BundleSwitch(a) => scenarios::bundle_switch::run(ctx, a).await,
        Cmd::ExportUnderLoad(a) => scenarios::export_load::run(ctx, a).await,
        Cmd::Attachments(a) => scenarios::attachments::run(ctx, a).await,
        Cmd::DbCeiling(a) => scenarios::db_ceiling::run(ctx, a).await,
        Cmd::Seed(a) => scenarios::seed::run(ctx, a).await,
        Cmd::Stats(a) => scenarios::stats_latency::run(ctx, a).await,
        Cmd::Scale(a) => scenarios::scale::run(ctx, a).await,
        Cmd::Capacity(a) => scenarios::capacity::run(ctx, a).await,
        Cmd::ScopeCost(a) => scenarios::scope_cost::run(ctx, a).await,
    }
}
