use proptest::prelude::*;
use serde_json::value::RawValue;
use serde_json::Value;

use super::*;
use crate::domain::sync::push_body;
use crate::testing::config;

/// A parsed value as compact JSON text; object keys come out sorted (serde_json's map is ordered).
pub(in crate::domain::sync) fn compact_json(value: &Value) -> Box<RawValue> {
    // Serialising a parsed `Value` cannot fail: its keys are strings and its numbers are finite.
    serde_json::value::to_raw_value(value).unwrap_or_else(|_| RawValue::NULL.to_owned())
}

/// NUL cannot appear in PostgreSQL text, and `\u0000` breaks any later cast to jsonb (exports,
/// statistics): refuse it up front so the push fails with 422 instead of a database error.
pub(in crate::domain::sync) fn storable_json(v: &Value) -> std::result::Result<(), &'static str> {
    match v {
        Value::String(s) if s.contains('\0') => Err("strings must not contain NUL characters"),
        Value::Array(items) => items.iter().try_for_each(storable_json),
        Value::Object(map) => {
            for (k, v) in map {
                if k.contains('\0') {
                    return Err("keys must not contain NUL characters");
                }
                storable_json(v)?;
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// The reference: what decoding did before the tape, kept here only to hold the tape to it. The
/// text parsed into a `Value` (the error is the record's 400), checked for NUL, written back.
fn reference(text: &str) -> Result<std::result::Result<String, &'static str>> {
    let value: Value = push_body::parse(text)?;
    Ok(storable_json(&value).map(|()| compact_json(&value).get().to_string()))
}

fn canonical(text: &str) -> Result<std::result::Result<String, &'static str>> {
    let mut tape = Tape::default();
    let mut doc = tape.read(text)?;
    let root = doc.root();
    let mut out = String::new();
    Ok(doc.write(root, &mut out).map(|()| out))
}

#[test]
fn keys_are_sorted_and_the_last_duplicate_wins() {
    let text =
        r#" { "b" : [ 1 , { "z":null, "y" : true } ], "a": "x", "b": {"d": 1, "c": 2}, "\u0061": -0 } "#;
    assert_eq!(canonical(text).unwrap().unwrap(), r#"{"a":-0,"b":{"c":2,"d":1}}"#);
    assert_eq!(canonical(text).unwrap(), reference(text).unwrap());
}

#[test]
fn numbers_keep_their_text_but_for_the_exponent() {
    for (text, want) in [
        ("1e300", "1e+300"),
        ("1E+2", "1e+2"),
        ("-1.50E-7", "-1.50e-7"),
        ("-0", "-0"),
        ("-0.0", "-0.0"),
        ("123456789012345678901234567890", "123456789012345678901234567890"),
        ("18446744073709551615", "18446744073709551615"),
        ("-9223372036854775808", "-9223372036854775808"),
        ("0.1000", "0.1000"),
    ] {
        assert_eq!(canonical(text).unwrap().unwrap(), want, "{text}");
        assert_eq!(reference(text).unwrap().unwrap(), want, "{text}");
    }
}

#[test]
fn strings_are_escaped_as_serde_json_escapes_them() {
    for text in [
        r#""plain é 😀""#,
        r#""\"\\\/\b\f\n\r\t""#,
        r#""\u0041\u00e9\u00E9\ud83d\ude00\u001f\u007f\u2028""#,
        r#""a\nb""#,
    ] {
        assert_eq!(canonical(text).unwrap(), reference(text).unwrap(), "{text}");
    }
}

#[test]
fn nul_is_refused_in_the_order_a_sorted_map_walks() {
    for text in [
        r#"{"b": "\u0000", "a\u0000": 1}"#,
        r#"{"a": "\u0000", "b\u0000": 1}"#,
        r#"{"a": "\u0000", "a": 1}"#,
        r#"[1, {"k": ["\u0000"]}]"#,
    ] {
        assert_eq!(canonical(text).unwrap(), reference(text).unwrap(), "{text}");
    }
    assert_eq!(canonical(r#"{"a\u0000": "\u0000"}"#).unwrap(), Err(NUL_IN_KEY));
}

#[test]
fn invalid_surrogates_fail_as_the_value_parser_fails() {
    for text in [
        r#""\ud800""#,
        r#""\udc00""#,
        r#""\ud800\u0041""#,
        r#""\ud800\n""#,
        r#"{"\ud800": 1}"#,
        r#"{"a": "\ud800", "a": 1}"#,
        r#"[{"a": 1}, "x\udfff"]"#,
    ] {
        assert!(canonical(text).is_err(), "{text}");
        assert!(reference(text).is_err(), "{text}");
    }
}

#[test]
fn deep_nesting_uses_no_recursion() {
    let depth = 200_000;
    let text = format!("{}1{}", "[{\"a\":".repeat(depth), "}]".repeat(depth));
    let out = canonical(&text).unwrap().unwrap();
    assert_eq!(out, text);
}

#[test]
fn entries_are_listed_as_read_with_their_decoded_keys() {
    let text = r#"{"b": 1, "\u0061": [2], "a": {"x": 3}, "c": null}"#;
    let mut tape = Tape::default();
    let mut doc = tape.read(text).unwrap();
    let root = doc.root();
    assert_eq!(doc.kind(root), Kind::Object);
    let entries: Vec<(&str, NodeId)> = doc.entries(root).collect();
    let keys: Vec<&str> = entries.iter().map(|(k, _)| *k).collect();
    assert_eq!(keys, ["b", "a", "a", "c"]);
    assert_eq!(&text[doc.span(entries[1].1)], "[2]");
    assert_eq!(&text[doc.span(entries[2].1)], r#"{"x": 3}"#);
    assert_eq!(doc.kind(entries[2].1), Kind::Object);
    assert_eq!(doc.kind(entries[3].1), Kind::Null);
    assert_eq!(doc.kind(entries[0].1), Kind::Other);
    assert_eq!(doc.entries(entries[0].1).count(), 0);
    let mut out = String::new();
    doc.write(root, &mut out).unwrap();
    assert_eq!(out, r#"{"a":{"x":3},"b":1,"c":null}"#);
}

/// A JSON value as text, with the freedom the grammar allows: spacing, escapes of any character,
/// key order and duplicates.
#[derive(Debug, Clone)]
enum Text {
    Literal(&'static str),
    Number(String),
    String(Vec<Piece>),
    Array(Vec<Text>),
    Object(Vec<(Vec<Piece>, Text)>),
}

#[derive(Debug, Clone)]
enum Piece {
    Char(char),
    Short(char),
    /// `\uXXXX`, upper- or lowercase: any code unit, lone surrogates included.
    Unit(u16, bool),
    /// A character beyond the BMP as its surrogate pair.
    Pair(char),
}

fn piece() -> impl Strategy<Value = Piece> {
    prop_oneof![
        6 => any::<char>().prop_filter("unescaped", |c| !matches!(c, '"' | '\\' | '\0'..='\u{1f}')).prop_map(Piece::Char),
        4 => proptest::sample::select(vec!['a', 'b', 'é', 'Z', ' ', '~', '\u{7f}', '😀']).prop_map(Piece::Char),
        2 => proptest::sample::select(vec!['"', '\\', '/', 'b', 'f', 'n', 'r', 't']).prop_map(Piece::Short),
        2 => (prop_oneof![0u16..0x80, 0xD7F0u16..0xE010, any::<u16>()], any::<bool>())
            .prop_map(|(u, upper)| Piece::Unit(u, upper)),
        1 => proptest::char::range('\u{10000}', '\u{10FFFF}').prop_map(Piece::Pair),
    ]
}

fn key() -> impl Strategy<Value = Vec<Piece>> {
    prop_oneof![
        // A few keys, so objects repeat them, in every spelling.
        3 => proptest::sample::select(vec!["a", "b", "ab", "B", "é", ""])
            .prop_map(|k| k.chars().map(Piece::Char).collect()),
        1 => Just(vec![Piece::Unit(0x61, false)]),
        1 => Just(vec![Piece::Unit(0, false)]),
        2 => proptest::collection::vec(piece(), 0..4),
    ]
}

fn number() -> impl Strategy<Value = String> {
    prop_oneof![
        "-?(0|[1-9][0-9]{0,25})(\\.[0-9]{1,5})?([eE][+-]?[0-9]{1,4})?",
        any::<i64>().prop_map(|n| n.to_string()),
        any::<u64>().prop_map(|n| n.to_string()),
        Just("-0".to_string()),
        Just("1e300".to_string()),
        Just("1E+2".to_string()),
    ]
}

fn text() -> impl Strategy<Value = Text> {
    let leaf = prop_oneof![
        proptest::sample::select(vec!["null", "true", "false"]).prop_map(Text::Literal),
        number().prop_map(Text::Number),
        proptest::collection::vec(piece(), 0..12).prop_map(Text::String),
    ];
    leaf.prop_recursive(6, 64, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Text::Array),
            proptest::collection::vec((key(), inner), 0..7).prop_map(Text::Object),
        ]
    })
}

/// Renders with whitespace from `spaces`, cycling.
fn render(t: &Text, spaces: &[&str], n: &mut usize, out: &mut String) {
    let space = |out: &mut String, n: &mut usize| {
        if !spaces.is_empty() {
            out.push_str(spaces[*n % spaces.len()]);
            *n += 1;
        }
    };
    space(out, n);
    match t {
        Text::Literal(l) => out.push_str(l),
        Text::Number(s) => out.push_str(s),
        Text::String(pieces) => render_string(pieces, out),
        Text::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                render(item, spaces, n, out);
            }
            space(out, n);
            out.push(']');
        }
        Text::Object(entries) => {
            out.push('{');
            for (i, (k, v)) in entries.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                space(out, n);
                render_string(k, out);
                space(out, n);
                out.push(':');
                render(v, spaces, n, out);
            }
            space(out, n);
            out.push('}');
        }
    }
    space(out, n);
}

fn render_string(pieces: &[Piece], out: &mut String) {
    out.push('"');
    for p in pieces {
        match p {
            Piece::Char(c) => out.push(*c),
            Piece::Short(c) => {
                out.push('\\');
                out.push(*c);
            }
            Piece::Unit(u, true) => out.push_str(&format!("\\u{u:04X}")),
            Piece::Unit(u, false) => out.push_str(&format!("\\u{u:04x}")),
            Piece::Pair(c) => {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{u:04x}"));
                }
            }
        }
    }
    out.push('"');
}

fn spacing() -> impl Strategy<Value = Vec<&'static str>> {
    prop_oneof![
        Just(vec![]),
        proptest::collection::vec(proptest::sample::select(vec!["", " ", "\n", "\t", "\r\n", "  "]), 1..6),
    ]
}

proptest! {
    #![proptest_config(config(512))]

    /// Byte for byte what the `Value` round trip wrote, and failing where it failed.
    #[test]
    fn canonical_text_equals_the_value_round_trip(t in text(), spaces in spacing()) {
        let mut text = String::new();
        render(&t, &spaces, &mut 0, &mut text);
        let want = reference(&text);
        let got = canonical(&text);
        prop_assert_eq!(got.is_err(), want.is_err(), "{}: {:?} {:?}", text, got, want);
        if let (Ok(got), Ok(want)) = (got, want) {
            prop_assert_eq!(got, want, "{}", text);
        }
    }

    /// The same on whatever the crate's JSON generators make, written by serde_json.
    #[test]
    fn canonical_text_of_generated_values(value in crate::testing::json_value()) {
        let text = value.to_string();
        prop_assert_eq!(canonical(&text).ok(), reference(&text).ok(), "{}", text);
        let pretty = serde_json::to_string_pretty(&value).unwrap_or_default();
        prop_assert_eq!(canonical(&pretty).ok(), reference(&pretty).ok(), "{}", pretty);
    }
}
