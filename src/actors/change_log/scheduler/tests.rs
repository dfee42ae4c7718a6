//! The scheduler's rules, example by example, then on arbitrary interleavings of arrivals and
//! commit progress played against a model of the driver: at most two commits, no group written
//! ahead but over a planned and disjoint one, the back-off's bounds, every push answered exactly
//! once, the bounds of a group, nothing left waiting once every commit is done.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

use proptest::prelude::*;

use super::*;
use crate::testing::config;

#[derive(Debug, Clone)]
struct P {
    id: usize,
    records: usize,
    bytes: usize,
    keys: Vec<u64>,
}

impl Queued for P {
    fn size(&self) -> (usize, usize) {
        (self.records, self.bytes)
    }

    fn keys(&self) -> impl Iterator<Item = u64> + '_ {
        self.keys.iter().copied()
    }
}

/// Jobs are numbered, bases are numbers.
type S = Scheduler<P, usize, u64>;
type A = Action<P, usize, u64>;

const LIMITS: Limits = Limits { pushes: 3, records: 8, bytes: 100 };

fn p(id: usize, keys: &[u64]) -> P {
    P { id, records: 1, bytes: 10, keys: keys.to_vec() }
}

fn ids(batch: &[P]) -> Vec<usize> {
    batch.iter().map(|p| p.id).collect()
}

/// The actions as (kind, group, push ids or job, base or told).
fn summary(actions: &[A]) -> Vec<(&'static str, GroupId, Vec<usize>, Option<u64>)> {
    actions
        .iter()
        .map(|a| match a {
            Action::Commit { group, batch } => ("commit", *group, ids(batch), None),
            Action::CommitAhead { group, batch, base } => ("ahead", *group, ids(batch), Some(*base)),
            Action::Run { group, job } => ("run", *group, vec![*job], None),
            Action::Tell { group, committed } => ("tell", *group, vec![], Some(u64::from(*committed))),
        })
        .collect()
}

#[test]
fn a_push_starts_at_once_and_those_arriving_meanwhile_go_together_once_it_has_sent_its_commit() {
    let mut s = S::new(LIMITS);
    assert_eq!(summary(&s.push(p(1, &[1]))), [("commit", 1, vec![1], None)]);
    assert!(s.push(p(2, &[1])).is_empty(), "a commit is writing");
    assert!(s.push(p(3, &[2])).is_empty());
    // Push 2 names a record of group 1: nothing is written ahead over it.
    assert!(s.planned(1, 10).is_empty());
    assert_eq!(summary(&s.wrote(1)), [("commit", 2, vec![2, 3], None)]);
    assert!(s.push(p(4, &[3])).is_empty(), "two commits run");
    assert!(s.done(1, Done::Committed { ahead: false }).is_empty(), "group 2 has not planned");
    assert_eq!(summary(&s.planned(2, 12)), [("ahead", 3, vec![4], Some(12))]);
}

#[test]
fn a_group_is_written_ahead_with_the_disjoint_pushes_at_the_front_within_the_bounds() {
    let mut s = S::new(LIMITS);
    s.push(p(1, &[1, 2]));
    for (id, keys) in [(2, &[3][..]), (3, &[4]), (4, &[5]), (5, &[6]), (6, &[3]), (7, &[7])] {
        s.push(p(id, keys));
    }
    // Three pushes at most per group.
    assert_eq!(summary(&s.planned(1, 10)), [("ahead", 2, vec![2, 3, 4], Some(10))]);
    // The group written ahead plans at once; a third commit waits for a connection.
    assert!(s.planned(2, 13).is_empty());
    assert_eq!(
        summary(&s.done(1, Done::Committed { ahead: false })),
        [("tell", 2, vec![], Some(1)), ("ahead", 3, vec![5], Some(13))],
        "told, and the next group is written ahead of it in turn, up to push 6, which names push 2's record"
    );
}

#[test]
fn bounds_count_records_and_bytes_and_one_push_over_them_goes_alone() {
    let mut s = S::new(LIMITS);
    s.job(0);
    s.push(P { id: 1, records: 20, bytes: 1, keys: vec![] });
    s.push(P { id: 2, records: 5, bytes: 1, keys: vec![] });
    s.push(P { id: 3, records: 3, bytes: 1, keys: vec![] });
    s.push(P { id: 4, records: 1, bytes: 99, keys: vec![] });
    assert_eq!(summary(&s.done(1, Done::Committed { ahead: false })), [("commit", 2, vec![1], None)]);
    assert_eq!(summary(&s.wrote(2)), [("commit", 3, vec![2, 3], None)]);
    s.done(2, Done::Committed { ahead: false });
    assert_eq!(summary(&s.wrote(3)), [("commit", 4, vec![4], None)]);
}

#[test]
fn jobs_run_alone_after_every_commit_before_them_has_sent_its_commit() {
    let mut s = S::new(LIMITS);
    s.push(p(1, &[1]));
    assert!(s.job(7).is_empty());
    assert!(s.push(p(2, &[2])).is_empty());
    assert!(s.planned(1, 10).is_empty(), "nothing is written ahead across a job");
    assert_eq!(summary(&s.wrote(1)), [("run", 2, vec![7], None)]);
    assert!(s.done(1, Done::Committed { ahead: false }).is_empty(), "the job runs alone");
    assert_eq!(summary(&s.done(2, Done::Committed { ahead: false })), [("commit", 3, vec![2], None)]);
}

#[test]
fn a_failed_group_tells_the_one_ahead_of_it_at_once_and_its_pushes_go_alone_first() {
    let mut s = S::new(LIMITS);
    s.push(p(1, &[1]));
    s.push(p(2, &[1]));
    s.push(p(3, &[2]));
    s.planned(1, 10);
    assert_eq!(summary(&s.wrote(1)), [("commit", 2, vec![2, 3], None)]);
    s.push(p(4, &[3]));
    assert_eq!(summary(&s.done(1, Done::Committed { ahead: false })), []);
    assert_eq!(summary(&s.planned(2, 12)), [("ahead", 3, vec![4], Some(12))]);
    s.push(p(5, &[4]));
    let retry = vec![p(2, &[1]), p(3, &[2])];
    assert_eq!(
        summary(&s.done(2, Done::Failed { retry })),
        [("tell", 3, vec![], Some(0))],
        "group 3 gives up now; nothing starts while it is writing"
    );
    assert!(s.planned(3, 13).is_empty(), "group 3 will be redone: nothing is written ahead of it");
    assert!(s.redo(3).is_empty());
    // Its redo waits for the lock like any commit; once it has sent its COMMIT the failed
    // group's pushes are committed one by one, before push 5.
    assert_eq!(summary(&s.wrote(3)), [("commit", 4, vec![2], None)]);
    s.planned(4, 14);
    assert_eq!(summary(&s.wrote(4)), []);
    assert_eq!(summary(&s.done(3, Done::Committed { ahead: false })), [("commit", 5, vec![3], None)]);
    s.planned(5, 15);
    s.wrote(5);
    assert_eq!(summary(&s.done(4, Done::Committed { ahead: false })), [("commit", 6, vec![5], None)]);
}

/// Starts a usual group of one push and a group written ahead of it, then redoes or commits that
/// one: what the back-off decides is whether the group ahead is written.
fn round(s: &mut S, next: &mut usize, ahead_commits: bool) -> bool {
    *next += 2;
    let (a, b) = (*next - 1, *next);
    s.push(p(a, &[a as u64]));
    let lead = s.last_id;
    s.push(p(b, &[b as u64]));
    let actions = s.planned(lead, 0);
    let written_ahead = matches!(actions.as_slice(), [Action::CommitAhead { .. }]);
    if written_ahead {
        s.planned(lead + 1, 1);
        s.wrote(lead);
        s.done(lead, Done::Committed { ahead: false });
        if ahead_commits {
            s.wrote(lead + 1);
            s.done(lead + 1, Done::Committed { ahead: true });
        } else {
            s.redo(lead + 1);
            s.planned(lead + 1, 1);
            s.wrote(lead + 1);
            s.done(lead + 1, Done::Committed { ahead: false });
        }
    } else {
        s.wrote(lead);
        s.planned(lead + 1, 1);
        s.wrote(lead + 1);
        s.done(lead, Done::Committed { ahead: false });
        s.done(lead + 1, Done::Committed { ahead: false });
    }
    written_ahead
}

#[test]
fn after_each_redo_twice_as_many_groups_start_the_usual_way_up_to_64_and_one_committed_ahead_resets() {
    let mut s = S::new(LIMITS);
    let mut next = 0;
    assert!(round(&mut s, &mut next, false), "written ahead at once, and redone");
    // Groups started in rounds that wrote none ahead, before the next one that did (and was
    // redone in turn). Rounds start two groups each; the first round's own lead counts as well.
    let mut gap_after_redo = || {
        let mut gap = 0;
        while !round(&mut s, &mut next, false) {
            gap += 2;
        }
        gap
    };
    let gaps: Vec<u32> = (0..8).map(|_| gap_after_redo()).collect();
    assert_eq!(gaps, [0, 2, 4, 8, 16, 32, 64, 64]);
    while !round(&mut s, &mut next, true) {}
    assert_eq!(s.next_skips, 1, "a group committed ahead resets the back-off");
    assert!(round(&mut s, &mut next, false), "written ahead again at once");
    let mut gap = 0;
    while !round(&mut s, &mut next, false) {
        gap += 2;
    }
    assert_eq!(gap, 0, "the back-off starts again at one group");
}

// ---- arbitrary interleavings against a model of the driver ----

#[derive(Debug, Clone)]
enum Op {
    Push {
        records: usize,
        bytes: usize,
        keys: Vec<u64>,
    },
    Job,
    /// Advances the running commit at `pick` (mod their number); `choice` picks the outcome.
    Step {
        pick: usize,
        choice: u8,
    },
}

fn arb_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0usize..5, 0usize..60, proptest::collection::vec(0u64..6, 0..3))
            .prop_map(|(records, bytes, keys)| Op::Push { records, bytes, keys }),
        1 => Just(Op::Job),
        7 => (any::<usize>(), any::<u8>()).prop_map(|(pick, choice)| Op::Step { pick, choice }),
    ]
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Usual,
    Ahead { told: Option<bool> },
    Job,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    Started,
    Planned(u64),
    Wrote,
}

#[derive(Debug)]
struct Group {
    kind: Kind,
    phase: Phase,
    batch: Vec<P>,
    keys: HashSet<u64>,
    /// Written ahead of this one.
    predecessor: Option<GroupId>,
    /// Gave up being written ahead; committed the usual way.
    redone: bool,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Queued_ {
    Push(usize),
    Alone(usize),
    Job(usize),
}

/// The driver as the scheduler's rules describe it, checking each action against them.
struct Model {
    s: S,
    running: BTreeMap<GroupId, Group>,
    queue: VecDeque<Queued_>,
    shapes: HashMap<usize, P>,
    answered: HashMap<usize, u32>,
    jobs_run: Vec<usize>,
    /// How each commit that ended (or gave up being written ahead) ended, for the groups ahead.
    ended: HashMap<GroupId, bool>,
    skips: u32,
    next_skips: u32,
    next_base: u64,
    pushes: usize,
    jobs: usize,
    /// Pushes in the order they left the queue for the first time.
    started: Vec<usize>,
}

impl Model {
    fn new() -> Self {
        Model {
            s: S::new(LIMITS),
            running: BTreeMap::new(),
            queue: VecDeque::new(),
            shapes: HashMap::new(),
            answered: HashMap::new(),
            jobs_run: Vec::new(),
            ended: HashMap::new(),
            skips: 0,
            next_skips: 1,
            next_base: 100,
            pushes: 0,
            jobs: 0,
            started: Vec::new(),
        }
    }

    fn writing(&self) -> bool {
        self.running.values().any(|g| g.phase != Phase::Wrote || g.kind == Kind::Job)
    }

    /// The push group that a group may be written ahead of, if any: the only one running,
    /// planned, not being redone, not doomed by its own predecessor.
    fn lead(&self) -> Option<(GroupId, &Group)> {
        let [(id, g)] = self.running.iter().collect::<Vec<_>>()[..] else { return None };
        let eligible = matches!(g.phase, Phase::Planned(_))
            && g.kind != Kind::Job
            && !g.redone
            && g.kind != (Kind::Ahead { told: Some(false) });
        eligible.then_some((*id, g))
    }

    /// The group the rules take from the front of the queue.
    fn expected_batch(&self, disjoint_from: Option<&HashSet<u64>>) -> Vec<usize> {
        let mut batch = Vec::new();
        let (mut records, mut bytes) = (0, 0);
        for q in &self.queue {
            let Queued_::Push(id) = q else { break };
            let shape = &self.shapes[id];
            if disjoint_from.is_some_and(|d| shape.keys.iter().any(|k| d.contains(k))) {
                break;
            }
            if !batch.is_empty()
                && (batch.len() >= LIMITS.pushes
                    || records + shape.records > LIMITS.records
                    || bytes + shape.bytes > LIMITS.bytes)
            {
                break;
            }
            records += shape.records;
            bytes += shape.bytes;
            batch.push(*id);
        }
        batch
    }

    fn apply(&mut self, actions: Vec<A>) {
        for action in actions {
            match action {
                Action::Commit { group, batch } => {
                    assert!(self.running.len() < 2, "a third commit");
                    assert!(!self.writing(), "a usual commit while another is writing");
                    let expected = match self.queue.front() {
                        Some(Queued_::Alone(id)) => vec![*id],
                        _ => self.expected_batch(None),
                    };
                    assert_eq!(ids(&batch), expected, "the group the rules take");
                    self.take(&batch);
                    self.skips = self.skips.saturating_sub(1);
                    self.start(group, Kind::Usual, batch, None);
                }
                Action::CommitAhead { group, batch, base } => {
                    assert_eq!(self.skips, 0, "written ahead during the back-off");
                    let Some((lead, g)) = self.lead() else {
                        panic!("written ahead of no planned group: {:?}", self.running)
                    };
                    assert_eq!(g.phase, Phase::Planned(base), "planned from the lead's plan");
                    let expected = self.expected_batch(Some(&g.keys));
                    assert!(!expected.is_empty());
                    assert_eq!(ids(&batch), expected, "the disjoint pushes at the front");
                    self.take(&batch);
                    self.start(group, Kind::Ahead { told: None }, batch, Some(lead));
                }
                Action::Run { group, job } => {
                    assert!(self.running.len() < 2 && !self.writing(), "a job beside a writing commit");
                    assert_eq!(self.queue.pop_front(), Some(Queued_::Job(job)));
                    self.jobs_run.push(job);
                    self.start(group, Kind::Job, Vec::new(), None);
                }
                Action::Tell { group, committed } => {
                    let g = self.running.get_mut(&group).expect("told a running group");
                    assert_eq!(g.kind, Kind::Ahead { told: None }, "told once, while it waits");
                    assert!(!g.redone);
                    let predecessor = g.predecessor.expect("a group written ahead");
                    assert_eq!(self.ended.get(&predecessor), Some(&committed), "told how it ended");
                    g.kind = Kind::Ahead { told: Some(committed) };
                }
            }
        }
        self.check_settled();
    }

    fn take(&mut self, batch: &[P]) {
        for push in batch {
            match self.queue.pop_front() {
                Some(Queued_::Push(id)) => {
                    assert_eq!(id, push.id);
                    self.started.push(id);
                }
                Some(Queued_::Alone(id)) => assert_eq!(id, push.id),
                other => panic!("took {} from {other:?}", push.id),
            }
        }
    }

    fn start(&mut self, id: GroupId, kind: Kind, batch: Vec<P>, predecessor: Option<GroupId>) {
        assert!(kind == Kind::Job || !batch.is_empty(), "an empty group");
        let (records, bytes) = batch.iter().fold((0, 0), |(r, b), p| (r + p.records, b + p.bytes));
        assert!(
            batch.len() <= 1
                || (batch.len() <= LIMITS.pushes && records <= LIMITS.records && bytes <= LIMITS.bytes),
            "over the bounds: {batch:?}"
        );
        let keys = batch.iter().flat_map(|p| p.keys.iter().copied()).collect();
        let g = Group { kind, phase: Phase::Started, batch, keys, predecessor, redone: false };
        assert!(self.running.insert(id, g).is_none());
    }

    /// After every event: nothing that may start waits, and the back-off matches the rules.
    fn check_settled(&self) {
        assert!(self.running.len() <= 2);
        if self.running.is_empty() || (self.running.len() < 2 && !self.writing()) {
            assert!(self.queue.is_empty(), "a commit could start: {:?} {:?}", self.running, self.queue);
        }
        if let Some((_, g)) = self.lead() {
            let could = self.skips == 0 && !self.expected_batch(Some(&g.keys)).is_empty();
            assert!(!could, "a group could be written ahead");
        }
        assert_eq!((self.s.skips, self.s.next_skips), (self.skips, self.next_skips));
        assert!(self.next_skips.is_power_of_two() && self.next_skips <= MAX_AHEAD_SKIPS);
        assert!(self.skips <= MAX_AHEAD_SKIPS);
    }

    fn push(&mut self, records: usize, bytes: usize, keys: Vec<u64>) {
        self.pushes += 1;
        let push = P { id: self.pushes, records, bytes, keys };
        self.shapes.insert(push.id, push.clone());
        self.queue.push_back(Queued_::Push(push.id));
        let actions = self.s.push(push);
        self.apply(actions);
    }

    fn job(&mut self) {
        self.jobs += 1;
        self.queue.push_back(Queued_::Job(self.jobs));
        let actions = self.s.job(self.jobs);
        self.apply(actions);
    }

    fn answer(&mut self, batch: Vec<P>) {
        for push in batch {
            *self.answered.entry(push.id).or_default() += 1;
        }
    }

    fn done(&mut self, id: GroupId, committed_ahead: Option<bool>, retry: bool) {
        let g = self.running.remove(&id).expect("running");
        let done = match committed_ahead {
            Some(ahead) => {
                self.answer(g.batch);
                if ahead {
                    self.next_skips = 1;
                }
                Done::Committed { ahead }
            }
            None if retry && g.batch.len() > 1 => {
                for push in g.batch.iter().rev() {
                    self.queue.push_front(Queued_::Alone(push.id));
                }
                Done::Failed { retry: g.batch }
            }
            None => {
                self.answer(g.batch);
                Done::Failed { retry: Vec::new() }
            }
        };
        self.ended.insert(id, committed_ahead.is_some());
        let actions = self.s.done(id, done);
        self.apply(actions);
        self.check_told(id);
    }

    fn redo(&mut self, id: GroupId) {
        let g = self.running.get_mut(&id).expect("running");
        g.kind = Kind::Usual;
        g.redone = true;
        g.phase = Phase::Started;
        self.ended.insert(id, false);
        self.skips = self.next_skips;
        self.next_skips = (self.next_skips * 2).min(MAX_AHEAD_SKIPS);
        let actions = self.s.redo(id);
        self.apply(actions);
        self.check_told(id);
    }

    /// Once `id` ended or gave up, a group written ahead of it that still waits has been told.
    fn check_told(&self, id: GroupId) {
        for g in self.running.values() {
            if g.predecessor == Some(id) && !g.redone {
                assert!(matches!(g.kind, Kind::Ahead { told: Some(_) }), "not told at once");
            }
        }
    }

    fn planned(&mut self, id: GroupId) {
        self.next_base += 1;
        self.running.get_mut(&id).expect("running").phase = Phase::Planned(self.next_base);
        let actions = self.s.planned(id, self.next_base);
        self.apply(actions);
    }

    fn wrote(&mut self, id: GroupId) {
        self.running.get_mut(&id).expect("running").phase = Phase::Wrote;
        let actions = self.s.wrote(id);
        self.apply(actions);
    }

    /// Moves commit `id` one step; false when it can only wait (for the commit before it).
    fn step(&mut self, id: GroupId, choice: u8) -> bool {
        let g = &self.running[&id];
        let fail = choice.is_multiple_of(4);
        let retry = choice & 4 != 0;
        match (g.kind, g.phase) {
            (Kind::Job, _) => self.done(id, (!fail).then_some(false), false),
            (Kind::Usual, _) if fail => self.done(id, None, retry),
            (Kind::Usual, Phase::Started) => self.planned(id),
            (Kind::Usual, Phase::Planned(_)) => self.wrote(id),
            (Kind::Usual, Phase::Wrote) => self.done(id, Some(false), false),
            // Writing ahead fails as a whole only when the database is away; other failures redo.
            (Kind::Ahead { .. }, Phase::Started) if fail => self.done(id, None, false),
            (Kind::Ahead { .. }, Phase::Started) if choice % 4 == 1 => self.redo(id),
            (Kind::Ahead { .. }, Phase::Started) => self.planned(id),
            (Kind::Ahead { told: None }, Phase::Planned(_)) if fail => self.done(id, None, false),
            (Kind::Ahead { told: None }, Phase::Planned(_)) => return false,
            (Kind::Ahead { told: Some(false) }, Phase::Planned(_)) => self.redo(id),
            (Kind::Ahead { told: Some(true) }, Phase::Planned(_)) if choice.is_multiple_of(3) => {
                self.redo(id)
            }
            (Kind::Ahead { told: Some(true) }, Phase::Planned(_)) => self.wrote(id),
            // Its COMMIT failed other than by the database going away: redone.
            (Kind::Ahead { .. }, Phase::Wrote) if choice % 4 == 1 => self.redo(id),
            (Kind::Ahead { .. }, Phase::Wrote) => self.done(id, (!fail).then_some(true), false),
        }
        true
    }

    fn run(&mut self, ops: &[Op]) {
        for op in ops {
            match op.clone() {
                Op::Push { records, bytes, keys } => self.push(records, bytes, keys),
                Op::Job => self.job(),
                Op::Step { pick, choice } => {
                    if let Some(&id) = self.running.keys().nth(pick % self.running.len().max(1)) {
                        self.step(id, choice);
                    }
                }
            }
        }
        // Then every commit succeeds: all must end, and nothing be left waiting.
        let mut steps = 0;
        while let Some(&id) = self.running.keys().find(|id| {
            let g = &self.running[id];
            g.kind != Kind::Ahead { told: None } || g.phase == Phase::Started
        }) {
            self.step(id, 2);
            steps += 1;
            assert!(steps < 10_000, "no progress");
        }
        assert!(self.running.is_empty(), "a group waits forever: {:?}", self.running);
        assert!(self.queue.is_empty());
    }
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn every_interleaving_keeps_the_rules_and_answers_every_push_once(
        ops in proptest::collection::vec(arb_op(), 0..160)
    ) {
        let mut model = Model::new();
        model.run(&ops);
        for id in 1..=model.pushes {
            prop_assert_eq!(model.answered.get(&id).copied(), Some(1), "push {} answered once", id);
        }
        prop_assert_eq!(model.jobs_run.clone(), (1..=model.jobs).collect::<Vec<_>>(), "jobs once, in order");
        prop_assert_eq!(model.started.clone(), (1..=model.pushes).collect::<Vec<_>>(), "pushes leave in order");
    }
}
