//! The streamed page against the whole-page encoder it replaced (`encode::reference`): the same
//! bytes for every dialect, page shape and record, however the rows are cut into chunks.

use chrono::{DateTime, TimeZone, Utc};
use proptest::prelude::*;
use serde_json::value::RawValue;
use serde_json::{json, Value};

use super::{PageWriter, PulledRecord};
use crate::domain::sync::encode::reference::{pull_response, PullPage};
use crate::domain::sync::{Dialect, StoredRecord};
use crate::domain::time::UnixMicros;
use crate::testing::{config, json_value, string};

/// A record as its row holds it: the stored JSON texts, possibly with whitespace around them.
#[derive(Debug, Clone)]
struct Row {
    id: String,
    form_type: String,
    form_version: String,
    data: String,
    deleted: bool,
    created_at: Option<DateTime<Utc>>,
    updated_at: Option<DateTime<Utc>>,
    synced_at: DateTime<Utc>,
    geolocation: Option<String>,
    author: Option<String>,
    device_id: Option<String>,
    tags: Option<String>,
    change_id: i64,
}

impl Row {
    fn view(&self) -> PulledRecord<'_> {
        PulledRecord {
            id: &self.id,
            form_type: &self.form_type,
            form_version: &self.form_version,
            data: &self.data,
            deleted: self.deleted,
            created_at: self.created_at.map(UnixMicros::of),
            updated_at: self.updated_at.map(UnixMicros::of),
            synced_at: UnixMicros::of(self.synced_at),
            geolocation: self.geolocation.as_deref(),
            author: self.author.as_deref(),
            device_id: self.device_id.as_deref(),
            tags: self.tags.as_deref(),
            change_id: self.change_id,
        }
    }

    /// The record as the whole-page encoder got it from the database layer.
    fn stored(&self) -> StoredRecord {
        let raw = |text: &str| RawValue::from_string(text.to_string()).expect("valid stored JSON");
        StoredRecord {
            id: self.id.clone(),
            form_type: self.form_type.clone(),
            form_version: self.form_version.clone(),
            data: raw(&self.data),
            deleted: self.deleted,
            created_at: self.created_at,
            updated_at: self.updated_at,
            synced_at: self.synced_at,
            geolocation: self.geolocation.as_deref().map(raw),
            author: self.author.clone(),
            device_id: self.device_id.clone(),
            tags: self.tags.as_deref().map(raw),
            change_id: self.change_id,
        }
    }
}

/// Any instant PostgreSQL's `timestamptz` holds at microsecond precision, and the edges.
fn instant() -> impl Strategy<Value = DateTime<Utc>> {
    prop_oneof![
        (-62_135_596_800i64..253_402_300_799, 0u32..1_000_000),
        (-200_000_000_000i64..-62_135_596_800, 0u32..1_000_000),
        (253_402_300_800i64..9_000_000_000_000, 0u32..1_000_000),
        Just((0i64, 0u32)),
        Just((1_719_316_800, 120_000)),
    ]
    .prop_map(|(secs, micros)| Utc.timestamp_opt(secs, micros * 1000).single().unwrap_or_default())
}

/// Stored JSON text of any value: compact, pretty, or with whitespace around it.
fn stored_json() -> impl Strategy<Value = String> {
    (json_value(), 0..4usize).prop_map(|(v, style)| match style {
        0 => v.to_string(),
        1 => serde_json::to_string_pretty(&v).expect("serialisable"),
        2 => format!(" \n\t{v}\r\n "),
        _ => format!("{:#}", json!({"nested": v})),
    })
}

fn row() -> impl Strategy<Value = Row> {
    (
        (string(), string(), string(), stored_json(), any::<bool>()),
        (proptest::option::of(instant()), proptest::option::of(instant()), instant()),
        (proptest::option::of(stored_json()), proptest::option::of(string()), proptest::option::of(string())),
        (proptest::option::of(stored_json()), 1i64..i64::MAX / 2),
    )
        .prop_map(
            |(
                (id, form_type, form_version, data, deleted),
                (created_at, updated_at, synced_at),
                (geolocation, author, device_id),
                (tags, change_id),
            )| Row {
                id,
                form_type,
                form_version,
                data,
                deleted,
                created_at,
                updated_at,
                synced_at,
                geolocation,
                author,
                device_id,
                tags,
                change_id,
            },
        )
}

fn dialect() -> impl Strategy<Value = Dialect> {
    prop_oneof![Just(Dialect::Synkronus), Just(Dialect::Spec), Just(Dialect::Camel)]
}

/// The streamed page of `rows` (the rows as the statement returns them, `limit + 1` at most), each
/// piece written into a fresh buffer at the cuts, the pieces then joined.
fn streamed(
    dialect: Dialect,
    head: i64,
    generation: i64,
    limit: i64,
    types: &[String],
    rows: &[Row],
    cuts: &[usize],
) -> Vec<u8> {
    let mut writer = PageWriter::new(dialect, head, generation, limit, types.to_vec());
    let mut pieces = vec![Vec::new()];
    writer.open(pieces.last_mut().unwrap());
    for (i, r) in rows.iter().enumerate() {
        if cuts.contains(&i) {
            pieces.push(Vec::new());
        }
        writer.record(pieces.last_mut().unwrap(), &r.view());
    }
    pieces.push(Vec::new());
    writer.close(pieces.last_mut().unwrap());
    pieces.concat()
}

/// What the whole-page path sent for the same statement result.
fn reference(
    dialect: Dialect,
    head: i64,
    generation: i64,
    limit: i64,
    types: &[String],
    rows: &[Row],
) -> Vec<u8> {
    let limit = limit as usize;
    let page = PullPage {
        records: rows.iter().take(limit).map(Row::stored).collect(),
        head,
        repository_generation: generation,
        has_more: rows.len() > limit,
        types: types.to_vec(),
    };
    pull_response(dialect, &page).expect("the reference encodes")
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn streamed_pages_equal_the_whole_page_encoder_byte_for_byte(
        dialect in dialect(),
        rows in proptest::collection::vec(row(), 0..8),
        limit in 1i64..8,
        head in 0i64..i64::MAX / 2,
        generation in 1i64..1000,
        types in proptest::collection::vec(string(), 0..3),
        cuts in proptest::collection::vec(0usize..8, 0..4),
    ) {
        let rows: Vec<Row> = rows.into_iter().take(limit as usize + 1).collect();
        let expected = reference(dialect, head, generation, limit, &types, &rows);
        let got = streamed(dialect, head, generation, limit, &types, &rows, &cuts);
        prop_assert_eq!(String::from_utf8_lossy(&got), String::from_utf8_lossy(&expected));
    }
}

fn sample(change_id: i64) -> Row {
    Row {
        id: format!("obs-{change_id}"),
        form_type: "household".into(),
        form_version: "1".into(),
        data: r#"{"members":3,"note":"a \"quoted\" word"}"#.into(),
        deleted: false,
        created_at: Some(Utc.timestamp_opt(1_719_316_800, 123_000).unwrap()),
        updated_at: None,
        synced_at: Utc.timestamp_opt(1_719_316_801, 0).unwrap(),
        geolocation: Some(r#"{"lat": -1.5, "lon": 36.8}"#.into()),
        author: Some("é".into()),
        device_id: None,
        tags: Some(r#"["a", "b"]"#.into()),
        change_id,
    }
}

#[test]
fn the_row_past_the_limit_says_more_remain_and_is_never_written() {
    let rows = [sample(7), sample(9), sample(12)];
    let body = streamed(Dialect::Synkronus, 40, 2, 2, &[], &rows, &[]);
    let page: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(page["records"].as_array().unwrap().len(), 2);
    assert_eq!(page["change_cutoff"], 9);
    assert_eq!(page["has_more"], true);
    assert_eq!(page["current_version"], 40);
    assert!(!String::from_utf8_lossy(&body).contains("obs-12"));
    assert_eq!(body, reference(Dialect::Synkronus, 40, 2, 2, &[], &rows));
}

#[test]
fn an_empty_page_ends_at_the_head_in_every_dialect() {
    for dialect in [Dialect::Synkronus, Dialect::Spec, Dialect::Camel] {
        let body = streamed(dialect, 40, 2, 50, &["household".into()], &[], &[]);
        assert_eq!(body, reference(dialect, 40, 2, 50, &["household".into()], &[]), "{dialect:?}");
    }
    let camel: Value = serde_json::from_slice(&streamed(Dialect::Camel, 40, 2, 50, &[], &[], &[])).unwrap();
    assert_eq!(
        camel,
        json!({"changes": {"observations": []}, "timestamp": 40, "hasMore": false,
        "changeCutoff": 40, "repository_generation": 2})
    );
}

#[test]
fn stored_json_is_written_as_stored_without_the_whitespace_around_it() {
    let mut row = sample(3);
    row.data = " {\"b\": [1, 2],  \"a\":1e400}\n".into();
    let body = streamed(Dialect::Spec, 3, 1, 10, &[], &[row], &[]);
    assert!(String::from_utf8_lossy(&body).contains(r#""data":{"b": [1, 2],  "a":1e400},"change_id":3"#));
}
