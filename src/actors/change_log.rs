//! The `ChangeLog` actor owns change_id allocation and commit order (ARCHITECTURE.md, "the change
//! log"). Pushes queue in its mailbox; every push waiting while a commit runs joins the next group
//! commit: one transaction, under one advisory lock, that assigns change_ids in order, writes
//! records, revisions and transmission results, moves the head, commits, then answers each sender.

use std::collections::{HashMap, VecDeque};

use actix::prelude::*;
use chrono::{SubsecRound, Utc};
use deadpool_postgres::Pool;
use tokio::sync::oneshot;
use tokio_postgres::types::Json;

use crate::db::attachments::{self, AttachmentRow, NewAttachment};
use crate::db::records::{self, Head, RevisionBatch};
use crate::domain::sync::{empty_object, IncomingRecord, PushResult, Warning};
use crate::error::{ApiError, ApiResult, ErrorCode, SharedError};

/// Bounds on one group commit: enough to amortise the transaction, small enough to keep latency
/// flat. The byte bound also keeps every statement far below PostgreSQL's 1 GB message limit
/// whatever the records weigh (a single push is bounded by MAX_JSON_BODY_BYTES).
const MAX_PUSHES_PER_COMMIT: usize = 256;
const MAX_RECORDS_PER_COMMIT: usize = 20_000;
const MAX_DATA_BYTES_PER_COMMIT: usize = 16 << 20;

/// A validated push, ready to commit.
pub struct Push {
    pub client_id: String,
    pub transmission_id: Option<String>,
    pub fingerprint: Vec<u8>,
    pub records: Vec<IncomingRecord>,
    /// Warnings found before the commit (decoding, schema checks), by record index.
    pub warnings: Vec<(usize, Warning)>,
    pub pushed_by: String,
    /// The repository generation the client holds, when it sent one (API.md 17.2).
    pub expected_generation: Option<i64>,
}

impl Push {
    /// The JSON text the push stores, which dominates a commit's size.
    fn data_bytes(&self) -> usize {
        self.records.iter().map(|r| r.data.as_ref().map_or(0, |d| d.get().len())).sum()
    }
}

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

/// Empties the repository and raises its generation (API.md 17.3), ordered with every commit.
struct ResetRepository;

impl Message for ResetRepository {
    type Result = ApiResult<Head>;
}

/// Anything waiting for the change log: pushes are committed in groups, the rest one by one.
enum Waiting {
    Push(Pending),
    Attachment(CommitAttachment, oneshot::Sender<ApiResult<AttachmentCommit>>),
    Reset(oneshot::Sender<ApiResult<Head>>),
}

/// The 409 a client gets when its generation is not the server's.
pub fn reset_required(server_generation: i64) -> ApiError {
    ApiError::of(ErrorCode::RepositoryResetRequired)
        .with_header(
            actix_web::http::header::HeaderName::from_static("x-repository-generation"),
            server_generation.to_string(),
        )
        .with_extra("repository_generation", server_generation)
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
    pub async fn reset_repository(&self) -> ApiResult<Head> {
        super::ask(&self.0, "change log", ResetRepository).await
    }
}

pub struct ChangeLog {
    pool: Pool,
    pending: VecDeque<Waiting>,
    committing: bool,
}

impl ChangeLog {
    pub fn new(pool: Pool) -> Self {
        ChangeLog { pool, pending: VecDeque::new(), committing: false }
    }

    /// Starts the next commit unless one is running: a group of waiting pushes, or one attachment.
    fn commit_next(&mut self, ctx: &mut Context<Self>) {
        if self.committing || self.pending.is_empty() {
            return;
        }
        self.committing = true;
        let pool = self.pool.clone();
        if let Some(waiting) = self.pending.pop_front_if(|w| !matches!(w, Waiting::Push(..))) {
            let work = async move {
                match waiting {
                    Waiting::Attachment(msg, reply) => {
                        let _ = reply.send(commit_attachment(&pool, msg.0).await);
                    }
                    Waiting::Reset(reply) => {
                        let _ = reply.send(reset(&pool).await);
                    }
                    Waiting::Push(p) => commit_and_reply(pool, vec![p]).await,
                }
            };
            ctx.spawn(actix::fut::wrap_future::<_, Self>(work).map(|_, act, ctx| {
                act.committing = false;
                act.commit_next(ctx);
            }));
            return;
        }
        let mut batch = Vec::new();
        let mut records = 0;
        let mut bytes = 0;
        while let Some(Waiting::Push(next)) = self.pending.front() {
            let n = next.push.records.len();
            let size = next.push.data_bytes();
            if !batch.is_empty()
                && (batch.len() >= MAX_PUSHES_PER_COMMIT
                    || records + n > MAX_RECORDS_PER_COMMIT
                    || bytes + size > MAX_DATA_BYTES_PER_COMMIT)
            {
                break;
            }
            records += n;
            bytes += size;
            if let Some(Waiting::Push(p)) = self.pending.pop_front() {
                batch.push(p);
            }
        }
        ctx.spawn(actix::fut::wrap_future::<_, Self>(commit_and_reply(pool, batch)).map(|_, act, ctx| {
            act.committing = false;
            act.commit_next(ctx);
        }));
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
        self.pending.push_back(Waiting::Push(Pending { push, reply }));
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

    fn handle(&mut self, _: ResetRepository, ctx: &mut Self::Context) -> Self::Result {
        let (reply, answer) = oneshot::channel();
        self.pending.push_back(Waiting::Reset(reply));
        self.commit_next(ctx);
        Box::pin(async move {
            answer.await.unwrap_or_else(|_| Err(ApiError::internal("change log dropped a reset")))
        })
    }
}

async fn reset(pool: &Pool) -> ApiResult<Head> {
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    records::lock_change_log(&tx).await?;
    let head = records::reset_repository(&tx).await?;
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
/// away, each push is retried alone so that one bad push cannot fail the others.
async fn commit_and_reply(pool: Pool, batch: Vec<Pending>) {
    crate::monitoring::group_commit(batch.len());
    let pushes: Vec<&Push> = batch.iter().map(|p| &p.push).collect();
    match commit(&pool, &pushes).await {
        Ok(outcomes) => {
            for (pending, outcome) in batch.into_iter().zip(outcomes) {
                let _ = pending.reply.send(outcome);
            }
        }
        Err(e) if batch.len() > 1 && e.code != ErrorCode::ServiceUnavailable => {
            tracing::warn!(error = %e, cause = %e.cause_chain(), pushes = batch.len(),
                "group commit failed; committing its pushes one by one");
            for pending in batch {
                let outcome = match commit(&pool, &[&pending.push]).await {
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
}

/// A record's latest state while a batch is built: as stored, or as an earlier push of the same
/// batch left it (then `batch_index` is that revision's row in the batch).
#[derive(Clone, Copy)]
struct Latest<'a> {
    change_id: i64,
    created_at: Option<chrono::DateTime<Utc>>,
    created_by: &'a str,
    data: Option<&'a serde_json::value::RawValue>,
    batch_index: Option<usize>,
}

/// What a push turns into once the stored transmissions are known.
enum Decision {
    Apply,
    Replay(PushResult),
    /// A duplicate of an earlier push in the same batch: it replays that push's result.
    SameAs(usize),
    Mismatch,
    /// The client holds another repository generation: nothing is stored.
    ResetRequired,
}

/// One transaction for the whole batch. The outer error fails the batch; inner errors are per push.
async fn commit(pool: &Pool, pushes: &[&Push]) -> ApiResult<Vec<ApiResult<PushOutcome>>> {
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    records::lock_change_log(&tx).await?;
    let Head { change_id: head, repository_generation } = records::head_and_generation(&tx).await?;

    let decisions = decide(&tx, pushes, repository_generation).await?;

    let applied =
        || pushes.iter().zip(&decisions).filter(|(_, d)| matches!(d, Decision::Apply)).map(|(p, _)| p);
    let mut ids: Vec<&str> = applied().flat_map(|p| p.records.iter().map(|r| r.id.as_str())).collect();
    let need_data: Vec<&str> = applied()
        .flat_map(|p| p.records.iter().filter(|r| r.data.is_none()).map(|r| r.id.as_str()))
        .collect();
    ids.sort_unstable();
    ids.dedup();
    let stored_states = records::current_states(&tx, &ids, &need_data).await?;
    let mut latest: HashMap<&str, Latest> = stored_states
        .iter()
        .map(|(id, s)| {
            let state = Latest {
                change_id: s.change_id,
                created_at: s.created_at,
                created_by: &s.created_by,
                data: s.data.as_deref(),
                batch_index: None,
            };
            (id.as_str(), state)
        })
        .collect();

    // Server time is the commit time; microseconds, as the database stores it.
    let now = Utc::now().trunc_subsecs(6);
    let empty = empty_object();
    let mut next = head;
    let mut revisions = RevisionBatch::with_capacity(applied().map(|p| p.records.len()).sum());
    let mut superseded_in_batch = Vec::new();
    let mut results: Vec<Option<PushResult>> = vec![None; pushes.len()];
    for (i, (push, decision)) in pushes.iter().zip(&decisions).enumerate() {
        if !matches!(decision, Decision::Apply) {
            continue;
        }
        let mut items = Vec::with_capacity(push.records.len());
        let mut warnings = push.warnings.clone();
        for (index, rec) in push.records.iter().enumerate() {
            next += 1;
            let prev = latest.get(rec.id.as_str()).copied();
            let overwrote = prev.map(|s| s.change_id);
            let conflict = match (rec.base_version, overwrote) {
                (Some(base), Some(current)) if base < current => {
                    warnings.push((index, Warning::conflict_overwritten(&rec.id, base, current)));
                    true
                }
                _ => false,
            };
            let data = rec.data.as_deref().or_else(|| prev.and_then(|s| s.data)).unwrap_or(&empty);
            let created_at = rec.created_at.or_else(|| prev.and_then(|s| s.created_at)).or(Some(now));
            let created_by = prev.map_or(push.pushed_by.as_str(), |s| s.created_by);
            if let Some(earlier) = prev.and_then(|s| s.batch_index) {
                superseded_in_batch.push(earlier);
            }

            latest.insert(
                &rec.id,
                Latest {
                    change_id: next,
                    created_at,
                    created_by,
                    data: Some(data),
                    batch_index: Some(revisions.change_id.len()),
                },
            );
            revisions.change_id.push(next);
            revisions.record_id.push(&rec.id);
            revisions.form_type.push(&rec.form_type);
            revisions.form_version.push(&rec.form_version);
            revisions.data.push(Json(data));
            revisions.deleted.push(rec.deleted);
            revisions.created_at.push(created_at);
            revisions.updated_at.push(rec.updated_at.or(Some(now)));
            revisions.geolocation.push(rec.geolocation.as_ref());
            revisions.author.push(rec.author.as_deref());
            revisions.device_id.push(rec.device_id.as_deref());
            revisions.tags.push(rec.tags.as_deref().map(Json));
            revisions.client_id.push(&push.client_id);
            revisions.transmission_id.push(push.transmission_id.as_deref());
            revisions.pushed_by.push(&push.pushed_by);
            revisions.created_by.push(created_by);
            revisions.overwrote_version.push(overwrote);
            revisions.conflict.push(conflict);
            items.push((rec.id.clone(), next));
        }
        warnings.sort_by_key(|(index, _)| *index);
        results[i] = Some(PushResult {
            head: 0,
            repository_generation,
            items,
            warnings: warnings.into_iter().map(|(_, w)| w).collect(),
        });
    }
    for result in results.iter_mut().flatten() {
        result.head = next;
    }

    // Records that existed before this batch and that it overwrites: their current state is
    // archived as a superseded revision.
    let overwritten_ids: Vec<&str> = stored_states.keys().map(String::as_str).collect();
    records::write_revisions(&tx, &revisions, &superseded_in_batch, &overwritten_ids, now).await?;
    let mut t_clients = Vec::new();
    let mut t_ids = Vec::new();
    let mut t_prints = Vec::new();
    let mut t_results = Vec::new();
    for ((push, decision), result) in pushes.iter().zip(&decisions).zip(&results) {
        if let (Decision::Apply, Some(tid), Some(result)) = (decision, &push.transmission_id, result) {
            t_clients.push(push.client_id.as_str());
            t_ids.push(tid.as_str());
            t_prints.push(push.fingerprint.as_slice());
            t_results.push(Json(result));
        }
    }
    records::insert_transmissions(&tx, &t_clients, &t_ids, &t_prints, &t_results).await?;
    if next != head {
        records::set_head(&tx, next).await?;
    }
    tx.commit().await?;

    Ok(decisions
        .into_iter()
        .enumerate()
        .map(|(i, decision)| match decision {
            Decision::Apply => results[i]
                .clone()
                .map(|result| PushOutcome { result, replayed: false })
                .ok_or_else(|| ApiError::internal("missing push result")),
            Decision::SameAs(j) => results[j]
                .clone()
                .map(|result| PushOutcome { result, replayed: true })
                .ok_or_else(|| ApiError::internal("missing push result")),
            Decision::Replay(result) => Ok(PushOutcome { result, replayed: true }),
            Decision::Mismatch => Err(ApiError::of(ErrorCode::TransmissionMismatch)),
            Decision::ResetRequired => Err(reset_required(repository_generation)),
        })
        .collect())
}

/// Replays, mismatches and in-batch duplicates, decided after the lock so that concurrent
/// duplicates (in this batch, a later batch or another process) see each other's results.
async fn decide(
    tx: &deadpool_postgres::Transaction<'_>,
    pushes: &[&Push],
    repository_generation: i64,
) -> ApiResult<Vec<Decision>> {
    let keyed: Vec<(String, String)> = pushes
        .iter()
        .filter_map(|p| p.transmission_id.as_ref().map(|t| (p.client_id.clone(), t.clone())))
        .collect();
    let (clients, tids): (Vec<String>, Vec<String>) = keyed.into_iter().unzip();
    let stored: HashMap<(String, String), records::StoredTransmission> =
        records::find_transmissions(tx, &clients, &tids)
            .await?
            .into_iter()
            .map(|t| ((t.client_id.clone(), t.transmission_id.clone()), t))
            .collect();
    let mut first_in_batch: HashMap<(String, String), usize> = HashMap::new();
    let mut decisions = Vec::with_capacity(pushes.len());
    for (i, push) in pushes.iter().enumerate() {
        if push.expected_generation.is_some_and(|g| g != repository_generation) {
            decisions.push(Decision::ResetRequired);
            continue;
        }
        let Some(tid) = &push.transmission_id else {
            decisions.push(Decision::Apply);
            continue;
        };
        let key = (push.client_id.clone(), tid.clone());
        let decision = if let Some(s) = stored.get(&key) {
            if s.fingerprint == push.fingerprint {
                Decision::Replay(s.result.clone())
            } else {
                Decision::Mismatch
            }
        } else if let Some(&j) = first_in_batch.get(&key) {
            if pushes[j].fingerprint == push.fingerprint {
                Decision::SameAs(j)
            } else {
                Decision::Mismatch
            }
        } else {
            first_in_batch.insert(key, i);
            Decision::Apply
        };
        decisions.push(decision);
    }
    Ok(decisions)
}
