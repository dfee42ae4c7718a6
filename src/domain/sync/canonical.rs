//! The canonical text of pushed JSON (a record's `data` and `geolocation`), written straight from
//! the record's text without building a `serde_json::Value` tree (docs/api.md §8.6).
//!
//! The canonical text is what serde_json writes for the `Value` it parses from the same text
//! (`domain::json_text` says exactly what that is), and stored fingerprints and the stored `data`
//! depend on every byte of it. The property suite of this module holds the two to the same bytes.
//!
//! A [`Tape`] reads a whole value into flat, reusable arrays: every node is a span of the text,
//! objects keep their entries as read (sorted only when written: a record's own fields are looked
//! up, never written), and a string is decoded only when re-escaping could change it. What a read
//! gives is a [`Doc`], the text and its nodes together: later code asks the document, and cannot
//! hand the nodes another text. Both passes loop over an explicit stack, so no input nests the
//! Rust stack.

use std::borrow::Cow;
use std::marker::PhantomData;
use std::ops::Range;

use serde::de::{self, Deserializer as _, Visitor};

use crate::domain::json_text::{self, Literal, Scanner, StringForm, StringToken};

/// Why a JSON value cannot be stored: NUL cannot appear in PostgreSQL text, and `\u0000` breaks
/// any later cast to jsonb (exports, statistics).
pub const NUL_IN_STRING: &str = "strings must not contain NUL characters";
pub const NUL_IN_KEY: &str = "keys must not contain NUL characters";

/// A node of the document read last, by its index: only that document hands them out, and the
/// tape cannot read again while one is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeId<'t> {
    index: usize,
    tape: PhantomData<&'t Nodes>,
}

impl NodeId<'_> {
    fn new(index: usize) -> Self {
        NodeId { index, tape: PhantomData }
    }
}

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
    /// A number as serde_json writes it.
    Number,
    /// A number it writes another way (an exponent without sign, or with `E`).
    NumberRewrite,
    /// A string without escapes.
    Text,
    /// A string whose escapes serde_json writes the same way: written as it stands, decoded when
    /// read.
    Escaped,
    /// A string with other escapes, or a NUL; `inner` is its decoded text in `Nodes::decoded`.
    Decoded,
    /// `inner` is the range of its items in `Nodes::items`.
    Array,
    /// `inner` is the range of its entries in `Nodes::entries`, as read.
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
    value: usize,
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

/// What a read leaves: the nodes and the decoded text of strings and keys.
#[derive(Debug, Default)]
struct Nodes {
    nodes: Vec<Node>,
    items: Vec<usize>,
    entries: Vec<Entry>,
    decoded: String,
}

/// Room a read and a write work in.
#[derive(Debug, Default)]
struct Scratch {
    pending_items: Vec<usize>,
    pending_entries: Vec<Entry>,
    frames: Vec<Frame>,
    open: Vec<Open>,
    order: Vec<usize>,
}

/// Reads JSON values into flat arrays, kept between reads, so a push of many records allocates
/// them once.
#[derive(Debug, Default)]
pub struct Tape {
    nodes: Nodes,
    scratch: Scratch,
}

/// One JSON value read by a [`Tape`]: its text and its nodes.
#[derive(Debug)]
pub struct Doc<'t> {
    text: &'t str,
    nodes: &'t Nodes,
    scratch: &'t mut Scratch,
    root: NodeId<'t>,
}

type Result<T> = std::result::Result<T, serde_json::Error>;

fn syntax(at: usize) -> serde_json::Error {
    de::Error::custom(format!("unexpected JSON text at byte {at}"))
}

impl Tape {
    /// Reads `text`, one JSON value, or fails where serde_json fails to parse it into a `Value`
    /// (nesting aside: the tape follows any depth, and a push body's was bounded when it was
    /// received).
    pub fn read<'t>(&'t mut self, text: &'t str) -> Result<Doc<'t>> {
        let Tape { nodes: n, scratch } = self;
        n.nodes.clear();
        n.items.clear();
        n.entries.clear();
        n.decoded.clear();
        scratch.pending_items.clear();
        scratch.pending_entries.clear();
        scratch.frames.clear();
        let mut s = Scanner::new(text);
        s.skip_whitespace();
        'value: loop {
            let start = s.pos();
            let mut node = match s.peek() {
                Some(b'{') => {
                    s.eat(b'{');
                    s.skip_whitespace();
                    if s.eat(b'}').is_some() {
                        let at = n.entries.len();
                        Node { shape: Shape::Object, start, end: s.pos(), inner: (at, at) }
                    } else {
                        let key = n.key(&mut s)?;
                        let pending = scratch.pending_entries.len();
                        scratch.frames.push(Frame { start, pending, key: Some(key) });
                        continue 'value;
                    }
                }
                Some(b'[') => {
                    s.eat(b'[');
                    s.skip_whitespace();
                    if s.eat(b']').is_some() {
                        let at = n.items.len();
                        Node { shape: Shape::Array, start, end: s.pos(), inner: (at, at) }
                    } else {
                        scratch.frames.push(Frame { start, pending: scratch.pending_items.len(), key: None });
                        continue 'value;
                    }
                }
                Some(b'"') => {
                    let token = s.string().ok_or_else(|| syntax(start))?;
                    let (shape, inner) = match (token.form(), token.has_nul()) {
                        (StringForm::Plain, _) => (Shape::Text, (0, 0)),
                        (StringForm::Canonical, false) => (Shape::Escaped, (0, 0)),
                        _ => (Shape::Decoded, n.decode(token)?),
                    };
                    Node { shape, start, end: token.end(), inner }
                }
                Some(b'-' | b'0'..=b'9') => {
                    let token = s.number().ok_or_else(|| syntax(start))?;
                    let shape = if token.is_canonical() { Shape::Number } else { Shape::NumberRewrite };
                    Node { shape, start, end: token.end(), inner: (0, 0) }
                }
                _ => {
                    let shape = match s.literal().ok_or_else(|| syntax(start))? {
                        Literal::Null => Shape::Null,
                        Literal::True | Literal::False => Shape::Bool,
                    };
                    Node { shape, start, end: s.pos(), inner: (0, 0) }
                }
            };
            // Hand each finished value to its container; a container that ends with it is
            // finished in turn.
            loop {
                let id = n.nodes.len();
                n.nodes.push(node);
                s.skip_whitespace();
                let Some(frame) = scratch.frames.last().copied() else {
                    return if s.at_end() {
                        Ok(Doc { text, nodes: n, scratch, root: NodeId::new(id) })
                    } else {
                        Err(syntax(s.pos()))
                    };
                };
                let close = match frame.key {
                    Some(key) => {
                        scratch.pending_entries.push(Entry { key, value: id });
                        b'}'
                    }
                    None => {
                        scratch.pending_items.push(id);
                        b']'
                    }
                };
                if s.eat(b',').is_some() {
                    s.skip_whitespace();
                    if frame.key.is_some() {
                        let key = n.key(&mut s)?;
                        if let Some(open) = scratch.frames.last_mut() {
                            open.key = Some(key);
                        }
                    }
                    continue 'value;
                }
                if s.eat(close).is_none() {
                    return Err(syntax(s.pos()));
                }
                scratch.frames.pop();
                let (shape, inner) = if frame.key.is_some() {
                    let at = n.entries.len();
                    n.entries.extend(scratch.pending_entries.drain(frame.pending..));
                    (Shape::Object, (at, n.entries.len()))
                } else {
                    let at = n.items.len();
                    n.items.extend(scratch.pending_items.drain(frame.pending..));
                    (Shape::Array, (at, n.items.len()))
                };
                node = Node { shape, start: frame.start, end: s.pos(), inner };
            }
        }
    }
}

impl Nodes {
    /// Reads a key and the colon after it; the scanner ends on the value.
    fn key(&mut self, s: &mut Scanner) -> Result<Key> {
        let token = s.string().ok_or_else(|| syntax(s.pos()))?;
        let key = match token.form() {
            StringForm::Plain => Key::Text(token.start() + 1, token.end() - 1),
            // Keys compare by their decoded text, whatever their escapes.
            _ => {
                let (from, to) = self.decode(token)?;
                Key::Decoded(from, to)
            }
        };
        s.skip_whitespace();
        s.eat(b':').ok_or_else(|| syntax(s.pos()))?;
        s.skip_whitespace();
        Ok(key)
    }

    /// Decodes a string into `decoded`: canonical escapes by the scanner's rules, any other with
    /// serde_json's own parser, so that it fails where that parser fails (a lone surrogate).
    fn decode(&mut self, token: StringToken) -> Result<(usize, usize)> {
        let from = self.decoded.len();
        match token.canonical_value() {
            Some(value) => self.decoded.push_str(&value),
            None => serde_json::Deserializer::from_str(token.text())
                .deserialize_str(AppendTo(&mut self.decoded))?,
        }
        Ok((from, self.decoded.len()))
    }

    fn key_text<'t>(&'t self, text: &'t str, key: Key) -> &'t str {
        match key {
            Key::Text(from, to) => &text[from..to],
            Key::Decoded(from, to) => &self.decoded[from..to],
        }
    }
}

impl<'t> Doc<'t> {
    /// The value read.
    pub fn root(&self) -> NodeId<'t> {
        self.root
    }

    fn node(&self, id: NodeId<'t>) -> &'t Node {
        &self.nodes.nodes[id.index]
    }

    /// What decoding needs to know of a node.
    pub fn kind(&self, id: NodeId<'t>) -> Kind {
        match self.node(id).shape {
            Shape::Null => Kind::Null,
            Shape::Object => Kind::Object,
            _ => Kind::Other,
        }
    }

    /// A node as a record field: strings decoded.
    pub fn field(&self, id: NodeId<'t>) -> Field<'t> {
        let node = self.node(id);
        let source = &self.text[node.start..node.end];
        match node.shape {
            Shape::Null => Field::Null,
            Shape::Bool => Field::Bool(source == "true"),
            Shape::Text => Field::Text(Cow::Borrowed(&source[1..source.len() - 1])),
            Shape::Escaped => {
                let mut value = String::with_capacity(source.len());
                json_text::unescape_canonical(&source[1..source.len() - 1], &mut value);
                Field::Text(Cow::Owned(value))
            }
            Shape::Decoded => Field::Text(Cow::Borrowed(&self.nodes.decoded[node.inner.0..node.inner.1])),
            Shape::Number | Shape::NumberRewrite | Shape::Array | Shape::Object => Field::Other(source),
        }
    }

    /// The node's text.
    pub fn span(&self, id: NodeId<'t>) -> Range<usize> {
        let node = self.node(id);
        node.start..node.end
    }

    /// The entries of `object` as read: every key with its value, repeated keys included. None
    /// for any other value.
    pub fn entries(&self, object: NodeId<'t>) -> impl Iterator<Item = (&'t str, NodeId<'t>)> + 't {
        let node = self.node(object);
        let range = if node.shape == Shape::Object { node.inner.0..node.inner.1 } else { 0..0 };
        let (nodes, text) = (self.nodes, self.text);
        nodes.entries[range].iter().map(move |e| (nodes.key_text(text, e.key), NodeId::new(e.value)))
    }

    /// Appends the canonical text of `node` to `out`, or says why the value cannot be stored: the
    /// first NUL in the order a sorted map walks its keys and values.
    pub fn write(&mut self, id: NodeId<'t>, out: &mut String) -> std::result::Result<(), &'static str> {
        let Scratch { open, order, .. } = &mut *self.scratch;
        open.clear();
        order.clear();
        let (n, text) = (self.nodes, self.text);
        let mut index = id.index;
        loop {
            let node = &n.nodes[index];
            let source = &text[node.start..node.end];
            match node.shape {
                Shape::Null | Shape::Bool | Shape::Number | Shape::Text | Shape::Escaped => {
                    out.push_str(source)
                }
                Shape::NumberRewrite => json_text::write_number(out, source),
                Shape::Decoded => {
                    let s = &n.decoded[node.inner.0..node.inner.1];
                    if s.contains('\0') {
                        return Err(NUL_IN_STRING);
                    }
                    json_text::write_string(out, s);
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
                    n.sort_entries(text, node.inner, order);
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
                    let entry = n.entries[order[at]];
                    match entry.key {
                        Key::Text(from, to) => {
                            out.push('"');
                            out.push_str(&text[from..to]);
                            out.push('"');
                        }
                        Key::Decoded(from, to) => {
                            let key = &n.decoded[from..to];
                            if key.contains('\0') {
                                return Err(NUL_IN_KEY);
                            }
                            json_text::write_string(out, key);
                        }
                    }
                    out.push(':');
                    index = entry.value;
                } else {
                    index = n.items[at];
                }
                break;
            }
        }
    }
}

impl Nodes {
    /// Appends to `order` the entries `entries[from..to]` of an object in key order, keeping of a
    /// repeated key the last read, as a parsed map does.
    fn sort_entries(&self, text: &str, (from, to): (usize, usize), order: &mut Vec<usize>) {
        let key = |i: usize| self.key_text(text, self.entries[i].key);
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
pub(in crate::domain::sync) mod tests;
