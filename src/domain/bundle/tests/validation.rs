//! Validation by example: the accepted layouts, then one test per problem code, step by step.

use std::path::Path;

use chrono::{TimeZone, Utc};

use crate::domain::bundle::test_support::*;
use crate::domain::bundle::*;

// ---- accepted layouts -----------------------------------------------------

#[test]
fn legacy_layout_is_accepted() {
    let bytes = zip_bytes(&[
        Item::File("index.html", b"<html/>"),
        Item::File("assets/app.js", b"1"),
        Item::File("forms/f/schema.json", SCHEMA.as_bytes()),
        Item::File("forms/f/ui.json", UI.as_bytes()),
    ]);
    let bundle = validate_bytes(&bytes).expect("legacy bundle");
    assert_eq!(bundle.layout, Layout::Legacy);
    assert_eq!(bundle.entry_point, "index.html");
    assert!(bundle.forms.contains_key("f"));
}

#[test]
fn app_forms_layout_with_manifest_renderers_and_ext() {
    let manifest = br#"{"version": "20250625-120000", "name": "Household survey",
        "entryPoint": "app/index.html", "description": "d", "createdAt": "2025-06-25T14:00:00+02:00"}"#;
    let schema = br#"{"type": "object", "properties": {
        "photo": {"type": "string", "x-renderer": "image"},
        "gps": {"type": "object", "x-question-type": "geo"}}}"#;
    let bytes = zip_bytes(&[
        Item::File("manifest.json", manifest),
        Item::Dir("app/"),
        Item::File("app/index.html", b"<html/>"),
        Item::Dir("app/forms/"),
        Item::Dir("app/forms/visit/"),
        Item::File("app/forms/visit/schema.json", schema),
        Item::File("app/forms/visit/ui.json", UI.as_bytes()),
        Item::File("app/forms/ext.json", b"{}"),
        Item::File("renderers/geo/renderer.jsx", b"export default 1"),
        Item::File("renderers/geo/style.css", b""),
    ]);
    let bundle = validate_bytes(&bytes).expect("app-forms bundle");
    assert_eq!(bundle.layout, Layout::AppForms);
    let declared = bundle.manifest.as_ref().expect("manifest");
    assert_eq!(declared.name, "Household survey");
    assert_eq!(declared.created_at, Utc.with_ymd_and_hms(2025, 6, 25, 12, 0, 0).single());
    assert_eq!(declared_version_id(declared).as_deref(), Some("20250625-120000"));
    assert_eq!(bundle.display_name("x"), "Household survey");
    assert_eq!(bundle.forms.keys().collect::<Vec<_>>(), ["visit"]);
    assert!(bundle.files.iter().any(|file| file.path == "manifest.json"));
}

#[test]
fn default_layout_may_hold_other_files_under_app_forms() {
    let bytes = default_bundle_with(&[Item::File("app/forms/widget.js", b"1")]);
    let bundle = validate_bytes(&bytes).expect("default bundle");
    assert_eq!(bundle.layout, Layout::Default);
}

// ---- step 1: structure and ZIP safety -------------------------------------

#[test]
fn not_a_zip_is_corrupt() {
    let result = validate_bytes(b"this is not a zip archive at all");
    assert_rejected(result, steps::STRUCTURE, codes::ZIP_CORRUPT, Some(""));
    let mut truncated = default_bundle_with(&[]);
    truncated.truncate(truncated.len() / 2);
    assert_rejected(validate_bytes(&truncated), steps::STRUCTURE, codes::ZIP_CORRUPT, None);
}

#[test]
fn encrypted_entry_is_corrupt() {
    let mut bytes = default_bundle_with(&[Item::File("app/secret.txt", b"secret")]);
    set_flag_bits(&mut bytes, "app/secret.txt", 1);
    assert_rejected(validate_bytes(&bytes), steps::STRUCTURE, codes::ZIP_CORRUPT, Some("app/secret.txt"));
}

#[test]
fn unsafe_paths_are_all_reported() {
    let mut bytes = default_bundle_with(&[
        Item::File("XXXabs.txt", b"1"),
        Item::File("app/XX/x.txt", b"2"),
        Item::File("appXback.txt", b"3"),
        Item::File("XXwin.txt", b"4"),
        Item::File("app/ctrlX.txt", b"5"),
        Item::File("app/emptyX/x.txt", b"6"),
    ]);
    replace_bytes(&mut bytes, b"XXXabs.txt", b"/../abs.tx");
    replace_bytes(&mut bytes, b"app/XX/x.txt", b"app/../x.txt");
    replace_bytes(&mut bytes, b"appXback.txt", b"app\\back.txt");
    replace_bytes(&mut bytes, b"XXwin.txt", b"C:win.txt");
    replace_bytes(&mut bytes, b"app/ctrlX.txt", b"app/ctrl\x01.txt");
    replace_bytes(&mut bytes, b"app/emptyX/x.txt", b"app/empty//x.txt");
    let rejection =
        assert_rejected(validate_bytes(&bytes), steps::STRUCTURE, codes::ZIP_UNSAFE_PATH, Some("/../abs.tx"));
    let unsafe_paths: Vec<&str> = rejection
        .problems
        .iter()
        .filter(|problem| problem.code == codes::ZIP_UNSAFE_PATH)
        .map(|problem| problem.path.as_str())
        .collect();
    assert_eq!(unsafe_paths.len(), 6, "{rejection:?}");
}

#[test]
fn invalid_utf8_name_with_utf8_flag_is_unsafe() {
    let mut bytes = default_bundle_with(&[Item::File("app/bad-X.txt", b"1")]);
    set_flag_bits(&mut bytes, "app/bad-X.txt", 1 << 11);
    replace_bytes(&mut bytes, b"app/bad-X.txt", b"app/bad-\xff.txt");
    assert_rejected(validate_bytes(&bytes), steps::STRUCTURE, codes::ZIP_UNSAFE_PATH, None);
}

#[test]
fn symlink_entry_is_rejected() {
    let mut bytes = default_bundle_with(&[Item::File("app/link", b"/etc/passwd")]);
    set_unix_mode(&mut bytes, "app/link", 0o120_777);
    assert_rejected(validate_bytes(&bytes), steps::STRUCTURE, codes::ZIP_SYMLINK, Some("app/link"));
}

#[test]
fn duplicate_entries_are_rejected() {
    let mut bytes = default_bundle_with(&[Item::File("app/one.js", b"1"), Item::File("app/two.js", b"2")]);
    replace_bytes(&mut bytes, b"app/two.js", b"app/one.js");
    assert_rejected(validate_bytes(&bytes), steps::STRUCTURE, codes::ZIP_DUPLICATE_ENTRY, Some("app/one.js"));

    let file_and_folder =
        default_bundle_with(&[Item::File("app/data", b"1"), Item::File("app/data/x.js", b"2")]);
    assert_rejected(
        validate_bytes(&file_and_folder),
        steps::STRUCTURE,
        codes::ZIP_DUPLICATE_ENTRY,
        Some("app/data"),
    );
}

#[test]
fn entry_larger_than_declared_is_a_bomb() {
    let payload = vec![b'a'; 300 * 1024];
    let mut bytes = default_bundle_with(&[Item::File("app/big.bin", &payload)]);
    set_declared_size(&mut bytes, "app/big.bin", 1000);
    assert_rejected(validate_bytes(&bytes), steps::STRUCTURE, codes::ZIP_BOMB, Some("app/big.bin"));
}

#[test]
fn high_compression_ratio_is_a_bomb() {
    let zeros = vec![0u8; 3 * 1024 * 1024];
    let bytes = default_bundle_with(&[Item::File("app/zeros.bin", &zeros)]);
    assert_rejected(validate_bytes(&bytes), steps::STRUCTURE, codes::ZIP_BOMB, Some("app/zeros.bin"));
    // The same size stored uncompressed is fine.
    let stored = default_bundle_with(&[Item::StoredFile("app/zeros.bin", &zeros)]);
    validate_bytes(&stored).expect("stored entry has ratio 1");
}

#[test]
fn too_many_entries_and_too_many_bytes_are_bombs() {
    let limits = Limits { max_entries: 3, ..Limits::default() };
    let bytes = default_bundle_with(&[Item::File("app/a.js", b"1")]);
    assert_rejected(validate_bytes_with(&bytes, &limits), steps::STRUCTURE, codes::ZIP_BOMB, Some(""));

    let limits = Limits { max_total_uncompressed_bytes: 1000, ..Limits::default() };
    let block = vec![b'x'; 600];
    let bytes = default_bundle_with(&[Item::File("app/a.js", &block), Item::File("app/b.js", &block)]);
    assert_rejected(validate_bytes_with(&bytes, &limits), steps::STRUCTURE, codes::ZIP_BOMB, Some(""));
}

#[test]
fn oversized_entry_is_too_large() {
    let limits = Limits { max_entry_bytes: 100, ..Limits::default() };
    let bytes = default_bundle_with(&[Item::File("app/big.js", &[b'x'; 200])]);
    assert_rejected(
        validate_bytes_with(&bytes, &limits),
        steps::STRUCTURE,
        codes::FILE_TOO_LARGE,
        Some("app/big.js"),
    );
}

#[test]
fn unexpected_entries_are_rejected() {
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (default_bundle_with(&[Item::File("__MACOSX/app/._index.html", b"")]), "__MACOSX/"),
        (default_bundle_with(&[Item::File("README.md", b"")]), "README.md"),
        (default_bundle_with(&[Item::File("index.html", b"")]), "index.html"),
        (default_bundle_with(&[Item::File("assets/x.js", b"")]), "assets/"),
        (default_bundle_with(&[Item::File("renderers/loose.jsx", b"")]), "renderers/loose.jsx"),
        (default_bundle_with(&[Item::File("forms/household/extra.txt", b"")]), "forms/household/extra.txt"),
        (default_bundle_with(&[Item::File("forms/notes.md", b"")]), "forms/notes.md"),
        (
            zip_bytes(&[
                Item::File("bundle/app/index.html", b"<html/>"),
                Item::File("bundle/forms/f/schema.json", SCHEMA.as_bytes()),
            ]),
            "bundle/",
        ),
    ];
    for (bytes, path) in cases {
        assert_rejected(validate_bytes(&bytes), steps::STRUCTURE, codes::UNEXPECTED_ENTRY, Some(path));
    }
}

#[test]
fn missing_index_is_rejected() {
    let no_index = zip_bytes(&[Item::File("app/main.js", b"1")]);
    assert_rejected(
        validate_bytes(&no_index),
        steps::STRUCTURE,
        codes::MISSING_APP_INDEX,
        Some("app/index.html"),
    );
    let only_forms = zip_bytes(&[Item::File("forms/f/schema.json", SCHEMA.as_bytes())]);
    assert_rejected(validate_bytes(&only_forms), steps::STRUCTURE, codes::MISSING_APP_INDEX, None);
}

#[test]
fn mixed_form_layouts_are_rejected() {
    let bytes = default_bundle_with(&[
        Item::File("app/forms/visit/schema.json", SCHEMA.as_bytes()),
        Item::File("app/forms/visit/ui.json", UI.as_bytes()),
    ]);
    assert_rejected(validate_bytes(&bytes), steps::STRUCTURE, codes::MIXED_FORM_LAYOUTS, Some("forms/"));
}

#[test]
fn renderer_without_entry_file_is_invalid() {
    let bytes = default_bundle_with(&[Item::File("renderers/geo/index.js", b"1")]);
    assert_rejected(
        validate_bytes(&bytes),
        steps::STRUCTURE,
        codes::RENDERER_INVALID,
        Some("renderers/geo/"),
    );
}

#[test]
fn structure_problems_stop_before_later_steps() {
    let bytes = default_bundle_with(&[
        Item::File("README.md", b""),
        Item::File("manifest.json", b"not json"),
        Item::File("forms/broken/schema.json", b"[]"),
    ]);
    let rejection =
        assert_rejected(validate_bytes(&bytes), steps::STRUCTURE, codes::UNEXPECTED_ENTRY, Some("README.md"));
    assert!(rejection.problems.iter().all(|problem| problem.code == codes::UNEXPECTED_ENTRY));
}

// ---- step 2: manifest -----------------------------------------------------

#[test]
fn manifest_must_be_a_small_json_object() {
    for manifest in [&b"not json"[..], b"[1, 2]", b"\"text\""] {
        let bytes = default_bundle_with(&[Item::File("manifest.json", manifest)]);
        assert_rejected(
            validate_bytes(&bytes),
            steps::MANIFEST,
            codes::MANIFEST_INVALID,
            Some("manifest.json"),
        );
    }
    let limits = Limits { max_manifest_bytes: 10, ..Limits::default() };
    let bytes = default_bundle_with(&[Item::File(
        "manifest.json",
        br#"{"version": "1", "name": "n", "entryPoint": "app/index.html"}"#,
    )]);
    assert_rejected(
        validate_bytes_with(&bytes, &limits),
        steps::MANIFEST,
        codes::MANIFEST_INVALID,
        Some("manifest.json"),
    );
}

#[test]
fn manifest_fields_are_required_strings() {
    let bytes = default_bundle_with(&[Item::File(
        "manifest.json",
        br#"{"version": "1.0", "name": "", "entryPoint": 5}"#,
    )]);
    let rejection = assert_rejected(
        validate_bytes(&bytes),
        steps::MANIFEST,
        codes::MANIFEST_FIELD_MISSING,
        Some("manifest.json#/name"),
    );
    assert!(rejection.problems.iter().any(|problem| problem.path == "manifest.json#/entryPoint"));
    assert_eq!(rejection.problems.len(), 2);
}

#[test]
fn manifest_values_are_checked() {
    for (manifest, path) in [
        (
            &br#"{"version": "1", "name": "n", "entryPoint": "../app/index.html"}"#[..],
            "manifest.json#/entryPoint",
        ),
        (
            br#"{"version": "1", "name": "n", "entryPoint": "/app/index.html"}"#,
            "manifest.json#/entryPoint",
        ),
        (
            br#"{"version": "1", "name": "n", "entryPoint": "app/index.html", "createdAt": "2025-06-25T12:00:00"}"#,
            "manifest.json#/createdAt",
        ),
    ] {
        let bytes = default_bundle_with(&[Item::File("manifest.json", manifest)]);
        assert_rejected(
            validate_bytes(&bytes),
            steps::MANIFEST,
            codes::MANIFEST_INVALID,
            Some(path),
        );
    }
}

// ---- step 3: entry point --------------------------------------------------

#[test]
fn declared_entry_point_must_exist() {
    let bytes = default_bundle_with(&[Item::File(
        "manifest.json",
        br#"{"version": "1", "name": "n", "entryPoint": "app/main.html"}"#,
    )]);
    assert_rejected(
        validate_bytes(&bytes),
        steps::ENTRY_POINT,
        codes::ENTRY_POINT_MISSING,
        Some("app/main.html"),
    );
    let folder_entry = default_bundle_with(&[
        Item::Dir("app/sub/"),
        Item::File("manifest.json", br#"{"version": "1", "name": "n", "entryPoint": "app/sub"}"#),
    ]);
    assert_rejected(validate_bytes(&folder_entry), steps::ENTRY_POINT, codes::ENTRY_POINT_MISSING, None);
}

// ---- step 4: forms --------------------------------------------------------

#[test]
fn form_names_are_checked() {
    let long_name = format!("forms/{}/", "f".repeat(256));
    let long_schema = format!("{long_name}schema.json");
    let long_ui = format!("{long_name}ui.json");
    let bytes = default_bundle_with(&[
        Item::File("forms/.hidden/schema.json", SCHEMA.as_bytes()),
        Item::File("forms/.hidden/ui.json", UI.as_bytes()),
        Item::File(&long_schema, SCHEMA.as_bytes()),
        Item::File(&long_ui, UI.as_bytes()),
    ]);
    let rejection = assert_rejected(
        validate_bytes(&bytes),
        steps::FORMS,
        codes::FORM_NAME_INVALID,
        Some("forms/.hidden/"),
    );
    assert!(rejection.problems.iter().any(|problem| problem.path == long_name));
}

#[test]
fn form_files_must_both_exist() {
    let bytes = default_bundle_with(&[
        Item::File("forms/visit/schema.json", SCHEMA.as_bytes()),
        Item::Dir("forms/empty/"),
    ]);
    let rejection = assert_rejected(
        validate_bytes(&bytes),
        steps::FORMS,
        codes::FORM_FILE_MISSING,
        Some("forms/visit/ui.json"),
    );
    assert_eq!(rejection.problems.len(), 3, "{rejection:?}");
}

#[test]
fn form_files_have_a_size_limit() {
    let limits = Limits { max_form_file_bytes: 50, ..Limits::default() };
    let big_schema = format!(r#"{{"type": "object", "description": "{}"}}"#, "d".repeat(100));
    let bytes = default_bundle_with(&[
        Item::File("forms/visit/schema.json", big_schema.as_bytes()),
        Item::File("forms/visit/ui.json", UI.as_bytes()),
    ]);
    assert_rejected(
        validate_bytes_with(&bytes, &limits),
        steps::FORMS,
        codes::FORM_FILE_TOO_LARGE,
        Some("forms/visit/schema.json"),
    );
}

#[test]
fn form_files_must_be_json_objects() {
    let bytes = default_bundle_with(&[
        Item::File("forms/visit/schema.json", b"{not json"),
        Item::File("forms/visit/ui.json", b"[]"),
        Item::File("forms/ext.json", b"42"),
    ]);
    let rejection = assert_rejected(
        validate_bytes(&bytes),
        steps::FORMS,
        codes::FORM_FILE_INVALID_JSON,
        Some("forms/visit/schema.json"),
    );
    for path in ["forms/visit/ui.json", "forms/ext.json"] {
        assert!(
            rejection
                .problems
                .iter()
                .any(|problem| problem.path == path && problem.code == codes::FORM_FILE_INVALID_JSON),
            "{path}: {rejection:?}"
        );
    }
}

#[test]
fn schema_must_compile_as_draft_07() {
    let bytes = default_bundle_with(&[
        Item::File("forms/visit/schema.json", br#"{"type": 5}"#),
        Item::File("forms/visit/ui.json", UI.as_bytes()),
    ]);
    assert_rejected(
        validate_bytes(&bytes),
        steps::FORMS,
        codes::FORM_SCHEMA_INVALID,
        Some("forms/visit/schema.json"),
    );
}

#[test]
fn upstream_json_forms_examples_compile() {
    let forms_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/forms");
    // arraySelect uses the non-standard type "array-select", which draft-07 refuses.
    for (name, compiles) in [("array", true), ("arraySelect", false), ("basic", true), ("control", true)] {
        let schema: serde_json::Value =
            serde_json::from_slice(&std::fs::read(forms_dir.join(name).join("schema.json")).expect("read"))
                .expect("json");
        assert_eq!(jsonschema::draft7::new(&schema).is_ok(), compiles, "{name}");
    }
}

#[test]
fn ui_schema_needs_a_string_type() {
    let bytes = default_bundle_with(&[
        Item::File("forms/visit/schema.json", SCHEMA.as_bytes()),
        Item::File("forms/visit/ui.json", br#"{"type": 1, "elements": []}"#),
    ]);
    assert_rejected(
        validate_bytes(&bytes),
        steps::FORMS,
        codes::FORM_UI_INVALID,
        Some("forms/visit/ui.json"),
    );
}

#[test]
fn renderer_references_must_resolve() {
    let schema = br#"{"type": "object", "properties": {
        "a": {"type": "string", "x-renderer": "signature"},
        "b": {"type": "string", "rendererType": "geo"},
        "c": {"type": "array", "items": {"type": "string", "x-question-type": "missing"}}}}"#;
    let bytes = default_bundle_with(&[
        Item::File("forms/visit/schema.json", schema),
        Item::File("forms/visit/ui.json", UI.as_bytes()),
        Item::File("renderers/geo/renderer.jsx", b"export default 1"),
    ]);
    let rejection = assert_rejected(
        validate_bytes(&bytes),
        steps::FORMS,
        codes::RENDERER_REFERENCE_MISSING,
        Some("forms/visit/schema.json#/properties/c/items/x-question-type"),
    );
    assert_eq!(rejection.problems.len(), 1, "{rejection:?}");
}

#[test]
fn declared_entry_count_reads_the_end_record() {
    let mut file = std::fs::File::open(fixture("valid_bundle01.zip")).expect("open");
    assert_eq!(crate::domain::bundle::zip_directory::declared_entry_count(&mut file).expect("read"), Some(7));
    let mut not_zip = std::io::Cursor::new(b"no end record here".to_vec());
    assert_eq!(crate::domain::bundle::zip_directory::declared_entry_count(&mut not_zip).expect("read"), None);
}

#[test]
fn app_forms_root_only_holds_forms() {
    let bytes = zip_bytes(&[
        Item::File("app/index.html", b"<html/>"),
        Item::File("app/forms/visit/schema.json", SCHEMA.as_bytes()),
        Item::File("app/forms/visit/ui.json", UI.as_bytes()),
        Item::File("app/forms/helper.js", b"1"),
    ]);
    assert_rejected(
        validate_bytes(&bytes),
        steps::STRUCTURE,
        codes::UNEXPECTED_ENTRY,
        Some("app/forms/helper.js"),
    );
}
