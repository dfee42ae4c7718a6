//! Property suite of the sync dialects: the decoders never panic on arbitrary JSON, and valid
//! records round-trip through every dialect's push and pull shapes.

use proptest::prelude::*;
use serde_json::{json, Value};

use crate::domain::sync::decode::{decode_pull, decode_pull_query, decode_push, PullQuery};
use crate::domain::sync::encode::push_response;
use crate::domain::sync::page::{PageWriter, PulledRecord};
use crate::domain::sync::{Dialect, PushResult};
use crate::domain::time::UnixMicros;
use crate::testing::*;

/// A push body in each dialect's shape, with generated record fields, so decoding gets deep.
fn push_shaped() -> impl Strategy<Value = Value> {
    let record = proptest::collection::vec((key(), json_value()), 0..10)
        .prop_map(|pairs| Value::Object(pairs.into_iter().collect()));
    (0..3usize, json_value(), json_value(), proptest::collection::vec(record, 0..6)).prop_map(
        |(dialect, client, tid, records)| match dialect {
            0 => json!({"client_id": client, "transmission_id": tid, "records": records}),
            1 => {
                json!({"client_id": client, "since_change_id": 0, "transmission_id": tid, "records": records})
            }
            _ => json!({"clientId": client, "transmissionId": tid, "changes": {"observations": records}}),
        },
    )
}

fn pull_query() -> impl Strategy<Value = PullQuery> {
    (
        proptest::option::of(string()),
        proptest::option::of(string()),
        proptest::collection::vec(string(), 0..3),
    )
        .prop_map(|(limit, page_token, schema_types)| PullQuery { limit, page_token, schema_types })
}

proptest! {
    #![proptest_config(config(64))]

    #[test]
    fn decoders_never_panic_on_arbitrary_json(body in json_value(), query in pull_query()) {
        let _ = decode_push(&body);
        let _ = decode_pull(&body, &query);
    }

    #[test]
    fn decoders_never_panic_on_push_shaped_json(body in push_shaped(), query in pull_query()) {
        if let Ok(push) = decode_push(&body) {
            // Whatever was accepted can be stored: ids are 1-255 chars without NUL.
            for r in &push.records {
                prop_assert!(!r.id().is_empty() && r.id().chars().count() <= 255 && !r.id().contains('\0'));
            }
            let _ = push.fingerprint();
        }
        if let Ok(pull) = decode_pull(&body, &query) {
            prop_assert!(pull.after >= 0 && (1..=500).contains(&pull.limit));
        }
    }

    #[test]
    fn query_pull_never_panics(pairs in proptest::collection::vec((key(), string()), 0..8)) {
        for dialect in [Dialect::Synkronus, Dialect::Spec, Dialect::Camel] {
            if let Ok(pull) = decode_pull_query(&pairs, dialect) {
                prop_assert!(pull.after >= 0 && (1..=500).contains(&pull.limit));
            }
        }
    }
}

#[derive(Debug, Clone)]
struct Generated {
    id: String,
    form_type: String,
    form_version: String,
    data: Value,
    deleted: bool,
}

fn storable_text(max: usize) -> impl Strategy<Value = String> {
    proptest::collection::vec(any::<char>().prop_filter("no NUL", |c| *c != '\0'), 1..max)
        .prop_map(|cs| cs.into_iter().collect())
}

fn storable_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        number(),
        storable_text(20).prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            proptest::collection::btree_map(storable_text(10), inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn generated_record() -> impl Strategy<Value = Generated> {
    (
        storable_text(40),
        storable_text(20),
        storable_text(10),
        proptest::collection::btree_map(storable_text(10), storable_json(), 0..6),
        any::<bool>(),
    )
        .prop_map(|(id, form_type, form_version, data, deleted)| Generated {
            id,
            form_type,
            form_version,
            data: Value::Object(data.into_iter().collect()),
            deleted,
        })
}

/// The record list of a push body in `dialect`, made of wire records.
fn push_body(dialect: Dialect, records: Vec<Value>) -> Value {
    match dialect {
        Dialect::Synkronus => json!({"client_id": "c", "transmission_id": "t", "records": records}),
        Dialect::Spec => json!({"client_id": "c", "transmission_id": "t", "records": records}),
        Dialect::Camel => {
            json!({"clientId": "c", "transmissionId": "t", "changes": {"observations": records}})
        }
    }
}

fn wire_record(dialect: Dialect, g: &Generated) -> Value {
    match dialect {
        Dialect::Synkronus => json!({"observation_id": g.id, "form_type": g.form_type,
            "form_version": g.form_version, "data": g.data, "deleted": g.deleted}),
        Dialect::Spec => json!({"id": g.id, "schema_type": g.form_type,
            "schema_version": g.form_version, "data": g.data, "deleted": g.deleted}),
        Dialect::Camel => json!({"observationId": g.id, "formType": g.form_type,
            "formVersion": g.form_version, "data": g.data, "deleted": g.deleted}),
    }
}

fn pulled_records(dialect: Dialect, body: &Value) -> Vec<Value> {
    let list = match dialect {
        Dialect::Camel => &body["changes"]["observations"],
        _ => &body["records"],
    };
    list.as_array().cloned().unwrap_or_default()
}

proptest! {
    #![proptest_config(config(48))]

    /// push decode -> pull encode -> text -> push decode gives the same records, per dialect.
    /// (Pull writes stored JSON text as is; the decoded record's text stands in for the database's copy.)
    #[test]
    fn valid_records_round_trip_through_every_dialect(
        records in proptest::collection::vec(generated_record(), 1..5),
        dialect in prop_oneof![Just(Dialect::Synkronus), Just(Dialect::Spec), Just(Dialect::Camel)],
    ) {
        let wire: Vec<Value> = records.iter().map(|g| wire_record(dialect, g)).collect();
        let body = push_body(dialect, wire);
        prop_assert_eq!(Dialect::detect(&body), dialect);
        let push = decode_push(&body).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(push.records.len(), records.len());
        // The database's copy of each record's JSON, as the pull reads it.
        let stored: Vec<(String, Option<String>, Option<String>)> = push
            .records
            .iter()
            .map(|r| {
                (
                    r.data().unwrap_or("null").to_string(),
                    r.geolocation().map(str::to_string),
                    r.tags().map(str::to_string),
                )
            })
            .collect();
        let head = stored.len() as i64;
        let mut writer = PageWriter::new(dialect, head, 1, 500, vec![]);
        let mut bytes = Vec::new();
        writer.open(&mut bytes);
        for (i, (r, (data, geolocation, tags))) in push.records.iter().zip(&stored).enumerate() {
            let record = PulledRecord {
                id: r.id(),
                form_type: r.form_type(),
                form_version: r.form_version(),
                data,
                deleted: r.deleted,
                created_at: r.created_at.map(UnixMicros::of),
                updated_at: r.updated_at.map(UnixMicros::of),
                synced_at: UnixMicros::of(chrono::Utc::now()),
                geolocation: geolocation.as_deref(),
                author: r.author(),
                device_id: r.device_id(),
                tags: tags.as_deref(),
                change_id: i as i64 + 1,
            };
            writer.record(&mut bytes, &record);
        }
        writer.close(&mut bytes);
        let text = String::from_utf8(bytes).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let pulled: Value = serde_json::from_str(&text).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let again = decode_push(&push_body(dialect, pulled_records(dialect, &pulled)))
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        for (g, r) in records.iter().zip(&again.records) {
            prop_assert_eq!(r.id(), &g.id);
            prop_assert_eq!(r.form_type(), &g.form_type);
            prop_assert_eq!(r.form_version(), &g.form_version);
            let data: Option<Value> = r.data().and_then(|d| serde_json::from_str(d).ok());
            prop_assert_eq!(data.as_ref(), Some(&g.data));
            prop_assert_eq!(r.deleted, g.deleted);
        }
        let result = PushResult {
            head,
            repository_generation: 1,
            items: again.records.iter().enumerate().map(|(i, r)| (r.id().to_string(), i as i64 + 1)).collect(),
            warnings: vec![],
            refused: vec![],
        };
        prop_assert!(push_response(dialect, &result).is_ok());
    }
}
