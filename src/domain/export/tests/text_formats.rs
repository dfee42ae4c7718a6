//! CSV and JSON exports: columns, quoting, the synkronus record shape, NDJSON and raw-JSON ZIPs.

use super::*;

// ---------------------------------------------------------------- CSV

#[test]
fn csv_columns_and_quoting() {
    let rows = household_rows();
    let mut inf = ColumnInference::new();
    rows.iter().for_each(|r| inf.observe_json_text(&r.data));
    let mut extra =
        row("obs,3", "household", 45, j(r#"{"head_name": "Line\nbreak, \"quoted\"", "members": 1}"#));
    extra.form_version = String::new();
    extra.author = Some(String::new());
    inf.observe_json_text(&extra.data);
    let columns = inf.finish();

    let mut zip = ExportZip::new(Vec::new());
    zip.start_csv_entry("household.csv").unwrap();
    let mut writer = CsvFormWriter::new(&mut zip, &columns).unwrap();
    writer.write_batch(&rows).unwrap();
    writer.write_row(&extra).unwrap();
    writer.finish().unwrap();
    let mut archive = read_zip(zip.finish().unwrap());
    {
        let entry = archive.by_name("household.csv").unwrap();
        assert_eq!(entry.compression(), zip::CompressionMethod::Deflated);
    }
    let text = String::from_utf8(entry_bytes(&mut archive, "household.csv")).unwrap();
    assert!(!text.starts_with('\u{feff}'));
    let lines: Vec<&str> = text.split("\r\n").collect();
    assert_eq!(
        lines[0],
        "observation_id,form_type,form_version,created_at,updated_at,deleted,version,data,\
         synced_at,geolocation,author,device_id,tags,data_address.city,data_big,data_head_name,\
         data_members,data_ok,data_score,data_tags"
    );
    assert_eq!(
        lines[1],
        "obs_1,household,1.0,2025-06-25T12:00:00.123456Z,2025-06-25T12:05:10.456Z,false,41,\
         \"{\"\"address\"\":{\"\"city\"\":\"\"Nairobi\"\"},\"\"big\"\":18446744073709551616,\
         \"\"head_name\"\":\"\"Amina\"\",\"\"members\"\":4,\"\"ok\"\":true,\"\"score\"\":1.5,\
         \"\"tags\"\":[\"\"a\"\",1]}\",2025-06-25T12:06:00.001Z,\
         \"{\"\"altitude\"\":null,\"\"latitude\"\":-1.2921,\"\"longitude\"\":36.8219}\",\
         alice,dev-1,\"[\"\"x\"\",\"\"y, \\\"\"z\\\"\"\"\"]\",Nairobi,18446744073709551616,Amina,4,true,1.5,\
         \"[\"\"a\"\",1]\""
    );
    assert_eq!(
        lines[2],
        "obs_2,household,1.0,,,true,44,\"{\"\"big\"\":\"\"n/a\"\",\"\"members\"\":2,\"\"score\"\":3}\",\
         2025-06-25T12:06:00Z,,,,,,n/a,,2,,3,"
    );
    // Records end with CRLF; the LF inside a quoted field does not end one.
    assert_eq!(
        lines[3],
        "\"obs,3\",household,,2025-06-25T12:00:00.123Z,,false,45,\
         \"{\"\"head_name\"\":\"\"Line\\nbreak, \\\"\"quoted\\\"\"\"\",\"\"members\"\":1}\",\
         2025-06-25T12:06:00Z,,,,,,,\"Line\nbreak, \"\"quoted\"\"\",1,,,"
    );
    // The quoted newline keeps the record whole across the physical line break.
    assert!(text.contains(",\"Line\nbreak, \"\"quoted\"\"\",1,,,\r\n"));
    assert!(text.ends_with("\r\n"));
}

#[test]
fn csv_field_quoting_rules() {
    let q = |s: &str| {
        let mut out = String::new();
        csv_writer::push_field(&mut out, s);
        out
    };
    assert_eq!(q("plain"), "plain");
    assert_eq!(q(""), "");
    assert_eq!(q("a,b"), "\"a,b\"");
    assert_eq!(q("say \"hi\""), "\"say \"\"hi\"\"\"");
    assert_eq!(q("cr\rlf\n"), "\"cr\rlf\n\"");
    assert_eq!(q(" spaced "), " spaced ");
    assert_eq!(q("ünï"), "ünï");
}

// ---------------------------------------------------------------- JSON

#[test]
fn observation_json_has_the_synkronus_shape() {
    let rows = household_rows();
    let full = observation_json(&rows[0]).unwrap();
    assert_eq!(
        full,
        j(r#"{"observation_id": "obs_1", "form_type": "household", "form_version": "1.0",
              "data": {"head_name": "Amina", "members": 4, "score": 1.5, "ok": true,
                       "address": {"city": "Nairobi"}, "tags": ["a", 1], "big": 18446744073709551616},
              "created_at": "2025-06-25T12:00:00.123456Z", "updated_at": "2025-06-25T12:05:10.456Z",
              "synced_at": "2025-06-25T12:06:00.001Z", "deleted": false,
              "geolocation": {"latitude": -1.2921, "longitude": 36.8219, "altitude": null},
              "version": 41, "author": "alice", "device_id": "dev-1", "tags": ["x", "y, \"z\""]}"#)
    );
    let sparse = observation_json(&rows[1]).unwrap();
    assert_eq!(sparse["created_at"], Value::Null);
    assert_eq!(sparse["updated_at"], Value::Null);
    assert_eq!(sparse["geolocation"], Value::Null);
    assert_eq!(sparse["author"], Value::Null);
    assert_eq!(sparse["tags"], Value::Null);
    assert_eq!(sparse["deleted"], json!(true));
    assert_eq!(sparse.as_object().unwrap().len(), 13);
}

#[test]
fn ndjson_lines() {
    let mut out = Vec::new();
    for r in household_rows() {
        write_ndjson_line(&mut out, &r).unwrap();
    }
    let text = String::from_utf8(out).unwrap();
    let lines: Vec<&str> = text.split_terminator('\n').collect();
    assert_eq!(lines.len(), 2);
    assert!(text.ends_with('\n'));
    for (line, r) in lines.iter().zip(household_rows()) {
        assert!(!line.contains('\n'));
        assert_eq!(j(line), observation_json(&r).unwrap());
    }
    assert!(lines[0].contains("\"big\":18446744073709551616"));
    assert!(lines[0].starts_with('{') && !lines[0].contains(": "));
}

#[test]
fn raw_json_zip() {
    let mut zip = ExportZip::new(Vec::new());
    let mut used = HashSet::new();
    for r in household_rows().iter().filter(|r| !r.deleted) {
        let name = raw_json_entry_name(&r.form_type, &r.observation_id, &mut used);
        zip.start_json_entry(&name).unwrap();
        serde_json::to_writer(&mut zip, &observation_json(r).unwrap()).unwrap();
    }
    let mut archive = read_zip(zip.finish().unwrap());
    assert_eq!(archive.len(), 1);
    let body = entry_bytes(&mut archive, "household/obs_1.json");
    let value: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(value["author"], json!("alice"));
    assert_eq!(value["version"], json!(41));
}
