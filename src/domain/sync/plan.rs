//! The planning half of a group commit (docs/architecture.md, "the commit path of a push").
//!
//! Given the pushes waiting at the change log, what the database holds for their transmissions
//! and records, the head and the commit time, these functions decide what each push becomes and
//! which change_ids, revisions and results the commit writes. They do no I/O: the `ChangeLog`
//! actor reads their inputs and writes their plan inside one transaction, under the change-log
//! lock, so that the rules below (and their property tests) are the whole of the commit's logic:
//!
//! - change_ids are dense and ordered: the applied records get `head + 1 ..= head + n` in push
//!   order, then record order, and the new head is the last of them;
//! - one revision chain per record: each revision overwrites the one before it, whether that is
//!   the stored state or an earlier revision of the same batch (which is then superseded), and a
//!   record keeps its owner and creation time;
//! - retries are idempotent: a transmission already stored replays its result, a second copy in
//!   the same batch replays the first's, and another payload under the same id is a mismatch; a
//!   stored result that cannot be read fails that push alone, and is never planned over;
//! - a stored record its pusher may not change (docs/api.md §20.4) is refused alone: it gets no
//!   revision, the rest of the push lands, and the refusal takes the next change_id for the
//!   tombstone addressed to the pusher (ids stay dense).

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasher, RandomState};

use chrono::{DateTime, Utc};
use hashbrown::HashTable;
use serde_json::value::RawValue;

use super::{IncomingRecord, PushResult, Refused, Warning};

/// A validated push, ready to commit.
#[derive(Debug, Clone)]
pub struct Push {
    pub client_id: String,
    pub transmission_id: Option<String>,
    pub fingerprint: Vec<u8>,
    pub records: Vec<IncomingRecord>,
    /// Warnings found before the commit (decoding, schema checks), by record index.
    pub warnings: Vec<(usize, Warning)>,
    pub pushed_by: String,
    /// The repository generation the client holds, when it sent one (docs/api.md §17.2).
    pub expected_generation: Option<i64>,
}

impl Push {
    /// The JSON text the push stores, which dominates a commit's size.
    pub fn data_bytes(&self) -> usize {
        self.records.iter().map(|r| r.data().map_or(0, str::len)).sum()
    }
}

/// A stored transmission result, for replay or mismatch detection.
#[derive(Debug, Clone)]
pub struct StoredTransmission {
    pub client_id: String,
    pub transmission_id: String,
    pub fingerprint: Vec<u8>,
    /// What was stored, as read back: a result this server cannot read (damaged, or stored in a
    /// shape it does not know) cannot be replayed, and the push must not be applied again.
    pub result: Result<PushResult, Unreadable>,
}

/// Why a stored push result cannot be read.
#[derive(Debug, Clone, PartialEq)]
pub struct Unreadable(pub String);

/// What the commit needs to know about a record that already exists.
#[derive(Debug, Clone)]
pub struct CurrentState {
    pub change_id: i64,
    pub created_at: Option<DateTime<Utc>>,
    pub created_by: String,
    /// Loaded only for records a deletion without data will touch (see [`records_to_read`]).
    pub data: Option<Box<RawValue>>,
}

/// What a push turns into once the stored transmissions are known.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    Apply,
    Replay(PushResult),
    /// A retry of a stored transmission whose result cannot be read.
    Unreadable(Unreadable),
    /// A duplicate of an earlier push in the same batch: it replays that push's result.
    SameAs(usize),
    Mismatch,
    /// The client holds another repository generation: nothing is stored.
    ResetRequired,
}

/// The (client_id, transmission_id) pairs whose stored results [`decide`] needs.
pub fn transmission_keys(pushes: &[&Push]) -> (Vec<String>, Vec<String>) {
    pushes.iter().filter_map(|p| p.transmission_id.as_ref().map(|t| (p.client_id.clone(), t.clone()))).unzip()
}

/// Replays, mismatches and in-batch duplicates. Decided under the lock, so that concurrent
/// duplicates (in this batch, a later batch or another process) see each other's results.
pub fn decide(
    pushes: &[&Push],
    stored: Vec<StoredTransmission>,
    repository_generation: i64,
) -> Vec<Decision> {
    let stored: HashMap<(String, String), StoredTransmission> =
        stored.into_iter().map(|t| ((t.client_id.clone(), t.transmission_id.clone()), t)).collect();
    let mut first_in_batch: HashMap<(&str, &str), usize> = HashMap::new();
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
        let decision = if let Some(s) = stored.get(&(push.client_id.clone(), tid.clone())) {
            if s.fingerprint == push.fingerprint {
                match &s.result {
                    Ok(result) => Decision::Replay(result.clone()),
                    Err(unreadable) => Decision::Unreadable(unreadable.clone()),
                }
            } else {
                Decision::Mismatch
            }
        } else if let Some(&j) = first_in_batch.get(&(push.client_id.as_str(), tid.as_str())) {
            if pushes[j].fingerprint == push.fingerprint {
                Decision::SameAs(j)
            } else {
                Decision::Mismatch
            }
        } else {
            first_in_batch.insert((&push.client_id, tid), i);
            Decision::Apply
        };
        decisions.push(decision);
    }
    decisions
}

fn applied<'p, 'a>(pushes: &'p [&'a Push], decisions: &'p [Decision]) -> impl Iterator<Item = &'a Push> + 'p {
    pushes.iter().zip(decisions).filter(|(_, d)| matches!(d, Decision::Apply)).map(|(p, _)| *p)
}

/// The records whose stored state the plan needs, sorted and distinct, and among them those whose
/// data it needs too (deletions that send none keep the stored data).
pub fn records_to_read<'a>(pushes: &[&'a Push], decisions: &[Decision]) -> (Vec<&'a str>, Vec<&'a str>) {
    // Made room for at once: grown by doubling, a list of 300,000 ids left 5 MB of its smaller
    // copies to the allocator.
    let mut ids = Vec::with_capacity(applied(pushes, decisions).map(|p| p.records.len()).sum());
    ids.extend(applied(pushes, decisions).flat_map(|p| p.records.iter().map(IncomingRecord::id)));
    let need_data: Vec<&str> = applied(pushes, decisions)
        .flat_map(|p| p.records.iter().filter(|r| r.data().is_none()).map(IncomingRecord::id))
        .collect();
    ids.sort_unstable();
    ids.dedup();
    (ids, need_data)
}

/// One revision the commit writes, in change_id order, as [`Plan::revision`] gives it.
#[derive(Debug, Clone, Copy)]
pub struct PlannedRevision<'a> {
    pub push: &'a Push,
    pub record: &'a IncomingRecord,
    pub change_id: i64,
    /// Canonical JSON text.
    pub data: &'a str,
    pub created_at: Option<DateTime<Utc>>,
    pub updated_at: Option<DateTime<Utc>>,
    /// The record's owner: whoever pushed its first revision.
    pub created_by: &'a str,
    /// The change_id this revision replaces, if the record existed.
    pub overwrote: Option<i64>,
    /// The client based its change on an older revision than the one it overwrote.
    pub conflict: bool,
}

/// A revision as the plan keeps it: 32 bytes where [`PlannedRevision`] takes 104, since a push
/// of 300,000 new records holds one per record for the whole commit (docs/api.md §18.4). What
/// the record does not say itself comes from the state it overwrites, kept once per overwrite
/// in `Plan::overwritten`, or from the push and the commit time.
#[derive(Clone, Copy)]
struct Revision<'a> {
    push: &'a Push,
    record: &'a IncomingRecord,
    change_id: i64,
    /// Index into `Plan::overwritten`, or [`NEW_RECORD`].
    overwrote: u32,
    conflict: bool,
}

/// `Revision::overwrote` of a record that did not exist.
const NEW_RECORD: u32 = u32::MAX;

/// A row of the plan in 4 bytes. A group commit's records come from bodies the body budget
/// admitted, some 20 bytes each at least: far fewer than 4 billion, so this never saturates.
fn row(index: usize) -> u32 {
    u32::try_from(index).unwrap_or(u32::MAX)
}

/// A record a push may not change, and the change_id of the tombstone addressed to its pusher.
#[derive(Debug, Clone, Copy)]
pub struct PlannedRefusal<'a> {
    pub pushed_by: &'a str,
    pub record_id: &'a str,
    pub change_id: i64,
}

/// The (pusher, record id) pairs of stored records that pusher may not change.
pub type OutOfScope = HashSet<(String, String)>;

/// Everything a group commit writes.
pub struct Plan<'a> {
    /// In change_id order; read through [`Plan::revision`].
    revisions: Vec<Revision<'a>>,
    /// The states the revisions overwrite, stored or of this batch.
    overwritten: Vec<Latest<'a>>,
    /// The commit time: the timestamps a record does not send.
    now: DateTime<Utc>,
    pub refusals: Vec<PlannedRefusal<'a>>,
    /// Indexes into `revisions` of those that a later revision of the same record replaces: they
    /// go to the history, the others become current states.
    pub superseded_in_batch: Vec<usize>,
    /// Per push: its result when it is applied.
    pub results: Vec<Option<PushResult>>,
    /// The head after the commit (unchanged when nothing is applied).
    pub head: i64,
    pub repository_generation: i64,
}

/// A record's latest state while the plan is built: as stored, or as an earlier revision of the
/// same batch left it (then `batch_index` is that revision's row).
#[derive(Clone, Copy)]
struct Latest<'a> {
    change_id: i64,
    created_at: Option<DateTime<Utc>>,
    created_by: &'a str,
    data: Option<&'a str>,
    batch_index: Option<usize>,
}

/// The data of a deletion whose record never had any.
const EMPTY_OBJECT: &str = "{}";

/// Assigns change_ids and builds the revisions and results of the applied pushes. `now` is the
/// commit time, in the database's precision.
pub fn plan<'a>(
    pushes: &[&'a Push],
    decisions: &[Decision],
    stored: &'a HashMap<String, CurrentState>,
    head: i64,
    repository_generation: i64,
    now: DateTime<Utc>,
    out_of_scope: &OutOfScope,
) -> Plan<'a> {
    let revisions = applied(pushes, decisions).map(|p| p.records.len()).sum();
    let mut plan = Plan {
        revisions: Vec::with_capacity(revisions),
        overwritten: Vec::new(),
        now,
        refusals: Vec::new(),
        superseded_in_batch: Vec::new(),
        results: vec![None; pushes.len()],
        head,
        repository_generation,
    };
    // The last revision of each record so far, by its row: a record of a big push is one index
    // of 4 bytes, its id read from the row (docs/api.md §18.4), made room for at once.
    let mut written = Written { rows: HashTable::with_capacity(revisions), hasher: RandomState::new() };
    for (i, (push, decision)) in pushes.iter().zip(decisions).enumerate() {
        if matches!(decision, Decision::Apply) {
            plan.results[i] = Some(plan.apply(push, stored, &mut written, out_of_scope));
        }
    }
    let head = plan.head;
    for result in plan.results.iter_mut().flatten() {
        result.head = head;
    }
    plan
}

/// The row of each record's last revision in the batch so far.
struct Written {
    rows: HashTable<u32>,
    hasher: RandomState,
}

impl<'a> Plan<'a> {
    /// The revision at `index` (in change_id order) with every column it writes.
    pub fn revision(&self, index: usize) -> PlannedRevision<'a> {
        let r = self.revisions[index];
        let prev = self.overwritten.get(r.overwrote as usize);
        PlannedRevision {
            push: r.push,
            record: r.record,
            change_id: r.change_id,
            data: r.record.data().or_else(|| prev.and_then(|s| s.data)).unwrap_or(EMPTY_OBJECT),
            created_at: r.record.created_at.or_else(|| prev.and_then(|s| s.created_at)).or(Some(self.now)),
            updated_at: r.record.updated_at.or(Some(self.now)),
            created_by: prev.map_or(r.push.pushed_by.as_str(), |s| s.created_by),
            overwrote: prev.map(|s| s.change_id),
            conflict: r.conflict,
        }
    }

    /// Every revision, in change_id order.
    pub fn revisions(&self) -> impl ExactSizeIterator<Item = PlannedRevision<'a>> + '_ {
        (0..self.revisions.len()).map(|i| self.revision(i))
    }

    /// How many revisions the commit writes.
    pub fn revision_count(&self) -> usize {
        self.revisions.len()
    }

    /// The id of the revision at `index`, without the rest of it.
    pub fn revision_id(&self, index: usize) -> &'a str {
        self.revisions[index].record.id()
    }

    /// The state the next revision of `id` overwrites: its last in this batch, else the stored one.
    fn latest(
        &self,
        id: &str,
        stored: &'a HashMap<String, CurrentState>,
        written: &Written,
    ) -> Option<Latest<'a>> {
        let hash = written.hasher.hash_one(id);
        match written.rows.find(hash, |&row| self.revisions[row as usize].record.id() == id) {
            Some(&row) => {
                let r = self.revision(row as usize);
                Some(Latest {
                    change_id: r.change_id,
                    created_at: r.created_at,
                    created_by: r.created_by,
                    data: Some(r.data),
                    batch_index: Some(row as usize),
                })
            }
            None => stored.get(id).map(|s| Latest {
                change_id: s.change_id,
                created_at: s.created_at,
                created_by: &s.created_by,
                data: s.data.as_deref().map(RawValue::get),
                batch_index: None,
            }),
        }
    }

    /// Records that the revision at `row` is the last of its record so far.
    fn write(&self, written: &mut Written, row: u32) {
        let id = self.revisions[row as usize].record.id();
        let hash = written.hasher.hash_one(id);
        let rehash = |&r: &u32| written.hasher.hash_one(self.revisions[r as usize].record.id());
        match written.rows.entry(hash, |&r| self.revisions[r as usize].record.id() == id, rehash) {
            hashbrown::hash_table::Entry::Occupied(mut e) => *e.get_mut() = row,
            hashbrown::hash_table::Entry::Vacant(e) => {
                e.insert(row);
            }
        }
    }

    /// Appends one push's revisions; its result still lacks the batch's final head.
    fn apply(
        &mut self,
        push: &'a Push,
        stored: &'a HashMap<String, CurrentState>,
        written: &mut Written,
        out_of_scope: &OutOfScope,
    ) -> PushResult {
        let mut items = Vec::with_capacity(push.records.len());
        let mut warnings = push.warnings.clone();
        let mut refused = Vec::new();
        for (index, rec) in push.records.iter().enumerate() {
            self.head += 1;
            let prev = self.latest(rec.id(), stored, written);
            // Only a stored state can be out of the pusher's scope: what this batch wrote is
            // theirs or another pusher's of the same commit, judged when it is stored.
            let is_stored = prev.is_some_and(|s| s.batch_index.is_none());
            if is_stored && out_of_scope.contains(&(push.pushed_by.clone(), rec.id().to_string())) {
                self.refusals.push(PlannedRefusal {
                    pushed_by: &push.pushed_by,
                    record_id: rec.id(),
                    change_id: self.head,
                });
                warnings.retain(|(i, _)| *i != index);
                refused.push(Refused::out_of_scope(index, rec.id()));
                continue;
            }
            let conflict = match (rec.base_version, prev.map(|s| s.change_id)) {
                (Some(base), Some(current)) if base < current => {
                    warnings.push((index, Warning::conflict_overwritten(rec.id(), base, current)));
                    true
                }
                _ => false,
            };
            let overwrote = match prev {
                Some(state) => {
                    self.overwritten.push(state);
                    row(self.overwritten.len() - 1)
                }
                None => NEW_RECORD,
            };
            if let Some(earlier) = prev.and_then(|s| s.batch_index) {
                self.superseded_in_batch.push(earlier);
            }
            self.revisions.push(Revision { push, record: rec, change_id: self.head, overwrote, conflict });
            self.write(written, row(self.revisions.len() - 1));
            items.push((rec.id().to_string(), self.head));
        }
        warnings.sort_by_key(|(index, _)| *index);
        PushResult {
            head: 0,
            repository_generation: self.repository_generation,
            items,
            warnings: warnings.into_iter().map(|(_, w)| w).collect(),
            refused,
        }
    }

    /// The results to store for replay: one per applied push that names its transmission.
    pub fn transmissions<'p>(
        &'p self,
        pushes: &'p [&'a Push],
    ) -> impl Iterator<Item = (&'a Push, &'a str, &'p PushResult)> + 'p {
        pushes
            .iter()
            .zip(&self.results)
            .filter_map(|(push, result)| Some((*push, push.transmission_id.as_deref()?, result.as_ref()?)))
    }

    /// What each push's sender is told, in push order. The plan is done with: each result moves
    /// to its answer, copied only for a duplicate in the batch (a push of 300,000 records has a
    /// result of some 14 MB).
    pub fn outcomes(mut self, decisions: Vec<Decision>) -> Vec<Outcome> {
        let mut results = std::mem::take(&mut self.results);
        let generation = self.repository_generation;
        drop(self);
        let copies: Vec<Option<PushResult>> = decisions
            .iter()
            .map(|decision| match decision {
                Decision::SameAs(j) => results[*j].clone(),
                _ => None,
            })
            .collect();
        decisions
            .into_iter()
            .zip(copies)
            .enumerate()
            .map(|(i, (decision, copy))| match decision {
                Decision::Apply => results[i].take().map_or(Outcome::Lost, Outcome::Applied),
                Decision::SameAs(_) => copy.map_or(Outcome::Lost, Outcome::Replayed),
                Decision::Replay(result) => Outcome::Replayed(result),
                Decision::Unreadable(unreadable) => Outcome::Unreadable(unreadable),
                Decision::Mismatch => Outcome::Mismatch,
                Decision::ResetRequired => Outcome::ResetRequired(generation),
            })
            .collect()
    }
}

/// A push's answer once its commit is done.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Applied(PushResult),
    /// A stored (or same-batch) result given again for a retry.
    Replayed(PushResult),
    /// The transmission id is taken by another payload.
    Mismatch,
    /// The client must reset: the server holds this generation.
    ResetRequired(i64),
    /// The stored result of its transmission cannot be read: nothing is replayed or stored.
    Unreadable(Unreadable),
    /// A result the plan should have and does not: never expected, answered as an internal error.
    Lost,
}

#[cfg(test)]
mod tests;
