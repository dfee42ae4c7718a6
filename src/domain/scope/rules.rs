//! The scope set (docs/api.md §20.2): rules saying which records each user receives. Parsed and
//! validated here, once, at the edge; everything after works on these types.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{json, Map, Value};

use crate::domain::problem::ItemProblem;
use crate::domain::role::Role;
use crate::domain::scope::attributes::is_attribute_name;
use crate::domain::user::validate_username;

pub const MAX_RULES: usize = 100;
const MAX_NAME_CHARS: usize = 200;
const MAX_FORM_TYPE_CHARS: usize = 255;
const MAX_LIST: usize = 1_000;
const MAX_PATH_SEGMENTS: usize = 16;
const MAX_VALUE_CHARS: usize = 255;

/// A validated list of rules. An empty list is a valid set: non-admins then see their own
/// records only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScopeRules {
    pub rules: Vec<ScopeRule>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScopeRule {
    pub name: String,
    pub roles: BTreeSet<Role>,
    pub users: BTreeSet<String>,
    pub form_types: FormTypes,
    pub condition: Option<Condition>,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FormTypes {
    All,
    Only(BTreeSet<String>),
}

/// A dotted path into a record's `data` (`address.district`): object keys only.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FieldPath(Vec<String>);

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Condition {
    InAttribute { field: FieldPath, attribute: String },
    Equals { field: FieldPath, value: String },
}

impl FieldPath {
    pub fn parse(raw: &str) -> Option<FieldPath> {
        let segments: Vec<String> = raw.split('.').map(str::to_owned).collect();
        let valid = !raw.is_empty()
            && segments.len() <= MAX_PATH_SEGMENTS
            && segments
                .iter()
                .all(|s| !s.is_empty() && s.chars().count() <= 255 && !s.chars().any(char::is_control));
        valid.then_some(FieldPath(segments))
    }

    pub fn segments(&self) -> &[String] {
        &self.0
    }

    pub fn dotted(&self) -> String {
        self.0.join(".")
    }
}

impl FormTypes {
    pub fn includes(&self, form_type: &str) -> bool {
        match self {
            FormTypes::All => true,
            FormTypes::Only(types) => types.contains(form_type),
        }
    }

    fn to_json(&self) -> Value {
        match self {
            FormTypes::All => json!("*"),
            FormTypes::Only(types) => json!(types),
        }
    }
}

impl Condition {
    pub fn field(&self) -> &FieldPath {
        match self {
            Condition::InAttribute { field, .. } | Condition::Equals { field, .. } => field,
        }
    }
}

impl ScopeRule {
    /// A rule applies to a user whose role or username it lists.
    pub fn applies_to(&self, username: &str, role: Role) -> bool {
        self.roles.contains(&role) || self.users.contains(username)
    }

    fn to_json(&self) -> Value {
        let mut applies_to = Map::new();
        if !self.roles.is_empty() {
            applies_to
                .insert("roles".into(), json!(self.roles.iter().map(|r| r.as_str()).collect::<Vec<_>>()));
        }
        if !self.users.is_empty() {
            applies_to.insert("users".into(), json!(self.users));
        }
        let mut rule = Map::new();
        rule.insert("name".into(), json!(self.name));
        rule.insert("applies_to".into(), Value::Object(applies_to));
        rule.insert("form_types".into(), self.form_types.to_json());
        match &self.condition {
            None => {}
            Some(Condition::InAttribute { field, attribute }) => {
                rule.insert("where".into(), json!({"field": field.dotted(), "in_attribute": attribute}));
            }
            Some(Condition::Equals { field, value }) => {
                rule.insert("where".into(), json!({"field": field.dotted(), "equals": value}));
            }
        }
        Value::Object(rule)
    }
}

impl ScopeRules {
    /// Parses the `rules` array of a `PUT /admin/scopes` body, listing every problem found.
    pub fn parse(raw: &Value) -> Result<ScopeRules, Vec<ItemProblem>> {
        let Some(list) = raw.as_array() else {
            return Err(vec![problem("/rules", "rules must be an array")]);
        };
        let mut problems = Vec::new();
        if list.len() > MAX_RULES {
            problems.push(problem("/rules", format!("at most {MAX_RULES} rules")));
        }
        let mut rules = Vec::with_capacity(list.len());
        let mut names: BTreeMap<String, usize> = BTreeMap::new();
        for (index, raw_rule) in list.iter().enumerate() {
            let at = format!("/rules/{index}");
            if let Some(rule) = parse_rule(raw_rule, &at, &mut problems) {
                rules.push(rule);
            }
            if let Some(name) = raw_rule.get("name").and_then(Value::as_str) {
                if let Some(first) = names.insert(name.to_owned(), index) {
                    problems.push(problem(
                        format!("{at}/name"),
                        format!("duplicate rule name '{name}' (also rule {first})"),
                    ));
                }
            }
        }
        if problems.is_empty() {
            Ok(ScopeRules { rules })
        } else {
            Err(problems)
        }
    }

    pub fn to_json(&self) -> Value {
        Value::Array(self.rules.iter().map(ScopeRule::to_json).collect())
    }
}

fn parse_rule(raw: &Value, at: &str, problems: &mut Vec<ItemProblem>) -> Option<ScopeRule> {
    let Some(object) = raw.as_object() else {
        problems.push(problem(at, "a rule must be an object"));
        return None;
    };
    let before = problems.len();
    for key in object.keys() {
        if !matches!(key.as_str(), "name" | "applies_to" | "form_types" | "where") {
            problems.push(problem(
                format!("{at}/{key}"),
                format!("unknown key '{key}' (a rule has name, applies_to, form_types and where)"),
            ));
        }
    }
    let name = match object.get("name").and_then(Value::as_str) {
        Some(name) if (1..=MAX_NAME_CHARS).contains(&name.chars().count()) => name.to_owned(),
        _ => {
            problems.push(problem(
                format!("{at}/name"),
                format!("name must be a string of 1 to {MAX_NAME_CHARS} characters"),
            ));
            String::new()
        }
    };
    let (roles, users) = parse_applies_to(object.get("applies_to"), &format!("{at}/applies_to"), problems);
    let form_types = parse_form_types(object.get("form_types"), &format!("{at}/form_types"), problems);
    let condition = match object.get("where") {
        None | Some(Value::Null) => None,
        Some(raw) => parse_condition(raw, &format!("{at}/where"), problems),
    };
    (problems.len() == before).then(|| ScopeRule {
        name,
        roles,
        users,
        form_types: form_types.unwrap_or(FormTypes::All),
        condition,
    })
}

fn parse_applies_to(
    raw: Option<&Value>,
    at: &str,
    problems: &mut Vec<ItemProblem>,
) -> (BTreeSet<Role>, BTreeSet<String>) {
    let mut roles = BTreeSet::new();
    let mut users = BTreeSet::new();
    let Some(object) = raw.and_then(Value::as_object) else {
        problems.push(problem(at, "applies_to must be an object with roles and/or users"));
        return (roles, users);
    };
    for key in object.keys() {
        if key != "roles" && key != "users" {
            problems.push(problem(
                format!("{at}/{key}"),
                format!("unknown key '{key}' (applies_to has roles and users)"),
            ));
        }
    }
    if let Some(raw_roles) = object.get("roles") {
        match string_list(raw_roles) {
            Some(list) => {
                for (i, name) in list.into_iter().enumerate() {
                    match Role::parse(name) {
                        Some(role) if name == role.as_str() => {
                            roles.insert(role);
                        }
                        _ => problems.push(problem(
                            format!("{at}/roles/{i}"),
                            format!("unknown role '{name}' (read-only, read-write or admin)"),
                        )),
                    }
                }
            }
            None => problems.push(problem(format!("{at}/roles"), "roles must be an array of role names")),
        }
    }
    if let Some(raw_users) = object.get("users") {
        match string_list(raw_users) {
            Some(list) => {
                for (i, name) in list.into_iter().enumerate() {
                    match validate_username(name) {
                        Ok(()) => {
                            users.insert(name.to_owned());
                        }
                        Err(reason) => problems
                            .push(problem(format!("{at}/users/{i}"), format!("user '{name}': {}", reason.0))),
                    }
                }
            }
            None => problems.push(problem(format!("{at}/users"), "users must be an array of usernames")),
        }
    }
    if object.get("roles").is_none() && object.get("users").is_none() {
        problems.push(problem(at, "applies_to must list roles and/or users"));
    } else if roles.is_empty() && users.is_empty() && !has_item_problem(problems, at) {
        problems.push(problem(at, "applies_to lists no role and no user: the rule would apply to nobody"));
    }
    (roles, users)
}

fn has_item_problem(problems: &[ItemProblem], at: &str) -> bool {
    problems.iter().any(|p| p.path.starts_with(at))
}

fn parse_form_types(raw: Option<&Value>, at: &str, problems: &mut Vec<ItemProblem>) -> Option<FormTypes> {
    match raw {
        Some(Value::String(star)) if star == "*" => Some(FormTypes::All),
        Some(Value::Array(items)) if items.is_empty() => {
            problems.push(problem(at, "form_types is empty: list form types or use \"*\""));
            None
        }
        Some(raw @ Value::Array(_)) => match string_list(raw) {
            Some(list) if list.len() <= MAX_LIST => {
                let mut types = BTreeSet::new();
                for (i, form_type) in list.into_iter().enumerate() {
                    if (1..=MAX_FORM_TYPE_CHARS).contains(&form_type.chars().count()) {
                        types.insert(form_type.to_owned());
                    } else {
                        problems.push(problem(
                            format!("{at}/{i}"),
                            format!("a form type must be 1 to {MAX_FORM_TYPE_CHARS} characters"),
                        ));
                    }
                }
                Some(FormTypes::Only(types))
            }
            _ => {
                problems.push(problem(
                    at,
                    format!("form_types must be \"*\" or an array of at most {MAX_LIST} strings"),
                ));
                None
            }
        },
        _ => {
            problems.push(problem(at, "form_types must be \"*\" or a non-empty array of form types"));
            None
        }
    }
}

fn parse_condition(raw: &Value, at: &str, problems: &mut Vec<ItemProblem>) -> Option<Condition> {
    let Some(object) = raw.as_object() else {
        problems.push(problem(at, "where must be an object with field and in_attribute or equals"));
        return None;
    };
    for key in object.keys() {
        if !matches!(key.as_str(), "field" | "in_attribute" | "equals") {
            problems.push(problem(
                format!("{at}/{key}"),
                format!("unknown key '{key}' (where has field and in_attribute or equals)"),
            ));
        }
    }
    let field = match object.get("field").and_then(Value::as_str).map(|raw| (raw, FieldPath::parse(raw))) {
        Some((_, Some(path))) => Some(path),
        Some((raw, None)) => {
            problems.push(problem(
                format!("{at}/field"),
                format!(
                    "bad path '{raw}': dot-separated keys of data, none empty, at most {MAX_PATH_SEGMENTS}"
                ),
            ));
            None
        }
        None => {
            problems.push(problem(
                format!("{at}/field"),
                "field must be a path into data, like \"district\" or \"address.district\"",
            ));
            None
        }
    };
    let condition = match (object.get("in_attribute"), object.get("equals")) {
        (Some(_), Some(_)) => {
            problems.push(problem(at, "where has either in_attribute or equals, not both"));
            None
        }
        (None, None) => {
            problems
                .push(problem(at, "where needs in_attribute (a user attribute name) or equals (a value)"));
            None
        }
        (Some(attribute), None) => match attribute.as_str() {
            Some(name) if is_attribute_name(name) => Some((None, Some(name.to_owned()))),
            _ => {
                problems.push(problem(
                    format!("{at}/in_attribute"),
                    "in_attribute must be an attribute name: 1 to 64 characters of letters, digits, '_', '.' and '-'",
                ));
                None
            }
        },
        (None, Some(value)) => match value.as_str() {
            Some(text) if (1..=MAX_VALUE_CHARS).contains(&text.chars().count()) => {
                Some((Some(text.to_owned()), None))
            }
            _ => {
                problems.push(problem(
                    format!("{at}/equals"),
                    format!("equals must be a string of 1 to {MAX_VALUE_CHARS} characters"),
                ));
                None
            }
        },
    };
    match (field, condition) {
        (Some(field), Some((None, Some(attribute)))) => Some(Condition::InAttribute { field, attribute }),
        (Some(field), Some((Some(value), None))) => Some(Condition::Equals { field, value }),
        _ => None,
    }
}

fn string_list(raw: &Value) -> Option<Vec<&str>> {
    raw.as_array()?.iter().map(Value::as_str).collect()
}

fn problem(path: impl Into<String>, message: impl Into<String>) -> ItemProblem {
    ItemProblem::new(path, "INVALID_RULE", message)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn documented_example() -> Value {
        json!([
            {"name": "field workers: their districts' households and visits",
             "applies_to": {"roles": ["read-only", "read-write"]},
             "form_types": ["household", "visit"],
             "where": {"field": "district", "in_attribute": "district"}},
            {"name": "supervisors: everything of their teams",
             "applies_to": {"users": ["sup1", "sup2"]},
             "form_types": "*",
             "where": {"field": "team", "in_attribute": "team"}},
            {"name": "everyone: the facility list",
             "applies_to": {"roles": ["read-only", "read-write"]},
             "form_types": ["facility"]}
        ])
    }

    #[test]
    fn the_documented_example_parses_and_round_trips() {
        let rules = ScopeRules::parse(&documented_example()).unwrap();
        assert_eq!(rules.rules.len(), 3);
        assert!(rules.rules[0].applies_to("anyone", Role::ReadOnly));
        assert!(!rules.rules[0].applies_to("anyone", Role::Admin));
        assert!(rules.rules[1].applies_to("sup2", Role::ReadOnly));
        assert_eq!(rules.rules[1].form_types, FormTypes::All);
        assert_eq!(ScopeRules::parse(&rules.to_json()).unwrap(), rules);
    }

    #[test]
    fn every_problem_is_listed_with_its_path() {
        let problems = ScopeRules::parse(&json!([
            {"name": "a", "applies_to": {"roles": ["superuser"]}, "form_types": []},
            {"name": "a", "applies_to": {"users": ["u"]}, "form_types": "*", "where": {"field": "x..y", "in_attribute": "d"}},
            {"name": "b", "applies_to": {}, "form_types": ["t"], "where": {"field": "x", "in_attribute": "d", "equals": "v"}},
            {"name": "c", "applies_to": {"roles": ["read-only"]}, "form_type": ["t"]},
            {"name": "d", "applies_to": {"roles": ["read-only"]}, "form_types": ["t"]},
            {"name": "d", "applies_to": {"roles": ["read-only"]}, "form_types": ["t"]}
        ]))
        .unwrap_err();
        let paths: Vec<&str> = problems.iter().map(|p| p.path.as_str()).collect();
        assert!(paths.contains(&"/rules/0/applies_to/roles/0"), "{paths:?}");
        assert!(paths.contains(&"/rules/0/form_types"), "{paths:?}");
        assert!(paths.contains(&"/rules/1/where/field"), "{paths:?}");
        assert!(paths.contains(&"/rules/2/applies_to"), "{paths:?}");
        assert!(paths.contains(&"/rules/2/where"), "{paths:?}");
        assert!(paths.contains(&"/rules/3/form_type"), "{paths:?}");
        assert!(paths.contains(&"/rules/5/name"), "{paths:?}");
        assert!(problems.iter().any(|p| p.message.contains("unknown role 'superuser'")));
        assert!(problems.iter().any(|p| p.message.contains("duplicate rule name 'd'")));
        assert!(problems.iter().all(|p| p.code == "INVALID_RULE"));
    }

    #[test]
    fn shapes_that_are_not_rules() {
        assert!(ScopeRules::parse(&json!({"rules": []})).is_err());
        assert!(ScopeRules::parse(&json!([7])).is_err());
        assert_eq!(ScopeRules::parse(&json!([])).unwrap().rules.len(), 0);
        let too_many: Vec<Value> = (0..101)
            .map(|i| json!({"name": format!("r{i}"), "applies_to": {"roles": ["read-only"]}, "form_types": "*"}))
            .collect();
        assert!(ScopeRules::parse(&Value::Array(too_many)).is_err());
    }

    #[test]
    fn paths() {
        assert_eq!(FieldPath::parse("address.district").unwrap().segments(), ["address", "district"]);
        assert!(FieldPath::parse("").is_none());
        assert!(FieldPath::parse(".a").is_none());
        assert!(FieldPath::parse("a.").is_none());
        assert!(FieldPath::parse(&vec!["k"; 17].join(".")).is_none());
    }
}
