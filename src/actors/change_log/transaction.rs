//! One commit of the change log, as the scheduler started it: a push group committed the usual way
//! or written ahead of the commit before it, an attachment, a reset. Each runs on a connection of
//! the change log's own pool and reports what the scheduler needs to know (planned, wrote, redo,
//! done) through the actor's channel, in that order.

use std::sync::Arc;
use std::time::Instant;

use chrono::{SubsecRound, Utc};
use deadpool_postgres::Pool;
use tokio::sync::{mpsc, oneshot};
use tracing::Instrument;

use super::scheduler::{Done, GroupId};
use super::{AttachmentCommit, CommitError, Event, Job, Pending, PushOutcome, Report};
use crate::db::attachments::{self, NewAttachment};
use crate::db::commit::{self, Base};
use crate::db::records::{self, Head};
use crate::db::scope::write::{self as scope_write, CommitScopes};
use crate::db::{audit, DbError, DbResult};
use crate::domain::audit::{Action, Origin};
use crate::domain::sync::plan::{self, Decision, OutOfScope, Outcome, Push};
use crate::monitoring::CommitPhases;

#[cfg(debug_assertions)]
use super::pauses::{Pauses, Point};

/// How a running commit reports to the change log.
pub(super) struct Reporter {
    pub(super) group: GroupId,
    pub(super) reports: mpsc::UnboundedSender<Report>,
    /// The key plans of the scope sets, shared by the change log's commits.
    pub(super) scopes: Arc<CommitScopes>,
    #[cfg(debug_assertions)]
    pub(super) pauses: Pauses,
}

impl Reporter {
    fn send(&self, event: Event) {
        // The actor outlives every commit it starts: a send cannot fail while anyone listens.
        let _ = self.reports.send(Report { group: self.group, event });
    }

    fn planned(&self, base: Base) {
        self.send(Event::Planned(base));
    }

    fn wrote(&self) {
        self.send(Event::Wrote);
    }

    fn redo(&self) {
        self.send(Event::Redo);
    }

    fn done(self, done: Done<Pending>) {
        self.send(Event::Done(done));
    }

    /// Test only: waits here while a test holds commits at `point`.
    #[cfg(debug_assertions)]
    async fn pause(&self, point: Point) {
        self.pauses.pass(point).await;
    }
}

/// A group written ahead: the base it plans from (what the commit before it planned), and how
/// that commit ended.
pub(super) struct Ahead {
    pub(super) base: Base,
    pub(super) predecessor: oneshot::Receiver<bool>,
}

type Answer = Result<PushOutcome, CommitError>;

/// Commits a group and answers its pushes. If it fails as a whole for a reason other than the
/// database being away, its pushes go back to the scheduler, which commits each alone so that
/// one bad push cannot fail the others.
pub(super) async fn push_group(pool: Pool, batch: Vec<Pending>, ahead: Option<Ahead>, reporter: Reporter) {
    // One span for the group, naming the requests whose pushes it commits and linked to each
    // push's span: a push's trace leads to the commit that answered it, and back.
    let request_ids: Vec<&str> = batch.iter().filter_map(|p| p.request_id.as_deref()).collect();
    let span = tracing::info_span!(parent: None, "group commit", pushes = batch.len(),
        records = batch.iter().map(|p| p.push.records.len()).sum::<usize>(),
        written_ahead = ahead.is_some(), request_ids = %request_ids.join(","));
    for pending in &batch {
        span.follows_from(&pending.span);
    }
    commit_group(pool, batch, ahead, reporter).instrument(span).await
}

async fn commit_group(pool: Pool, batch: Vec<Pending>, ahead: Option<Ahead>, reporter: Reporter) {
    crate::monitoring::group_commit(batch.len());
    let mut phases = phases_of(&batch);
    let result = {
        let pushes: Vec<&Push> = batch.iter().map(|p| &p.push).collect();
        commit(&pool, &pushes, &mut phases, &reporter, ahead).await
    };
    match result {
        Ok((answers, committed_ahead)) => {
            for (pending, answer) in batch.into_iter().zip(answers) {
                let _ = pending.reply.send(answer);
            }
            phases.lap("reply");
            phases.log();
            reporter.done(Done::Committed { ahead: committed_ahead });
        }
        Err(e) if batch.len() > 1 && !e.is_unavailable() => {
            tracing::warn!(error = %e, cause = %cause_chain(&e), pushes = batch.len(),
                "group commit failed; committing its pushes one by one");
            reporter.done(Done::Failed { retry: batch });
        }
        Err(e) => {
            match <[Pending; 1]>::try_from(batch) {
                Ok([pending]) => {
                    let _ = pending.reply.send(Err(CommitError::Db(e)));
                }
                Err(batch) => {
                    // One failure answers every push of the group, each answer with the whole chain.
                    let shared = std::sync::Arc::new(e);
                    for pending in batch {
                        let _ = pending.reply.send(Err(CommitError::Group(shared.clone())));
                    }
                }
            }
            reporter.done(Done::Failed { retry: Vec::new() });
        }
    }
}

/// Runs an attachment commit or a reset and answers it.
pub(super) async fn run_job(pool: Pool, job: Job, reporter: Reporter) {
    let committed = match job {
        Job::Attachment(new, reply) => {
            let result = commit_attachment(&pool, new).await;
            let committed = result.is_ok();
            let _ = reply.send(result);
            committed
        }
        Job::Reset(origin, reply) => {
            let result = reset(&pool, &origin).await.map_err(CommitError::from);
            let committed = result.is_ok();
            let _ = reply.send(result);
            committed
        }
    };
    reporter.done(if committed {
        Done::Committed { ahead: false }
    } else {
        Done::Failed { retry: Vec::new() }
    });
}

/// One transaction for the whole group: reads what the plan needs, writes what it planned. The
/// error fails the group; the answers are per push, with whether it committed as written ahead.
/// With `ahead`, the group is first written ahead of the commit before it, and committed the
/// usual way if that does not hold.
async fn commit(
    pool: &Pool,
    pushes: &[&Push],
    phases: &mut CommitPhases,
    reporter: &Reporter,
    ahead: Option<Ahead>,
) -> DbResult<(Vec<Answer>, bool)> {
    let mut client = pool.get().await?;
    phases.lap("connection");
    if let Some(ahead) = ahead {
        let tx = client.transaction().await?;
        match commit_ahead(tx, pushes, ahead, phases, reporter).await {
            Ok(Some(answers)) => {
                crate::monitoring::commit_ahead(true);
                return Ok((answers, true));
            }
            Ok(None) => {}
            Err(e) if e.is_unavailable() => return Err(e),
            Err(e) => {
                // A row another process writes (the transaction then rolls back as it is dropped).
                tracing::debug!(error = %e, cause = %cause_chain(&e), "writing ahead failed");
            }
        }
        crate::monitoring::commit_ahead(false);
        // A group written ahead of this one planned from the base this attempt would have
        // committed: it is told now, not once this group is redone. Its rows may hold change_ids
        // that the commit holding the lock now is waiting to insert, while the redo waits for that
        // commit: a wait PostgreSQL cannot see through this process.
        reporter.redo();
        #[cfg(debug_assertions)]
        reporter.pause(Point::Redo).await;
    }
    let tx = client.transaction().await?;
    phases.lap("begin");
    // The records of every push are read as if all applied: replays are rare, and reading with
    // the lock saves a round trip that every commit would otherwise pay.
    let (clients, transmission_ids) = plan::transmission_keys(pushes);
    let inputs = {
        // Dropped once read: a list of every record id is some 5 MB for a push of 300,000.
        let (ids, need_data) = plan::records_to_read(pushes, &vec![Decision::Apply; pushes.len()]);
        commit::lock_and_read(&tx, &clients, &transmission_ids, &ids, &need_data).await?
    };
    phases.lap("lock_and_read");
    let Base { head, repository_generation, scope } = inputs.base;
    let decisions = plan::decide(pushes, inputs.transmissions, repository_generation);
    let mut states = inputs.states;
    if decisions.iter().any(|d| !matches!(d, Decision::Apply)) {
        // Only the records this batch writes count as overwritten.
        let (ids, _) = plan::records_to_read(pushes, &decisions);
        states.retain(|id, _| ids.binary_search(&id.as_str()).is_ok());
    }
    // Scoped sync (docs/api.md §20): the keys to write, and the updates to refuse.
    let scoped = scope_write::commit_scope(&tx, scope, &reporter.scopes).await?;
    let out_of_scope = match &scoped {
        Some(s) if s.enforce => scope_write::out_of_scope_of(&tx, pushes, &decisions, &states).await?,
        _ => OutOfScope::new(),
    };

    // Server time is the commit time; microseconds, as the database stores it.
    let now = Utc::now().trunc_subsecs(6);
    let plan = plan::plan(pushes, &decisions, &states, head, repository_generation, now, &out_of_scope);
    reporter.planned(Base { head: plan.head, repository_generation, scope });
    #[cfg(debug_assertions)]
    reporter.pause(Point::Planned).await;
    // Records that existed before this batch and that it overwrites: their current state is
    // archived as a superseded revision. A record refused to every push that named it keeps it.
    let overwritten: Vec<&str> = if plan.refusals.is_empty() {
        states.keys().map(String::as_str).collect()
    } else {
        let revised: std::collections::HashSet<&str> =
            (0..plan.revision_count()).map(|i| plan.revision_id(i)).collect();
        states.keys().map(String::as_str).filter(|id| revised.contains(id)).collect()
    };
    phases.lap("plan");
    futures_util::try_join!(
        commit::write_plan(&tx, pushes, &plan, &overwritten, now, phases),
        scope_write::write_plan(&tx, scoped.as_deref(), &plan, &states)
    )?;
    if scoped.is_some() {
        phases.lap("scope");
    }
    reporter.wrote();
    tx.commit().await?;
    phases.lap("commit");
    Ok((answers(pushes, plan.outcomes(decisions)), false))
}

/// Writes a group of new records ahead of the commit before it (docs/architecture.md, step 3b):
/// `None` when it rolled back because the group overwrites stored records, the commit before
/// failed, or another commit came in between; the caller then commits it the usual way.
async fn commit_ahead(
    tx: deadpool_postgres::Transaction<'_>,
    pushes: &[&Push],
    ahead: Ahead,
    phases: &mut CommitPhases,
    reporter: &Reporter,
) -> DbResult<Option<Vec<Answer>>> {
    let (clients, transmission_ids) = plan::transmission_keys(pushes);
    let (transmissions, states) = {
        let (ids, need_data) = plan::records_to_read(pushes, &vec![Decision::Apply; pushes.len()]);
        commit::read_ahead(&tx, &clients, &transmission_ids, &ids, &need_data).await?
    };
    phases.lap("read_ahead");
    if !states.is_empty() {
        // Overwrites move the kept statistics by the stored rows, which needs the lock first.
        tx.rollback().await?;
        return Ok(None);
    }
    let Base { head, repository_generation, scope } = ahead.base;
    let decisions = plan::decide(pushes, transmissions, repository_generation);
    let now = Utc::now().trunc_subsecs(6);
    // New records only (see above): nothing to refuse; their keys are those of the base's sets,
    // which the lock's base check below confirms.
    let plan = plan::plan(pushes, &decisions, &states, head, repository_generation, now, &OutOfScope::new());
    reporter.planned(Base { head: plan.head, repository_generation, scope });
    let scoped = scope_write::commit_scope(&tx, scope, &reporter.scopes).await?;
    phases.lap("plan");
    futures_util::try_join!(
        commit::write_ahead(&tx, pushes, &plan, now, phases),
        scope_write::write_plan(&tx, scoped.as_deref(), &plan, &states)
    )?;
    if scoped.is_some() {
        phases.lap("scope");
    }
    #[cfg(debug_assertions)]
    reporter.pause(Point::WroteAhead).await;
    let predecessor_committed = ahead.predecessor.await.unwrap_or(false);
    phases.lap("wait_for_predecessor");
    #[cfg(debug_assertions)]
    reporter.pause(Point::Told).await;
    if !predecessor_committed || !commit::try_lock_at(&tx, ahead.base).await? {
        tx.rollback().await?;
        return Ok(None);
    }
    phases.lap("lock");
    commit::finish_ahead(&tx, pushes, &plan).await?;
    phases.lap("statistics_head");
    reporter.wrote();
    tx.commit().await?;
    phases.lap("commit");
    Ok(Some(answers(pushes, plan.outcomes(decisions))))
}

/// The planned outcomes as the senders' answers, in push order.
fn answers(pushes: &[&Push], outcomes: Vec<Outcome>) -> Vec<Answer> {
    pushes
        .iter()
        .zip(outcomes)
        .map(|(push, outcome)| match outcome {
            Outcome::Applied(result) => Ok(PushOutcome { result, replayed: false }),
            Outcome::Replayed(result) => Ok(PushOutcome { result, replayed: true }),
            Outcome::Mismatch => Err(CommitError::TransmissionMismatch),
            Outcome::ResetRequired(generation) => Err(CommitError::ResetRequired(generation)),
            Outcome::Unreadable(unreadable) => Err(CommitError::StoredResultUnreadable {
                client_id: push.client_id.clone(),
                transmission_id: push.transmission_id.clone().unwrap_or_default(),
                reason: unreadable.0,
            }),
            Outcome::Lost => Err(CommitError::Lost),
        })
        .collect()
}

async fn reset(pool: &Pool, origin: &Origin) -> DbResult<Head> {
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    records::lock_change_log(&tx).await?;
    let head = records::reset_repository(&tx).await?;
    crate::db::scope::reset(&tx).await?;
    let details = serde_json::json!({"repository_generation": head.repository_generation});
    audit::append(&tx, &origin.entry(Action::RepositoryReset, None, details)).await?;
    tx.commit().await?;
    Ok(head)
}

/// Inserts the attachment row with the next change_id, or reports what is already stored.
async fn commit_attachment(pool: &Pool, new: NewAttachment) -> Result<AttachmentCommit, CommitError> {
    let mut client = pool.get().await.map_err(DbError::from)?;
    let tx = client.transaction().await.map_err(DbError::from)?;
    records::lock_change_log(&tx).await?;
    if let Some(existing) = attachments::find(&tx, &new.id).await? {
        if existing.sha256 == new.sha256 {
            return Ok(AttachmentCommit { row: existing, created: false });
        }
        return Err(CommitError::AttachmentExists);
    }
    let change_id = records::head(&tx).await? + 1;
    let row = attachments::insert(&tx, &new, change_id).await?;
    scope_write::note_upload(&tx, &row.id, change_id).await?;
    records::set_head(&tx, change_id).await?;
    tx.commit().await.map_err(DbError::from)?;
    Ok(AttachmentCommit { row, created: true })
}

/// A stopwatch for `batch`'s commit, its queue wait measured from the oldest push.
fn phases_of(batch: &[Pending]) -> CommitPhases {
    let now = Instant::now();
    CommitPhases::start(
        batch.len(),
        batch.iter().map(|p| p.push.records.len()).sum(),
        batch.iter().map(|p| now - p.queued_at).max().unwrap_or_default(),
    )
}

/// The causes below `e`, outermost first, as one log-friendly line.
fn cause_chain(e: &dyn std::error::Error) -> String {
    let mut parts = Vec::new();
    let mut next = e.source();
    while let Some(cause) = next {
        parts.push(cause.to_string());
        next = cause.source();
    }
    parts.join(": ")
}
