//! When the change log starts each commit, and how (docs/architecture.md, "The change log", steps
//! 2 and 3b): a state machine without I/O. The `ChangeLog` actor tells it what happens (a push or
//! another job arrives; a commit has planned, has sent its COMMIT, gave up being written ahead, is
//! done) and carries out the actions it answers (commit a group, write one ahead, run a job, tell
//! a group written ahead how the commit before it ended). Its rules, which `tests.rs` checks on
//! arbitrary interleavings:
//!
//! - at most two commits run at once, one per connection of the change log;
//! - a commit starts the usual way (it will wait for the lock) only once every running commit has
//!   sent its COMMIT: its reads, plan and wait for the lock then overlap the other's WAL flush;
//! - a group is written ahead only of the one commit running, a push group that has planned and
//!   not yet sent its COMMIT, and is neither being redone nor doomed by a failure before it; with
//!   pushes from the front of the queue that name none of its records and transmissions; planning
//!   from the base that commit planned;
//! - after a group written ahead is redone, the next 1, 2, 4 … 64 push groups start the usual way
//!   before one is written ahead again; a group committed ahead resets the count;
//! - a group written ahead is told how the commit before it ended once, as soon as that is known:
//!   when it is done, or when it gives up being written ahead itself (its redo waits for the lock,
//!   and the group ahead of it must not wait for that);
//! - every push leaves the queue in exactly one group, in arrival order; a group that failed as a
//!   whole (for a reason other than the database being away) hands its pushes back, and each is
//!   then committed alone, before anything else;
//! - a group holds at most [`Limits`] pushes, records and bytes, unless it is one push;
//! - an attachment or a reset runs alone: it starts once every running commit has sent its COMMIT,
//!   and nothing starts until it is done.

use std::collections::{HashSet, VecDeque};

/// A commit started by the scheduler, numbered in start order.
pub type GroupId = u64;

/// Bounds on one group commit.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub pushes: usize,
    pub records: usize,
    pub bytes: usize,
}

impl Limits {
    /// Enough to amortise the transaction, small enough to keep latency flat. The byte bound also
    /// keeps every statement far below PostgreSQL's 1 GB message limit whatever the records weigh
    /// (a single push is bounded by MAX_JSON_BODY_BYTES).
    pub const GROUP_COMMIT: Limits = Limits { pushes: 256, records: 20_000, bytes: 16 << 20 };
}

/// The longest back-off: push groups started the usual way before one is written ahead again.
pub const MAX_AHEAD_SKIPS: u32 = 64;

/// What the scheduler reads of a push.
pub trait Queued {
    /// Its records and the JSON bytes it stores, which the bounds of a group count.
    fn size(&self) -> (usize, usize);
    /// Hashes of the records and the transmission it names. A collision only costs a group its
    /// chance to be written ahead.
    fn keys(&self) -> impl Iterator<Item = u64> + '_;
}

/// What the driver does next.
#[derive(Debug)]
pub enum Action<P, J, B> {
    /// Commit these pushes as one group, the usual way: under the lock, from what it reads there.
    Commit { group: GroupId, batch: Vec<P> },
    /// Write these pushes ahead of the running commit, planning from `base` (what that commit
    /// planned); then wait for [`Action::Tell`] before trying the lock.
    CommitAhead { group: GroupId, batch: Vec<P>, base: B },
    /// Run an attachment commit or a reset, alone.
    Run { group: GroupId, job: J },
    /// Tell a group written ahead whether the commit before it committed.
    Tell { group: GroupId, committed: bool },
}

/// How a commit ended.
#[derive(Debug)]
pub enum Done<P> {
    /// Committed, every push answered; `ahead` when it committed as written ahead.
    Committed { ahead: bool },
    /// Not committed. Its pushes are answered, except those handed back in `retry`: a group that
    /// failed as a whole for a reason other than the database being away, each of whose pushes is
    /// then committed alone, so that one bad push cannot fail the others.
    Failed { retry: Vec<P> },
}

enum Entry<P, J> {
    Push(P),
    /// A push of a group that failed as a whole, committed alone.
    Alone(P),
    Job(J),
}

enum Stage<B> {
    Started,
    Planned(B),
    /// Its COMMIT is sent (or, for a job, never: a job counts as writing until it is done).
    Wrote,
}

struct Running<B> {
    id: GroupId,
    /// The hashes a push group names (`None` for a job).
    keys: Option<HashSet<u64>>,
    stage: Stage<B>,
    /// Whether a group may be written ahead of this one: not of a job, nor of a group that is
    /// being redone or whose predecessor did not commit (it will be redone).
    may_lead: bool,
    /// The group written ahead of this one, until it is told how this one ended.
    successor: Option<GroupId>,
    /// The group this one is written ahead of, until this one is told how it ended.
    predecessor: Option<GroupId>,
}

pub struct Scheduler<P, J, B> {
    limits: Limits,
    queue: VecDeque<Entry<P, J>>,
    /// In start order; at most two.
    running: Vec<Running<B>>,
    /// Push groups to start the usual way before writing one ahead again, and how many the next
    /// redo will ask for: where several processes commit at once, one of them takes the lock
    /// between almost every two commits of this one, and a group written ahead is then nearly
    /// always redone, twice the work.
    skips: u32,
    next_skips: u32,
    last_id: GroupId,
}

impl<P: Queued, J, B: Clone> Scheduler<P, J, B> {
    pub fn new(limits: Limits) -> Self {
        Scheduler {
            limits,
            queue: VecDeque::new(),
            running: Vec::with_capacity(2),
            skips: 0,
            next_skips: 1,
            last_id: 0,
        }
    }

    /// A push arrives.
    pub fn push(&mut self, push: P) -> Vec<Action<P, J, B>> {
        self.queue.push_back(Entry::Push(push));
        self.pump()
    }

    /// An attachment commit or a reset arrives.
    pub fn job(&mut self, job: J) -> Vec<Action<P, J, B>> {
        self.queue.push_back(Entry::Job(job));
        self.pump()
    }

    /// `group` has planned: `base` is what it commits, if it commits (the head after it, the
    /// generation), and what a group written ahead of it plans from.
    pub fn planned(&mut self, group: GroupId, base: B) -> Vec<Action<P, J, B>> {
        if let Some(g) = self.running_mut(group) {
            if matches!(g.stage, Stage::Started) {
                g.stage = Stage::Planned(base);
            }
        }
        self.pump()
    }

    /// `group` has written everything and is sending its COMMIT.
    pub fn wrote(&mut self, group: GroupId) -> Vec<Action<P, J, B>> {
        if let Some(g) = self.running_mut(group) {
            g.stage = Stage::Wrote;
        }
        self.pump()
    }

    /// `group`, written ahead, gave up (the commit before it failed, another commit came in
    /// between, or it overwrites stored records) and is now committed the usual way.
    pub fn redo(&mut self, group: GroupId) -> Vec<Action<P, J, B>> {
        let mut actions = Vec::new();
        if let Some(g) = self.running_mut(group) {
            g.stage = Stage::Started;
            g.may_lead = false;
            let successor = g.successor.take();
            let predecessor = g.predecessor.take();
            if let Some(s) = successor {
                self.told(s, false, &mut actions);
            }
            if let Some(p) = predecessor.and_then(|p| self.running_mut(p)) {
                p.successor = None;
            }
        }
        self.skips = self.next_skips;
        self.next_skips = (self.next_skips * 2).min(MAX_AHEAD_SKIPS);
        actions.extend(self.pump());
        actions
    }

    /// `group` is done: its connection is free.
    pub fn done(&mut self, group: GroupId, done: Done<P>) -> Vec<Action<P, J, B>> {
        let mut actions = Vec::new();
        let Some(at) = self.running.iter().position(|g| g.id == group) else {
            return self.pump();
        };
        let g = self.running.remove(at);
        let committed = matches!(done, Done::Committed { .. });
        if let Some(s) = g.successor {
            self.told(s, committed, &mut actions);
        }
        if let Some(p) = g.predecessor.and_then(|p| self.running_mut(p)) {
            p.successor = None;
        }
        match done {
            Done::Committed { ahead: true } => self.next_skips = 1,
            Done::Committed { ahead: false } => {}
            Done::Failed { retry } => {
                for push in retry.into_iter().rev() {
                    self.queue.push_front(Entry::Alone(push));
                }
            }
        }
        actions.extend(self.pump());
        actions
    }

    fn told(&mut self, successor: GroupId, committed: bool, actions: &mut Vec<Action<P, J, B>>) {
        if let Some(s) = self.running_mut(successor) {
            s.predecessor = None;
            // It will be redone: a group written ahead of it would be too.
            s.may_lead &= committed;
            actions.push(Action::Tell { group: successor, committed });
        }
    }

    fn running_mut(&mut self, group: GroupId) -> Option<&mut Running<B>> {
        self.running.iter_mut().find(|g| g.id == group)
    }

    /// Starts whatever may start now.
    fn pump(&mut self) -> Vec<Action<P, J, B>> {
        let mut actions = Vec::new();
        while self.running.len() < 2 && !self.queue.is_empty() {
            let writing = self.running.iter().any(|g| !matches!(g.stage, Stage::Wrote));
            let next = if writing { self.write_ahead() } else { self.start_next() };
            match next {
                Some(action) => actions.push(action),
                None => break,
            }
        }
        actions
    }

    fn start(&mut self, keys: Option<HashSet<u64>>, predecessor: Option<GroupId>) -> GroupId {
        self.last_id += 1;
        self.running.push(Running {
            id: self.last_id,
            may_lead: keys.is_some(),
            keys,
            stage: Stage::Started,
            successor: None,
            predecessor,
        });
        self.last_id
    }

    /// Nothing is writing: the next job, lone push or group starts the usual way.
    fn start_next(&mut self) -> Option<Action<P, J, B>> {
        match self.queue.pop_front()? {
            Entry::Job(job) => Some(Action::Run { group: self.start(None, None), job }),
            Entry::Alone(push) => {
                let keys = push.keys().collect();
                self.skips = self.skips.saturating_sub(1);
                Some(Action::Commit { group: self.start(Some(keys), None), batch: vec![push] })
            }
            Entry::Push(push) => {
                self.queue.push_front(Entry::Push(push));
                let (batch, keys) = take_pushes(&mut self.queue, self.limits, None);
                self.skips = self.skips.saturating_sub(1);
                Some(Action::Commit { group: self.start(Some(keys), None), batch })
            }
        }
    }

    /// The one running commit is writing: a group may be written ahead of it.
    fn write_ahead(&mut self) -> Option<Action<P, J, B>> {
        let [lead] = self.running.as_slice() else { return None };
        let (Stage::Planned(base), Some(lead_keys)) = (&lead.stage, &lead.keys) else { return None };
        if self.skips > 0 || !lead.may_lead {
            return None;
        }
        let (batch, keys) = take_pushes(&mut self.queue, self.limits, Some(lead_keys));
        if batch.is_empty() {
            return None;
        }
        let (base, lead_id) = (base.clone(), lead.id);
        let group = self.start(Some(keys), Some(lead_id));
        self.running[0].successor = Some(group);
        Some(Action::CommitAhead { group, batch, base })
    }
}

/// Takes pushes from the front of the queue, within the bounds of one group (the first always
/// fits), while they name none of `disjoint_from`'s hashes. Stops at a lone push or a job.
fn take_pushes<P: Queued, J>(
    queue: &mut VecDeque<Entry<P, J>>,
    limits: Limits,
    disjoint_from: Option<&HashSet<u64>>,
) -> (Vec<P>, HashSet<u64>) {
    let mut batch = Vec::new();
    let mut keys = HashSet::new();
    let (mut records, mut bytes) = (0, 0);
    while let Some(Entry::Push(next)) = queue.front() {
        if disjoint_from.is_some_and(|other| next.keys().any(|k| other.contains(&k))) {
            break;
        }
        let (n, size) = next.size();
        if !batch.is_empty()
            && (batch.len() >= limits.pushes || records + n > limits.records || bytes + size > limits.bytes)
        {
            break;
        }
        records += n;
        bytes += size;
        if let Some(Entry::Push(push)) = queue.pop_front() {
            keys.extend(push.keys());
            batch.push(push);
        }
    }
    (batch, keys)
}

#[cfg(test)]
mod tests;
