//! Property suite of bundle validation: arbitrary, mutated and truncated ZIPs are refused or
//! accepted, never a panic.

use std::io::Write;

use proptest::prelude::*;

use crate::domain::bundle::{validate_zip, Limits};
use crate::testing::*;

const FIXTURE: &[u8] = include_bytes!("../../../tests/fixtures/upstream/valid_bundle01.zip");

fn small_zip(stored: bool) -> Vec<u8> {
    let mut writer = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let method = if stored { zip::CompressionMethod::Stored } else { zip::CompressionMethod::Deflated };
    let options = zip::write::SimpleFileOptions::default().compression_method(method);
    let files: [(&str, &[u8]); 4] = [
        ("manifest.json", br#"{"version":"20250101-000000","name":"Fuzz","entryPoint":"app/index.html"}"#),
        ("app/index.html", b"<html></html>"),
        ("forms/household/schema.json", br#"{"type":"object","properties":{"name":{"type":"string"}}}"#),
        ("forms/household/ui.json", br#"{"type":"VerticalLayout","elements":[]}"#),
    ];
    for (name, content) in files {
        writer.start_file(name, options).expect("start");
        writer.write_all(content).expect("write");
    }
    writer.finish().expect("finish").into_inner()
}

/// Runs the validator on `bytes` from a temp file: it must return, Ok or a rejection.
fn validate(bytes: &[u8]) -> bool {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("bundle.zip");
    std::fs::write(&path, bytes).expect("write zip");
    validate_zip(&path, &Limits::default()).is_ok()
}

fn base() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![Just(FIXTURE.to_vec()), Just(small_zip(true)), Just(small_zip(false))]
}

#[test]
fn the_unmutated_bases_are_valid() {
    assert!(validate(FIXTURE));
    assert!(validate(&small_zip(true)));
    assert!(validate(&small_zip(false)));
}

proptest! {
    #![proptest_config(config(48))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        prop_assert!(!validate(&bytes));
    }

    #[test]
    fn mutated_bundles_never_panic(
        base in base(),
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..12),
    ) {
        let mut bytes = base;
        for (at, b) in edits {
            let i = at.index(bytes.len());
            bytes[i] = b;
        }
        let _ = validate(&bytes);
    }

    /// Mutations aimed at the end of the file hit the central directory and its sizes/offsets.
    #[test]
    fn mutated_directories_never_panic(
        base in base(),
        edits in proptest::collection::vec((0usize..200, any::<u8>()), 1..8),
        cut in 0usize..64,
    ) {
        let mut bytes = base;
        let len = bytes.len();
        for (back, b) in edits {
            let i = len - 1 - back.min(len - 1);
            bytes[i] = b;
        }
        let _ = validate(&bytes);
        bytes.truncate(len.saturating_sub(cut));
        let _ = validate(&bytes);
    }

    #[test]
    fn truncated_bundles_never_panic(base in base(), keep in any::<prop::sample::Index>()) {
        let _ = validate(&base[..keep.index(base.len())]);
    }
}
