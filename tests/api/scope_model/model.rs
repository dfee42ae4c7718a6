//! The model of scoped sync the test checks the server against: users, records, the scope set in
//! force, and who sees what, written from docs/api.md §20.2 alone (none of the server's code). A
//! history of undo steps gives the state after any recent operation, for reads that a read replica
//! answers from a snapshot slightly behind the primary.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::Rng;
use serde_json::{json, Value};

pub const FORM_TYPES: [&str; 4] = ["household", "visit", "facility", "note"];
pub const DISTRICTS: [&str; 5] = ["north", "south", "east", "west", "central"];
/// "7" also matches the number 7 in a record's data (a number matches by its text).
pub const TEAMS: [&str; 4] = ["t1", "t2", "t3", "7"];
/// The attributes users may have; "zone" is named by rules but rarely set.
pub const ATTRIBUTES: [&str; 3] = ["district", "team", "zone"];
/// What a string `address` holds when it is not an object (a rule on `address` can equal it).
pub const STREET: &str = "12 Main St";

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    ReadOnly,
    ReadWrite,
    Admin,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::ReadOnly => "read-only",
            Role::ReadWrite => "read-write",
            Role::Admin => "admin",
        }
    }

    pub fn can_push(self) -> bool {
        self != Role::ReadOnly
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Condition {
    InAttribute(String),
    Equals(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub name: String,
    pub roles: Vec<Role>,
    pub users: Vec<String>,
    /// `None` is `"*"`.
    pub form_types: Option<Vec<String>>,
    /// The dotted path's segments and what the value there must be.
    pub condition: Option<(Vec<String>, Condition)>,
}

impl Rule {
    pub fn to_json(&self) -> Value {
        let mut applies_to = serde_json::Map::new();
        if !self.roles.is_empty() {
            applies_to.insert("roles".into(), json!(self.roles.iter().map(|r| r.name()).collect::<Vec<_>>()));
        }
        if !self.users.is_empty() {
            applies_to.insert("users".into(), json!(self.users));
        }
        let mut rule = json!({
            "name": self.name,
            "applies_to": applies_to,
            "form_types": match &self.form_types { None => json!("*"), Some(types) => json!(types) },
        });
        if let Some((path, condition)) = &self.condition {
            let field = path.join(".");
            rule["where"] = match condition {
                Condition::InAttribute(attribute) => json!({"field": field, "in_attribute": attribute}),
                Condition::Equals(value) => json!({"field": field, "equals": value}),
            };
        }
        rule
    }

    fn applies_to(&self, user: &str, facts: &UserFacts) -> bool {
        self.roles.contains(&facts.role) || self.users.iter().any(|u| u == user)
    }

    /// §20.2: the form type is listed (or `*`), and the `where`, if any, holds: the value at the
    /// path is a string, or a number by its text, equal to one of the user's values of the
    /// attribute, or to the constant. Anything else at the path (missing, null, a boolean, an
    /// object, an array, or a path through a non-object) never matches.
    fn selects(&self, facts: &UserFacts, record: &Rec) -> bool {
        if let Some(types) = &self.form_types {
            if !types.contains(&record.form_type) {
                return false;
            }
        }
        let Some((path, condition)) = &self.condition else { return true };
        let mut at = &record.data;
        for segment in path {
            match at.as_object().and_then(|o| o.get(segment)) {
                Some(next) => at = next,
                None => return false,
            }
        }
        let text = match at {
            Value::String(s) => s.clone(),
            Value::Number(n) => n.to_string(),
            _ => return false,
        };
        match condition {
            Condition::Equals(value) => *value == text,
            Condition::InAttribute(attribute) => {
                facts.attributes.get(attribute).is_some_and(|values| values.contains(&text))
            }
        }
    }
}

pub fn rules_json(rules: &[Rule]) -> Value {
    Value::Array(rules.iter().map(Rule::to_json).collect())
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserFacts {
    pub role: Role,
    pub attributes: BTreeMap<String, Vec<String>>,
}

impl UserFacts {
    pub fn attributes_json(&self) -> Value {
        json!(self.attributes)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Rec {
    pub form_type: String,
    pub data: Value,
    pub deleted: bool,
    pub created_by: String,
}

/// Everything that decides what each user sees.
#[derive(Debug, Clone, Default)]
pub struct State {
    pub records: BTreeMap<String, Rec>,
    pub users: BTreeMap<String, UserFacts>,
    /// The set in force; `None` when there is none (everyone sees everything).
    pub set: Option<Vec<Rule>>,
}

impl State {
    /// §20.2: with no set everyone sees every record; admins always do; otherwise a user sees
    /// their own records and those selected by a rule that applies to them. Deletion does not
    /// change membership (a deleted record is held by nobody, but may be undeleted).
    pub fn may_see_under(&self, set: Option<&[Rule]>, user: &str, record: &Rec) -> bool {
        let Some(rules) = set else { return true };
        let facts = &self.users[user];
        facts.role == Role::Admin
            || record.created_by == user
            || rules.iter().any(|rule| rule.applies_to(user, facts) && rule.selects(facts, record))
    }

    pub fn may_see(&self, user: &str, record: &Rec) -> bool {
        self.may_see_under(self.set.as_deref(), user, record)
    }

    /// What a device of `user` must hold after a complete sync: every live record they may see.
    pub fn expected(&self, user: &str) -> BTreeMap<String, Value> {
        self.records
            .iter()
            .filter(|(_, r)| !r.deleted && self.may_see(user, r))
            .map(|(id, r)| (id.clone(), r.data.clone()))
            .collect()
    }

    /// What a pull row about `id` must say: `Some(data)` live, `None` a tombstone.
    pub fn row(&self, user: &str, id: &str) -> Option<&Value> {
        self.records.get(id).filter(|r| !r.deleted && self.may_see(user, r)).map(|r| &r.data)
    }

    /// §20.4: a non-admin's update or deletion of an existing record outside their visible set is
    /// refused (`OUT_OF_SCOPE`) under `set`.
    pub fn refused_under(&self, set: Option<&[Rule]>, pusher: &str, id: &str) -> bool {
        match self.records.get(id) {
            None => false,
            Some(record) => !self.may_see_under(set, pusher, record),
        }
    }
}

pub enum Undo {
    Record(String, Option<Rec>),
    User(String, UserFacts),
    Set(Option<Vec<Rule>>),
}

/// One operation's effect, reversible, and the change head right after it was acknowledged.
struct Step {
    head: i64,
    /// Whether the operation changed the state in one commit that also moved the head to `head`
    /// (a push); other operations (a set switch, an attribute change) may move the head in more
    /// than one commit, or not at all.
    atomic: bool,
    undo: Vec<Undo>,
}

/// The model: the current state and, when kept, the history of the recent steps.
pub struct Model {
    pub state: State,
    pending: Vec<Undo>,
    steps: VecDeque<Step>,
    /// The head of the oldest state still in the history, and its index.
    first_head: i64,
    first_index: usize,
    keep: usize,
}

impl Model {
    /// `keep`: how many steps of history to keep (0: none, the reads are exact).
    pub fn new(keep: usize) -> Self {
        Model {
            state: State::default(),
            pending: Vec::new(),
            steps: VecDeque::new(),
            first_head: 0,
            first_index: 0,
            keep,
        }
    }

    pub fn put_record(&mut self, id: &str, record: Rec) {
        let old = self.state.records.insert(id.to_string(), record);
        self.pending.push(Undo::Record(id.to_string(), old));
    }

    pub fn put_user(&mut self, name: &str, facts: UserFacts) {
        if let Some(old) = self.state.users.insert(name.to_string(), facts) {
            self.pending.push(Undo::User(name.to_string(), old));
        }
    }

    pub fn put_set(&mut self, set: Option<Vec<Rule>>) {
        let old = std::mem::replace(&mut self.state.set, set);
        self.pending.push(Undo::Set(old));
    }

    /// Closes the current operation: its changes become one step, at `head`.
    pub fn commit(&mut self, head: i64, atomic: bool) {
        let undo = std::mem::take(&mut self.pending);
        if self.keep == 0 {
            return;
        }
        self.steps.push_back(Step { head, atomic, undo });
        while self.steps.len() > self.keep {
            let step = self.steps.pop_front().expect("a step");
            self.first_head = step.head;
            self.first_index += 1;
        }
    }

    /// Starts the history at the current state, whose head is `head`.
    pub fn set_origin(&mut self, head: i64) {
        self.steps.clear();
        self.pending.clear();
        self.first_head = head;
        self.first_index = 0;
    }

    pub fn index(&self) -> usize {
        self.first_index + self.steps.len()
    }

    fn head_at(&self, index: usize) -> i64 {
        if index == self.first_index {
            self.first_head
        } else {
            self.steps[index - self.first_index - 1].head
        }
    }

    /// The states (by index, oldest first) a read whose snapshot head is `snapshot` may have seen.
    /// State k is the one after step k; during step k the head went from h(k-1) to h(k) and the
    /// state changed from k-1 to k at one commit in between (a push: exactly at h(k)). `None`
    /// when the snapshot is older than the history kept.
    pub fn candidates(&self, snapshot: i64) -> Option<BTreeSet<usize>> {
        if snapshot < self.first_head {
            return None;
        }
        let last = self.index();
        let mut out = BTreeSet::new();
        if snapshot >= self.head_at(last) {
            out.insert(last);
        }
        for k in (self.first_index + 1)..=last {
            let (before, after) = (self.head_at(k - 1), self.head_at(k));
            if snapshot < before || snapshot > after {
                continue;
            }
            let step = &self.steps[k - self.first_index - 1];
            if step.atomic && after > before {
                out.insert(if snapshot == after { k } else { k - 1 });
            } else {
                out.insert(k - 1);
                out.insert(k);
            }
        }
        if snapshot == self.first_head {
            out.insert(self.first_index);
        }
        Some(out)
    }

    /// The states from `oldest` to the current one, newest first (each a full copy).
    pub fn states_back_to(&self, oldest: usize) -> Vec<(usize, State)> {
        let mut state = self.state.clone();
        let mut index = self.index();
        let mut out = vec![(index, state.clone())];
        while index > oldest.max(self.first_index) {
            let step = &self.steps[index - self.first_index - 1];
            for undo in step.undo.iter().rev() {
                match undo {
                    Undo::Record(id, old) => match old {
                        Some(record) => {
                            state.records.insert(id.clone(), record.clone());
                        }
                        None => {
                            state.records.remove(id);
                        }
                    },
                    Undo::User(name, facts) => {
                        state.users.insert(name.clone(), facts.clone());
                    }
                    Undo::Set(set) => state.set = set.clone(),
                }
            }
            index -= 1;
            out.push((index, state.clone()));
        }
        out
    }
}

/// Random content, from the test's seeded generator only.
pub struct Gen {
    pub rng: StdRng,
    serial: u64,
    rule_serial: u64,
}

impl Gen {
    pub fn new(rng: StdRng) -> Self {
        Gen { rng, serial: 0, rule_serial: 0 }
    }

    pub fn chance(&mut self, p: f64) -> bool {
        self.rng.gen_bool(p)
    }

    pub fn below(&mut self, n: usize) -> usize {
        self.rng.gen_range(0..n)
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        items.choose(&mut self.rng).expect("a non-empty list")
    }

    /// A random subset of `items` of `min..=max` elements, in the items' order.
    pub fn subset(&mut self, items: &[&str], min: usize, max: usize) -> Vec<String> {
        let n = self.rng.gen_range(min..=max.min(items.len()));
        let mut chosen: Vec<usize> = rand::seq::index::sample(&mut self.rng, items.len(), n).into_vec();
        chosen.sort_unstable();
        chosen.into_iter().map(|i| items[i].to_string()).collect()
    }

    pub fn form_type(&mut self) -> String {
        self.pick(&FORM_TYPES).to_string()
    }

    fn district_value(&mut self) -> Value {
        match self.below(20) {
            0 => Value::Null,
            1 => json!(7),
            2 => json!(["north"]),
            3 => json!(true),
            _ => json!(self.pick(&DISTRICTS)),
        }
    }

    fn team_value(&mut self) -> Value {
        match self.below(12) {
            0 => json!(7),
            1 => json!({"id": "t1"}),
            _ => json!(self.pick(&TEAMS)),
        }
    }

    /// A record's data: a serial (so every write is distinguishable), usually a district and a
    /// team, sometimes nested (`address.district`, `meta.team`), sometimes shapes that never match.
    pub fn data(&mut self) -> Value {
        self.serial += 1;
        let mut data = json!({"n": self.serial});
        if self.below(10) < 8 {
            data["district"] = self.district_value();
        }
        if self.below(10) < 7 {
            data["team"] = self.team_value();
        }
        match self.below(10) {
            0..=4 => {
                let mut address = json!({"line": "x"});
                if self.below(10) < 8 {
                    address["district"] = self.district_value();
                }
                data["address"] = address;
            }
            5 => data["address"] = json!(STREET),
            6 => data["address"] = Value::Null,
            _ => {}
        }
        if self.below(10) < 4 {
            data["meta"] = json!({"team": self.team_value()});
        }
        data
    }

    /// A user's attributes: some districts and teams (sometimes none, sometimes an empty list),
    /// rarely a zone.
    pub fn attributes(&mut self) -> BTreeMap<String, Vec<String>> {
        let mut attributes = BTreeMap::new();
        if self.below(10) < 8 {
            attributes.insert("district".to_string(), self.subset(&DISTRICTS, 0, 3));
        }
        if self.below(10) < 6 {
            attributes.insert("team".to_string(), self.subset(&TEAMS, 1, 2));
        }
        if self.below(10) < 1 {
            attributes.insert("zone".to_string(), self.subset(&DISTRICTS, 1, 2));
        }
        attributes
    }

    pub fn role(&mut self) -> Role {
        match self.below(20) {
            0..=6 => Role::ReadOnly,
            7..=16 => Role::ReadWrite,
            _ => Role::Admin,
        }
    }

    fn field(&mut self) -> Vec<String> {
        let path: &[&str] = match self.below(20) {
            0..=6 => &["district"],
            7..=10 => &["team"],
            11..=15 => &["address", "district"],
            16..=18 => &["meta", "team"],
            _ => &["address"],
        };
        path.iter().map(|s| s.to_string()).collect()
    }

    /// A random set of 1 to 4 rules, with names unique across the whole run.
    pub fn rules(&mut self, usernames: &[String]) -> Vec<Rule> {
        let count = 1 + self.below(4);
        (0..count)
            .map(|_| {
                self.rule_serial += 1;
                let mut roles = Vec::new();
                let mut users = Vec::new();
                while roles.is_empty() && users.is_empty() {
                    if self.chance(0.7) {
                        for role in [Role::ReadOnly, Role::ReadWrite, Role::Admin] {
                            let p = if role == Role::Admin { 0.1 } else { 0.6 };
                            if self.chance(p) {
                                roles.push(role);
                            }
                        }
                    }
                    if self.chance(0.4) {
                        let names: Vec<&str> = usernames.iter().map(String::as_str).collect();
                        users = self.subset(&names, 1, 2);
                    }
                }
                let form_types = if self.chance(0.25) { None } else { Some(self.subset(&FORM_TYPES, 1, 3)) };
                let condition = match self.below(20) {
                    0..=4 => None,
                    5..=15 => {
                        let field = self.field();
                        let natural =
                            if field.last().is_some_and(|f| f == "team") { "team" } else { "district" };
                        let attribute = if self.chance(0.8) {
                            natural.to_string()
                        } else {
                            self.pick(&ATTRIBUTES).to_string()
                        };
                        Some((field, Condition::InAttribute(attribute)))
                    }
                    _ => {
                        let field = self.field();
                        let value = match self.below(10) {
                            0..=5 => self.pick(&DISTRICTS).to_string(),
                            6..=8 => self.pick(&TEAMS).to_string(),
                            _ => STREET.to_string(),
                        };
                        Some((field, Condition::Equals(value)))
                    }
                };
                Rule { name: format!("rule {}", self.rule_serial), roles, users, form_types, condition }
            })
            .collect()
    }
}
