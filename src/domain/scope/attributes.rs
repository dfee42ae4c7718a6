//! User attributes (docs/api.md §20.1): what scope rules compare record fields with.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

use crate::domain::problem::ItemProblem;

pub const MAX_ATTRIBUTES: usize = 64;
pub const MAX_VALUES: usize = 1_000;
pub const MAX_NAME_CHARS: usize = 64;
pub const MAX_VALUE_CHARS: usize = 255;

/// A user's attributes: name → distinct values, both validated. Values keep their first order
/// of appearance (the portal shows them as entered); duplicates are dropped.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct UserAttributes(BTreeMap<String, Vec<String>>);

impl UserAttributes {
    /// Parses `{"name": ["value", ...]}`; every problem is listed, each naming its attribute.
    pub fn parse(raw: &Value) -> Result<UserAttributes, Vec<ItemProblem>> {
        let Some(object) = raw.as_object() else {
            return Err(vec![problem("/attributes", "attributes must be an object of arrays of strings")]);
        };
        let mut problems = Vec::new();
        if object.len() > MAX_ATTRIBUTES {
            problems.push(problem("/attributes", format!("at most {MAX_ATTRIBUTES} attributes")));
        }
        let mut attributes = BTreeMap::new();
        for (name, values) in object {
            let path = format!("/attributes/{}", pointer_escape(name));
            if !is_attribute_name(name) {
                problems.push(problem(
                    &path,
                    format!(
                        "attribute name '{name}' must be 1 to {MAX_NAME_CHARS} characters of letters, digits, '_', '.' and '-'"
                    ),
                ));
                continue;
            }
            let Some(values) = values.as_array() else {
                problems.push(problem(&path, format!("attribute '{name}' must be an array of strings")));
                continue;
            };
            if values.len() > MAX_VALUES {
                problems
                    .push(problem(&path, format!("attribute '{name}' has more than {MAX_VALUES} values")));
                continue;
            }
            let mut kept: Vec<String> = Vec::with_capacity(values.len());
            for (i, value) in values.iter().enumerate() {
                match value.as_str() {
                    Some(text) if is_attribute_value(text) => {
                        if !kept.iter().any(|k| k == text) {
                            kept.push(text.to_owned());
                        }
                    }
                    Some(_) => problems.push(problem(
                        format!("{path}/{i}"),
                        format!("attribute '{name}': each value must be 1 to {MAX_VALUE_CHARS} characters"),
                    )),
                    None => problems.push(problem(
                        format!("{path}/{i}"),
                        format!("attribute '{name}': each value must be a string"),
                    )),
                }
            }
            attributes.insert(name.clone(), kept);
        }
        if problems.is_empty() {
            Ok(UserAttributes(attributes))
        } else {
            Err(problems)
        }
    }

    pub fn values(&self, name: &str) -> &[String] {
        self.0.get(name).map(Vec::as_slice).unwrap_or(&[])
    }

    pub fn to_json(&self) -> Value {
        serde_json::to_value(&self.0).unwrap_or_else(|_| Value::Object(Default::default()))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

pub fn is_attribute_name(name: &str) -> bool {
    let chars = name.chars().count();
    (1..=MAX_NAME_CHARS).contains(&chars)
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

fn is_attribute_value(value: &str) -> bool {
    (1..=MAX_VALUE_CHARS).contains(&value.chars().count())
}

fn pointer_escape(name: &str) -> String {
    name.replace('~', "~0").replace('/', "~1")
}

fn problem(path: impl Into<String>, message: impl Into<String>) -> ItemProblem {
    ItemProblem::new(path, "INVALID_ATTRIBUTE", message)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn accepts_the_documented_shape_and_drops_duplicate_values() {
        let parsed =
            UserAttributes::parse(&json!({"district": ["north", "east", "north"], "team": ["t7"]})).unwrap();
        assert_eq!(parsed.values("district"), ["north", "east"]);
        assert_eq!(parsed.values("team"), ["t7"]);
        assert!(parsed.values("missing").is_empty());
        assert_eq!(parsed.to_json(), json!({"district": ["north", "east"], "team": ["t7"]}));
    }

    #[test]
    fn every_problem_names_its_attribute() {
        let problems = UserAttributes::parse(&json!({
            "bad name!": ["x"], "district": "north", "team": [7, ""], "ok": ["fine"]
        }))
        .unwrap_err();
        let messages: Vec<&str> = problems.iter().map(|p| p.message.as_str()).collect();
        assert_eq!(problems.len(), 4, "{messages:?}");
        assert!(messages.iter().any(|m| m.contains("'bad name!'")));
        assert!(messages.iter().any(|m| m.contains("'district' must be an array")));
        assert_eq!(messages.iter().filter(|m| m.contains("'team'")).count(), 2);
    }

    #[test]
    fn limits() {
        assert!(UserAttributes::parse(&json!([])).is_err());
        assert!(UserAttributes::parse(&json!({ "x".repeat(65): ["a"] })).is_err());
        assert!(UserAttributes::parse(&json!({ "x".repeat(64): ["a"] })).is_ok());
        assert!(UserAttributes::parse(&json!({"d": ["v".repeat(256)]})).is_err());
        let many: Vec<String> = (0..1001).map(|i| i.to_string()).collect();
        assert!(UserAttributes::parse(&json!({ "d": many })).is_err());
        assert_eq!(UserAttributes::parse(&json!({})).unwrap(), UserAttributes::default());
    }
}
