//! The writing pass's reading of one row's `data` text (docs/api.md §13.2): the `data` column and
//! the data columns, straight from the stored JSON text.
//!
//! What an export writes is defined by the parsed value: the `data` column is its compact JSON
//! (`serde_json::to_string`, keys in byte order) and each data column one of its leaves. Pushes
//! store `data` in exactly that form already, so for nearly every row the stored text *is* the
//! `data` column and its leaves can be sliced out of it without building a tree. [`scan`] checks
//! that claim while it walks the text and gives up at the first byte where serialising the parsed
//! value would differ (whitespace, keys out of order or repeated, an escape or a number written
//! another way); such a row takes the tree path, so the output never depends on which path ran.

use std::borrow::Cow;
use std::collections::HashMap;

use serde_json::Value;

use super::inference::{for_each_leaf, MAX_FLATTEN_DEPTH};
use super::DataColumn;
use crate::domain::json_text::{Literal, Scanner};

/// Containers nested deeper than this take the tree path (whose parser stops at 128).
const MAX_SCAN_NESTING: usize = 100;

/// One non-null leaf of `data`, borrowed from the text when the text is canonical.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Leaf<'a> {
    Bool(bool),
    /// The number's JSON text (arbitrary_precision keeps it).
    Number(Cow<'a, str>),
    Str(Cow<'a, str>),
    /// An array or an object past the flattening depth, as compact JSON.
    Raw(Cow<'a, str>),
}

impl Leaf<'_> {
    /// The text of a UTF8 column: strings as they are, anything else as compact JSON.
    pub(crate) fn text(&self) -> &str {
        match self {
            Leaf::Bool(true) => "true",
            Leaf::Bool(false) => "false",
            Leaf::Number(t) | Leaf::Str(t) | Leaf::Raw(t) => t,
        }
    }

    pub(crate) fn as_bool(&self) -> Option<bool> {
        match self {
            Leaf::Bool(b) => Some(*b),
            _ => None,
        }
    }

    /// As `serde_json::Number::as_i64` with arbitrary_precision.
    pub(crate) fn as_i64(&self) -> Option<i64> {
        match self {
            Leaf::Number(t) => t.parse().ok(),
            _ => None,
        }
    }

    /// As `serde_json::Number::as_f64` with arbitrary_precision.
    pub(crate) fn as_f64(&self) -> Option<f64> {
        match self {
            Leaf::Number(t) => t.parse::<f64>().ok().filter(|f| f.is_finite()),
            _ => None,
        }
    }

    fn of_value(value: &Value) -> Option<Leaf<'static>> {
        Some(match value {
            Value::Null => return None,
            Value::Bool(b) => Leaf::Bool(*b),
            Value::Number(n) => Leaf::Number(Cow::Owned(n.to_string())),
            Value::String(s) => Leaf::Str(Cow::Owned(s.clone())),
            other => Leaf::Raw(Cow::Owned(other.to_string())),
        })
    }
}

/// Maps a row's `data` onto a fixed column set for the writing pass.
#[derive(Debug, Clone)]
pub(crate) struct ColumnProjector {
    index: HashMap<String, usize>,
    names: Vec<String>,
}

impl ColumnProjector {
    pub(crate) fn new(columns: &[DataColumn]) -> Self {
        let index = columns.iter().enumerate().map(|(i, c)| (c.name.clone(), i)).collect();
        Self { index, names: columns.iter().map(|c| c.name.clone()).collect() }
    }

    /// Reads one row's stored `data` text: fills `out` with one slot per column and returns the
    /// `data` column's text. When two paths of the same row map to one name
    /// (`{"a.b": 1, "a": {"b": 2}}`) the first non-null in key order wins; inference saw both, so
    /// the column type accepts either.
    pub(crate) fn project<'a>(
        &self,
        text: &'a str,
        out: &mut Vec<Option<Leaf<'a>>>,
    ) -> Result<Cow<'a, str>, serde_json::Error> {
        out.clear();
        out.resize(self.names.len(), None);
        let mut next = 0;
        let mut fill = |name: &str, value: Option<Leaf<'a>>| self.fill(out, &mut next, name, value);
        if scan(text, &mut fill).is_some() {
            return Ok(Cow::Borrowed(text));
        }
        // Not canonical: the slots filled before the scan gave up are discarded.
        out.clear();
        out.resize(self.names.len(), None);
        let value: Value = serde_json::from_str(text)?;
        let mut next = 0;
        for_each_leaf(&value, &mut |name, v| self.fill(out, &mut next, name, Leaf::of_value(v)));
        Ok(Cow::Owned(serde_json::to_string(&value)?))
    }

    /// `next`: the column after the one the row's last leaf went to. The rows of a form type
    /// mostly share one shape and a row's leaves come in key order, as the columns do, so it is
    /// nearly always the one this leaf goes to, and the name is not hashed.
    fn fill<'a>(&self, out: &mut [Option<Leaf<'a>>], next: &mut usize, name: &str, value: Option<Leaf<'a>>) {
        let column = match self.names.get(*next) {
            Some(expected) if expected == name => Some(*next),
            _ => self.index.get(name).copied(),
        };
        let Some(column) = column else { return };
        *next = column + 1;
        if let (Some(slot @ None), Some(value)) = (out.get_mut(column), value) {
            *slot = Some(value);
        }
    }
}

/// Walks canonical text, reporting its leaves (`None` for a null); `None` as soon as the text is
/// not canonical (some leaves may have been reported by then). Canonical: what
/// `serde_json::to_string` writes for the value the text parses to (`domain::json_text`).
pub(crate) fn scan<'a>(text: &'a str, leaf: &mut dyn FnMut(&str, Option<Leaf<'a>>)) -> Option<()> {
    let mut s = Scanner::new(text);
    if s.peek() == Some(b'{') {
        let mut name = String::from(super::inference::COLUMN_PREFIX);
        fields(&mut s, &mut name, 0, 0, leaf)?;
    } else {
        skip_value(&mut s, 0)?;
    }
    s.at_end().then_some(())
}

/// Whether `text` is canonical JSON (see [`scan`]), of any value.
pub(crate) fn is_canonical(text: &str) -> bool {
    let mut s = Scanner::new(text);
    skip_value(&mut s, 0).is_some() && s.at_end()
}

/// Whether `text` is a canonical JSON array of strings only, as a `Vec<String>` serialises.
pub(crate) fn is_canonical_string_array(text: &str) -> bool {
    let mut s = Scanner::new(text);
    let array = (|| {
        s.eat(b'[')?;
        if s.eat(b']').is_some() {
            return Some(());
        }
        loop {
            string(&mut s)?;
            if s.eat(b',').is_none() {
                return s.eat(b']');
            }
        }
    })();
    array.is_some() && s.at_end()
}

/// An object's entries at flattening `depth` (as `inference::walk`); `nesting` containers enclose
/// the object.
fn fields<'a>(
    s: &mut Scanner<'a>,
    name: &mut String,
    depth: usize,
    nesting: usize,
    leaf: &mut dyn FnMut(&str, Option<Leaf<'a>>),
) -> Option<()> {
    if nesting >= MAX_SCAN_NESTING {
        return None;
    }
    s.eat(b'{')?;
    if s.eat(b'}').is_some() {
        return Some(());
    }
    let mut previous: Option<Cow<'a, str>> = None;
    loop {
        let key = string(s)?;
        // The tree's keys are in byte order and unique: anything else serialises differently.
        if previous.as_ref().is_some_and(|p| key.as_ref() <= p.as_ref()) {
            return None;
        }
        s.eat(b':')?;
        let len = name.len();
        if depth > 0 {
            name.push('.');
        }
        name.push_str(&key);
        if s.peek()? == b'{' && depth < MAX_FLATTEN_DEPTH {
            fields(s, name, depth + 1, nesting + 1, leaf)?;
        } else {
            leaf(name, leaf_value(s, nesting + 1)?);
        }
        name.truncate(len);
        previous = Some(key);
        if s.eat(b',').is_none() {
            return s.eat(b'}');
        }
    }
}

/// A value that is a leaf; `Some(None)` for null.
fn leaf_value<'a>(s: &mut Scanner<'a>, nesting: usize) -> Option<Option<Leaf<'a>>> {
    let start = s.pos();
    Some(Some(match s.peek()? {
        b'"' => Leaf::Str(string(s)?),
        b'-' | b'0'..=b'9' => Leaf::Number(Cow::Borrowed(number(s)?)),
        b'[' | b'{' => {
            skip_value(s, nesting)?;
            Leaf::Raw(Cow::Borrowed(&s.text()[start..s.pos()]))
        }
        _ => match s.literal()? {
            Literal::True => Leaf::Bool(true),
            Literal::False => Leaf::Bool(false),
            Literal::Null => return Some(None),
        },
    }))
}

/// Checks any value without reporting leaves.
fn skip_value(s: &mut Scanner, nesting: usize) -> Option<()> {
    match s.peek()? {
        b'{' => {
            if nesting >= MAX_SCAN_NESTING {
                return None;
            }
            s.eat(b'{');
            if s.eat(b'}').is_some() {
                return Some(());
            }
            // As `fields` checks keys, without building the names no one asks for.
            let mut previous: Option<Cow<str>> = None;
            loop {
                let key = string(s)?;
                if previous.as_ref().is_some_and(|p| key.as_ref() <= p.as_ref()) {
                    return None;
                }
                s.eat(b':')?;
                skip_value(s, nesting + 1)?;
                previous = Some(key);
                if s.eat(b',').is_none() {
                    return s.eat(b'}');
                }
            }
        }
        b'[' => {
            if nesting >= MAX_SCAN_NESTING {
                return None;
            }
            s.eat(b'[');
            if s.eat(b']').is_some() {
                return Some(());
            }
            loop {
                skip_value(s, nesting + 1)?;
                if s.eat(b',').is_none() {
                    return s.eat(b']');
                }
            }
        }
        _ => leaf_value(s, nesting).map(drop),
    }
}

/// A canonical string's value.
fn string<'a>(s: &mut Scanner<'a>) -> Option<Cow<'a, str>> {
    s.string()?.canonical_value()
}

/// A canonical number's text.
fn number<'a>(s: &mut Scanner<'a>) -> Option<&'a str> {
    let token = s.number()?;
    token.is_canonical().then(|| token.text())
}
