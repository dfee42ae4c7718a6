//! The `ChangeLog` actor owns change_id allocation and commit order (docs/architecture.md, "The
//! change log"). Pushes queue in its mailbox; every push waiting while a commit runs joins the next
//! group commit: one transaction, under one advisory lock, that assigns change_ids in order, writes
//! records, revisions and transmission results, moves the head, commits, then answers each sender.
//!
//! The actor is a driver. [`scheduler`] decides, without I/O, when each commit starts and how (a
//! group, a group written ahead of the one before it, an attachment, a reset); `transaction` runs
//! each commit on the change log's own connections and reports its progress back through one
//! channel; the actor hands those reports to the scheduler and carries out what it answers.

mod scheduler;
mod transaction;

#[cfg(debug_assertions)]
pub mod pauses;

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;
use std::time::Instant;

use actix::prelude::*;
use deadpool_postgres::Pool;
use tokio::sync::{mpsc, oneshot};

use crate::db::attachments::{AttachmentRow, NewAttachment};
use crate::db::commit::Base;
use crate::db::records::Head;
use crate::db::scope::write::CommitScopes;
use crate::db::DbError;
use crate::domain::audit::Origin;
pub use crate::domain::sync::plan::Push;
use crate::domain::sync::PushResult;
use crate::error::{ApiError, ApiResult, ErrorCode};
use scheduler::{Action, Done, GroupId, Limits, Queued, Scheduler};

/// What goes wrong inside the change log, in its own terms; each becomes an HTTP error once, in
/// [`ChangeLogHandle`].
#[derive(Debug, thiserror::Error)]
pub enum CommitError {
    /// This commit's own database failure.
    #[error("the commit failed")]
    Db(#[from] DbError),
    /// One database failure answered to every push of a group that failed as a whole.
    #[error("the group commit failed")]
    Group(#[source] Arc<DbError>),
    /// The transmission id is taken by another payload.
    #[error("the transmission id is taken by another payload")]
    TransmissionMismatch,
    /// The client holds another repository generation than this one, the server's.
    #[error("the repository is at generation {0}")]
    ResetRequired(i64),
    /// The result stored for this push's transmission cannot be read, so it cannot be replayed
    /// (and the push must not be applied twice).
    #[error("the stored result of transmission '{transmission_id}' of client '{client_id}' cannot be read: {reason}")]
    StoredResultUnreadable { client_id: String, transmission_id: String, reason: String },
    /// The attachment id is stored with other bytes.
    #[error("the attachment id is taken by other bytes")]
    AttachmentExists,
    /// A plan without a result for a push it applied: never expected.
    #[error("the commit planned no result for a push it applied")]
    Lost,
    /// The change log dropped the request without answering it.
    #[error("the change log dropped the request")]
    Dropped,
}

impl From<CommitError> for ApiError {
    fn from(e: CommitError) -> Self {
        match e {
            CommitError::Db(db) => ApiError::from(db),
            CommitError::Group(ref db) if db.is_unavailable() => ApiError::unavailable(e),
            CommitError::TransmissionMismatch => ApiError::of(ErrorCode::TransmissionMismatch),
            CommitError::ResetRequired(generation) => ApiError::reset_required(generation),
            CommitError::AttachmentExists => ApiError::of(ErrorCode::AttachmentExists),
            CommitError::Group(_)
            | CommitError::StoredResultUnreadable { .. }
            | CommitError::Lost
            | CommitError::Dropped => ApiError::internal(e),
        }
    }
}

impl Message for Push {
    type Result = Result<PushOutcome, CommitError>;
}

#[derive(Debug, Clone)]
pub struct PushOutcome {
    pub result: PushResult,
    /// True when this answer is a stored result replayed for a retry.
    pub replayed: bool,
}

/// A push waiting for its commit, with its sender's reply channel.
struct Pending {
    push: Push,
    reply: oneshot::Sender<Result<PushOutcome, CommitError>>,
    queued_at: Instant,
    /// The push's request, for the group commit's span.
    request_id: Option<String>,
    span: tracing::Span,
}

impl Queued for Pending {
    fn size(&self) -> (usize, usize) {
        (self.push.records.len(), self.push.data_bytes())
    }

    fn keys(&self) -> impl Iterator<Item = u64> + '_ {
        let push = &self.push;
        let records = push.records.iter().map(|r| hash_of(&(0u8, r.id())));
        let transmission =
            push.transmission_id.as_deref().map(|t| hash_of(&(1u8, push.client_id.as_str(), t)));
        records.chain(transmission)
    }
}

fn hash_of(key: &impl Hash) -> u64 {
    let mut hasher = DefaultHasher::new();
    key.hash(&mut hasher);
    hasher.finish()
}

/// Records a new attachment with the next change_id, so attachment manifests share the records'
/// no-skip guarantee. The file must already be stored under its content hash.
struct CommitAttachment(NewAttachment);

impl Message for CommitAttachment {
    type Result = Result<AttachmentCommit, CommitError>;
}

#[derive(Debug, Clone)]
pub struct AttachmentCommit {
    pub row: AttachmentRow,
    /// False when the same bytes were already stored under this id (an idempotent retry).
    pub created: bool,
}

/// Empties the repository and raises its generation (docs/api.md §17.3), ordered with every commit.
struct ResetRepository(Origin);

impl Message for ResetRepository {
    type Result = Result<Head, CommitError>;
}

/// What the change log runs alone, one by one, between group commits.
enum Job {
    Attachment(NewAttachment, oneshot::Sender<Result<AttachmentCommit, CommitError>>),
    Reset(Origin, oneshot::Sender<Result<Head, CommitError>>),
}

/// The change log's front door: every commit of the repository goes through these methods.
#[derive(Clone)]
pub struct ChangeLogHandle {
    addr: Addr<ChangeLog>,
    #[cfg(debug_assertions)]
    pauses: pauses::Pauses,
}

impl ChangeLogHandle {
    /// Starts the change log on `pool`: its own connections (two).
    pub fn start(pool: Pool) -> Self {
        let change_log = ChangeLog::new(pool);
        #[cfg(debug_assertions)]
        let pauses = change_log.pauses.clone();
        ChangeLogHandle {
            addr: change_log.start(),
            #[cfg(debug_assertions)]
            pauses,
        }
    }

    /// Commits a push (in a group commit with whatever else is waiting) and answers its result.
    pub async fn push(&self, push: Push) -> ApiResult<PushOutcome> {
        super::ask(&self.addr, "change log", push).await
    }

    /// Records a stored attachment with the next change_id.
    pub async fn commit_attachment(&self, new: NewAttachment) -> ApiResult<AttachmentCommit> {
        super::ask(&self.addr, "change log", CommitAttachment(new)).await
    }

    /// Empties the repository and raises its generation, ordered with every commit. Only the
    /// `AttachmentStore` calls this: the reset also deletes attachment files, which it owns.
    pub async fn reset_repository(&self, origin: Origin) -> ApiResult<Head> {
        super::ask(&self.addr, "change log", ResetRepository(origin)).await
    }

    /// Test only: where a test holds this server's commits at a chosen point (see [`pauses`]).
    #[cfg(debug_assertions)]
    pub fn pauses(&self) -> &pauses::Pauses {
        &self.pauses
    }
}

/// What a running commit tells the change log, in the order it happens.
struct Report {
    group: GroupId,
    event: Event,
}

enum Event {
    /// It has planned from `Base`, and commits that base if it commits.
    Planned(Base),
    /// Its writes are done and its COMMIT is being sent.
    Wrote,
    /// Written ahead, it gave up and is committed the usual way.
    Redo,
    Done(Done<Pending>),
}

pub struct ChangeLog {
    pool: Pool,
    scheduler: Scheduler<Pending, Job, Base>,
    reports: mpsc::UnboundedSender<Report>,
    /// Taken when the actor starts.
    incoming: Option<mpsc::UnboundedReceiver<Report>>,
    /// Groups written ahead, waiting to hear whether the commit before them committed.
    waiting: HashMap<GroupId, oneshot::Sender<bool>>,
    scopes: Arc<CommitScopes>,
    #[cfg(debug_assertions)]
    pauses: pauses::Pauses,
}

impl ChangeLog {
    fn new(pool: Pool) -> Self {
        let (reports, incoming) = mpsc::unbounded_channel();
        ChangeLog {
            pool,
            scheduler: Scheduler::new(Limits::GROUP_COMMIT),
            reports,
            incoming: Some(incoming),
            waiting: HashMap::new(),
            scopes: Arc::default(),
            #[cfg(debug_assertions)]
            pauses: pauses::Pauses::default(),
        }
    }

    fn reporter(&self, group: GroupId) -> transaction::Reporter {
        transaction::Reporter {
            group,
            reports: self.reports.clone(),
            scopes: self.scopes.clone(),
            #[cfg(debug_assertions)]
            pauses: self.pauses.clone(),
        }
    }

    /// Carries out the scheduler's actions.
    fn execute(&mut self, actions: Vec<Action<Pending, Job, Base>>, ctx: &mut Context<Self>) {
        for action in actions {
            match action {
                Action::Commit { group, batch } => {
                    let work = transaction::push_group(self.pool.clone(), batch, None, self.reporter(group));
                    ctx.spawn(actix::fut::wrap_future(work));
                }
                Action::CommitAhead { group, batch, base } => {
                    let (tell, told) = oneshot::channel();
                    self.waiting.insert(group, tell);
                    let ahead = transaction::Ahead { base, predecessor: told };
                    let work =
                        transaction::push_group(self.pool.clone(), batch, Some(ahead), self.reporter(group));
                    ctx.spawn(actix::fut::wrap_future(work));
                }
                Action::Run { group, job } => {
                    let work = transaction::run_job(self.pool.clone(), job, self.reporter(group));
                    ctx.spawn(actix::fut::wrap_future(work));
                }
                Action::Tell { group, committed } => {
                    if let Some(tell) = self.waiting.remove(&group) {
                        let _ = tell.send(committed);
                    }
                }
            }
        }
    }
}

impl Actor for ChangeLog {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        // Handlers only enqueue, so a deep mailbox costs little and keeps pushers from stalling.
        ctx.set_mailbox_capacity(4096);
        if let Some(incoming) = self.incoming.take() {
            let reports = futures_util::stream::unfold(incoming, |mut incoming| async move {
                incoming.recv().await.map(|report| (report, incoming))
            });
            ctx.add_stream(reports);
        }
    }
}

impl StreamHandler<Report> for ChangeLog {
    fn handle(&mut self, Report { group, event }: Report, ctx: &mut Self::Context) {
        let actions = match event {
            Event::Planned(base) => self.scheduler.planned(group, base),
            Event::Wrote => self.scheduler.wrote(group),
            Event::Redo => {
                self.waiting.remove(&group);
                self.scheduler.redo(group)
            }
            Event::Done(done) => {
                self.waiting.remove(&group);
                self.scheduler.done(group, done)
            }
        };
        self.execute(actions, ctx);
    }

    /// The actor holds a sender of the stream, so it never ends while the actor runs.
    fn finished(&mut self, _: &mut Self::Context) {}
}

super::traced!(ChangeLog: Push, CommitAttachment, ResetRepository);

impl Handler<Push> for ChangeLog {
    type Result = ResponseFuture<Result<PushOutcome, CommitError>>;

    fn handle(&mut self, push: Push, ctx: &mut Self::Context) -> Self::Result {
        let (reply, answer) = oneshot::channel();
        let request_id = crate::telemetry::request_id::try_current();
        let span = tracing::Span::current();
        let actions =
            self.scheduler.push(Pending { push, reply, queued_at: Instant::now(), request_id, span });
        self.execute(actions, ctx);
        Box::pin(async move { answer.await.unwrap_or(Err(CommitError::Dropped)) })
    }
}

impl Handler<CommitAttachment> for ChangeLog {
    type Result = ResponseFuture<Result<AttachmentCommit, CommitError>>;

    fn handle(&mut self, CommitAttachment(new): CommitAttachment, ctx: &mut Self::Context) -> Self::Result {
        let (reply, answer) = oneshot::channel();
        let actions = self.scheduler.job(Job::Attachment(new, reply));
        self.execute(actions, ctx);
        Box::pin(async move { answer.await.unwrap_or(Err(CommitError::Dropped)) })
    }
}

impl Handler<ResetRepository> for ChangeLog {
    type Result = ResponseFuture<Result<Head, CommitError>>;

    fn handle(&mut self, ResetRepository(origin): ResetRepository, ctx: &mut Self::Context) -> Self::Result {
        let (reply, answer) = oneshot::channel();
        let actions = self.scheduler.job(Job::Reset(origin, reply));
        self.execute(actions, ctx);
        Box::pin(async move { answer.await.unwrap_or(Err(CommitError::Dropped)) })
    }
}
