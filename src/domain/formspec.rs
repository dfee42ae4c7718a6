//! Form specification rules (docs/api.md §11): identifiers, content checks, and the version a
//! bundle's form is registered under.

use serde_json::Value;

/// `schema` and `uischema` may each be at most this large, serialised (docs/api.md §11.1).
pub const MAX_PART_BYTES: usize = 1024 * 1024;

/// `formType` and `version`: 1 to 255 characters without `/` (docs/api.md §11.1).
pub fn is_valid_identifier(text: &str) -> bool {
    let chars = text.chars().count();
    (1..=255).contains(&chars) && !text.contains('/')
}

/// One content problem: the JSON pointer into the request body and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContentProblem {
    pub path: &'static str,
    pub code: &'static str,
    pub message: String,
}

/// Checks `schema` and `uischema` (docs/api.md §11.1: objects, at most 1 MiB, schema compiles as
/// draft-07). All problems are returned together.
pub fn check_content(schema: &Value, uischema: &Value) -> Vec<ContentProblem> {
    let mut problems = Vec::new();
    for (path, value) in [("/schema", schema), ("/uischema", uischema)] {
        if !value.is_object() {
            problems.push(ContentProblem {
                path,
                code: "TYPE_ERROR",
                message: format!("{} must be a JSON object", &path[1..]),
            });
            continue;
        }
        let size = serde_json::to_vec(value).map_or(usize::MAX, |bytes| bytes.len());
        if size > MAX_PART_BYTES {
            problems.push(ContentProblem {
                path,
                code: "TOO_LARGE",
                message: format!("{} is larger than {MAX_PART_BYTES} bytes", &path[1..]),
            });
        }
    }
    if schema.is_object() {
        if let Err(error) = jsonschema::draft7::new(schema) {
            problems.push(ContentProblem {
                path: "/schema",
                code: "SCHEMA_INVALID",
                message: format!("schema is not a valid JSON Schema draft-07: {error}"),
            });
        }
    }
    problems
}

/// A bundle form whose spec version already existed with other content: the existing spec was
/// kept, and the upload or switch answers with a `FORMSPEC_CONFLICT` warning (docs/api.md §11.2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeptFormSpec {
    pub form_type: String,
    pub version: String,
}

impl KeptFormSpec {
    /// What the uploader is told (the `FORMSPEC_CONFLICT` warning's message).
    pub fn message(&self) -> String {
        format!(
            "Form spec {} version {} already exists with different content; the existing spec was kept",
            self.form_type, self.version
        )
    }
}

/// The version a bundle's form is registered under (docs/api.md §11.2): the schema's top-level
/// string `version` when it is a valid identifier, otherwise the bundle version id.
pub fn bundle_form_version(schema: &Value, bundle_version: &str) -> String {
    match schema.get("version") {
        Some(Value::String(version)) if is_valid_identifier(version) => version.clone(),
        _ => bundle_version.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn identifiers() {
        assert!(is_valid_identifier("household"));
        assert!(is_valid_identifier(&"é".repeat(255)));
        assert!(!is_valid_identifier(""));
        assert!(!is_valid_identifier("a/b"));
        assert!(!is_valid_identifier(&"a".repeat(256)));
    }

    #[test]
    fn content_rules() {
        assert!(check_content(&json!({"type": "object"}), &json!({"type": "VerticalLayout"})).is_empty());
        let problems = check_content(&json!([]), &json!("x"));
        assert_eq!(problems.len(), 2);
        let problems = check_content(&json!({"type": 12}), &json!({}));
        assert_eq!(problems.iter().map(|p| p.code).collect::<Vec<_>>(), ["SCHEMA_INVALID"]);
        let big = json!({"description": "x".repeat(MAX_PART_BYTES)});
        assert_eq!(check_content(&big, &json!({}))[0].code, "TOO_LARGE");
    }

    #[test]
    fn registered_versions() {
        assert_eq!(bundle_form_version(&json!({"version": "2.1"}), "20250101-000000"), "2.1");
        assert_eq!(bundle_form_version(&json!({"version": 2}), "20250101-000000"), "20250101-000000");
        assert_eq!(bundle_form_version(&json!({"version": "a/b"}), "v"), "v");
        assert_eq!(bundle_form_version(&json!({}), "v"), "v");
    }
}
