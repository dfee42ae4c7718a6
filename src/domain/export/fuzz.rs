//! Property suite of column inference: the streaming pass over JSON text finds what the tree walk
//! finds.

use proptest::prelude::*;
use serde_json::{json, Value};

use crate::domain::export::ColumnInference;
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
