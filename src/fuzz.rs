//! Property tests standing in for cargo-fuzz (which needs a nightly toolchain): the parsers that
//! face untrusted input must never panic, and must refuse what they cannot vouch for. Each target
//! runs a few dozen cases in `make test`; `PROPTEST_CASES=100000 cargo test --lib fuzz::` runs a
//! long campaign (SECURITY.md). A failure found this way becomes a named regression test below.

use proptest::prelude::*;
use proptest::test_runner::Config;
use serde_json::{json, Map, Value};

/// Cases per property: small by default so `make test` stays fast; PROPTEST_CASES overrides it.
fn config(default_cases: u32) -> Config {
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

fn key() -> impl Strategy<Value = String> {
    prop_oneof![4 => proptest::sample::select(KEYS).prop_map(str::to_string), 1 => any::<String>()]
}

fn number() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(|f| serde_json::Number::from_f64(f).map(Value::Number).unwrap_or(Value::Null)),
        // Out of every integer range, kept exact by arbitrary_precision.
        "-?[1-9][0-9]{19,40}(\\.[0-9]{1,5})?(e[+-]?[0-9]{1,4})?"
            .prop_map(|s| serde_json::from_str(&s).unwrap_or(Value::Null)),
    ]
}

fn string() -> impl Strategy<Value = String> {
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

fn json_value() -> impl Strategy<Value = Value> {
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

mod sync_codecs {
    use super::*;
    use crate::domain::sync::decode::{decode_pull, decode_pull_query, decode_push, PullQuery};
    use crate::domain::sync::encode::{pull_response, push_response};
    use crate::domain::sync::{Dialect, PullPage, PushResult, StoredRecord};

    /// A push body in each dialect's shape, with generated record fields, so decoding gets deep.
    fn push_shaped() -> impl Strategy<Value = Value> {
        let record = proptest::collection::vec((key(), json_value()), 0..10)
            .prop_map(|pairs| Value::Object(pairs.into_iter().collect()));
        (0..3usize, json_value(), json_value(), proptest::collection::vec(record, 0..6)).prop_map(
            |(dialect, client, tid, records)| match dialect {
                0 => json!({"client_id": client, "transmission_id": tid, "records": records}),
                1 => json!({"client_id": client, "since_change_id": 0, "transmission_id": tid, "records": records}),
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
            .prop_map(|(limit, page_token, schema_types)| PullQuery {
                limit,
                page_token,
                schema_types,
            })
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
                    prop_assert!(!r.id.is_empty() && r.id.chars().count() <= 255 && !r.id.contains('\0'));
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

    fn raw(v: &Value) -> Box<serde_json::value::RawValue> {
        serde_json::value::RawValue::from_string(v.to_string()).expect("valid JSON text")
    }

    proptest! {
        #![proptest_config(config(48))]

        /// push decode -> pull encode -> text -> push decode gives the same records, per dialect.
        /// (Pull encodes stored JSON text as is; `raw` stands in for the database's copy.)
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
            let stored: Vec<StoredRecord> = push
                .records
                .iter()
                .enumerate()
                .map(|(i, r)| StoredRecord {
                    id: r.id.clone(),
                    form_type: r.form_type.clone(),
                    form_version: r.form_version.clone(),
                    data: r.data.clone().unwrap_or_else(|| raw(&Value::Null)),
                    deleted: r.deleted,
                    created_at: r.created_at,
                    updated_at: r.updated_at,
                    synced_at: chrono::Utc::now(),
                    geolocation: r.geolocation.as_ref().map(raw),
                    author: r.author.clone(),
                    device_id: r.device_id.clone(),
                    tags: r.tags.clone().map(|t| raw(&Value::from(t))),
                    change_id: i as i64 + 1,
                })
                .collect();
            let head = stored.len() as i64;
            let page = PullPage { records: stored, head, repository_generation: 1, has_more: false, types: vec![] };
            let text = String::from_utf8(pull_response(dialect, &page).map_err(|e| TestCaseError::fail(e.to_string()))?)
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            let pulled: Value = serde_json::from_str(&text).map_err(|e| TestCaseError::fail(e.to_string()))?;
            let again = decode_push(&push_body(dialect, pulled_records(dialect, &pulled)))
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            for (g, r) in records.iter().zip(&again.records) {
                prop_assert_eq!(&r.id, &g.id);
                prop_assert_eq!(&r.form_type, &g.form_type);
                prop_assert_eq!(&r.form_version, &g.form_version);
                let data: Option<Value> = r.data.as_ref().and_then(|d| serde_json::from_str(d.get()).ok());
                prop_assert_eq!(data.as_ref(), Some(&g.data));
                prop_assert_eq!(r.deleted, g.deleted);
            }
            let result = PushResult {
                head,
                repository_generation: 1,
                items: again.records.iter().enumerate().map(|(i, r)| (r.id.clone(), i as i64 + 1)).collect(),
                warnings: vec![],
            };
            prop_assert!(push_response(dialect, &result).is_object());
        }
    }
}

mod page_tokens {
    use super::*;
    use crate::domain::page_token::{decode, encode, TokenKind};
    use crate::domain::sync::PullCursor;

    fn kind() -> impl Strategy<Value = TokenKind> {
        prop_oneof![Just(TokenKind::Pull), Just(TokenKind::Observations), Just(TokenKind::History)]
    }

    proptest! {
        #![proptest_config(config(128))]

        #[test]
        fn arbitrary_strings_never_panic(token in any::<String>(), k in kind()) {
            let _ = decode::<PullCursor>(k, &token);
            let _ = decode::<Value>(k, &token);
        }

        #[test]
        fn prefixed_garbage_never_panics(body in "[A-Za-z0-9_\\-=.+/ ]{0,200}", k in kind()) {
            for prefix in ["p1.", "o1.", "h1."] {
                let _ = decode::<PullCursor>(k, &format!("{}{}", prefix, body));
            }
        }

        #[test]
        fn tokens_round_trip_and_mutations_never_panic(
            a in any::<i64>(),
            t in proptest::collection::vec(any::<String>(), 0..4),
            at in any::<prop::sample::Index>(),
            byte in any::<u8>(),
        ) {
            let cursor = PullCursor { a, t };
            let token = encode(TokenKind::Pull, &cursor);
            prop_assert_eq!(decode::<PullCursor>(TokenKind::Pull, &token), Some(cursor));
            prop_assert_eq!(decode::<PullCursor>(TokenKind::History, &token), None);
            let mut bytes = token.into_bytes();
            let i = at.index(bytes.len());
            bytes[i] = byte;
            let _ = decode::<PullCursor>(TokenKind::Pull, &String::from_utf8_lossy(&bytes));
        }
    }
}

mod jwt {
    use std::time::Duration;

    use super::*;
    use crate::auth::AuthService;
    use crate::db::users::UserRow;
    use crate::domain::role::Role;
    use crate::error::ErrorCode;

    const SECRET: &[u8] = b"fuzz-secret-fuzz-secret-fuzz-secret-0123";
    const B64URL: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

    fn service() -> AuthService {
        AuthService::new(SECRET, Duration::from_secs(3600), Duration::from_secs(7200)).expect("auth service")
    }

    fn real_token(auth: &AuthService) -> String {
        let user = UserRow {
            id: uuid::Uuid::new_v4(),
            username: "fuzz".into(),
            email: None,
            role: Role::Admin,
            password_hash: String::new(),
            token_generation: 1,
            created_at: chrono::Utc::now(),
            last_login: None,
        };
        auth.issue_access_token(&user).expect("token").token
    }

    proptest! {
        #![proptest_config(config(128))]

        #[test]
        fn arbitrary_strings_are_refused(token in any::<String>()) {
            prop_assert!(service().decode(&token).is_err());
        }

        #[test]
        fn dotted_garbage_is_refused(parts in proptest::collection::vec("[A-Za-z0-9_\\-]{0,80}", 0..5)) {
            prop_assert!(service().decode(&parts.join(".")).is_err());
        }

        /// Any change to a real token's characters is refused (no malleable signature, no
        /// accepted alternative encoding), and the error is a plain 401 code.
        #[test]
        fn mutated_real_tokens_are_refused(at in any::<prop::sample::Index>(), pick in any::<prop::sample::Index>()) {
            let auth = service();
            let token = real_token(&auth);
            prop_assert!(auth.decode(&token).is_ok());
            let mut bytes = token.clone().into_bytes();
            let i = at.index(bytes.len());
            let mut replacement = B64URL[pick.index(B64URL.len())];
            if replacement == bytes[i] {
                replacement = if bytes[i] == b'A' { b'B' } else { b'A' };
            }
            bytes[i] = replacement;
            let mutated = String::from_utf8(bytes).expect("ascii");
            match auth.decode(&mutated) {
                Ok(_) => prop_assert!(false, "mutated token accepted: {} -> {}", token, mutated),
                Err(code) => prop_assert!(matches!(code, ErrorCode::InvalidToken)),
            }
        }

        #[test]
        fn truncated_or_extended_real_tokens_are_refused(cut in any::<prop::sample::Index>(), tail in "[A-Za-z0-9_\\-.]{1,8}") {
            let auth = service();
            let token = real_token(&auth);
            let short = &token[..cut.index(token.len())];
            prop_assert!(auth.decode(short).is_err());
            let extended = format!("{token}{tail}");
            prop_assert!(auth.decode(&extended).is_err());
        }
    }
}

mod bundle_zip {
    use std::io::Write;

    use super::*;
    use crate::domain::bundle::{validate_zip, Limits};

    const FIXTURE: &[u8] = include_bytes!("../tests/fixtures/upstream/valid_bundle01.zip");

    fn small_zip(stored: bool) -> Vec<u8> {
        let mut writer = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
        let method = if stored { zip::CompressionMethod::Stored } else { zip::CompressionMethod::Deflated };
        let options = zip::write::SimpleFileOptions::default().compression_method(method);
        let files: [(&str, &[u8]); 4] = [
            (
                "manifest.json",
                br#"{"version":"20250101-000000","name":"Fuzz","entryPoint":"app/index.html"}"#,
            ),
            ("app/index.html", b"<html></html>"),
            ("forms/household/schema.json", br#"{"type":"object","properties":{"name":{"type":"string"}}}"#),
            ("forms/household/ui.json", br#"{"type":"VerticalLayout","elements":[]}"#),
        ];
        for (name, content) in files {
            writer.start_file(name, options).expect("start");
            writer.write_all(content).expect("write");
        }
        writer.finish().expect("finish").into_inner()
    }

    /// Runs the validator on `bytes` from a temp file: it must return, Ok or a rejection.
    fn validate(bytes: &[u8]) -> bool {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("bundle.zip");
        std::fs::write(&path, bytes).expect("write zip");
        validate_zip(&path, &Limits::default()).is_ok()
    }

    fn base() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![Just(FIXTURE.to_vec()), Just(small_zip(true)), Just(small_zip(false))]
    }

    #[test]
    fn the_unmutated_bases_are_valid() {
        assert!(validate(FIXTURE));
        assert!(validate(&small_zip(true)));
        assert!(validate(&small_zip(false)));
    }

    proptest! {
        #![proptest_config(config(48))]

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
            prop_assert!(!validate(&bytes));
        }

        #[test]
        fn mutated_bundles_never_panic(
            base in base(),
            edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..12),
        ) {
            let mut bytes = base;
            for (at, b) in edits {
                let i = at.index(bytes.len());
                bytes[i] = b;
            }
            let _ = validate(&bytes);
        }

        /// Mutations aimed at the end of the file hit the central directory and its sizes/offsets.
        #[test]
        fn mutated_directories_never_panic(
            base in base(),
            edits in proptest::collection::vec((0usize..200, any::<u8>()), 1..8),
            cut in 0usize..64,
        ) {
            let mut bytes = base;
            let len = bytes.len();
            for (back, b) in edits {
                let i = len - 1 - back.min(len - 1);
                bytes[i] = b;
            }
            let _ = validate(&bytes);
            bytes.truncate(len.saturating_sub(cut));
            let _ = validate(&bytes);
        }

        #[test]
        fn truncated_bundles_never_panic(base in base(), keep in any::<prop::sample::Index>()) {
            let _ = validate(&base[..keep.index(base.len())]);
        }
    }
}

mod export_inference {
    use super::*;
    use crate::domain::export::ColumnInference;

    fn both_ways(
        data: &Value,
    ) -> (Vec<crate::domain::export::DataColumn>, Vec<crate::domain::export::DataColumn>) {
        let mut parsed = ColumnInference::new();
        parsed.observe(data);
        let mut streamed = ColumnInference::new();
        streamed.observe_json_text(&data.to_string());
        (parsed.finish(), streamed.finish())
    }

    #[test]
    fn streaming_inference_matches_on_edge_cases() {
        let mut deep = json!(1);
        for _ in 0..80 {
            deep = json!({"n": deep, "e": {}});
        }
        for data in [
            json!({"a\"b": 1, "é\n": [1, {"x": 2}], "dot.ted": {"x": null}}),
            json!({"big": 123456789012345678901234567890_u128, "neg": -1, "f": 1.5, "e": 1e300, "u": u64::MAX}),
            json!({"t": true, "s": "x", "o": {"p": {"q": "r"}}}),
            deep,
            json!([1, 2]),
            json!("text"),
        ] {
            let (parsed, streamed) = both_ways(&data);
            assert_eq!(parsed, streamed, "{data}");
        }
    }

    proptest! {
        #![proptest_config(config(256))]

        /// The inference pass reads JSON text without parsing it into a tree: it must find the
        /// same columns and types as the tree walk.
        #[test]
        fn streaming_inference_matches_the_tree_walk(data in json_value()) {
            let (parsed, streamed) = both_ways(&data);
            prop_assert_eq!(parsed, streamed);
        }
    }
}
