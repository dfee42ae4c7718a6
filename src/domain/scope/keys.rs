//! Bucket keys: how records and users meet (docs/architecture.md, "Scoped sync").
//!
//! A *family* is what a rule selects records by: its form types and, when it has a `where`, the
//! field it reads. A record belongs to one bucket per family that matches its form type: the
//! family alone, or the family and the field's value. A user holds the buckets their rules give
//! them: the family for a rule without `where`, the family and the `equals` value, or the family
//! and each of their values of the attribute `in_attribute` names. Records and users never meet
//! in any other way, so a pull reads the rows of a few buckets, and a change to the rules or to a
//! user's attributes is a change to a set of keys.

use std::collections::{BTreeMap, BTreeSet};

use sha2::{Digest, Sha256};

use crate::domain::role::Role;
use crate::domain::scope::attributes::UserAttributes;
use crate::domain::scope::extract::PathSet;
use crate::domain::scope::rules::{Condition, FieldPath, FormTypes, ScopeRule, ScopeRules};

/// The key every record has when the whole repository is delivered: the key of "everything".
pub const ALL: &str = "*";

/// Values longer than this never equal an attribute value or an `equals` (both at most 255
/// characters), so they make no key.
const MAX_VALUE_BYTES: usize = 1_020;

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Family {
    pub form_types: FormTypes,
    pub field: Option<FieldPath>,
}

impl Family {
    pub fn of(rule: &ScopeRule) -> Family {
        Family {
            form_types: rule.form_types.clone(),
            field: rule.condition.as_ref().map(|c| c.field().clone()),
        }
    }

    /// A short, stable name: the same family has the same id in every set version, so rules that
    /// do not change keep their buckets (and nothing has to be delivered again).
    pub fn id(&self) -> String {
        let mut hasher = Sha256::new();
        match &self.form_types {
            FormTypes::All => hasher.update(b"types:*"),
            FormTypes::Only(types) => {
                hasher.update(b"types:");
                for form_type in types {
                    hasher.update((form_type.len() as u64).to_be_bytes());
                    hasher.update(form_type.as_bytes());
                }
            }
        }
        match &self.field {
            None => hasher.update(b"\x00field:none"),
            Some(path) => {
                hasher.update(b"\x00field:");
                for segment in path.segments() {
                    hasher.update((segment.len() as u64).to_be_bytes());
                    hasher.update(segment.as_bytes());
                }
            }
        }
        let digest = hasher.finalize();
        format!("f{}", hex::encode(&digest[..8]))
    }

    /// True for the family of a rule without `where` over every form type: every record is in
    /// its one bucket, forever (no change to a record takes it out). Its holders see everything,
    /// as admins do, so it needs no rows: the commit path writes none for it.
    pub fn is_everything(&self) -> bool {
        self.form_types == FormTypes::All && self.field.is_none()
    }

    fn key(&self, id: &str, value: Option<&str>) -> String {
        match value {
            None => id.to_owned(),
            Some(value) => format!("{id}={value}"),
        }
    }
}

/// The key of a user's own deliveries (records they may no longer hold, addressed to them alone).
pub fn personal_key(username: &str) -> String {
    format!("@{username}")
}

pub fn is_personal(key: &str) -> bool {
    key.starts_with('@')
}

/// What the commit path needs to give each written record its keys: the families of the set in
/// force and of the one being prepared, and the paths they read.
#[derive(Debug, Clone, Default)]
pub struct KeyPlan {
    families: Vec<PlannedFamily>,
    paths: PathSet,
}

#[derive(Debug, Clone)]
struct PlannedFamily {
    family: Family,
    id: String,
    path_index: Option<usize>,
}

impl KeyPlan {
    pub fn new<'a>(families: impl IntoIterator<Item = &'a Family>) -> KeyPlan {
        let mut plan = KeyPlan::default();
        let mut seen = BTreeSet::new();
        for family in families {
            if family.is_everything() || !seen.insert(family.clone()) {
                continue;
            }
            let path_index = family.field.as_ref().map(|path| plan.paths.add(path));
            plan.families.push(PlannedFamily { id: family.id(), family: family.clone(), path_index });
        }
        plan
    }

    pub fn is_empty(&self) -> bool {
        self.families.is_empty()
    }

    /// The record's keys, sorted and distinct. `data` is the stored JSON text of its `data`.
    pub fn record_keys(&self, form_type: &str, data: &str) -> Result<Vec<String>, serde_json::Error> {
        let matching: Vec<&PlannedFamily> =
            self.families.iter().filter(|f| f.family.form_types.includes(form_type)).collect();
        if matching.is_empty() {
            return Ok(Vec::new());
        }
        let values =
            if matching.iter().any(|f| f.path_index.is_some()) { self.paths.read(data)? } else { Vec::new() };
        let mut keys = BTreeSet::new();
        for planned in matching {
            match planned.path_index {
                None => {
                    keys.insert(planned.family.key(&planned.id, None));
                }
                Some(index) => {
                    if let Some(Some(value)) = values.get(index) {
                        if value.len() <= MAX_VALUE_BYTES {
                            keys.insert(planned.family.key(&planned.id, Some(value)));
                        }
                    }
                }
            }
        }
        Ok(keys.into_iter().collect())
    }

    /// The ids of the families whose keys this plan writes.
    pub fn family_ids(&self) -> impl Iterator<Item = &str> {
        self.families.iter().map(|f| f.id.as_str())
    }
}

impl ScopeRules {
    pub fn families(&self) -> BTreeSet<Family> {
        self.rules.iter().map(Family::of).collect()
    }
}

/// Who a user is, as far as scopes are concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserFacts {
    pub username: String,
    pub role: Role,
    pub attributes: UserAttributes,
}

/// What a user receives. `All` is the whole repository (admins, everyone while no set is in
/// force, and the users of a rule without `where` over every form type); `Keys` are the buckets of their rules plus their personal key. Their own records are
/// theirs in both cases (the author's records are read by `created_by`, not through a key).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Visibility {
    All,
    Keys(BTreeSet<String>),
}

impl Visibility {
    pub fn of(rules: Option<&ScopeRules>, user: &UserFacts) -> Visibility {
        let Some(rules) = rules else { return Visibility::All };
        if user.role == Role::Admin {
            return Visibility::All;
        }
        let applying: Vec<&ScopeRule> =
            rules.rules.iter().filter(|r| r.applies_to(&user.username, user.role)).collect();
        if applying.iter().any(|rule| Family::of(rule).is_everything()) {
            return Visibility::All;
        }
        let mut keys = BTreeSet::from([personal_key(&user.username)]);
        for rule in applying {
            let family = Family::of(rule);
            let id = family.id();
            match &rule.condition {
                None => {
                    keys.insert(family.key(&id, None));
                }
                Some(Condition::Equals { value, .. }) => {
                    keys.insert(family.key(&id, Some(value)));
                }
                Some(Condition::InAttribute { attribute, .. }) => {
                    for value in user.attributes.values(attribute) {
                        keys.insert(family.key(&id, Some(value)));
                    }
                }
            }
        }
        Visibility::Keys(keys)
    }

    /// The keys a pull reads rows of (the personal key included); empty for `All`.
    pub fn keys(&self) -> Vec<String> {
        match self {
            Visibility::All => Vec::new(),
            Visibility::Keys(keys) => keys.iter().cloned().collect(),
        }
    }

    /// The keys stored for the user (`scope_user_keys`): `ALL` alone for one who sees
    /// everything, which the readers take as they take an admin.
    pub fn stored_keys(&self) -> Vec<String> {
        match self {
            Visibility::All => vec![ALL.to_owned()],
            Visibility::Keys(keys) => keys.iter().cloned().collect(),
        }
    }

    /// The rules that apply to a user, by name (the preview shows them).
    pub fn matching_rules<'r>(rules: &'r ScopeRules, user: &UserFacts) -> Vec<&'r ScopeRule> {
        if user.role == Role::Admin {
            return Vec::new();
        }
        rules.rules.iter().filter(|r| r.applies_to(&user.username, user.role)).collect()
    }
}

/// The keys whose records a user's devices must be sent again when their visibility changes
/// from `old` to `new`: every record in one of these buckets may have entered or left the set.
/// Personal keys never change hands, so they are never part of it.
pub fn changed_keys(old: &Visibility, new: &Visibility) -> BTreeSet<String> {
    match (old, new) {
        (Visibility::All, Visibility::All) => BTreeSet::new(),
        (Visibility::All, Visibility::Keys(_)) | (Visibility::Keys(_), Visibility::All) => {
            BTreeSet::from([ALL.to_owned()])
        }
        (Visibility::Keys(old), Visibility::Keys(new)) => {
            old.symmetric_difference(new).filter(|key| !is_personal(key)).cloned().collect()
        }
    }
}

/// Which buckets may change hands when the set in force goes from `old` to `new`, whatever the
/// users' attributes: everything (`ALL`) when either side is "no set"; otherwise every bucket of
/// each family whose rules differ between the two (a new or dropped rule, other roles or users, a
/// different attribute or value). Families whose rules are the same in both keep their holders.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Touched {
    All,
    Families(BTreeSet<String>),
}

impl Touched {
    pub fn between(old: Option<&ScopeRules>, new: Option<&ScopeRules>) -> Touched {
        let (Some(old), Some(new)) = (old, new) else {
            return if old.is_none() && new.is_none() {
                Touched::Families(BTreeSet::new())
            } else {
                Touched::All
            };
        };
        let by_family = |rules: &ScopeRules| {
            let mut map: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
            for rule in &rules.rules {
                map.entry(Family::of(rule).id()).or_default().insert(grant_signature(rule));
            }
            map
        };
        let (old, new) = (by_family(old), by_family(new));
        let ids: BTreeSet<&String> = old.keys().chain(new.keys()).collect();
        Touched::Families(ids.into_iter().filter(|id| old.get(*id) != new.get(*id)).cloned().collect())
    }

    pub fn is_nothing(&self) -> bool {
        matches!(self, Touched::Families(ids) if ids.is_empty())
    }

    /// True when every record must be redelivered to some users: either side is "no set", or
    /// the rules without `where` over every form type changed hands (their users go from seeing
    /// everything to seeing their keys, or back).
    pub fn every_record(&self) -> bool {
        match self {
            Touched::All => true,
            Touched::Families(ids) => ids.contains(&everything_id()),
        }
    }

    /// The touched families whose buckets have rows (`Touched::All`: none is listed).
    pub fn families(&self) -> Vec<String> {
        match self {
            Touched::All => Vec::new(),
            Touched::Families(ids) => ids.iter().filter(|id| **id != everything_id()).cloned().collect(),
        }
    }

    /// True when a key of this family (a bucket key, `fID` or `fID=value`) is touched.
    pub fn covers(&self, key: &str) -> bool {
        match self {
            Touched::All => true,
            Touched::Families(ids) => {
                let family = key.split_once('=').map_or(key, |(id, _)| id);
                ids.contains(family)
            }
        }
    }
}

/// The id of the family every record is in (see [`Family::is_everything`]).
fn everything_id() -> String {
    Family { form_types: FormTypes::All, field: None }.id()
}

/// What a rule grants within its family, independent of its name.
fn grant_signature(rule: &ScopeRule) -> String {
    let roles: Vec<&str> = rule.roles.iter().map(|r| r.as_str()).collect();
    let users: Vec<&String> = rule.users.iter().collect();
    let what = match &rule.condition {
        None => "all".to_owned(),
        Some(Condition::Equals { value, .. }) => format!("equals:{value}"),
        Some(Condition::InAttribute { attribute, .. }) => format!("attr:{attribute}"),
    };
    serde_json::json!([roles, users, what]).to_string()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn rules(raw: serde_json::Value) -> ScopeRules {
        ScopeRules::parse(&raw).unwrap()
    }

    fn user(name: &str, role: Role, attributes: serde_json::Value) -> UserFacts {
        UserFacts { username: name.into(), role, attributes: UserAttributes::parse(&attributes).unwrap() }
    }

    fn example() -> ScopeRules {
        rules(json!([
            {"name": "workers", "applies_to": {"roles": ["read-only", "read-write"]},
             "form_types": ["household", "visit"], "where": {"field": "district", "in_attribute": "district"}},
            {"name": "facilities", "applies_to": {"roles": ["read-only", "read-write"]}, "form_types": ["facility"]},
            {"name": "north", "applies_to": {"users": ["sup"]}, "form_types": "*", "where": {"field": "district", "equals": "north"}}
        ]))
    }

    #[test]
    fn records_and_users_meet_in_the_same_keys() {
        let set = example();
        let plan = KeyPlan::new(&set.families());
        let worker = Visibility::of(Some(&set), &user("w", Role::ReadWrite, json!({"district": ["east"]})));
        let sup = Visibility::of(Some(&set), &user("sup", Role::ReadOnly, json!({})));
        let Visibility::Keys(worker_keys) = &worker else { panic!() };
        let Visibility::Keys(sup_keys) = &sup else { panic!() };
        let visible = |keys: &BTreeSet<String>, form_type: &str, data: &str| {
            plan.record_keys(form_type, data).unwrap().iter().any(|k| keys.contains(k))
        };
        assert!(visible(worker_keys, "household", r#"{"district":"east"}"#));
        assert!(!visible(worker_keys, "household", r#"{"district":"north"}"#));
        assert!(!visible(worker_keys, "other", r#"{"district":"east"}"#));
        assert!(visible(worker_keys, "facility", r#"{}"#));
        assert!(visible(sup_keys, "anything", r#"{"district":"north"}"#));
        assert!(!visible(sup_keys, "household", r#"{"district":"east"}"#));
        assert!(worker_keys.contains("@w") && sup_keys.contains("@sup"));
        assert_eq!(Visibility::of(Some(&set), &user("a", Role::Admin, json!({}))), Visibility::All);
        assert_eq!(Visibility::of(None, &user("w", Role::ReadOnly, json!({}))), Visibility::All);
    }

    #[test]
    fn numbers_match_by_their_text_and_missing_fields_by_nothing() {
        let set = rules(json!([{"name": "n", "applies_to": {"roles": ["read-only"]}, "form_types": "*",
                                "where": {"field": "a.zone", "in_attribute": "zone"}}]));
        let plan = KeyPlan::new(&set.families());
        let keys = plan.record_keys("t", r#"{"a":{"zone":7}}"#).unwrap();
        let Visibility::Keys(user_keys) =
            Visibility::of(Some(&set), &user("u", Role::ReadOnly, json!({"zone": ["7"]})))
        else {
            panic!()
        };
        assert!(keys.iter().any(|k| user_keys.contains(k)));
        assert!(plan.record_keys("t", r#"{"a":{"zone":null}}"#).unwrap().is_empty());
        assert!(plan.record_keys("t", r#"{"a":{"zone":[7]}}"#).unwrap().is_empty());
        assert!(plan.record_keys("t", r#"{}"#).unwrap().is_empty());
        assert!(plan.record_keys("t", "not json").is_err());
    }

    #[test]
    fn changed_keys_between_visibilities() {
        let set = example();
        let before = Visibility::of(Some(&set), &user("w", Role::ReadWrite, json!({"district": ["east"]})));
        let after =
            Visibility::of(Some(&set), &user("w", Role::ReadWrite, json!({"district": ["east", "west"]})));
        let changed = changed_keys(&before, &after);
        assert_eq!(changed.len(), 1);
        assert!(changed.iter().next().unwrap().ends_with("=west"));
        assert_eq!(changed_keys(&Visibility::All, &after), BTreeSet::from([ALL.to_owned()]));
        assert!(changed_keys(&after, &after).is_empty());
    }

    #[test]
    fn touched_families_are_those_whose_grants_differ() {
        let old = example();
        assert_eq!(Touched::between(None, Some(&old)), Touched::All);
        assert_eq!(Touched::between(Some(&old), None), Touched::All);
        assert!(Touched::between(Some(&old), Some(&old)).is_nothing());
        let mut renamed = old.clone();
        renamed.rules[0].name = "renamed".into();
        assert!(Touched::between(Some(&old), Some(&renamed)).is_nothing());
        let mut widened = old.clone();
        widened.rules[1].roles.insert(Role::Admin);
        let touched = Touched::between(Some(&old), Some(&widened));
        let facility = Family::of(&old.rules[1]).id();
        assert_eq!(touched, Touched::Families(BTreeSet::from([facility.clone()])));
        assert!(touched.covers(&facility));
        assert!(!touched.covers(&format!("{}=east", Family::of(&old.rules[0]).id())));
    }

    #[test]
    fn a_rule_over_everything_without_where_gives_everything_and_writes_no_keys() {
        let mut set = example();
        set.rules.extend(
            rules(json!([{"name": "supervisors", "applies_to": {"users": ["sup"]}, "form_types": "*"}]))
                .rules,
        );
        assert_eq!(Visibility::of(Some(&set), &user("sup", Role::ReadOnly, json!({}))), Visibility::All);
        assert_eq!(Visibility::All.stored_keys(), vec![ALL.to_owned()]);
        let worker = user("w", Role::ReadWrite, json!({"district": ["east"]}));
        assert!(matches!(Visibility::of(Some(&set), &worker), Visibility::Keys(_)));
        let plan = KeyPlan::new(&set.families());
        assert_eq!(plan.family_ids().count(), 3);
        assert!(plan.record_keys("other", "{}").unwrap().is_empty());

        // Adding or dropping it redelivers every record; other touched families keep their rows.
        let touched = Touched::between(Some(&example()), Some(&set));
        assert!(touched.every_record() && touched.families().is_empty());
        let mut widened = set.clone();
        widened.rules[1].roles.insert(Role::Admin);
        let touched = Touched::between(Some(&set), Some(&widened));
        assert!(!touched.every_record());
        assert_eq!(touched.families(), vec![Family::of(&set.rules[1]).id()]);
        assert!(Touched::All.every_record() && Touched::All.families().is_empty());
    }

    #[test]
    fn family_ids_are_stable_and_distinct() {
        let set = example();
        let ids: BTreeSet<String> = set.families().iter().map(Family::id).collect();
        assert_eq!(ids.len(), 3);
        assert_eq!(Family::of(&set.rules[0]).id(), Family::of(&example().rules[0]).id());
        assert!(ids.iter().all(|id| id.len() == 17 && id.starts_with('f')));
    }
}
