//! Property suite of column inference and projection: the streaming passes over JSON text find
//! what the tree walk finds, and the stored geolocation and tags texts are written as their parsed
//! values would be.

use proptest::prelude::*;
use serde_json::{json, Value};

use crate::domain::export::inference::for_each_leaf;
use crate::domain::export::projection::{scan, ColumnProjector, Leaf};
use crate::domain::export::{ColumnInference, ExportRow};
use crate::testing::*;

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

/// What the writers wrote before they read the text: the `data` column as the parsed value
/// serialised, each data column the first non-null leaf of its name.
fn by_tree(text: &str) -> (String, Vec<(String, Leaf<'static>)>) {
    let value: Value = serde_json::from_str(text).unwrap();
    let mut leaves: Vec<(String, Leaf<'static>)> = Vec::new();
    for_each_leaf(&value, &mut |name, v| {
        let leaf = match v {
            Value::Null => return,
            Value::Bool(b) => Leaf::Bool(*b),
            Value::Number(n) => Leaf::Number(n.to_string().into()),
            Value::String(s) => Leaf::Str(s.clone().into()),
            other => Leaf::Raw(other.to_string().into()),
        };
        if !leaves.iter().any(|(n, _)| n == name) {
            leaves.push((name.to_owned(), leaf));
        }
    });
    (serde_json::to_string(&value).unwrap(), leaves)
}

/// The projector on `text` gives what the tree gives, and takes the fast path exactly when the
/// text is what serialising its value writes.
fn check_projection(text: &str) {
    let (data, leaves) = by_tree(text);
    let mut inference = ColumnInference::new();
    inference.observe_json_text(text);
    let columns = inference.finish();
    let projector = ColumnProjector::new(&columns);
    let mut out = Vec::new();
    let written = projector.project(text, &mut out).unwrap();
    assert_eq!(written, data, "data column of {text}");
    for (column, slot) in columns.iter().zip(&out) {
        let expected = leaves.iter().find(|(n, _)| *n == column.name).map(|(_, l)| l);
        assert_eq!(slot.as_ref(), expected, "{} of {text}", column.name);
    }
    assert_eq!(scan(text, &mut |_, _| {}).is_some(), data == text, "fast path for {text}");
}

/// Objects with their keys in reverse order, a second copy of the first key, no other changes.
fn reordered(value: &Value) -> String {
    match value {
        Value::Object(map) if !map.is_empty() => {
            let mut fields: Vec<String> = map
                .iter()
                .rev()
                .map(|(k, v)| format!("{}:{}", Value::from(k.as_str()), reordered(v)))
                .collect();
            fields.push(fields[0].clone());
            format!("{{{}}}", fields.join(","))
        }
        Value::Array(items) => format!("[{}]", items.iter().map(reordered).collect::<Vec<_>>().join(",")),
        other => other.to_string(),
    }
}

#[test]
fn projection_reads_text_as_the_tree_would_on_edge_cases() {
    let mut deep = json!(1);
    for _ in 0..80 {
        deep = json!({"n": deep, "e": {}});
    }
    let mut deeper = json!([1]);
    for _ in 0..110 {
        deeper = json!([deeper]);
    }
    for text in [
        r#"{"a":1,"b":{"c":[1,{"d":2}],"e":null},"f":"x"}"#,
        r#"{"a": 1}"#,
        r#"{"b":1,"a":2}"#,
        r#"{"a":1,"a":2}"#,
        r#"{"n":1e5,"m":1E+5,"o":1e+5,"p":-0,"q":0.50,"r":123456789012345678901234567890}"#,
        r#"{"s":"tab\there \"q\" back\\slash \u001f \u0000 é 😀"}"#,
        r#"{"s":"\/"}"#,
        r#"{"s":"\u0041"}"#,
        r#"{"s":"\u0008"}"#,
        r#"{"s":"\u001F"}"#,
        r#"{"s":"\ud83d\ude00"}"#,
        r#"{"\n":1,"a\"b":{"x":true},"é":false}"#,
        r#"{"x":[]," y":{}}"#,
        r#"[1,2]"#,
        r#""text""#,
        r#"null"#,
        r#"{}"#,
        " {\"a\":1}",
        "{\"a\":1}\n",
    ] {
        check_projection(text);
    }
    check_projection(&deep.to_string());
    // Canonical, but nested past what the scan follows: the tree path answers, equally.
    let text = deeper.to_string();
    let (data, _) = by_tree(&format!("{{\"a\":{text}}}"));
    let projector = ColumnProjector::new(&[]);
    assert_eq!(projector.project(&format!("{{\"a\":{text}}}"), &mut Vec::new()).unwrap(), data);
}

proptest! {
    #![proptest_config(config(256))]

    /// Stored text in any form: compact as pushes store it, pretty-printed, keys reordered and
    /// repeated.
    #[test]
    fn projection_reads_text_as_the_tree_would(data in json_value()) {
        check_projection(&data.to_string());
        check_projection(&serde_json::to_string_pretty(&data).unwrap());
        check_projection(&reordered(&data));
    }
}

#[test]
fn plain_runs_stop_at_every_byte_that_ends_them() {
    use crate::domain::export::projection::is_canonical;
    for offset in 0..68 {
        let plain = format!("{{\"k\":\"{}é{}\"}}", "a".repeat(offset), "b".repeat(9));
        assert!(is_canonical(&plain), "{plain}");
        for byte in (0u8..0x20).chain([b'"', b'\\']) {
            let text = format!("{{\"k\":\"{}{}{}\"}}", "a".repeat(offset), char::from(byte), "b".repeat(9));
            let reserialised = serde_json::from_str::<Value>(&text).map(|v| v.to_string());
            let canonical = reserialised.is_ok_and(|again| again == text);
            assert_eq!(is_canonical(&text), canonical, "{text:?}");
        }
    }
}

proptest! {
    #![proptest_config(config(256))]

    /// Strings made of what ends a plain run (quotes, backslashes, control characters) around
    /// multi-byte characters, at every offset of the scan's blocks.
    #[test]
    fn projection_reads_strings_as_the_tree_would(s in "[ab\"\\\\\u{0}-\u{1f}\u{7f}é😀 ]{0,100}") {
        let text = Value::String(s).to_string();
        check_projection(&format!("{{\"k\":{text},\"l\":[{text}]}}"));
        check_projection(&format!("{{\"k\": {text}}}"));
    }

    /// The scan that canonical text takes records what serde's visitor records, and any other
    /// text gets the visitor's answer.
    #[test]
    fn inference_reads_any_text_as_the_visitor_does(data in json_value()) {
        for text in [data.to_string(), serde_json::to_string_pretty(&data).unwrap(), reordered(&data)] {
            let mut either = ColumnInference::new();
            either.observe_json_text(&text);
            let mut visited = ColumnInference::new();
            visited.observe_visited(&text);
            prop_assert_eq!(either.finish(), visited.finish(), "{}", text);
        }
    }

    /// Geolocation and tags as stored text are written as the parsed values were: compact JSON
    /// with a JSON null as none, and tags as a list of strings.
    #[test]
    fn geolocation_and_tags_text_read_as_their_values(data in json_value(), tags in json_value()) {
        let texts = |v: &Value| [v.to_string(), serde_json::to_string_pretty(v).unwrap(), reordered(v)];
        let tag_list = |v: &Value| match v {
            Value::Array(items) => Some(
                items.iter().map(|t| t.as_str().map_or_else(|| t.to_string(), str::to_owned)).collect::<Vec<_>>(),
            ),
            _ => None,
        };
        let string_tags = Value::from(tag_list(&tags).unwrap_or_default());
        for (geolocation, tag_value) in [(&data, &tags), (&data, &string_tags)] {
            for (g, t) in texts(geolocation).into_iter().zip(texts(tag_value)) {
                let mut row = crate::domain::export::tests::row("o", "f", 1, json!({}));
                row.geolocation = Some(g.clone());
                row.tags = Some(t.clone());
                let parsed: Value = serde_json::from_str(&g).unwrap();
                let expected = (!parsed.is_null()).then(|| parsed.to_string());
                prop_assert_eq!(row.geolocation_json().unwrap().map(|c| c.into_owned()), expected, "{}", g);
                let expected = tag_list(tag_value).map(|l| serde_json::to_string(&l).unwrap());
                prop_assert_eq!(row.tags_json().unwrap().map(|c| c.into_owned()), expected, "{}", t);
                prop_assert_eq!(row.tag_list().unwrap(), tag_list(tag_value));
            }
        }
        let none = ExportRow { geolocation: None, tags: None, ..crate::domain::export::tests::row("o", "f", 1, json!({})) };
        prop_assert_eq!(none.geolocation_json().unwrap(), None);
        prop_assert_eq!(none.tags_json().unwrap(), None);
    }
}
