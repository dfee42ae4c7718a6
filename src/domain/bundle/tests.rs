//! Tests of the fixtures, extraction, manifests and changes; validation by problem code is in
//! `tests/validation.rs`.

mod validation;

use std::collections::BTreeMap;
use std::path::Path;

use chrono::{TimeZone, Utc};
use serde_json::json;

use super::test_support::*;
use super::*;

fn created_at() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2025, 6, 25, 12, 0, 3).single().expect("valid time")
}

fn validate_fixture(name: &str) -> ValidatedBundle {
    validate_zip(&fixture(name), &Limits::default()).expect("fixture validates")
}

/// Validates, extracts and builds the manifest of a fixture.
fn fixture_version(name: &str, version_id: &str) -> (ValidatedBundle, tempfile::TempDir, BundleManifest) {
    let bundle = validate_fixture(name);
    let dir = tempfile::tempdir().expect("temp dir");
    extract(&bundle, &fixture(name), dir.path()).expect("extract");
    let manifest = build_manifest(
        version_id,
        bundle.display_name(version_id),
        &bundle.entry_point,
        created_at(),
        dir.path(),
    )
    .expect("manifest");
    (bundle, dir, manifest)
}

fn files_on_disk(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    walkdir::WalkDir::new(dir)
        .min_depth(1)
        .into_iter()
        .map(|item| item.expect("walk"))
        .filter(|item| !item.file_type().is_dir())
        .map(|item| {
            assert!(item.file_type().is_file(), "only regular files are written");
            let relative =
                item.path().strip_prefix(dir).expect("inside").to_str().expect("utf-8").replace('\\', "/");
            (relative, std::fs::read(item.path()).expect("read"))
        })
        .collect()
}

// ---- fixtures -------------------------------------------------------------

#[test]
fn fixture_bundles_validate_in_default_layout() {
    for name in ["valid_bundle01.zip", "valid_bundle02.zip"] {
        let bundle = validate_fixture(name);
        assert_eq!(bundle.layout, Layout::Default);
        assert_eq!(bundle.manifest, None);
        assert_eq!(bundle.entry_point, "app/index.html");
        assert_eq!(bundle.display_name("20250625-120000"), "20250625-120000");
        assert_eq!(bundle.forms.keys().collect::<Vec<_>>(), ["example"]);
        let form = &bundle.forms["example"];
        assert_eq!(form.schema["type"], json!("object"));
        assert_eq!(form.ui["type"], json!("VerticalLayout"));
    }
    let paths: Vec<String> =
        validate_fixture("valid_bundle02.zip").files.into_iter().map(|file| file.path).collect();
    assert_eq!(
        paths,
        [
            "app/THIS_IS_VERSION_2.txt",
            "app/black_sheep_coffee.png",
            "app/index.html",
            "forms/example/schema.json",
            "forms/example/ui.json",
        ]
    );
}

#[test]
fn extract_writes_exactly_the_entries() {
    let (bundle, dir, manifest) = fixture_version("valid_bundle01.zip", "20250625-120000");
    let on_disk = files_on_disk(dir.path());
    let expected: Vec<&str> = bundle.files.iter().map(|file| file.path.as_str()).collect();
    assert_eq!(on_disk.keys().map(String::as_str).collect::<Vec<_>>(), expected);
    let mut archive =
        zip::ZipArchive::new(std::fs::File::open(fixture("valid_bundle01.zip")).expect("open")).expect("zip");
    for file in &bundle.files {
        let mut entry = archive.by_name(&file.path).expect("entry");
        let mut content = Vec::new();
        std::io::Read::read_to_end(&mut entry, &mut content).expect("read");
        assert_eq!(on_disk[&file.path], content, "{}", file.path);
        assert_eq!(file.size, content.len() as u64);
    }
    assert_eq!(manifest.files.len(), bundle.files.len());
}

#[test]
fn fixture_manifest_follows_the_contract() {
    let (_, dir, manifest) = fixture_version("valid_bundle01.zip", "20250625-120000");
    assert_eq!(manifest.version, "20250625-120000");
    assert_eq!(manifest.name, "20250625-120000");
    assert_eq!(manifest.entry_point, "app/index.html");
    assert_eq!(manifest.generated_at, "2025-06-25T12:00:03Z");
    let index = manifest.files.iter().find(|file| file.path == "app/index.html").expect("index listed");
    assert_eq!(index.size, 75);
    assert_eq!(index.mime_type, "text/html; charset=utf-8");
    assert_eq!(index.mod_time, "2025-06-25T12:00:03Z");
    let content = std::fs::read(dir.path().join("app/index.html")).expect("read");
    assert_eq!(index.hash, hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&content)));
    let paths: Vec<&str> = manifest.files.iter().map(|file| file.path.as_str()).collect();
    let mut sorted = paths.clone();
    sorted.sort_unstable();
    assert_eq!(paths, sorted);
    assert_eq!(manifest.hash, bundle_hash("20250625-120000", &manifest.files));

    let body = serde_json::to_value(&manifest).expect("serialise");
    let keys: Vec<&str> = body.as_object().expect("object").keys().map(String::as_str).collect();
    for key in ["version", "name", "entryPoint", "hash", "generatedAt", "files"] {
        assert!(keys.contains(&key), "{key} in {keys:?}");
    }
    let file_keys = body["files"][0].as_object().expect("file object");
    for key in ["path", "hash", "size", "mimeType", "modTime"] {
        assert!(file_keys.contains_key(key), "{key}");
    }
    assert!(body["files"][0]["size"].is_number());
}

#[test]
fn a_version_manifest_equals_the_manifest_of_its_folder() {
    let (bundle, dir, manifest) = fixture_version("valid_bundle01.zip", "20250625-120000");
    let unpacked = build_manifest("", "", &bundle.entry_point, created_at(), dir.path()).expect("manifest");
    assert_eq!(version_manifest(&bundle, "20250625-120000", unpacked.files, created_at()), manifest);
}

#[test]
fn bundle_hash_is_stable_and_version_specific() {
    let (bundle, dir, first) = fixture_version("valid_bundle01.zip", "20250625-120000");
    let again =
        build_manifest("20250625-120000", "20250625-120000", &bundle.entry_point, created_at(), dir.path())
            .expect("manifest");
    assert_eq!(first, again);
    let other_id =
        build_manifest("20250625-120000-2", "20250625-120000", &bundle.entry_point, created_at(), dir.path())
            .expect("manifest");
    assert_ne!(first.hash, other_id.hash);
    assert_eq!(first.files, other_id.files);
    let (_, _, second_bundle) = fixture_version("valid_bundle02.zip", "20250625-120000");
    assert_ne!(first.hash, second_bundle.hash);
}

#[test]
fn changes_between_the_fixtures() {
    let (_, dir1, manifest1) = fixture_version("valid_bundle01.zip", "20250624-090000");
    let (_, dir2, manifest2) = fixture_version("valid_bundle02.zip", "20250625-120000");
    let a = VersionView::load(&manifest1, dir1.path()).expect("view a");
    let b = VersionView::load(&manifest2, dir2.path()).expect("view b");
    let changes = diff_versions(&a, &b);
    let body = serde_json::to_value(&changes).expect("serialise");
    assert_eq!(
        body,
        json!({
            "current_version": "20250624-090000", "target_version": "20250625-120000",
            "added": [{"path": "app/THIS_IS_VERSION_2.txt"}],
            "modified": [{"path": "forms/example/schema.json"}],
            "removed": [],
            "compare_version_a": "20250624-090000", "compare_version_b": "20250625-120000",
            "form_changes": true, "ui_changes": false,
            "new_forms": [], "removed_forms": [],
            "modified_forms": [{"form": "example", "schema_changed": true, "ui_changed": false,
                                "core_changed": false,
                                "added_fields": [{"field": "lastname", "type": "string"}],
                                "removed_fields": []}]
        })
    );

    let reverse = diff_versions(&b, &a);
    assert_eq!(reverse.removed, [ChangedPath { path: "app/THIS_IS_VERSION_2.txt".into() }]);
    assert_eq!(reverse.modified_forms[0].removed_fields[0].field, "lastname");

    let same = serde_json::to_value(diff_versions(&a, &a)).expect("serialise");
    for key in ["added", "modified", "removed", "new_forms", "removed_forms", "modified_forms"] {
        assert_eq!(same[key], json!([]), "{key}");
    }
    assert_eq!(same["form_changes"], json!(false));
    assert_eq!(same["ui_changes"], json!(false));
}

#[test]
fn form_level_changes() {
    let view = |version: &str, forms: Vec<(&str, serde_json::Value, serde_json::Value)>| VersionView {
        version: version.to_owned(),
        files: BTreeMap::new(),
        forms: forms
            .into_iter()
            .map(|(name, schema, ui)| (name.to_owned(), FormView { schema, ui }))
            .collect(),
    };
    let a = view(
        "a",
        vec![
            ("gone", json!({}), json!({"type": "X"})),
            (
                "kept",
                json!({"properties": {"age": {"type": "integer"}, "core_id": {"type": "string"},
                                      "flag": {"type": "boolean", "x-core": true}}}),
                json!({"type": "VerticalLayout"}),
            ),
            ("same", json!({"a": 1, "b": 2}), json!({"type": "X"})),
        ],
    );
    let b = view(
        "b",
        vec![
            (
                "kept",
                json!({"properties": {"age": {"type": "string"}, "core_id": {"type": "string"},
                                      "flag": {"type": "boolean", "x-core": true, "title": "F"},
                                      "zeta": {}}}),
                json!({"type": "HorizontalLayout"}),
            ),
            ("new", json!({}), json!({"type": "X"})),
            ("same", json!({"b": 2, "a": 1}), json!({"type": "X"})),
        ],
    );
    let changes = diff_versions(&a, &b);
    assert_eq!(changes.new_forms, [FormName { form: "new".into() }]);
    assert_eq!(changes.removed_forms, [FormName { form: "gone".into() }]);
    assert_eq!(changes.modified_forms.len(), 1);
    let kept = &changes.modified_forms[0];
    assert!(kept.schema_changed && kept.ui_changed && kept.core_changed);
    assert_eq!(
        serde_json::to_value(&kept.added_fields).expect("json"),
        json!([{"field": "age", "type": "string"}, {"field": "zeta", "type": null}])
    );
    assert_eq!(
        serde_json::to_value(&kept.removed_fields).expect("json"),
        json!([{"field": "age", "type": "integer"}])
    );
    assert!(changes.form_changes && changes.ui_changes);
}

#[test]
fn form_file_paths_prefer_app_forms() {
    let paths = form_file_paths(["app/forms/a/schema.json", "app/forms/a/ui.json", "app/x.js"]);
    assert_eq!(paths.keys().collect::<Vec<_>>(), ["a"]);
    assert_eq!(paths["a"].schema.as_deref(), Some("app/forms/a/schema.json"));
    let paths = form_file_paths(["forms/b/schema.json", "forms/ext.json", "app/index.html"]);
    assert_eq!(paths["b"].schema.as_deref(), Some("forms/b/schema.json"));
    assert_eq!(paths["b"].ui, None);
}
