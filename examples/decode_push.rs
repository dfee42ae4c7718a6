//! The push handler's work on a body before the change log (check, split, decode, fingerprint),
//! for instruction counts under callgrind:
//!
//! ```sh
//! cargo build --release --example decode_push
//! valgrind --tool=callgrind --toggle-collect='*decode_for_callgrind*' \
//!     target/release/examples/decode_push [sorted|client] [pushes]
//! # and --toggle-collect='*fingerprint_for_callgrind*' for the fingerprint alone
//! ```
//!
//! The body is a push of 50 records as `synkronus-load push-storm` builds them
//! (load-tests/src/payload.rs: about 1 KB of `data`, keys sorted as serde_json writes them), or
//! with `client` the same records with the keys of every object in the order a client app writes
//! them.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;
use synkronus::domain::sync::decode::decode_push_body;
use synkronus::domain::sync::PushRequest;
use synkronus::http::extract::{malformed_json, parse_push_body};

const WORDS: &[&str] = &["water", "school", "harvest", "clinic", "market", "rain", "goats", "maize"];

fn push_body(n: usize, client_order: bool) -> Vec<u8> {
    let mut rng = StdRng::seed_from_u64(17);
    let now = "2026-11-26T10:00:00.000Z";
    let records: Vec<String> = (0..n)
        .map(|i| {
            let mut notes = String::new();
            while notes.len() < 860 {
                notes.push_str(WORDS[rng.gen_range(0..WORDS.len())]);
                notes.push(' ');
            }
            let notes = serde_json::Value::from(notes.trim_end());
            let (lat, lon) = (-1.2921 + rng.gen_range(-0.1..0.1), 36.8219 + rng.gen_range(-0.1..0.1));
            let members = rng.gen_range(1..12);
            let income = (rng.gen_range(0.0..5000.0_f64) * 100.0).round() / 100.0;
            let ward = rng.gen_range(1..40);
            if client_order {
                format!(
                    r#"{{"observation_id":"dev-{i}","form_type":"survey","form_version":"1.0","data":{{"head_name":"Wanjiru","members":{members},"village":"Kisumu Ndogo","income":{income},"has_water":true,"visit_date":"2025-06-26","address":{{"ward":{ward},"city":"Nairobi"}},"tags":["survey","baseline"],"notes":{notes}}},"created_at":"{now}","updated_at":"{now}","synced_at":null,"deleted":false,"geolocation":{{"longitude":{lon},"latitude":{lat},"accuracy":8.5,"altitude":null,"altitude_accuracy":null}}}}"#
                )
            } else {
                json!({
                    "observation_id": format!("dev-{i}"), "form_type": "survey", "form_version": "1.0",
                    "data": {
                        "head_name": "Wanjiru", "members": members, "village": "Kisumu Ndogo", "income": income,
                        "has_water": true, "visit_date": "2025-06-26", "address": {"city": "Nairobi", "ward": ward},
                        "tags": ["survey", "baseline"], "notes": notes,
                    },
                    "created_at": now, "updated_at": now, "synced_at": null, "deleted": false,
                    "geolocation": {"latitude": lat, "longitude": lon, "accuracy": 8.5, "altitude": null,
                        "altitude_accuracy": null},
                })
                .to_string()
            }
        })
        .collect();
    format!(r#"{{"transmission_id":"t-1","client_id":"dev","records":[{}]}}"#, records.join(",")).into_bytes()
}

#[inline(never)]
fn decode_for_callgrind(bytes: &[u8]) -> Result<PushRequest, String> {
    let body =
        parse_push_body(bytes).and_then(|r| r.split().map_err(malformed_json)).map_err(|e| e.message)?;
    decode_push_body(&body).map_err(|e| e.message)
}

/// Separate from decoding: under valgrind, sha2 cannot detect the CPU's SHA extensions and hashes
/// in software, which would swamp every other count.
#[inline(never)]
fn fingerprint_for_callgrind(push: &PushRequest) -> Vec<u8> {
    push.fingerprint()
}

fn main() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let client_order = args.next().is_some_and(|o| o == "client");
    let pushes: usize = args.next().and_then(|n| n.parse().ok()).unwrap_or(10);
    let body = push_body(50, client_order);
    let mut fingerprint = Vec::new();
    for _ in 0..pushes {
        fingerprint = fingerprint_for_callgrind(&decode_for_callgrind(std::hint::black_box(&body))?);
    }
    println!(
        "{} pushes of 50 records, {} bytes each; fingerprint {}",
        pushes,
        body.len(),
        hex::encode(fingerprint)
    );
    Ok(())
}
