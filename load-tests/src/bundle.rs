//! Builds valid app bundles (section 9.1, default layout) for the bundle scenarios.

use crate::payload::{random_bytes, sha256_hex};
use anyhow::Result;
use rand::SeedableRng;
use serde_json::json;
use std::collections::BTreeMap;
use std::io::{Cursor, Write};
use zip::write::SimpleFileOptions;
use zip::CompressionMethod;

pub struct BuiltBundle {
    pub zip: Vec<u8>,
    /// path -> sha256 hex of every file, for comparing with the server's manifest.
    pub files: BTreeMap<String, String>,
}

/// A bundle with `app/index.html`, one asset of `asset_bytes` random bytes, and `forms` form
/// folders. `variant` changes every file's content so two variants never share a hash.
pub fn build_bundle(variant: u32, asset_bytes: usize, forms: u32) -> Result<BuiltBundle> {
    let mut files: Vec<(String, Vec<u8>)> = Vec::new();
    let index = format!(
        "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>Load test v{variant}</title>\
         <script src=\"assets/app-{variant}.js\"></script></head>\
         <body><h1>synkronus-load bundle variant {variant}</h1></body></html>\n"
    );
    files.push(("app/index.html".into(), index.into_bytes()));
    files.push((
        format!("app/assets/app-{variant}.js"),
        format!("console.log('synkronus-load variant {variant}');\n").into_bytes(),
    ));
    if asset_bytes > 0 {
        // Seeded by the variant: the same variant is reproducible, different variants differ.
        let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed_0000 + u64::from(variant));
        files.push(("app/assets/blob.bin".into(), random_bytes(asset_bytes, &mut rng)));
    }
    for f in 0..forms {
        let ty = format!("loadform{f}");
        let schema = json!({
            "$schema": "http://json-schema.org/draft-07/schema#",
            "type": "object",
            "title": format!("Load form {f} (variant {variant})"),
            "properties": {
                "head_name": {"type": "string"},
                "members": {"type": "integer", "minimum": 0},
                "notes": {"type": "string"},
                format!("field_v{variant}"): {"type": "string"}
            }
        });
        let ui = json!({"type": "VerticalLayout", "elements": []});
        files.push((format!("forms/{ty}/schema.json"), serde_json::to_vec_pretty(&schema)?));
        files.push((format!("forms/{ty}/ui.json"), serde_json::to_vec_pretty(&ui)?));
    }

    let mut w = zip::ZipWriter::new(Cursor::new(Vec::new()));
    for (path, bytes) in &files {
        // Random bytes do not compress; storing them keeps the builder and the server's
        // ratio checks cheap. Text is deflated like a real bundle.
        let method =
            if path.ends_with(".bin") { CompressionMethod::Stored } else { CompressionMethod::Deflated };
        let opts = SimpleFileOptions::default().compression_method(method).unix_permissions(0o644);
        w.start_file(path.as_str(), opts)?;
        w.write_all(bytes)?;
    }
    let zip = w.finish()?.into_inner();
    let files = files.into_iter().map(|(p, b)| (p, sha256_hex(&b))).collect();
    Ok(BuiltBundle { zip, files })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn bundle_is_a_valid_zip_with_default_layout() {
        let b = build_bundle(1, 100_000, 2).unwrap();
        let mut z = zip::ZipArchive::new(Cursor::new(b.zip.clone())).unwrap();
        let mut names: Vec<String> =
            (0..z.len()).map(|i| z.by_index(i).unwrap().name().unwrap().to_string()).collect();
        names.sort();
        assert!(names.contains(&"app/index.html".to_string()));
        assert!(names.contains(&"app/assets/blob.bin".to_string()));
        assert!(names.contains(&"forms/loadform0/schema.json".to_string()));
        assert!(names.contains(&"forms/loadform1/ui.json".to_string()));
        // Only allowed top-level entries (9.1).
        assert!(names.iter().all(|n| n.starts_with("app/") || n.starts_with("forms/")));
        for i in 0..z.len() {
            let mut f = z.by_index(i).unwrap();
            let name = f.name().unwrap().to_string();
            let mut buf = Vec::new();
            f.read_to_end(&mut buf).unwrap();
            assert_eq!(b.files[&name], sha256_hex(&buf), "{name}");
            if name.ends_with("schema.json") {
                let v: serde_json::Value = serde_json::from_slice(&buf).unwrap();
                assert_eq!(v["type"], "object");
                assert!(v["properties"].is_object());
            }
            if name.ends_with("ui.json") {
                let v: serde_json::Value = serde_json::from_slice(&buf).unwrap();
                assert_eq!(v["type"], "VerticalLayout");
            }
        }
        assert_eq!(b.files["app/assets/blob.bin"].len(), 64);
        assert!(b.zip.len() > 100_000);
    }

    #[test]
    fn variants_differ_everywhere() {
        let a = build_bundle(1, 1000, 1).unwrap();
        let b = build_bundle(2, 1000, 1).unwrap();
        // ui.json is the fixed minimal layout; every other file must tell variants apart so a
        // mixed-version download is detectable.
        for (path, hash) in a.files.iter().filter(|(p, _)| !p.ends_with("ui.json")) {
            if let Some(other) = b.files.get(path) {
                assert_ne!(hash, other, "{path} identical across variants");
            }
        }
        // Same variant is reproducible.
        let a2 = build_bundle(1, 1000, 1).unwrap();
        assert_eq!(a.files, a2.files);
    }
}
