//! The `ChangeLog` actor owns change_id allocation and commit order (docs/architecture.md, "The
//! change log"). Pushes queue in its mailbox; every push waiting while a commit runs joins the next group
//! commit: one transaction, under one advisory lock, that assigns change_ids in order, writes
//! records, revisions and transmission results, moves the head, commits, then answers each sender.

use std::collections::{HashSet, VecDeque};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::time::Instant;

use actix::prelude::*;
use chrono::{SubsecRound, Utc};
use deadpool_postgres::Pool;
use futures_util::future::{FutureExt, Shared};
use tokio::sync::oneshot;

use crate::db::attachments::{self, AttachmentRow, NewAttachment};
use crate::db::audit;
use crate::db::commit;
use crate::db::records::{self, Head};
use crate::domain::audit::{Action, Origin};
pub use crate::domain::sync::plan::Push;
use crate::domain::sync::plan::{self, Decision, Outcome};
use crate::domain::sync::PushResult;
use crate::error::{ApiError, ApiResult, ErrorCode, SharedError};
use crate::monitoring::CommitPhases;

/// Bounds on one group commit: enough to amortise the transaction, small enough to keep latency
/// flat. The byte bound also keeps every statement far below PostgreSQL's 1 GB message limit
/// whatever the records weigh (a single push is bounded by MAX_JSON_BODY_BYTES).
const MAX_PUSHES_PER_COMMIT: usize = 256;
const MAX_RECORDS_PER_COMMIT: usize = 20_000;
const MAX_DATA_BYTES_PER_COMMIT: usize = 16 << 20;

impl Message for Push {
    type Result = ApiResult<PushOutcome>;
}

#[derive(Debug, Clone)]
pub struct PushOutcome {
    pub result: PushResult,
    /// True when this answer is a stored result replayed for a retry.
    pub replayed: bool,
}

struct Pending {
    push: Push,
    reply: oneshot::Sender<ApiResult<PushOutcome>>,
    queued_at: Instant,
}

/// Records a new attachment with the next change_id, so attachment manifests share the records'
/// no-skip guarantee. The file must already be stored under its content hash.
struct CommitAttachment(pub NewAttachment);

impl Message for CommitAttachment {
    type Result = ApiResult<AttachmentCommit>;
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
    type Result = ApiResult<Head>;
}

/// Anything waiting for the change log: pushes are committed in groups, the rest one by one.
enum Waiting {
    Push(Pending),
    Attachment(CommitAttachment, oneshot::Sender<ApiResult<AttachmentCommit>>),
    Reset(Origin, oneshot::Sender<ApiResult<Head>>),
}

/// The change log's front door: every commit of the repository goes through these methods.
#[derive(Clone)]
pub struct ChangeLogHandle(pub(super) Addr<ChangeLog>);

impl ChangeLogHandle {
    /// Commits a push (in a group commit with whatever else is waiting) and answers its result.
    pub async fn push(&self, push: Push) -> ApiResult<PushOutcome> {
        super::ask(&self.0, "change log", push).await
    }

    /// Records a stored attachment with the next change_id.
    pub async fn commit_attachment(&self, new: NewAttachment) -> ApiResult<AttachmentCommit> {
        super::ask(&self.0, "change log", CommitAttachment(new)).await
    }

    /// Empties the repository and raises its generation, ordered with every commit. Only the
    /// `AttachmentStore` calls this: the reset also deletes attachment files, which it owns.
    pub async fn reset_repository(&self, origin: Origin) -> ApiResult<Head> {
        super::ask(&self.0, "change log", ResetRepository(origin)).await
    }
}

pub struct ChangeLog {
    pool: Pool,
    pending: VecDeque<Waiting>,
    /// Commits started and not yet answered: at most two, one per connection of the change log.
    in_flight: usize,
    /// The commit still writing, if any (by its number): the next one starts once it has sent its
    /// COMMIT, so that one's reads, plan and wait for the lock overlap this one's WAL flush, unless
    /// it can be written ahead of it (see [`Tail`]).
    writing: Option<u64>,
    /// The last push group started, while nothing but pushes follows it.
    tail: Option<Tail>,
    /// Groups to start the usual way before writing one ahead again, and how many the next redo
    /// will skip: where several processes commit at once, one of them takes the lock between
    /// almost every two commits of this one, and a group written ahead is then nearly always
    /// redone, twice the work. After each redo the change log stops trying for twice as many
    /// groups (up to [`MAX_AHEAD_SKIPS`]); a group committed ahead resets the count.
    ahead_skips: u32,
    next_ahead_skips: u32,
    started: u64,
}

const MAX_AHEAD_SKIPS: u32 = 64;

/// The last push group started. Once it has planned (under the lock, or from the head the group
/// before it plans, if it is itself written ahead), the next group may write its rows ahead of
/// it: it reads and writes without the lock, with change_ids from the planned head on, then tries
/// the lock once this one has committed and commits if the head and generation are still the
/// ones planned; otherwise it rolls back and commits the usual way. Its reads cannot miss a write
/// that matters: its pushes name no record and no transmission this group names (`keys`), the
/// group before this one has committed when it starts (two commits in flight at most), and any
/// other commit moves the head it checks. docs/architecture.md, step 3b, has the whole argument.
struct Tail {
    id: u64,
    keys: BatchKeys,
    planned: Option<Head>,
    committed: Shared<oneshot::Receiver<()>>,
}

/// The records and transmissions a group names, as hashes: a collision only costs a group its
/// chance to be written ahead.
#[derive(Default)]
struct BatchKeys(HashSet<u64>);

impl BatchKeys {
    fn of(push: &Push) -> impl Iterator<Item = u64> + '_ {
        let records = push.records.iter().map(|r| hash_of(&(0u8, r.id.as_str())));
        let transmission =
            push.transmission_id.as_deref().map(|t| hash_of(&(1u8, push.client_id.as_str(), t)));
        records.chain(transmission)
    }

    fn add(&mut self, push: &Push) {
        self.0.extend(Self::of(push));
    }

    fn overlaps(&self, push: &Push) -> bool {
        Self::of(push).any(|k| self.0.contains(&k))
    }
}

fn hash_of(key: &impl Hash) -> u64 {
    let mut hasher = DefaultHasher::new();
    key.hash(&mut hasher);
    hasher.finish()
}

/// What a commit tells the change log as it goes.
#[derive(Default)]
struct Signals {
    /// It has planned: the head and generation it commits, if it commits.
    planned: Option<oneshot::Sender<Head>>,
    /// Its writes are done and its COMMIT is being sent.
    wrote: Option<oneshot::Sender<()>>,
    /// Its COMMIT succeeded.
    committed: Option<oneshot::Sender<()>>,
    /// Set when it was written ahead: true if it committed so, false if it was redone.
    committed_ahead: Option<bool>,
}

impl Signals {
    fn planned(&mut self, head: Head) {
        if let Some(s) = self.planned.take() {
            let _ = s.send(head);
        }
    }

    fn wrote(&mut self) {
        if let Some(s) = self.wrote.take() {
            let _ = s.send(());
        }
    }

    fn committed(&mut self) {
        if let Some(s) = self.committed.take() {
            let _ = s.send(());
        }
    }
}

/// The commit a group is written ahead of: the head it plans to commit, and its COMMIT's outcome.
struct Ahead {
    base: Head,
    predecessor: Shared<oneshot::Receiver<()>>,
}

impl ChangeLog {
    pub fn new(pool: Pool) -> Self {
        ChangeLog {
            pool,
            pending: VecDeque::new(),
            in_flight: 0,
            writing: None,
            tail: None,
            ahead_skips: 0,
            next_ahead_skips: 1,
            started: 0,
        }
    }

    /// Starts the next commit unless both connections are busy: once nothing is writing, a group
    /// of waiting pushes, or one attachment or reset (which counts as writing until it is done);
    /// while a push group is writing, a group written ahead of it.
    fn commit_next(&mut self, ctx: &mut Context<Self>) {
        if self.in_flight >= 2 || self.pending.is_empty() {
            return;
        }
        if self.writing.is_some() {
            self.write_ahead(ctx);
            return;
        }
        if let Some(waiting) = self.pending.pop_front_if(|w| !matches!(w, Waiting::Push(..))) {
            let id = self.begin();
            self.tail = None;
            let pool = self.pool.clone();
            let work = async move {
                match waiting {
                    Waiting::Attachment(msg, reply) => {
                        let _ = reply.send(commit_attachment(&pool, msg.0).await);
                    }
                    Waiting::Reset(origin, reply) => {
                        let _ = reply.send(reset(&pool, &origin).await);
                    }
                    Waiting::Push(p) => {
                        commit_and_reply(pool, vec![p], Signals::default(), None).await;
                    }
                }
            };
            ctx.spawn(
                actix::fut::wrap_future::<_, Self>(work).map(move |_, act, ctx| act.commit_done(id, ctx)),
            );
            return;
        }
        let (batch, keys) = self.take_pushes(|_| true);
        self.ahead_skips = self.ahead_skips.saturating_sub(1);
        self.start_group(batch, keys, None, ctx);
    }

    /// Starts a group written ahead of the tail (which it replaces), once the tail has planned,
    /// with the pushes at the front of the queue that name none of its records and transmissions.
    fn write_ahead(&mut self, ctx: &mut Context<Self>) {
        if self.ahead_skips > 0 {
            return;
        }
        let Some(tail) = self.tail.take_if(|t| self.writing == Some(t.id)) else {
            return;
        };
        let Some(base) = tail.planned else {
            self.tail = Some(tail);
            return;
        };
        let (batch, keys) = self.take_pushes(|push| !tail.keys.overlaps(push));
        if batch.is_empty() {
            self.tail = Some(tail);
            return;
        }
        let ahead = Ahead { base, predecessor: tail.committed.clone() };
        self.start_group(batch, keys, Some(ahead), ctx);
    }

    /// Takes waiting pushes from the front, within a group commit's bounds, while `fits` accepts them.
    fn take_pushes(&mut self, fits: impl Fn(&Push) -> bool) -> (Vec<Pending>, BatchKeys) {
        let mut batch = Vec::new();
        let mut keys = BatchKeys::default();
        let mut records = 0;
        let mut bytes = 0;
        while let Some(Waiting::Push(next)) = self.pending.front() {
            let n = next.push.records.len();
            let size = next.push.data_bytes();
            if !fits(&next.push)
                || (!batch.is_empty()
                    && (batch.len() >= MAX_PUSHES_PER_COMMIT
                        || records + n > MAX_RECORDS_PER_COMMIT
                        || bytes + size > MAX_DATA_BYTES_PER_COMMIT))
            {
                break;
            }
            records += n;
            bytes += size;
            if let Some(Waiting::Push(p)) = self.pending.pop_front() {
                keys.add(&p.push);
                batch.push(p);
            }
        }
        (batch, keys)
    }

    fn begin(&mut self) -> u64 {
        self.started += 1;
        self.writing = Some(self.started);
        self.in_flight += 1;
        self.started
    }

    /// Starts a push group, which becomes the tail.
    fn start_group(
        &mut self,
        batch: Vec<Pending>,
        keys: BatchKeys,
        ahead: Option<Ahead>,
        ctx: &mut Context<Self>,
    ) {
        let id = self.begin();
        let (planned, planned_rx) = oneshot::channel();
        let (wrote, wrote_rx) = oneshot::channel();
        let (committed, committed_rx) = oneshot::channel();
        self.tail = Some(Tail { id, keys, planned: None, committed: committed_rx.shared() });
        let signals = Signals {
            planned: Some(planned),
            wrote: Some(wrote),
            committed: Some(committed),
            committed_ahead: None,
        };
        ctx.spawn(actix::fut::wrap_future::<_, Self>(planned_rx).map(move |head, act, ctx| {
            if let (Ok(head), Some(tail)) = (head, act.tail.as_mut()) {
                if tail.id == id {
                    tail.planned = Some(head);
                    act.commit_next(ctx);
                }
            }
        }));
        // A commit that fails before its COMMIT drops `wrote`: the next one may start all the same.
        ctx.spawn(
            actix::fut::wrap_future::<_, Self>(wrote_rx).map(move |_, act, ctx| act.writes_done(id, ctx)),
        );
        let pool = self.pool.clone();
        ctx.spawn(actix::fut::wrap_future::<_, Self>(commit_and_reply(pool, batch, signals, ahead)).map(
            move |committed_ahead, act, ctx| {
                if let Some(committed) = committed_ahead {
                    act.back_off(committed);
                }
                act.commit_done(id, ctx)
            },
        ));
    }

    /// After a group written ahead: reset the back-off if it committed so, else skip the next
    /// groups' chance and double the next skip (see `ahead_skips`).
    fn back_off(&mut self, committed_ahead: bool) {
        if committed_ahead {
            self.next_ahead_skips = 1;
        } else {
            self.ahead_skips = self.next_ahead_skips;
            self.next_ahead_skips = (self.next_ahead_skips * 2).min(MAX_AHEAD_SKIPS);
        }
    }

    fn commit_done(&mut self, id: u64, ctx: &mut Context<Self>) {
        self.in_flight -= 1;
        self.writes_done(id, ctx);
    }

    fn writes_done(&mut self, id: u64, ctx: &mut Context<Self>) {
        if self.writing == Some(id) {
            self.writing = None;
        }
        self.commit_next(ctx);
    }
}

impl Actor for ChangeLog {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        // Handlers only enqueue, so a deep mailbox costs little and keeps pushers from stalling.
        ctx.set_mailbox_capacity(4096);
    }
}

impl Handler<Push> for ChangeLog {
    type Result = ResponseFuture<ApiResult<PushOutcome>>;

    fn handle(&mut self, push: Push, ctx: &mut Self::Context) -> Self::Result {
        let (reply, answer) = oneshot::channel();
        self.pending.push_back(Waiting::Push(Pending { push, reply, queued_at: Instant::now() }));
        self.commit_next(ctx);
        Box::pin(async move {
            answer.await.unwrap_or_else(|_| Err(ApiError::internal("change log dropped a push")))
        })
    }
}

impl Handler<CommitAttachment> for ChangeLog {
    type Result = ResponseFuture<ApiResult<AttachmentCommit>>;

    fn handle(&mut self, msg: CommitAttachment, ctx: &mut Self::Context) -> Self::Result {
        let (reply, answer) = oneshot::channel();
        self.pending.push_back(Waiting::Attachment(msg, reply));
        self.commit_next(ctx);
        Box::pin(async move {
            answer.await.unwrap_or_else(|_| Err(ApiError::internal("change log dropped an attachment")))
        })
    }
}

impl Handler<ResetRepository> for ChangeLog {
    type Result = ResponseFuture<ApiResult<Head>>;

    fn handle(&mut self, ResetRepository(origin): ResetRepository, ctx: &mut Self::Context) -> Self::Result {
        let (reply, answer) = oneshot::channel();
        self.pending.push_back(Waiting::Reset(origin, reply));
        self.commit_next(ctx);
        Box::pin(async move {
            answer.await.unwrap_or_else(|_| Err(ApiError::internal("change log dropped a reset")))
        })
    }
}

async fn reset(pool: &Pool, origin: &Origin) -> ApiResult<Head> {
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
async fn commit_attachment(pool: &Pool, new: NewAttachment) -> ApiResult<AttachmentCommit> {
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    records::lock_change_log(&tx).await?;
    if let Some(existing) = attachments::find(&tx, &new.id).await? {
        if existing.sha256 == new.sha256 {
            return Ok(AttachmentCommit { row: existing, created: false });
        }
        return Err(ApiError::of(ErrorCode::AttachmentExists));
    }
    let change_id = records::head(&tx).await? + 1;
    let row = attachments::insert(&tx, &new, change_id).await?;
    records::set_head(&tx, change_id).await?;
    tx.commit().await?;
    Ok(AttachmentCommit { row, created: true })
}

/// Commits a batch; if the batch as a whole fails for a reason other than the database being
/// away, each push is retried alone so that one bad push cannot fail the others. Returns whether a
/// batch written ahead committed so (`None` when it was not written ahead).
async fn commit_and_reply(
    pool: Pool,
    batch: Vec<Pending>,
    mut signals: Signals,
    ahead: Option<Ahead>,
) -> Option<bool> {
    crate::monitoring::group_commit(batch.len());
    let pushes: Vec<&Push> = batch.iter().map(|p| &p.push).collect();
    let mut phases = phases_of(&batch);
    match commit(&pool, &pushes, &mut phases, &mut signals, ahead).await {
        Ok(outcomes) => {
            for (pending, outcome) in batch.into_iter().zip(outcomes) {
                let _ = pending.reply.send(outcome);
            }
            phases.lap("reply");
            phases.log();
        }
        Err(e) if batch.len() > 1 && e.code != ErrorCode::ServiceUnavailable => {
            // A group written ahead of this one gives up now rather than after the retries.
            signals.committed = None;
            tracing::warn!(error = %e, cause = %e.cause_chain(), pushes = batch.len(),
                "group commit failed; committing its pushes one by one");
            for pending in batch {
                let mut signals = Signals::default();
                let outcome =
                    match commit(&pool, &[&pending.push], &mut phases_of(&[]), &mut signals, None).await {
                        Ok(mut outcomes) => {
                            outcomes.pop().unwrap_or_else(|| Err(ApiError::internal("empty commit")))
                        }
                        Err(e) => Err(e),
                    };
                let _ = pending.reply.send(outcome);
            }
        }
        Err(e) => {
            // One failure answers every push of the batch, each answer with the whole chain.
            let unavailable = e.code == ErrorCode::ServiceUnavailable;
            let cause = SharedError::new(e);
            for pending in batch {
                let copy = if unavailable {
                    ApiError::unavailable(cause.clone())
                } else {
                    ApiError::internal(cause.clone())
                };
                let _ = pending.reply.send(Err(copy));
            }
        }
    }
    signals.committed_ahead
}

/// One transaction for the whole batch: reads what the plan needs, writes what it planned. The
/// outer error fails the batch; inner errors are per push. With `ahead`, the batch is first
/// written ahead of the commit before it, and committed the usual way if that does not hold.
async fn commit(
    pool: &Pool,
    pushes: &[&Push],
    phases: &mut CommitPhases,
    signals: &mut Signals,
    ahead: Option<Ahead>,
) -> ApiResult<Vec<ApiResult<PushOutcome>>> {
    let mut client = pool.get().await?;
    phases.lap("connection");
    if let Some(ahead) = ahead {
        let tx = client.transaction().await?;
        match commit_ahead(tx, pushes, ahead, phases, signals).await {
            Ok(Some(outcomes)) => {
                crate::monitoring::commit_ahead(true);
                signals.committed_ahead = Some(true);
                return Ok(outcomes);
            }
            Ok(None) => {}
            Err(e) if e.code == ErrorCode::ServiceUnavailable => return Err(e),
            Err(e) => {
                // A row another process writes (the transaction then rolls back as it is dropped).
                tracing::debug!(error = %e, cause = %e.cause_chain(), "writing ahead failed");
            }
        }
        crate::monitoring::commit_ahead(false);
        // A group written ahead of this one planned from the head this attempt would have
        // committed: it must give up now, not once this batch is redone. Its rows may hold
        // change_ids that the commit holding the lock now is waiting to insert, while the redo
        // waits for that commit: a wait PostgreSQL cannot see through this process.
        signals.committed = None;
        signals.committed_ahead = Some(false);
    }
    let tx = client.transaction().await?;
    phases.lap("begin");
    // The records of every push are read as if all applied: replays are rare, and reading with
    // the lock saves a round trip that every commit would otherwise pay.
    let (clients, transmission_ids) = plan::transmission_keys(pushes);
    let (all_ids, all_need_data) = plan::records_to_read(pushes, &vec![Decision::Apply; pushes.len()]);
    let inputs = commit::lock_and_read(&tx, &clients, &transmission_ids, &all_ids, &all_need_data).await?;
    phases.lap("lock_and_read");
    let Head { change_id: head, repository_generation } = inputs.head;
    let decisions = plan::decide(pushes, inputs.transmissions, repository_generation);
    let mut states = inputs.states;
    let (ids, _) = plan::records_to_read(pushes, &decisions);
    if ids.len() != all_ids.len() {
        // Only the records this batch writes count as overwritten.
        states.retain(|id, _| ids.binary_search(&id.as_str()).is_ok());
    }

    // Server time is the commit time; microseconds, as the database stores it.
    let now = Utc::now().trunc_subsecs(6);
    let plan = plan::plan(pushes, &decisions, &states, head, repository_generation, now);
    signals.planned(Head { change_id: plan.head, repository_generation });
    // Records that existed before this batch and that it overwrites: their current state is
    // archived as a superseded revision.
    let overwritten: Vec<&str> = states.keys().map(String::as_str).collect();
    phases.lap("plan");
    commit::write_plan(&tx, pushes, &plan, &overwritten, now, phases).await?;
    signals.wrote();
    tx.commit().await?;
    signals.committed();
    phases.lap("commit");
    Ok(plan.outcomes(decisions).into_iter().map(answer).collect())
}

/// Writes a batch of new records ahead of the commit before it (see [`Tail`]): `None` when it
/// rolled back because the batch overwrites stored records, the commit before failed, or another
/// commit came in between; the caller then commits it the usual way.
async fn commit_ahead(
    tx: deadpool_postgres::Transaction<'_>,
    pushes: &[&Push],
    ahead: Ahead,
    phases: &mut CommitPhases,
    signals: &mut Signals,
) -> ApiResult<Option<Vec<ApiResult<PushOutcome>>>> {
    let (clients, transmission_ids) = plan::transmission_keys(pushes);
    let (ids, need_data) = plan::records_to_read(pushes, &vec![Decision::Apply; pushes.len()]);
    let (transmissions, states) =
        commit::read_ahead(&tx, &clients, &transmission_ids, &ids, &need_data).await?;
    phases.lap("read_ahead");
    if !states.is_empty() {
        // Overwrites move the kept statistics by the stored rows, which needs the lock first.
        tx.rollback().await?;
        return Ok(None);
    }
    let Head { change_id: head, repository_generation } = ahead.base;
    let decisions = plan::decide(pushes, transmissions, repository_generation);
    let now = Utc::now().trunc_subsecs(6);
    let plan = plan::plan(pushes, &decisions, &states, head, repository_generation, now);
    signals.planned(Head { change_id: plan.head, repository_generation });
    phases.lap("plan");
    commit::write_ahead(&tx, pushes, &plan, now, phases).await?;
    let predecessor_committed = ahead.predecessor.await.is_ok();
    phases.lap("wait_for_predecessor");
    if !predecessor_committed || !commit::try_lock_at(&tx, ahead.base).await? {
        tx.rollback().await?;
        return Ok(None);
    }
    phases.lap("lock");
    commit::finish_ahead(&tx, &plan).await?;
    phases.lap("statistics_head");
    signals.wrote();
    tx.commit().await?;
    signals.committed();
    phases.lap("commit");
    Ok(Some(plan.outcomes(decisions).into_iter().map(answer).collect()))
}

/// A planned outcome as the sender's answer.
fn answer(outcome: Outcome) -> ApiResult<PushOutcome> {
    match outcome {
        Outcome::Applied(result) => Ok(PushOutcome { result, replayed: false }),
        Outcome::Replayed(result) => Ok(PushOutcome { result, replayed: true }),
        Outcome::Mismatch => Err(ApiError::of(ErrorCode::TransmissionMismatch)),
        Outcome::ResetRequired(generation) => Err(ApiError::reset_required(generation)),
        Outcome::Lost => Err(ApiError::internal("missing push result")),
    }
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
