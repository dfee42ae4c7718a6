//! Reads the values at a few paths of a record's `data` in one pass over its JSON text, without
//! building a tree: values that are not asked for are skipped by the parser.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::value::RawValue;

use crate::domain::scope::rules::FieldPath;

/// The paths to read, as a tree of keys; each path has an index into the answer.
#[derive(Debug, Default, Clone)]
pub struct PathSet {
    root: Node,
    len: usize,
}

#[derive(Debug, Default, Clone)]
struct Node {
    children: BTreeMap<String, Node>,
    leaf: Option<usize>,
}

/// What a rule can compare: a string's text or a number's text as it was pushed.
pub type Scalar = Option<String>;

impl PathSet {
    /// Adds a path and returns its index in [`PathSet::read`]'s answer (the same index when the
    /// path was added before).
    pub fn add(&mut self, path: &FieldPath) -> usize {
        let mut node = &mut self.root;
        for segment in path.segments() {
            node = node.children.entry(segment.clone()).or_default();
        }
        match node.leaf {
            Some(index) => index,
            None => {
                node.leaf = Some(self.len);
                self.len += 1;
                self.len - 1
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The string or number text at each path; `None` where the path is missing or holds
    /// `null`, a boolean, an object or an array. `data` must be a JSON object's text.
    pub fn read(&self, data: &str) -> Result<Vec<Scalar>, serde_json::Error> {
        let mut found = vec![None; self.len];
        if self.len > 0 {
            read_node(&self.root, data, &mut found)?;
        }
        Ok(found)
    }
}

fn read_node(node: &Node, json: &str, found: &mut [Scalar]) -> Result<(), serde_json::Error> {
    let mut deserializer = serde_json::Deserializer::from_str(json);
    NodeSeed { node, found }.deserialize(&mut deserializer)?;
    deserializer.end()
}

struct NodeSeed<'n, 'f> {
    node: &'n Node,
    found: &'f mut [Scalar],
}

impl<'de> DeserializeSeed<'de> for NodeSeed<'_, '_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for NodeSeed<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    // Anything but an object holds no path below it.
    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key_seed(KeySeed)? {
            match self.node.children.get(key.as_str()) {
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
                Some(child) if child.leaf.is_none() => {
                    map.next_value_seed(NodeSeed { node: child, found: self.found })?;
                }
                Some(child) => {
                    let raw: &RawValue = map.next_value()?;
                    if let Some(index) = child.leaf {
                        self.found[index] = scalar_text(raw.get());
                    }
                    if !child.children.is_empty() {
                        read_node(child, raw.get(), self.found).map_err(serde::de::Error::custom)?;
                    }
                }
            }
        }
        Ok(())
    }
}

/// An object key, borrowed from the text unless it had escapes.
pub(super) enum Key<'de> {
    Borrowed(&'de str),
    Owned(String),
}

impl Key<'_> {
    pub(super) fn as_str(&self) -> &str {
        match self {
            Key::Borrowed(key) => key,
            Key::Owned(key) => key,
        }
    }
}

pub(super) struct KeySeed;

impl<'de> DeserializeSeed<'de> for KeySeed {
    type Value = Key<'de>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Key<'de>, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeySeed {
    type Value = Key<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an object key")
    }

    fn visit_borrowed_str<E>(self, key: &'de str) -> Result<Key<'de>, E> {
        Ok(Key::Borrowed(key))
    }

    fn visit_str<E>(self, key: &str) -> Result<Key<'de>, E> {
        Ok(Key::Owned(key.to_owned()))
    }
}

/// A string's text, or a number's text exactly as written; nothing for the other kinds.
fn scalar_text(raw: &str) -> Scalar {
    match raw.as_bytes().first()? {
        b'"' => serde_json::from_str::<String>(raw).ok(),
        b'-' | b'0'..=b'9' => Some(raw.to_owned()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::{json, Value};

    use super::*;

    fn paths(list: &[&str]) -> PathSet {
        let mut set = PathSet::default();
        for path in list {
            set.add(&FieldPath::parse(path).unwrap());
        }
        set
    }

    #[test]
    fn reads_strings_and_number_text_only() {
        let set = paths(&["district", "n", "big", "flag", "none", "obj", "list", "missing", "esc"]);
        let data = r#"{"district":"north","n":7,"big":1e300,"flag":true,"none":null,"obj":{"a":1},"list":["x"],"esc":"a\"b\u00e9"}"#;
        let found = set.read(data).unwrap();
        assert_eq!(
            found,
            vec![
                Some("north".into()),
                Some("7".into()),
                Some("1e300".into()),
                None,
                None,
                None,
                None,
                None,
                Some("a\"bé".into())
            ]
        );
    }

    #[test]
    fn nested_paths_and_a_path_below_a_leaf() {
        let set = paths(&["address.district", "address", "address.gps.lat"]);
        let found =
            set.read(r#"{"address":{"district":"east","gps":{"lat":-1.5}},"x":[{"address":1}]}"#).unwrap();
        assert_eq!(found, vec![Some("east".into()), None, Some("-1.5".into())]);
        let found = set.read(r#"{"address":"flat 4"}"#).unwrap();
        assert_eq!(found, vec![None, Some("flat 4".into()), None]);
    }

    #[test]
    fn the_same_path_twice_has_one_index_and_escaped_keys_match() {
        let mut set = PathSet::default();
        let a = set.add(&FieldPath::parse("k").unwrap());
        let b = set.add(&FieldPath::parse("k").unwrap());
        assert_eq!(a, b);
        assert_eq!(set.read(r#"{"\u006b":"v"}"#).unwrap(), vec![Some("v".into())]);
    }

    fn lookup(value: &Value, path: &[&str]) -> Scalar {
        let mut at = value;
        for key in path {
            at = at.as_object()?.get(*key)?;
        }
        match at {
            Value::String(s) => Some(s.clone()),
            Value::Number(n) => Some(n.to_string()),
            _ => None,
        }
    }

    fn arb_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i32>().prop_map(|n| json!(n)),
            "[a-c]{0,3}".prop_map(Value::String),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..3).prop_map(Value::Array),
                prop::collection::btree_map("[a-c]", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn agrees_with_a_tree_walk(data in prop::collection::btree_map("[a-c]", arb_json(), 0..4)) {
            let data = Value::Object(data.into_iter().collect());
            let list = ["a", "b", "a.b", "a.c", "b.a.c", "c"];
            let set = paths(&list);
            let found = set.read(&data.to_string()).unwrap();
            for (i, path) in list.iter().enumerate() {
                let segments: Vec<&str> = path.split('.').collect();
                prop_assert_eq!(&found[i], &lookup(&data, &segments), "path {}", path);
            }
        }
    }
}
