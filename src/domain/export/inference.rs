//! Data-column inference (docs/api.md §13.2): one pass over a form type's rows
//! collects, per flattened leaf path, the JSON kinds seen; the writing pass then
//! projects every row onto the resulting column set.

use serde_json::{Map, Value};

use super::projection::{scan, Leaf};

/// At most this many data columns per file; all values remain in `data`.
pub const MAX_DATA_COLUMNS: usize = 1000;

/// Every data column name starts with this; the fixed `data` column cannot collide.
pub(super) const COLUMN_PREFIX: &str = "data_";

/// Objects nested deeper than this are treated as leaves (compact JSON text), so
/// a pathological document cannot exhaust the export thread's stack.
pub(super) const MAX_FLATTEN_DEPTH: usize = 64;

/// Storage type of a data column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ColumnType {
    Boolean,
    Int64,
    Float64,
    /// Strings as they are; any other value as compact JSON text.
    Utf8,
}

/// One inferred data column.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataColumn {
    /// The full column name, `data_<path>`.
    pub name: String,
    pub column_type: ColumnType,
}

impl DataColumn {
    /// The flattened path inside `data` (the name without its `data_` prefix).
    pub fn path(&self) -> &str {
        self.name.strip_prefix(COLUMN_PREFIX).unwrap_or(&self.name)
    }
}

// Kinds seen at one path, as a bit set: inference only needs to know which kinds
// occurred, which keeps the state per path at one byte whatever the row count.
const KIND_NULL: u8 = 1;
const KIND_BOOL: u8 = 1 << 1;
const KIND_INT: u8 = 1 << 2;
/// An integer literal outside i64: not INT64, but still an integer for DOUBLE.
const KIND_BIG_INT: u8 = 1 << 3;
const KIND_FLOAT: u8 = 1 << 4;
const KIND_STRING: u8 = 1 << 5;
/// Arrays, objects past the depth limit, and numbers no f64 can hold.
const KIND_OTHER: u8 = 1 << 6;

/// Accumulates the kinds seen per data column over any number of rows.
///
/// Only the first [`MAX_DATA_COLUMNS`] names (in byte order) are kept: a name
/// that sorts after 1,000 others already seen can never be in the output, so
/// memory stays bounded even when every row brings new keys.
#[derive(Debug, Default, Clone)]
pub struct ColumnInference {
    /// Sorted by name.
    kinds: Vec<(String, u8)>,
    /// Where the row's next leaf is expected: after the one before. The rows of a form type
    /// mostly share one shape and a row's leaves come in key order, which is nearly the names'
    /// order, so most leaves are found by one comparison instead of a search.
    next: usize,
}

impl ColumnInference {
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds one row's `data`. A non-object `data` has no leaves and adds nothing.
    pub fn observe(&mut self, data: &Value) {
        self.next = 0;
        for_each_leaf(data, &mut |name, value| self.record(name, kind_of(value)));
    }

    /// Feeds one row's `data` as JSON text, as the database returns it: the same result as
    /// [`observe`](Self::observe) on the parsed value, without building it. The inference pass
    /// reads every row of an export, and allocating each document's tree was most of its cost.
    /// Text that is not valid JSON adds what was read before the error.
    pub fn observe_json_text(&mut self, text: &str) {
        // Canonical text, as pushes store `data`, is read by the writing pass's scan, a few times
        // faster than serde's visitor; any other text takes the visitor. A scan that gives up has
        // recorded only leaves the visitor records again, and kinds only accumulate, so the
        // result is the same either way.
        self.next = 0;
        if scan(text, &mut |name, leaf| self.record(name, leaf_kind(leaf.as_ref()))).is_some() {
            return;
        }
        self.observe_visited(text);
    }

    /// [`observe_json_text`](Self::observe_json_text) through serde's visitor alone.
    pub(super) fn observe_visited(&mut self, text: &str) {
        self.next = 0;
        let mut de = serde_json::Deserializer::from_str(text);
        de.disable_recursion_limit();
        let mut name = String::from(COLUMN_PREFIX);
        let _ = serde::de::DeserializeSeed::deserialize(
            streaming::Document { inference: self, name: &mut name },
            &mut de,
        );
    }

    fn record(&mut self, name: &str, kind: u8) {
        let kinds = &mut self.kinds;
        let found = match kinds.get(self.next) {
            Some((expected, _)) if expected == name => Ok(self.next),
            _ => kinds.binary_search_by(|(n, _)| n.as_str().cmp(name)),
        };
        let at = match found {
            Ok(at) => {
                kinds[at].1 |= kind;
                at
            }
            // Sorts after MAX_DATA_COLUMNS names already kept: never in the output.
            Err(at) if at >= MAX_DATA_COLUMNS => return,
            Err(at) => {
                kinds.insert(at, (name.to_owned(), kind));
                kinds.truncate(MAX_DATA_COLUMNS);
                at
            }
        };
        self.next = at + 1;
    }

    /// Number of columns currently tracked (never more than [`MAX_DATA_COLUMNS`]).
    pub fn len(&self) -> usize {
        self.kinds.len()
    }

    pub fn is_empty(&self) -> bool {
        self.kinds.is_empty()
    }

    /// The data columns, sorted by name, with their inferred types.
    pub fn finish(self) -> Vec<DataColumn> {
        self.kinds.into_iter().map(|(name, bits)| DataColumn { name, column_type: resolve(bits) }).collect()
    }
}

fn kind_of(value: &Value) -> u8 {
    match value {
        Value::Null => KIND_NULL,
        Value::Bool(_) => KIND_BOOL,
        Value::Number(n) => number_kind(n),
        Value::String(_) => KIND_STRING,
        Value::Array(_) | Value::Object(_) => KIND_OTHER,
    }
}

fn number_kind(n: &serde_json::Number) -> u8 {
    number_text_kind(n.as_str())
}

/// A number's kind from its JSON text, which arbitrary_precision keeps: what `is_i64`, `as_f64`
/// and `is_u64` answer, as they parse that text.
fn number_text_kind(text: &str) -> u8 {
    if text.parse::<i64>().is_ok() {
        KIND_INT
    } else if !text.parse::<f64>().is_ok_and(f64::is_finite) {
        KIND_OTHER
    } else if is_integer_literal(text) {
        KIND_BIG_INT
    } else {
        KIND_FLOAT
    }
}

fn leaf_kind(leaf: Option<&Leaf>) -> u8 {
    match leaf {
        None => KIND_NULL,
        Some(Leaf::Bool(_)) => KIND_BOOL,
        Some(Leaf::Number(text)) => number_text_kind(text),
        Some(Leaf::Str(_)) => KIND_STRING,
        Some(Leaf::Raw(_)) => KIND_OTHER,
    }
}

/// The streaming walk behind [`ColumnInference::observe_json_text`]: serde visitors that follow
/// `walk`'s rules (flatten objects with `.`, arrays and over-deep objects are leaves) and report
/// each leaf's kind, skipping values instead of building them.
mod streaming {
    use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
    use std::fmt;

    use super::{
        number_kind, ColumnInference, KIND_BOOL, KIND_INT, KIND_NULL, KIND_OTHER, KIND_STRING,
        MAX_FLATTEN_DEPTH,
    };

    /// serde_json's arbitrary_precision hands numbers to visitors as a one-entry map under this key.
    const NUMBER_TOKEN: &str = "$serde_json::private::Number";

    /// The whole `data` document: only an object has leaves.
    pub(super) struct Document<'a> {
        pub inference: &'a mut ColumnInference,
        pub name: &'a mut String,
    }

    impl<'de> DeserializeSeed<'de> for Document<'_> {
        type Value = ();

        fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<(), D::Error> {
            de.deserialize_any(Node { inference: self.inference, name: self.name, depth: 0, top: true })
        }
    }

    /// A value at `name`, inside `depth` objects. `top` is the document itself.
    struct Node<'a> {
        inference: &'a mut ColumnInference,
        name: &'a mut String,
        depth: usize,
        top: bool,
    }

    impl Node<'_> {
        fn leaf(self, kind: u8) {
            if !self.top {
                self.inference.record(self.name, kind);
            }
        }
    }

    impl<'de> DeserializeSeed<'de> for Node<'_> {
        type Value = ();

        fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<(), D::Error> {
            de.deserialize_any(self)
        }
    }

    impl<'de> Visitor<'de> for Node<'_> {
        type Value = ();

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a JSON value")
        }

        fn visit_unit<E>(self) -> Result<(), E> {
            self.leaf(KIND_NULL);
            Ok(())
        }

        fn visit_bool<E>(self, _: bool) -> Result<(), E> {
            self.leaf(KIND_BOOL);
            Ok(())
        }

        fn visit_i64<E>(self, _: i64) -> Result<(), E> {
            self.leaf(KIND_INT);
            Ok(())
        }

        fn visit_u64<E>(self, n: u64) -> Result<(), E> {
            self.leaf(number_kind(&serde_json::Number::from(n)));
            Ok(())
        }

        fn visit_f64<E>(self, n: f64) -> Result<(), E> {
            let kind = serde_json::Number::from_f64(n).map_or(KIND_OTHER, |n| number_kind(&n));
            self.leaf(kind);
            Ok(())
        }

        fn visit_str<E>(self, _: &str) -> Result<(), E> {
            self.leaf(KIND_STRING);
            Ok(())
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            self.leaf(KIND_OTHER);
            Ok(())
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
            let too_deep = !self.top && self.depth >= MAX_FLATTEN_DEPTH;
            let Some(first) = map.next_key_seed(Key)? else {
                // An empty object has no leaves, unless it is past the depth limit: then it is one.
                if too_deep {
                    self.leaf(KIND_OTHER);
                }
                return Ok(());
            };
            if first == NUMBER_TOKEN {
                let text: String = map.next_value()?;
                let kind = text.parse::<serde_json::Number>().map_or(KIND_OTHER, |n| number_kind(&n));
                self.leaf(kind);
                return Ok(());
            }
            if too_deep {
                map.next_value::<IgnoredAny>()?;
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                self.leaf(KIND_OTHER);
                return Ok(());
            }
            let depth = if self.top { 0 } else { self.depth + 1 };
            let mut key = first;
            loop {
                let len = self.name.len();
                if depth > 0 {
                    self.name.push('.');
                }
                self.name.push_str(&key);
                map.next_value_seed(Node { inference: self.inference, name: self.name, depth, top: false })?;
                self.name.truncate(len);
                match map.next_key_seed(Key)? {
                    Some(next) => key = next,
                    None => return Ok(()),
                }
            }
        }
    }

    /// An object key, borrowed from the text when it has no escapes.
    struct Key;

    impl<'de> DeserializeSeed<'de> for Key {
        type Value = std::borrow::Cow<'de, str>;

        fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<Self::Value, D::Error> {
            de.deserialize_str(self)
        }
    }

    impl<'de> Visitor<'de> for Key {
        type Value = std::borrow::Cow<'de, str>;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("an object key")
        }

        fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Self::Value, E> {
            Ok(std::borrow::Cow::Borrowed(s))
        }

        fn visit_str<E>(self, s: &str) -> Result<Self::Value, E> {
            Ok(std::borrow::Cow::Owned(s.to_owned()))
        }
    }
}

/// With arbitrary_precision a number keeps its source text; `10` is an integer,
/// `10.0` and `1e1` are not (they say the producer meant a real number).
fn is_integer_literal(text: &str) -> bool {
    let digits = text.strip_prefix('-').unwrap_or(text);
    !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
}

fn resolve(bits: u8) -> ColumnType {
    let seen = bits & !KIND_NULL;
    let numeric = KIND_INT | KIND_BIG_INT | KIND_FLOAT;
    if seen == KIND_BOOL {
        ColumnType::Boolean
    } else if seen == KIND_INT {
        ColumnType::Int64
    } else if seen & KIND_FLOAT != 0 && seen & !numeric == 0 {
        ColumnType::Float64
    } else {
        // Only strings, only nulls, arrays, mixed kinds, or integers that do not
        // all fit i64 (exact text beats a lossy double when nothing forces one).
        ColumnType::Utf8
    }
}

/// Calls `f(column_name, value)` for each leaf of an object, flattening nested
/// objects with `.`. Arrays are leaves; empty objects have no leaves.
pub(crate) fn for_each_leaf<'a, F>(data: &'a Value, f: &mut F)
where
    F: FnMut(&str, &'a Value),
{
    if let Value::Object(map) = data {
        let mut name = String::from(COLUMN_PREFIX);
        walk(map, &mut name, 0, f);
    }
}

fn walk<'a, F>(map: &'a Map<String, Value>, name: &mut String, depth: usize, f: &mut F)
where
    F: FnMut(&str, &'a Value),
{
    for (key, value) in map {
        let len = name.len();
        if depth > 0 {
            name.push('.');
        }
        name.push_str(key);
        match value {
            Value::Object(inner) if depth < MAX_FLATTEN_DEPTH => walk(inner, name, depth + 1, f),
            leaf => f(name, leaf),
        }
        name.truncate(len);
    }
}
