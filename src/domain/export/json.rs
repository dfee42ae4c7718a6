//! The synkronus-dialect record (docs/api.md §8.7 plus 17.5) for NDJSON and raw-json exports.

use std::io::Write;

use serde_json::{Map, Value};

use super::{format_timestamp, ExportError, ExportRow};

/// The record as the synkronus dialect returns it. Unknown values are `null`,
/// never omitted (docs/api.md §1.3).
pub fn observation_json(row: &ExportRow) -> Result<Value, ExportError> {
    let ts = |t: Option<chrono::DateTime<chrono::Utc>>| match t {
        Some(t) => Value::String(format_timestamp(t)),
        None => Value::Null,
    };
    let text = |s: &Option<String>| match s {
        Some(s) => Value::String(s.clone()),
        None => Value::Null,
    };
    let mut m = Map::new();
    m.insert("observation_id".into(), row.observation_id.clone().into());
    m.insert("form_type".into(), row.form_type.clone().into());
    m.insert("form_version".into(), row.form_version.clone().into());
    m.insert("data".into(), serde_json::from_str(&row.data)?);
    m.insert("created_at".into(), ts(row.created_at));
    m.insert("updated_at".into(), ts(row.updated_at));
    m.insert("synced_at".into(), ts(Some(row.synced_at)));
    m.insert("deleted".into(), row.deleted.into());
    m.insert("geolocation".into(), row.geolocation_value()?);
    m.insert("version".into(), row.version.into());
    m.insert("author".into(), text(&row.author));
    m.insert("device_id".into(), text(&row.device_id));
    m.insert(
        "tags".into(),
        match row.tag_list()? {
            Some(tags) => Value::from(tags),
            None => Value::Null,
        },
    );
    Ok(Value::Object(m))
}

/// Writes one record as compact JSON followed by `\n`.
pub fn write_ndjson_line<W: Write>(w: &mut W, row: &ExportRow) -> Result<(), ExportError> {
    let mut line = serde_json::to_vec(&observation_json(row)?)?;
    line.push(b'\n');
    // One write per record: the sink (a channel into the HTTP body) then sees a
    // few larger chunks rather than one per JSON token.
    w.write_all(&line)?;
    Ok(())
}
