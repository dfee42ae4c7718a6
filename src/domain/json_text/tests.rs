//! The scanner's classification against serde_json itself: a token is canonical exactly when
//! serde_json writes its value that way, and the writers write what serde_json writes.

use proptest::prelude::*;
use serde_json::Value;

use super::*;
use crate::testing::config;

/// The string token at the start of `text`, and what is left after it.
fn string_token(text: &str) -> Option<(StringToken<'_>, usize)> {
    let mut s = Scanner::new(text);
    let token = s.string()?;
    Some((token, s.pos()))
}

/// What serde_json makes of a JSON string literal: its value, and that value written again.
fn serde_string(text: &str) -> Option<(String, String)> {
    let value: String = serde_json::from_str(text).ok()?;
    let again = serde_json::to_string(&value).ok()?;
    Some((value, again))
}

fn check_string(text: &str) {
    let scanned = string_token(text).filter(|(_, end)| *end == text.len());
    let parsed = serde_string(text);
    // Accepted by the scanner exactly when serde_json accepts it, but for lone surrogates: the
    // scanner reads escapes, serde_json's parser decodes them (the canonical writer asks it).
    match (&scanned, &parsed) {
        (Some((token, _)), Some((value, again))) => {
            assert_eq!(token.form() != StringForm::Rewrite, again == text, "{text:?}");
            assert_eq!(token.has_nul(), value.contains('\0'), "{text:?}");
            if let Some(decoded) = token.canonical_value() {
                assert_eq!(decoded, value.as_str(), "{text:?}");
            }
            let mut written = String::new();
            write_string(&mut written, value);
            assert_eq!(&written, again, "{text:?}");
        }
        (Some((token, _)), None) => {
            assert_eq!(token.form(), StringForm::Rewrite, "a surrogate is not canonical: {text:?}")
        }
        (None, Some(_)) => panic!("the scanner refused {text:?}"),
        (None, None) => {}
    }
}

#[test]
fn strings_are_classified_as_serde_json_writes_them() {
    for text in [
        r#""""#,
        r#""plain é 😀""#,
        r#""\"\\\b\f\n\r\t""#,
        r#""\/""#,
        r#""\u0000""#,
        r#""\u001f\u0001""#,
        r#""\u001F""#,
        r#""\u0008""#,
        r#""\u0022""#,
        r#""\u0041\u00e9""#,
        r#""\ud83d\ude00""#,
        r#""\ud800""#,
        r#""\u12""#,
        r#""\x""#,
        "\"tab\there\"",
        r#""open"#,
    ] {
        check_string(text);
    }
}

fn check_number(text: &str) {
    let mut s = Scanner::new(text);
    let token = s.number().filter(|_| s.at_end());
    let parsed: Option<Value> = serde_json::from_str(text).ok().filter(Value::is_number);
    assert_eq!(token.is_some(), parsed.is_some(), "{text:?}");
    if let (Some(token), Some(value)) = (token, parsed) {
        let again = value.to_string();
        let mut written = String::new();
        write_number(&mut written, text);
        assert_eq!(written, again, "{text:?}");
        assert_eq!(token.is_canonical(), again == text, "{text:?}");
    }
}

#[test]
fn numbers_are_classified_as_serde_json_writes_them() {
    for text in [
        "0",
        "-0",
        "1",
        "-12",
        "0.5",
        "1e5",
        "1E5",
        "1e+5",
        "1E-5",
        "1.50e-7",
        "01",
        "1.",
        ".5",
        "-",
        "1e",
        "1e+",
        "123456789012345678901234567890",
        "18446744073709551615",
    ] {
        check_number(text);
    }
}

#[test]
fn literals_are_whole_words() {
    for (text, want) in
        [("true", Some(Literal::True)), ("false", Some(Literal::False)), ("null", Some(Literal::Null))]
    {
        let mut s = Scanner::new(text);
        assert_eq!(s.literal(), want);
        assert!(s.at_end());
    }
    for text in ["tru", "nul", "fals", "x"] {
        assert_eq!(Scanner::new(text).literal(), None, "{text}");
    }
}

/// A string literal's inside made of what the grammar allows: any character, short escapes,
/// `\u` escapes of any code unit in either case.
fn string_literal() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        4 => any::<char>().prop_filter("unescaped", |c| !matches!(c, '"' | '\\' | '\0'..='\u{1f}')).prop_map(String::from),
        2 => proptest::sample::select(vec!["\\\"", "\\\\", "\\/", "\\b", "\\f", "\\n", "\\r", "\\t"]).prop_map(String::from),
        2 => (prop_oneof![0u32..0x80, 0xD7F0u32..0xE010, 0u32..0x10000], any::<bool>())
            .prop_map(|(u, upper)| if upper { format!("\\u{u:04X}") } else { format!("\\u{u:04x}") }),
        1 => proptest::sample::select(vec!["\u{1}", "\n", "\\", "\\u12"]).prop_map(String::from),
    ];
    proptest::collection::vec(piece, 0..10).prop_map(|pieces| format!("\"{}\"", pieces.concat()))
}

proptest! {
    #![proptest_config(config(2048))]

    #[test]
    fn any_string_literal_is_classified_as_serde_json_writes_it(text in string_literal()) {
        check_string(&text);
    }

    #[test]
    fn serde_json_output_is_canonical(s in any::<String>(), controls in "[\\x00-\\x1f\"\\\\/]{0,8}") {
        for s in [s.as_str(), controls.as_str()] {
            let mut out = String::new();
            write_string(&mut out, s);
            prop_assert_eq!(&out, &serde_json::to_string(s).unwrap_or_default());
            let (token, end) = string_token(&out).unwrap_or_else(|| panic!("scans {out:?}"));
            prop_assert_eq!(end, out.len());
            prop_assert_ne!(token.form(), StringForm::Rewrite);
            let value = token.canonical_value();
            prop_assert_eq!(value.as_deref(), Some(s));
        }
    }

    #[test]
    fn any_number_is_classified_as_serde_json_writes_it(text in "-?(0|[1-9][0-9]{0,25}|0[0-9])(\\.[0-9]{0,4})?([eE][+-]?[0-9]{0,4})?") {
        check_number(&text);
    }
}
