//! The canonical text of pushed JSON (a record's `data` and `geolocation`), written straight from
//! the record's text without building a `serde_json::Value` tree (docs/api.md §8.6).
//!
//! The canonical text is what serde_json writes for the `Value` it parses from the same text, and
//! stored fingerprints and the stored `data` depend on every byte of it: compact, object keys in
//! byte order with the last of duplicated keys kept, strings escaped the way serde_json escapes
//! them, and numbers as its `arbitrary_precision` parser keeps them (verbatim but for the
//! exponent, which it writes as `e` with an explicit sign). The property suite at the end of this
//! file holds the two to the same bytes.
//!
//! A [`Tape`] first reads a whole value into flat, reusable arrays: every node is a span of the
//! text, objects keep their entries as read (sorted only when written: a record's own fields are
//! looked up, never written), and a string is decoded only when re-escaping could change it. Both
//! passes loop over an explicit stack, so no input nests the Rust stack.

use std::borrow::Cow;
use std::ops::Range;

use serde::de::{self, Deserializer as _, Visitor};

/// Why a JSON value cannot be stored: NUL cannot appear in PostgreSQL text, and `\u0000` breaks
/// any later cast to jsonb (exports, statistics).
pub const NUL_IN_STRING: &str = "strings must not contain NUL characters";
pub const NUL_IN_KEY: &str = "keys must not contain NUL characters";

/// A node of the tape, by its index.
pub type NodeId = usize;

/// The values decoding tells apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Null,
    Object,
    Other,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    Null,
    Bool,
    /// A number without exponent.
    Number,
    /// A number with an exponent.
    Exponent,
    /// A string without escapes.
    Text,
    /// A string whose escapes serde_json writes the same way (`\"`, `\\`, `\b`, `\f`, `\n`, `\r`,
    /// `\t`): written as it stands, decoded when read.
    Escaped,
    /// A string with `\u` or `\/` escapes; `inner` is its decoded text in `Tape::decoded`.
    Decoded,
    /// `inner` is the range of its items in `Tape::items`.
    Array,
    /// `inner` is the range of its entries in `Tape::entries`, as read.
    Object,
}

/// A value as decoding reads a record's own fields: strings decoded, anything else as its text.
#[derive(Debug, Clone, PartialEq)]
pub enum Field<'t> {
    Null,
    Bool(bool),
    Text(Cow<'t, str>),
    /// A number, array or object.
    Other(&'t str),
}

#[derive(Debug, Clone, Copy)]
struct Node {
    shape: Shape,
    /// The value's text.
    start: usize,
    end: usize,
    inner: (usize, usize),
}

/// An object key: a span of the text when it has no escapes, else its decoded text.
#[derive(Debug, Clone, Copy)]
enum Key {
    Text(usize, usize),
    Decoded(usize, usize),
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    key: Key,
    value: NodeId,
}

/// An object or array being read: where it starts, where its members wait on the pending
/// stacks, and for an object the key of the member being read.
#[derive(Debug, Clone, Copy)]
struct Frame {
    start: usize,
    pending: usize,
    key: Option<Key>,
}

/// An object or array being written: its members are `items[first..end]` for an array, and for
/// an object the entries at `order[first..end]` (sorted, one per key); `next` is the next to write.
#[derive(Debug, Clone, Copy)]
struct Open {
    object: bool,
    first: usize,
    next: usize,
    end: usize,
}

/// One JSON value read into flat arrays. The arrays are kept between reads, so a push of many
/// records allocates them once.
#[derive(Debug, Default)]
pub struct Tape {
    nodes: Vec<Node>,
    items: Vec<NodeId>,
    entries: Vec<Entry>,
    decoded: String,
    pending_items: Vec<NodeId>,
    pending_entries: Vec<Entry>,
    frames: Vec<Frame>,
    open: Vec<Open>,
    order: Vec<usize>,
}

type Result<T> = std::result::Result<T, serde_json::Error>;

fn syntax(at: usize) -> serde_json::Error {
    de::Error::custom(format!("unexpected JSON text at byte {at}"))
}

fn skip_whitespace(b: &[u8], mut i: usize) -> usize {
    while matches!(b.get(i), Some(b' ' | b'\t' | b'\n' | b'\r')) {
        i += 1;
    }
    i
}

impl Tape {
    /// Reads `text`, one JSON value that a parser has already accepted as such (the push body is
    /// parsed as a whole before its records are read). Fails exactly where serde_json fails to
    /// parse the same text into a `Value`: on a `\u` escape that is not valid UTF-16. Returns the
    /// root node.
    pub fn read(&mut self, text: &str) -> Result<NodeId> {
        self.nodes.clear();
        self.items.clear();
        self.entries.clear();
        self.decoded.clear();
        self.pending_items.clear();
        self.pending_entries.clear();
        self.frames.clear();
        let b = text.as_bytes();
        let mut i = skip_whitespace(b, 0);
        'value: loop {
            let start = i;
            let mut node = match b.get(i) {
                Some(b'{') => {
                    i = skip_whitespace(b, i + 1);
                    if b.get(i) == Some(&b'}') {
                        i += 1;
                        let at = self.entries.len();
                        Node { shape: Shape::Object, start, end: i, inner: (at, at) }
                    } else {
                        let key = self.key(text, &mut i)?;
                        let pending = self.pending_entries.len();
                        self.frames.push(Frame { start, pending, key: Some(key) });
                        continue 'value;
                    }
                }
                Some(b'[') => {
                    i = skip_whitespace(b, i + 1);
                    if b.get(i) == Some(&b']') {
                        i += 1;
                        let at = self.items.len();
                        Node { shape: Shape::Array, start, end: i, inner: (at, at) }
                    } else {
                        self.frames.push(Frame { start, pending: self.pending_items.len(), key: None });
                        continue 'value;
                    }
                }
                Some(b'"') => {
                    let (end, escapes) = string_end(b, i)?;
                    i = end;
                    match escapes {
                        Escapes::Decode => {
                            let inner = self.decode(text, start, end)?;
                            Node { shape: Shape::Decoded, start, end, inner }
                        }
                        Escapes::Same => Node { shape: Shape::Escaped, start, end, inner: (0, 0) },
                        Escapes::None => Node { shape: Shape::Text, start, end, inner: (0, 0) },
                    }
                }
                Some(b'-' | b'0'..=b'9') => {
                    i += 1;
                    let mut exponent = false;
                    while let Some(c @ (b'0'..=b'9' | b'.' | b'e' | b'E' | b'+' | b'-')) = b.get(i) {
                        exponent |= matches!(c, b'e' | b'E');
                        i += 1;
                    }
                    let shape = if exponent { Shape::Exponent } else { Shape::Number };
                    Node { shape, start, end: i, inner: (0, 0) }
                }
                Some(b't') => literal(b, &mut i, b"true", Shape::Bool)?,
                Some(b'f') => literal(b, &mut i, b"false", Shape::Bool)?,
                Some(b'n') => literal(b, &mut i, b"null", Shape::Null)?,
                _ => return Err(syntax(i)),
            };
            // Hand each finished value to its container; a container that ends with it is
            // finished in turn.
            loop {
                let id = self.nodes.len();
                self.nodes.push(node);
                let Some(frame) = self.frames.last().copied() else {
                    return if skip_whitespace(b, i) == b.len() { Ok(id) } else { Err(syntax(i)) };
                };
                i = skip_whitespace(b, i);
                let close = match frame.key {
                    Some(key) => {
                        self.pending_entries.push(Entry { key, value: id });
                        b'}'
                    }
                    None => {
                        self.pending_items.push(id);
                        b']'
                    }
                };
                match b.get(i) {
                    Some(b',') => {
                        i = skip_whitespace(b, i + 1);
                        if frame.key.is_some() {
                            let key = self.key(text, &mut i)?;
                            if let Some(open) = self.frames.last_mut() {
                                open.key = Some(key);
                            }
                        }
                        continue 'value;
                    }
                    Some(&c) if c == close => {
                        i += 1;
                        self.frames.pop();
                        let (shape, inner) = if frame.key.is_some() {
                            let at = self.entries.len();
                            self.entries.extend(self.pending_entries.drain(frame.pending..));
                            (Shape::Object, (at, self.entries.len()))
                        } else {
                            let at = self.items.len();
                            self.items.extend(self.pending_items.drain(frame.pending..));
                            (Shape::Array, (at, self.items.len()))
                        };
                        node = Node { shape, start: frame.start, end: i, inner };
                    }
                    _ => return Err(syntax(i)),
                }
            }
        }
    }

    /// Reads a key and the colon after it; `i` ends on the value.
    fn key(&mut self, text: &str, i: &mut usize) -> Result<Key> {
        let b = text.as_bytes();
        if b.get(*i) != Some(&b'"') {
            return Err(syntax(*i));
        }
        let start = *i;
        let (end, escapes) = string_end(b, start)?;
        let key = match escapes {
            Escapes::None => Key::Text(start + 1, end - 1),
            // Keys compare by their decoded text, whatever their escapes.
            _ => {
                let (from, to) = self.decode(text, start, end)?;
                Key::Decoded(from, to)
            }
        };
        *i = skip_whitespace(b, end);
        if b.get(*i) != Some(&b':') {
            return Err(syntax(*i));
        }
        *i = skip_whitespace(b, *i + 1);
        Ok(key)
    }

    /// Decodes the string at `start..end` (quotes included) with serde_json's own parser, so it
    /// fails where that parser fails; its text is appended to `decoded`.
    fn decode(&mut self, text: &str, start: usize, end: usize) -> Result<(usize, usize)> {
        let from = self.decoded.len();
        let source = text.get(start..end).ok_or_else(|| syntax(start))?;
        serde_json::Deserializer::from_str(source).deserialize_str(AppendTo(&mut self.decoded))?;
        Ok((from, self.decoded.len()))
    }

    /// What decoding needs to know of a node.
    pub fn kind(&self, node: NodeId) -> Kind {
        match self.nodes.get(node).map(|n| n.shape) {
            Some(Shape::Null) => Kind::Null,
            Some(Shape::Object) => Kind::Object,
            _ => Kind::Other,
        }
    }

    /// A node as a record field: strings decoded.
    pub fn field<'t>(&self, text: &'t str, node: NodeId) -> Result<Field<'t>> {
        let Some(n) = self.nodes.get(node) else { return Ok(Field::Null) };
        let source = text.get(n.start..n.end).unwrap_or_default();
        Ok(match n.shape {
            Shape::Null => Field::Null,
            Shape::Bool => Field::Bool(source == "true"),
            Shape::Text => Field::Text(Cow::Borrowed(source.get(1..source.len() - 1).unwrap_or_default())),
            Shape::Escaped => Field::Text(Cow::Owned(serde_json::from_str(source)?)),
            Shape::Decoded => Field::Text(Cow::Owned(
                self.decoded.get(n.inner.0..n.inner.1).unwrap_or_default().to_string(),
            )),
            Shape::Number | Shape::Exponent | Shape::Array | Shape::Object => Field::Other(source),
        })
    }

    /// The node's text in the text it was read from.
    pub fn span(&self, node: NodeId) -> Range<usize> {
        self.nodes.get(node).map_or(0..0, |n| n.start..n.end)
    }

    /// The entries of `object` as read: every key with its value, repeated keys included.
    pub fn entries<'t>(
        &'t self,
        text: &'t str,
        object: NodeId,
    ) -> impl Iterator<Item = (&'t str, NodeId)> + 't {
        let range = match self.nodes.get(object) {
            Some(node) if node.shape == Shape::Object => node.inner.0..node.inner.1,
            _ => 0..0,
        };
        let entries = self.entries.get(range).unwrap_or_default();
        entries.iter().map(move |e| (key_text(text, &self.decoded, e.key), e.value))
    }

    /// Appends the canonical text of `node` (read from `text`) to `out`, or says why the value
    /// cannot be stored: the first NUL in the order a sorted map walks its keys and values.
    pub fn write(
        &mut self,
        text: &str,
        node: NodeId,
        out: &mut String,
    ) -> std::result::Result<(), &'static str> {
        let (mut open, mut order) = (std::mem::take(&mut self.open), std::mem::take(&mut self.order));
        open.clear();
        order.clear();
        let written = self.write_with(text, node, out, &mut open, &mut order);
        (self.open, self.order) = (open, order);
        written
    }

    /// Appends to `order` the entries `entries[from..to]` of an object in key order, keeping of a
    /// repeated key the last read, as a parsed map does.
    fn sort_entries(&self, text: &str, (from, to): (usize, usize), order: &mut Vec<usize>) {
        let key = |i: usize| self.entries.get(i).map_or("", |e| key_text(text, &self.decoded, e.key));
        let first = order.len();
        order.extend(from..to);
        let members = &mut order[first..];
        if members.windows(2).all(|w| key(w[0]) < key(w[1])) {
            return;
        }
        // Stable: of equal keys the last read stays last, and replaces the ones before it.
        members.sort_by(|a, b| key(*a).cmp(key(*b)));
        let mut kept = first;
        for at in first..order.len() {
            let entry = order[at];
            if kept > first && key(order[kept - 1]) == key(entry) {
                order[kept - 1] = entry;
            } else {
                order[kept] = entry;
                kept += 1;
            }
        }
        order.truncate(kept);
    }

    fn write_with(
        &self,
        text: &str,
        mut id: NodeId,
        out: &mut String,
        open: &mut Vec<Open>,
        order: &mut Vec<usize>,
    ) -> std::result::Result<(), &'static str> {
        loop {
            let Some(node) = self.nodes.get(id) else { return Ok(()) };
            let source = text.get(node.start..node.end).unwrap_or_default();
            match node.shape {
                Shape::Null | Shape::Bool | Shape::Number | Shape::Text | Shape::Escaped => {
                    out.push_str(source)
                }
                Shape::Exponent => write_exponent(out, source),
                Shape::Decoded => {
                    let s = self.decoded.get(node.inner.0..node.inner.1).unwrap_or_default();
                    if s.contains('\0') {
                        return Err(NUL_IN_STRING);
                    }
                    write_escaped(out, s);
                }
                Shape::Array => {
                    out.push('[');
                    open.push(Open {
                        object: false,
                        first: node.inner.0,
                        next: node.inner.0,
                        end: node.inner.1,
                    });
                }
                Shape::Object => {
                    out.push('{');
                    let first = order.len();
                    self.sort_entries(text, node.inner, order);
                    open.push(Open { object: true, first, next: first, end: order.len() });
                }
            }
            // The next value to write, closing the containers that have none left.
            loop {
                let Some(top) = open.last_mut() else { return Ok(()) };
                if top.next == top.end {
                    out.push(if top.object { '}' } else { ']' });
                    if top.object {
                        order.truncate(top.first);
                    }
                    open.pop();
                    continue;
                }
                if top.next != top.first {
                    out.push(',');
                }
                let at = top.next;
                top.next += 1;
                if top.object {
                    let Some(entry) = order.get(at).and_then(|&e| self.entries.get(e)) else { return Ok(()) };
                    match entry.key {
                        Key::Text(from, to) => {
                            out.push('"');
                            out.push_str(text.get(from..to).unwrap_or_default());
                            out.push('"');
                        }
                        Key::Decoded(from, to) => {
                            let key = self.decoded.get(from..to).unwrap_or_default();
                            if key.contains('\0') {
                                return Err(NUL_IN_KEY);
                            }
                            write_escaped(out, key);
                        }
                    }
                    out.push(':');
                    id = entry.value;
                } else {
                    let Some(&item) = self.items.get(at) else { return Ok(()) };
                    id = item;
                }
                break;
            }
        }
    }
}

fn key_text<'t>(text: &'t str, decoded: &'t str, key: Key) -> &'t str {
    match key {
        Key::Text(from, to) => text.get(from..to),
        Key::Decoded(from, to) => decoded.get(from..to),
    }
    .unwrap_or_default()
}

fn literal(b: &[u8], i: &mut usize, word: &[u8], shape: Shape) -> Result<Node> {
    let start = *i;
    if b.get(start..start + word.len()) != Some(word) {
        return Err(syntax(start));
    }
    *i += word.len();
    Ok(Node { shape, start, end: *i, inner: (0, 0) })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Escapes {
    None,
    /// Only escapes serde_json writes the same way.
    Same,
    /// `\u` or `\/`: the text must be decoded and escaped again.
    Decode,
}

/// The end of the string opening at `start` (one past its closing quote), and what escapes it has.
fn string_end(b: &[u8], start: usize) -> Result<(usize, Escapes)> {
    let mut i = start + 1;
    let mut escapes = Escapes::None;
    // Most strings (keys, ids, dates) are short: a look at their first bytes is cheaper than
    // setting up a vector search.
    let near = b.len().min(i + 24);
    while i < near {
        match b[i] {
            b'"' => return Ok((i + 1, escapes)),
            b'\\' => break,
            _ => i += 1,
        }
    }
    loop {
        let rest = b.get(i..).unwrap_or_default();
        match memchr::memchr2(b'"', b'\\', rest) {
            Some(at) if rest[at] == b'"' => return Ok((i + at + 1, escapes)),
            Some(at) => {
                match rest.get(at + 1) {
                    Some(b'u' | b'/') => escapes = Escapes::Decode,
                    Some(_) if escapes == Escapes::None => escapes = Escapes::Same,
                    Some(_) => {}
                    None => return Err(syntax(i + at)),
                }
                i += at + 2;
            }
            None => return Err(syntax(start)),
        }
    }
}

/// serde_json's `arbitrary_precision` parser keeps a number's text but writes its exponent as a
/// lowercase `e` followed by an explicit sign.
fn write_exponent(out: &mut String, number: &str) {
    match number.find(['e', 'E']) {
        Some(at) => {
            out.push_str(&number[..at]);
            out.push('e');
            let exponent = &number[at + 1..];
            if !exponent.starts_with(['+', '-']) {
                out.push('+');
            }
            out.push_str(exponent);
        }
        None => out.push_str(number),
    }
}

/// A string as serde_json writes it: `"` and `\` escaped, the control characters as `\b`, `\t`,
/// `\n`, `\f`, `\r` or `\u00xx`, everything else as it is.
pub fn write_escaped(out: &mut String, s: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push('"');
    let mut run = 0;
    for (i, byte) in s.bytes().enumerate() {
        let escape = match byte {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            0x08 => "\\b",
            0x09 => "\\t",
            0x0A => "\\n",
            0x0C => "\\f",
            0x0D => "\\r",
            0x00..=0x1F => "",
            _ => continue,
        };
        out.push_str(&s[run..i]);
        run = i + 1;
        if escape.is_empty() {
            out.push_str("\\u00");
            out.push(char::from(HEX[usize::from(byte >> 4)]));
            out.push(char::from(HEX[usize::from(byte & 0xF)]));
        } else {
            out.push_str(escape);
        }
    }
    out.push_str(&s[run..]);
    out.push('"');
}

/// Appends a decoded string to a buffer.
struct AppendTo<'s>(&'s mut String);

impl<'de> Visitor<'de> for AppendTo<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a string")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<(), E> {
        self.0.push_str(v);
        Ok(())
    }
}

#[cfg(test)]
mod tests;
