//! Scope sets (docs/api.md §20) for the scenarios that run under one: putting a set in force and
//! waiting until it is prepared, and the rules the scenarios use.

use super::Ctx;
use anyhow::{bail, Result};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// The form types a district-scoped fleet uses: households and visits carry a `district` field,
/// the shared type is for everyone.
#[derive(Debug, Clone)]
pub struct ScopedTypes {
    pub household: String,
    pub visit: String,
    pub shared: String,
}

impl ScopedTypes {
    pub fn new(prefix: &str) -> ScopedTypes {
        ScopedTypes {
            household: format!("{prefix}_household"),
            visit: format!("{prefix}_visit"),
            shared: format!("{prefix}_facility"),
        }
    }

    /// Field workers receive their districts' households and visits and every shared record.
    pub fn district_rules(&self) -> Value {
        json!([
            {"name": "field workers: their districts' households and visits",
             "applies_to": {"roles": ["read-only", "read-write"]},
             "form_types": [self.household, self.visit],
             "where": {"field": "district", "in_attribute": "district"}},
            {"name": "everyone: the facility list",
             "applies_to": {"roles": ["read-only", "read-write"]},
             "form_types": [self.shared]}
        ])
    }

    /// `n` rules (at least the two of [`ScopedTypes::district_rules`]): the district rule, the
    /// shared one, then rules over form types of their own with each kind of `where` (an
    /// attribute, a constant, a nested path, none) and of `applies_to`, so a push's commit
    /// evaluates a set of realistic size.
    pub fn rules(&self, n: usize, prefix: &str) -> Value {
        let mut rules = match self.district_rules() {
            Value::Array(r) => r,
            _ => Vec::new(),
        };
        let mut i = 0;
        while rules.len() < n {
            let form = format!("{prefix}_extra{i:02}");
            let rule = match i % 4 {
                0 => json!({"name": format!("extra {i}: by team"),
                    "applies_to": {"roles": ["read-write"]}, "form_types": [form],
                    "where": {"field": "team", "in_attribute": "team"}}),
                1 => json!({"name": format!("extra {i}: one region"),
                    "applies_to": {"roles": ["read-only", "read-write"]}, "form_types": [form],
                    "where": {"field": "region", "equals": "north"}}),
                2 => json!({"name": format!("extra {i}: by ward"),
                    "applies_to": {"roles": ["read-write"]}, "form_types": [form],
                    "where": {"field": "address.ward", "in_attribute": "ward"}}),
                _ => json!({"name": format!("extra {i}: supervisors"),
                    "applies_to": {"users": [format!("{prefix}-supervisor")]}, "form_types": "*"}),
            };
            rules.push(rule);
            i += 1;
        }
        Value::Array(rules)
    }
}

/// The name of district `i`, the value of the `district` field and attribute.
pub fn district_name(i: u64) -> String {
    format!("d{i:04}")
}

/// Polls `/admin/scopes/status` until nothing is being prepared and `version` (when given) is
/// in force; the seconds it took.
pub async fn wait_prepared(ctx: &Ctx, version: Option<i64>, timeout: Duration) -> Result<f64> {
    let start = Instant::now();
    loop {
        match ctx.api.scope_status().await {
            Ok(s) => {
                let active = s["active_version"].as_i64();
                if s["preparing_version"].is_null() && version.is_none_or(|v| active == Some(v)) {
                    return Ok(start.elapsed().as_secs_f64());
                }
            }
            Err(f) => bail!("GET /admin/scopes/status failed: {f}"),
        }
        if start.elapsed() > timeout {
            bail!("the scope set was still being prepared after {} s", timeout.as_secs());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Puts `rules` in force and waits until every node has switched to them; the version and the
/// seconds of preparation.
pub async fn put_in_force(ctx: &Ctx, rules: &Value, timeout: Duration) -> Result<(i64, f64)> {
    let version = match ctx.api.put_scopes(rules).await {
        Ok(v) => v,
        Err(f) => bail!("PUT /admin/scopes failed (--username must be an admin): {f}"),
    };
    let secs = wait_prepared(ctx, Some(version), timeout).await?;
    Ok((version, secs))
}

/// Back to no scope set, waiting until it is in force.
pub async fn clear(ctx: &Ctx, timeout: Duration) -> Result<()> {
    if let Err(f) = ctx.api.delete_scopes().await {
        bail!("DELETE /admin/scopes failed: {f}");
    }
    wait_prepared(ctx, None, timeout).await.map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rule_sets_have_the_size_asked_and_unique_names() {
        let t = ScopedTypes::new("cost_x");
        for n in [2, 3, 10, 40] {
            let rules = t.rules(n, "cost_x");
            let rules = rules.as_array().unwrap();
            assert_eq!(rules.len(), n);
            let names: std::collections::HashSet<&str> =
                rules.iter().map(|r| r["name"].as_str().unwrap()).collect();
            assert_eq!(names.len(), n);
        }
        let rules = t.district_rules();
        assert_eq!(rules[0]["form_types"][0], "cost_x_household");
        assert_eq!(rules[0]["where"]["in_attribute"], "district");
        assert!(rules[1].get("where").is_none());
        assert_eq!(district_name(7), "d0007");
    }
}
