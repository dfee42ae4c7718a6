//! Realistic record payloads and incompressible byte blobs.

use rand::{Rng, RngCore};
use serde_json::{json, Value};

const FIRST_NAMES: &[&str] = &[
    "Amina", "Juma", "Wanjiru", "Otieno", "Fatuma", "Kipchoge", "Achieng", "Baraka", "Zawadi", "Mwangi",
    "Nia", "Omondi",
];
const VILLAGES: &[&str] =
    &["Kibera", "Mathare", "Kisumu Ndogo", "Nyalenda", "Bondo", "Siaya", "Kakamega", "Voi"];
const WORDS: &[&str] = &[
    "water",
    "school",
    "harvest",
    "clinic",
    "market",
    "rain",
    "goats",
    "maize",
    "road",
    "well",
    "visit",
    "household",
    "follow-up",
    "consent",
    "children",
    "latrine",
    "garden",
    "solar",
];

/// The current time as the RFC 3339 text real clients send.
pub fn now_rfc3339() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// Builds the `data` object of a household-survey-like observation whose compact JSON is about
/// `target_bytes` long: a handful of typed fields (so exports infer several column types)
/// padded with free-text notes.
pub fn record_data(target_bytes: usize, rng: &mut impl Rng) -> Value {
    let mut data = json!({
        "head_name": FIRST_NAMES[rng.gen_range(0..FIRST_NAMES.len())],
        "members": rng.gen_range(1..12),
        "village": VILLAGES[rng.gen_range(0..VILLAGES.len())],
        "income": (rng.gen_range(0.0..5000.0_f64) * 100.0).round() / 100.0,
        "has_water": rng.gen_bool(0.6),
        "visit_date": "2025-06-26",
        "address": {"city": "Nairobi", "ward": rng.gen_range(1..40)},
        "tags": ["survey", "baseline"],
    });
    let base = serde_json::to_string(&data).map(|s| s.len()).unwrap_or(0);
    // `,"notes":""` costs 11 bytes on top of the text itself.
    let want = target_bytes.saturating_sub(base + 11);
    if want > 0 {
        let mut notes = String::with_capacity(want + 16);
        while notes.len() < want {
            if !notes.is_empty() {
                notes.push(' ');
            }
            notes.push_str(WORDS[rng.gen_range(0..WORDS.len())]);
        }
        notes.truncate(want);
        if let Value::Object(m) = &mut data {
            m.insert("notes".into(), Value::String(notes));
        }
    }
    data
}

/// One push record in the synkronus dialect (section 8.7).
pub fn record(id: &str, form_type: &str, data_bytes: usize, rng: &mut impl Rng) -> Value {
    let now = now_rfc3339();
    json!({
        "observation_id": id,
        "form_type": form_type,
        "form_version": "1.0",
        "data": record_data(data_bytes, rng),
        "created_at": now,
        "updated_at": now,
        "synced_at": null,
        "deleted": false,
        "geolocation": {
            "latitude": -1.2921 + rng.gen_range(-0.1..0.1),
            "longitude": 36.8219 + rng.gen_range(-0.1..0.1),
            "accuracy": 8.5,
            "altitude": null,
            "altitude_accuracy": null
        }
    })
}

/// Pre-serialised record bodies, so generating a push costs a few string copies instead of
/// building and serialising JSON trees: on a 2-core box shared with the server, the generator
/// must not be what limits the measured throughput.
pub struct RecordPool {
    /// Each record's JSON minus the opening `{`: `"created_at":...}`.
    tails: Vec<String>,
}

impl RecordPool {
    pub fn new(form_type: &str, data_bytes: usize, variants: usize, rng: &mut impl Rng) -> RecordPool {
        RecordPool::with_fields(form_type, data_bytes, variants, &[], rng)
    }

    /// A pool whose records' `data` also holds `fields` (a `district` that scope rules match).
    pub fn with_fields(
        form_type: &str,
        data_bytes: usize,
        variants: usize,
        fields: &[(String, Value)],
        rng: &mut impl Rng,
    ) -> RecordPool {
        let tails = (0..variants.max(1))
            .map(|_| {
                let mut r = record("", form_type, data_bytes, rng);
                if let Value::Object(m) = &mut r {
                    m.remove("observation_id");
                    if let Some(Value::Object(data)) = m.get_mut("data") {
                        for (k, v) in fields {
                            data.insert(k.clone(), v.clone());
                        }
                    }
                }
                let s = r.to_string();
                s[1..].to_string()
            })
            .collect();
        RecordPool { tails }
    }

    /// A complete synkronus push body (8.7) for the given observation ids.
    pub fn push_body(
        &self,
        transmission_id: &str,
        client_id: &str,
        ids: &[String],
        rng: &mut impl Rng,
    ) -> Vec<u8> {
        let per = self.tails.first().map(|t| t.len()).unwrap_or(0) + 64;
        let mut out = String::with_capacity(ids.len() * per + 128);
        out.push_str("{\"transmission_id\":");
        out.push_str(&Value::from(transmission_id).to_string());
        out.push_str(",\"client_id\":");
        out.push_str(&Value::from(client_id).to_string());
        out.push_str(",\"records\":[");
        for (i, id) in ids.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str("{\"observation_id\":");
            out.push_str(&Value::from(id.as_str()).to_string());
            out.push(',');
            out.push_str(&self.tails[rng.gen_range(0..self.tails.len())]);
        }
        out.push_str("]}");
        out.into_bytes()
    }
}

/// Random bytes: incompressible, so bundle assets and attachments measure real transfer sizes
/// rather than how well the server or ZIP compresses zeros.
pub fn random_bytes(len: usize, rng: &mut impl RngCore) -> Vec<u8> {
    let mut v = vec![0u8; len];
    rng.fill_bytes(&mut v);
    v
}

/// A short random id fragment for run-unique observation ids.
pub fn run_tag() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..10].to_string()
}

/// Observation id in the style Formulus generates.
pub fn observation_id(run: &str, device: u64, seq: u64) -> String {
    format!("obs_{run}_{device}_{seq}")
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn data_size_close_to_target() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for target in [300usize, 1024, 4096] {
            let d = record_data(target, &mut rng);
            let len = serde_json::to_string(&d).unwrap().len();
            assert!(len.abs_diff(target) <= 8, "target {target} got {len}");
            assert!(d["members"].is_i64());
            assert!(d["has_water"].is_boolean());
        }
        // Below the fixed fields' size there is no padding at all.
        let small = record_data(10, &mut rng);
        assert!(small.get("notes").is_none());
    }

    #[test]
    fn record_is_synkronus_dialect() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        let r = record("obs_x_1_2", "household", 1024, &mut rng);
        assert_eq!(r["observation_id"], "obs_x_1_2");
        assert_eq!(r["form_type"], "household");
        assert!(r["data"].is_object());
        assert_eq!(r["deleted"], false);
        assert!(chrono::DateTime::parse_from_rfc3339(r["created_at"].as_str().unwrap()).is_ok());
        // Dialect detection (8.1) must not see spec or camel keys.
        assert!(r.get("id").is_none() && r.get("schema_type").is_none());
    }

    #[test]
    fn pool_bodies_are_valid_pushes() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let pool = RecordPool::new("household", 1024, 4, &mut rng);
        let ids = vec!["obs_a".to_string(), "obs_\"b".to_string()];
        let body = pool.push_body("tx-1", "dev-1", &ids, &mut rng);
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["transmission_id"], "tx-1");
        assert_eq!(v["client_id"], "dev-1");
        let recs = v["records"].as_array().unwrap();
        assert_eq!(recs.len(), 2);
        assert_eq!(recs[1]["observation_id"], "obs_\"b");
        assert_eq!(recs[0]["form_type"], "household");
        let data_len = recs[0]["data"].to_string().len();
        assert!(data_len.abs_diff(1024) <= 8, "{data_len}");
        let empty = pool.push_body("t", "c", &[], &mut rng);
        let v: Value = serde_json::from_slice(&empty).unwrap();
        assert_eq!(v["records"].as_array().unwrap().len(), 0);
    }

    #[test]
    fn pool_fields_land_in_data() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(9);
        let fields = vec![("district".to_string(), Value::from("d007"))];
        let pool = RecordPool::with_fields("household", 300, 2, &fields, &mut rng);
        let body = pool.push_body("t", "c", &["obs_1".to_string()], &mut rng);
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["records"][0]["data"]["district"], "d007");
        assert!(v["records"][0]["data"]["members"].is_i64());
    }

    #[test]
    fn random_bytes_are_random_and_sized() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let a = random_bytes(4096, &mut rng);
        let b = random_bytes(4096, &mut rng);
        assert_eq!(a.len(), 4096);
        assert_ne!(a, b);
        assert_eq!(sha256_hex(b"abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
        assert_eq!(observation_id("r", 3, 9), "obs_r_3_9");
    }
}
