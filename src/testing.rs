//! What the property suites share (each suite lives next to the code it tests, in a `fuzz`
//! module, so `cargo test --lib fuzz` runs them all): the case count and generators of arbitrary
//! JSON biased towards the keys the decoders look at.
//!
//! The suites stand in for cargo-fuzz (which needs a nightly toolchain): the parsers that face
//! untrusted input must never panic, and must refuse what they cannot vouch for. Each target runs a
//! few dozen cases in `make test`; `PROPTEST_CASES=100000 cargo test --release --lib fuzz` runs a
//! long campaign (SECURITY.md). A failure found this way becomes a named regression test.

use proptest::prelude::*;
use proptest::test_runner::Config;
use serde_json::{Map, Value};

/// Cases per property: small by default so `make test` stays fast; PROPTEST_CASES overrides it.
pub fn config(default_cases: u32) -> Config {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(default_cases);
    Config { cases, failure_persistence: None, ..Config::default() }
}

/// Keys the decoders look at, so generated objects hit their branches, plus arbitrary ones.
const KEYS: &[&str] = &[
    "records",
    "changes",
    "observations",
    "client_id",
    "clientId",
    "transmission_id",
    "transmissionId",
    "observation_id",
    "observationId",
    "id",
    "schema_type",
    "schema_version",
    "form_type",
    "formType",
    "form_version",
    "data",
    "deleted",
    "version",
    "created_at",
    "updatedAt",
    "geolocation",
    "tags",
    "author",
    "device_id",
    "since",
    "since_change_id",
    "currentVersion",
    "limit",
    "page_token",
    "pageToken",
    "schema_types",
    "schemaTypes",
];

pub fn key() -> impl Strategy<Value = String> {
    prop_oneof![4 => proptest::sample::select(KEYS).prop_map(str::to_string), 1 => any::<String>()]
}

pub fn number() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(|f| serde_json::Number::from_f64(f).map(Value::Number).unwrap_or(Value::Null)),
        // Out of every integer range, kept exact by arbitrary_precision.
        "-?[1-9][0-9]{19,40}(\\.[0-9]{1,5})?(e[+-]?[0-9]{1,4})?"
            .prop_map(|s| serde_json::from_str(&s).unwrap_or(Value::Null)),
    ]
}

pub fn string() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        "[a-z0-9\\-]{0,12}",
        Just(String::new()),
        Just("\0".to_string()),
        Just("x".repeat(300)),
        Just("2025-06-25T12:00:00Z".to_string()),
        Just("p1.eyJhIjo1LCJ0IjpbXX0".to_string()),
    ]
}

pub fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        number(),
        string().prop_map(Value::String),
    ];
    leaf.prop_recursive(6, 96, 8, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
            proptest::collection::vec((key(), inner), 0..8)
                .prop_map(|pairs| Value::Object(pairs.into_iter().collect::<Map<_, _>>())),
        ]
    })
}
