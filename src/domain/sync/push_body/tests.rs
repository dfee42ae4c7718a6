use proptest::prelude::*;
use serde_json::json;

use super::*;
use crate::testing::config;

fn split(text: &str) -> PushBody<'_> {
    Received::parse(text.as_bytes()).unwrap().split().unwrap()
}

#[test]
fn only_the_read_fields_and_record_lists_are_kept() {
    let text =
        json!({"client_id": "c", "other": [1, 2], "records": [{"a": 1}, 2], "repository_generation": 3})
            .to_string();
    let push = split(&text);
    assert_eq!(push.fields().unwrap().len(), 2);
    assert_eq!(push.field("repository_generation"), Some(&json!(3)));
    let records = push.records(Dialect::Synkronus).unwrap();
    assert_eq!(records.iter().map(|r| r.get()).collect::<Vec<_>>(), [r#"{"a":1}"#, "2"]);
    assert!(push.records(Dialect::Camel).is_none());
}

#[test]
fn detection_matches_the_parsed_body() {
    for value in [
        json!({"client_id": "c", "records": [{"id": "x", "schema_type": null}]}),
        json!({"client_id": "c", "since_change_id": null, "records": []}),
        json!({"clientId": "c", "changes": {"observations": [{}]}}),
        json!({"client_id": "c", "records": [{"id": "x"}]}),
        json!({"records": "not a list"}),
        json!([{"client_id": "c"}]),
        json!(null),
    ] {
        let text = value.to_string();
        let push = split(&text);
        assert_eq!(push.dialect(), Dialect::detect(&value), "{value}");
        assert_eq!(push.fields().is_some(), value.is_object());
    }
    // A first record that does not parse is no spec record, whatever its keys.
    let text = r#"{"clientId": "c", "records": [{"id": "x", "schema_type": "\ud800"}], "changes": {"observations": []}}"#;
    assert_eq!(split(text).dialect(), Dialect::Camel);
}

#[test]
fn duplicated_keys_keep_the_last_as_a_parsed_body_does() {
    let push = split(r#"{"client_id":"a","client_id":"b","records":[1],"records":[]}"#);
    assert_eq!(push.field("client_id"), Some(&json!("b")));
    assert_eq!(push.records(Dialect::Synkronus).unwrap().len(), 0);
}

#[test]
fn one_pass_splits_the_usual_bodies() {
    for text in [
        r#"{"client_id":"c","transmission_id":"t","records":[{"observation_id":"o","data":{}}]}"#,
        r#" {"clientId":"c","changes":{"observations":[{"id":"x"}],"other":1}} "#,
        r#"{"client_id":"c","changes":5,"records":{"a":1}}"#,
        "[1,2]",
        "\"text\"",
        "12.5e3",
    ] {
        assert!(matches!(Received::parse(text.as_bytes()), Ok(Received::Split(_))), "{text}");
    }
}

/// What the former steps made of a body: the check's error, or the split's error or parts.
type Outcome = Result<Result<Parts, String>, String>;

#[derive(Debug, PartialEq)]
struct Parts {
    fields: Option<Map<String, Value>>,
    records: Option<Vec<String>>,
    observations: Option<Vec<String>>,
    dialect: Dialect,
}

fn parts(body: &PushBody) -> Parts {
    let texts = |list: &Option<Vec<&RawValue>>| {
        list.as_ref().map(|l| l.iter().map(|r| r.get().to_string()).collect())
    };
    Parts {
        fields: body.fields.clone(),
        records: texts(&body.records),
        observations: texts(&body.observations),
        dialect: body.dialect(),
    }
}

/// The reference: check the whole body as `&RawValue`, then split it with [`PushBody::from_raw`].
fn former(bytes: &[u8]) -> Outcome {
    let raw: &RawValue = {
        let mut de = serde_json::Deserializer::from_slice(bytes);
        de.disable_recursion_limit();
        let raw = <&RawValue>::deserialize(&mut de).and_then(|raw| de.end().map(|()| raw));
        raw.map_err(|e| e.to_string())?
    };
    Ok(PushBody::from_raw(raw).map(|b| parts(&b)).map_err(|e| e.to_string()))
}

fn now(bytes: &[u8]) -> Outcome {
    let received = Received::parse(bytes).map_err(|e| e.to_string())?;
    Ok(received.split().map(|b| parts(&b)).map_err(|e| e.to_string()))
}

fn key_text() -> impl Strategy<Value = String> {
    prop_oneof![
        proptest::sample::select(vec![
            "\"client_id\"",
            "\"transmission_id\"",
            "\"clientId\"",
            "\"since_change_id\"",
            "\"repository_generation\"",
            "\"records\"",
            "\"changes\"",
            "\"observations\"",
            "\"\\u0063lient_id\"",
            "\"\\ud800\"",
            "\"id\"",
            "\"schema_type\"",
            "\"x\"",
        ])
        .prop_map(str::to_string),
        any::<String>().prop_map(|s| Value::from(s).to_string()),
    ]
}

fn value_text() -> BoxedStrategy<String> {
    let leaf = prop_oneof![
        proptest::sample::select(vec![
            "\"c\"",
            "\"\\ud800\"",
            "\"\\u0000\"",
            "5",
            "-0",
            "1E+2",
            "null",
            "true",
            "[]",
            "{}",
            "\"x\\ud800y\"",
        ])
        .prop_map(str::to_string),
        crate::testing::json_value().prop_map(|v| v.to_string()),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(|items| format!("[{}]", items.join(","))),
            proptest::collection::vec((key_text(), inner), 0..4).prop_map(|entries| {
                let entries: Vec<String> = entries.into_iter().map(|(k, v)| format!("{k} : {v}")).collect();
                format!("{{ {} }}", entries.join(" , "))
            }),
        ]
    })
    .boxed()
}

/// Push-like bodies, then sometimes broken: cut short, a byte replaced by an invalid UTF-8 one or
/// by a bracket, a non-object, spaces around.
fn body_bytes() -> impl Strategy<Value = Vec<u8>> {
    let object = proptest::collection::vec((key_text(), value_text()), 0..7).prop_map(|entries| {
        let entries: Vec<String> = entries.into_iter().map(|(k, v)| format!("{k}:{v}")).collect();
        format!("{{{}}}", entries.join(","))
    });
    let text = prop_oneof![6 => object, 1 => value_text()];
    (text, 0..6u8, any::<prop::sample::Index>(), "[ \n\t]{0,3}").prop_map(|(text, damage, at, space)| {
        let mut bytes = format!("{space}{text}{space}").into_bytes();
        let i = at.index(bytes.len().max(1)).min(bytes.len().saturating_sub(1));
        match damage {
            0 if !bytes.is_empty() => bytes.truncate(i),
            1 if !bytes.is_empty() => bytes[i] = 0xFF,
            2 if !bytes.is_empty() => bytes[i] = b'[',
            3 => bytes.extend_from_slice(b" x"),
            _ => {}
        }
        bytes
    })
}

proptest! {
    #![proptest_config(config(1024))]

    /// Same answers, same errors (to the byte, positions included), at the same step.
    #[test]
    fn one_pass_answers_as_the_former_steps(bytes in body_bytes()) {
        prop_assert_eq!(now(&bytes), former(&bytes), "{}", String::from_utf8_lossy(&bytes));
    }
}
