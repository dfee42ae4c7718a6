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
/// `serde_json::to_string` writes for the value the text parses to.
pub(crate) fn scan<'a>(text: &'a str, leaf: &mut dyn FnMut(&str, Option<Leaf<'a>>)) -> Option<()> {
    let mut s = Scanner { text, pos: 0 };
    if s.peek() == Some(b'{') {
        let mut name = String::from(super::inference::COLUMN_PREFIX);
        s.fields(&mut name, 0, 0, leaf)?;
    } else {
        s.skip_value(0)?;
    }
    (s.pos == text.len()).then_some(())
}

/// Whether `text` is canonical JSON (see [`scan`]), of any value.
pub(crate) fn is_canonical(text: &str) -> bool {
    let mut s = Scanner { text, pos: 0 };
    s.skip_value(0).is_some() && s.pos == text.len()
}

/// Whether `text` is a canonical JSON array of strings only, as a `Vec<String>` serialises.
pub(crate) fn is_canonical_string_array(text: &str) -> bool {
    let mut s = Scanner { text, pos: 0 };
    let array = (|| {
        s.eat(b'[')?;
        if s.eat(b']').is_some() {
            return Some(());
        }
        loop {
            s.string()?;
            if s.eat(b',').is_none() {
                return s.eat(b']');
            }
        }
    })();
    array.is_some() && s.pos == text.len()
}

struct Scanner<'a> {
    text: &'a str,
    pos: usize,
}

impl<'a> Scanner<'a> {
    fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.pos).copied()
    }

    fn eat(&mut self, byte: u8) -> Option<()> {
        (self.peek()? == byte).then(|| self.pos += 1)
    }

    /// An object's entries at flattening `depth` (as `inference::walk`); `nesting` containers
    /// enclose the object.
    fn fields(
        &mut self,
        name: &mut String,
        depth: usize,
        nesting: usize,
        leaf: &mut dyn FnMut(&str, Option<Leaf<'a>>),
    ) -> Option<()> {
        if nesting >= MAX_SCAN_NESTING {
            return None;
        }
        self.eat(b'{')?;
        if self.eat(b'}').is_some() {
            return Some(());
        }
        let mut previous: Option<Cow<'a, str>> = None;
        loop {
            let key = self.string()?;
            // The tree's keys are in byte order and unique: anything else serialises differently.
            if previous.as_ref().is_some_and(|p| key.as_ref() <= p.as_ref()) {
                return None;
            }
            self.eat(b':')?;
            let len = name.len();
            if depth > 0 {
                name.push('.');
            }
            name.push_str(&key);
            if self.peek()? == b'{' && depth < MAX_FLATTEN_DEPTH {
                self.fields(name, depth + 1, nesting + 1, leaf)?;
            } else {
                leaf(name, self.leaf(nesting + 1)?);
            }
            name.truncate(len);
            previous = Some(key);
            if self.eat(b',').is_none() {
                return self.eat(b'}');
            }
        }
    }

    /// A value that is a leaf; `Some(None)` for null.
    fn leaf(&mut self, nesting: usize) -> Option<Option<Leaf<'a>>> {
        let start = self.pos;
        Some(Some(match self.peek()? {
            b'"' => Leaf::Str(self.string()?),
            b'n' => {
                self.literal("null")?;
                return Some(None);
            }
            b't' => {
                self.literal("true")?;
                Leaf::Bool(true)
            }
            b'f' => {
                self.literal("false")?;
                Leaf::Bool(false)
            }
            b'-' | b'0'..=b'9' => Leaf::Number(Cow::Borrowed(self.number()?)),
            b'[' | b'{' => {
                self.skip_value(nesting)?;
                Leaf::Raw(Cow::Borrowed(self.text.get(start..self.pos)?))
            }
            _ => return None,
        }))
    }

    /// Checks any value without reporting leaves.
    fn skip_value(&mut self, nesting: usize) -> Option<()> {
        match self.peek()? {
            b'{' => {
                if nesting >= MAX_SCAN_NESTING {
                    return None;
                }
                self.pos += 1;
                if self.eat(b'}').is_some() {
                    return Some(());
                }
                // As `fields` checks keys, without building the names no one asks for.
                let mut previous: Option<Cow<'a, str>> = None;
                loop {
                    let key = self.string()?;
                    if previous.as_ref().is_some_and(|p| key.as_ref() <= p.as_ref()) {
                        return None;
                    }
                    self.eat(b':')?;
                    self.skip_value(nesting + 1)?;
                    previous = Some(key);
                    if self.eat(b',').is_none() {
                        return self.eat(b'}');
                    }
                }
            }
            b'[' => {
                if nesting >= MAX_SCAN_NESTING {
                    return None;
                }
                self.pos += 1;
                if self.eat(b']').is_some() {
                    return Some(());
                }
                loop {
                    self.skip_value(nesting + 1)?;
                    if self.eat(b',').is_none() {
                        return self.eat(b']');
                    }
                }
            }
            _ => self.leaf(nesting).map(drop),
        }
    }

    fn literal(&mut self, word: &str) -> Option<()> {
        let end = self.pos + word.len();
        (self.text.get(self.pos..end)? == word).then(|| self.pos = end)
    }

    /// `-?(0|[1-9][0-9]*)(\.[0-9]+)?(e[+-][0-9]+)?`: serde_json keeps a number's text, except that
    /// it writes an exponent as `e` with a sign, so only that spelling of one is canonical.
    fn number(&mut self) -> Option<&'a str> {
        let start = self.pos;
        let bytes = self.text.as_bytes();
        let digits = |pos: &mut usize| {
            let from = *pos;
            while bytes.get(*pos).is_some_and(u8::is_ascii_digit) {
                *pos += 1;
            }
            *pos - from
        };
        let mut pos = self.pos;
        if bytes.get(pos) == Some(&b'-') {
            pos += 1;
        }
        match bytes.get(pos)? {
            b'0' => pos += 1,
            b'1'..=b'9' => {
                digits(&mut pos);
            }
            _ => return None,
        }
        if bytes.get(pos) == Some(&b'.') {
            pos += 1;
            if digits(&mut pos) == 0 {
                return None;
            }
        }
        match bytes.get(pos) {
            Some(b'e') => {
                pos += 1;
                if !matches!(bytes.get(pos), Some(b'+' | b'-')) {
                    return None;
                }
                pos += 1;
                if digits(&mut pos) == 0 {
                    return None;
                }
            }
            Some(b'E') => return None,
            _ => {}
        }
        // "-0" stays text in serde_json too, but a digit straight after "0" is not JSON.
        if bytes.get(pos).is_some_and(u8::is_ascii_digit) {
            return None;
        }
        self.pos = pos;
        self.text.get(start..pos)
    }

    /// A string with only the escapes serde_json writes: `\"`, `\\`, `\b`, `\f`, `\n`, `\r`, `\t`
    /// and `\u00xx` (lower-case hex) for the other control characters.
    fn string(&mut self) -> Option<Cow<'a, str>> {
        self.eat(b'"')?;
        let bytes = self.text.as_bytes();
        let start = self.pos;
        let mut owned: Option<String> = None;
        let mut run = start;
        loop {
            let b = *bytes.get(self.pos)?;
            match b {
                b'"' => {
                    let tail = self.text.get(run..self.pos)?;
                    self.pos += 1;
                    return Some(match owned {
                        None => Cow::Borrowed(tail),
                        Some(mut s) => {
                            s.push_str(tail);
                            Cow::Owned(s)
                        }
                    });
                }
                b'\\' => {
                    let s = owned.get_or_insert_with(String::new);
                    s.push_str(self.text.get(run..self.pos)?);
                    let (c, len) = unescape(bytes.get(self.pos + 1..)?)?;
                    s.push(c);
                    self.pos += 1 + len;
                    run = self.pos;
                }
                0..=0x1f => return None,
                _ => self.pos = plain_run(bytes, self.pos + 1),
            }
        }
    }
}

/// Where the run of bytes a string holds as they are (no `"`, `\\` or control character) that
/// starts at `pos` ends. 32 bytes at a time, with no early exit inside a block so that the
/// compiler turns the test into a few vector instructions: the free-text fields that make up
/// most of a record's `data` are long runs, and this loop was the scan's largest cost byte by
/// byte. (Words of eight bytes with bit tricks, or a bit mask per block, measured slower.)
fn plain_run(bytes: &[u8], mut pos: usize) -> usize {
    while let Some(block) = bytes.get(pos..pos + 32) {
        if block.iter().fold(false, |special, &b| special | (b < 0x20) | (b == b'"') | (b == b'\\')) {
            break;
        }
        pos += 32;
    }
    while bytes.get(pos).is_some_and(|&b| b >= 0x20 && b != b'"' && b != b'\\') {
        pos += 1;
    }
    pos
}

/// The character of a canonical escape (the bytes after the backslash) and the bytes it took.
fn unescape(after: &[u8]) -> Option<(char, usize)> {
    let c = match *after.first()? {
        b'"' => '"',
        b'\\' => '\\',
        b'b' => '\u{8}',
        b'f' => '\u{c}',
        b'n' => '\n',
        b'r' => '\r',
        b't' => '\t',
        b'u' => {
            let hex = after.get(1..5)?;
            let [b'0', b'0', hi @ (b'0' | b'1'), lo] = *hex else { return None };
            let lo = match lo {
                b'0'..=b'9' => lo - b'0',
                b'a'..=b'f' => lo - b'a' + 10,
                _ => return None,
            };
            let code = (hi - b'0') * 16 + lo;
            // These five have short escapes: `\u0008` is not how serde_json writes a backspace.
            if matches!(code, 0x08 | 0x09 | 0x0a | 0x0c | 0x0d) {
                return None;
            }
            return Some((char::from(code), 5));
        }
        _ => return None,
    };
    Some((c, 1))
}
