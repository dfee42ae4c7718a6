//! Internal model -> wire, per dialect (docs/api.md §8.7–8.9): push answers and the Observation
//! of the listings. Pull pages are written as their rows arrive, by `page`.

use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::{Dialect, PushResult, StoredRecord, Warning};
use crate::domain::time::WireTime;

/// The Observation (8.7) with the given key style: the synkronus dialect's snake_case, or camel.
/// Borrowed, with raw JSON: serialising it copies the stored text and parses nothing. One
/// definition for both styles, so the two dialects cannot drift apart.
macro_rules! observation_record {
    ($name:ident $(, #[$style:meta])?) => {
        #[derive(Serialize)]
        $(#[$style])?
        struct $name<'a> {
            observation_id: &'a str,
            form_type: &'a str,
            form_version: &'a str,
            data: &'a RawValue,
            created_at: Option<WireTime>,
            updated_at: Option<WireTime>,
            synced_at: WireTime,
            deleted: bool,
            geolocation: Option<&'a RawValue>,
            version: i64,
            author: Option<&'a str>,
            device_id: Option<&'a str>,
            tags: Option<&'a RawValue>,
        }

        impl<'a> $name<'a> {
            fn of(r: &'a StoredRecord) -> Self {
                $name {
                    observation_id: &r.id,
                    form_type: &r.form_type,
                    form_version: &r.form_version,
                    data: &r.data,
                    created_at: r.created_at.map(WireTime),
                    updated_at: r.updated_at.map(WireTime),
                    synced_at: WireTime(r.synced_at),
                    deleted: r.deleted,
                    geolocation: r.geolocation.as_deref(),
                    version: r.change_id,
                    author: r.author.as_deref(),
                    device_id: r.device_id.as_deref(),
                    tags: r.tags.as_deref(),
                }
            }
        }
    };
}

observation_record!(SynkronusRecord);

/// The synkronus Observation as a JSON object, for the non-hot read paths that add fields.
pub fn synkronus_record(r: &StoredRecord) -> Map<String, Value> {
    match serde_json::to_value(SynkronusRecord::of(r)) {
        Ok(Value::Object(m)) => m,
        _ => Map::new(),
    }
}

// The push answers below were written from a `serde_json::Value`, whose map sorts keys: the
// fields of these types are declared in byte order so that serialising them straight gives the
// same bytes. (The tree of the successes of a spec push of 300,000 records weighed some 100 MB.)

#[derive(Serialize)]
struct SynkronusPush<'a> {
    current_version: i64,
    failed_records: Vec<FailedRecord<'a>>,
    repository_generation: i64,
    success_count: usize,
    warnings: Warnings<'a>,
}

/// A record refused alone (docs/api.md §20.4), as the synkronus dialect's `failed_records`
/// lists it; the spec dialect's `failures` add the code and message under their own names.
#[derive(Serialize)]
struct FailedRecord<'a> {
    error: &'a str,
    id: &'a str,
    index: usize,
    message: &'a str,
}

#[derive(Serialize)]
struct SpecFailure<'a> {
    code: &'a str,
    id: &'a str,
    index: usize,
    message: &'a str,
}

#[derive(Serialize)]
struct SpecPush<'a> {
    change_cutoff: i64,
    failures: Vec<SpecFailure<'a>>,
    repository_generation: i64,
    successes: Successes<'a>,
    warnings: Warnings<'a>,
}

/// `{"change_id":…,"id":…}` per record, in request order.
struct Successes<'a>(&'a [(String, i64)]);

impl Serialize for Successes<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct SpecSuccess<'a> {
            change_id: i64,
            id: &'a str,
        }
        serializer.collect_seq(self.0.iter().map(|(id, change_id)| SpecSuccess { change_id: *change_id, id }))
    }
}

#[derive(Serialize)]
struct CamelPush<'a> {
    conflicts: Vec<CamelConflict<'a>>,
    repository_generation: i64,
    timestamp: i64,
    warnings: Vec<SortedWarning<'a>>,
}

/// A conflict as camel clients read it: both versions always present, `null` when unknown.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct CamelConflict<'a> {
    base_version: Option<i64>,
    code: &'a str,
    id: &'a str,
    message: &'a str,
    server_version: Option<i64>,
}

struct Warnings<'a>(&'a [Warning]);

impl Serialize for Warnings<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.0.iter().map(SortedWarning))
    }
}

/// A warning with its keys in byte order, absent fields left out as `Warning` leaves them out.
struct SortedWarning<'a>(&'a Warning);

impl Serialize for SortedWarning<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let w = self.0;
        let mut map = serializer.serialize_map(None)?;
        if let Some(v) = w.base_version {
            map.serialize_entry("base_version", &v)?;
        }
        map.serialize_entry("code", &w.code)?;
        if let Some(errors) = &w.errors {
            map.serialize_entry("errors", errors)?;
        }
        map.serialize_entry("id", &w.id)?;
        map.serialize_entry("message", &w.message)?;
        if let Some(v) = w.server_version {
            map.serialize_entry("server_version", &v)?;
        }
        map.end()
    }
}

/// The push response body in `dialect`: its keys in byte order, the layout clients have always
/// received.
pub fn push_response(dialect: Dialect, result: &PushResult) -> serde_json::Result<Vec<u8>> {
    let head = result.head;
    let repository_generation = result.repository_generation;
    match dialect {
        Dialect::Synkronus => serde_json::to_vec(&SynkronusPush {
            current_version: head,
            failed_records: result
                .refused
                .iter()
                .map(|r| FailedRecord { error: &r.code, id: &r.id, index: r.index, message: &r.message })
                .collect(),
            repository_generation,
            success_count: result.items.len(),
            warnings: Warnings(&result.warnings),
        }),
        Dialect::Spec => serde_json::to_vec(&SpecPush {
            change_cutoff: head,
            failures: result
                .refused
                .iter()
                .map(|r| SpecFailure { code: &r.code, id: &r.id, index: r.index, message: &r.message })
                .collect(),
            repository_generation,
            successes: Successes(&result.items),
            warnings: Warnings(&result.warnings),
        }),
        Dialect::Camel => {
            let (conflicts, mut warnings): (Vec<&Warning>, Vec<&Warning>) =
                result.warnings.iter().partition(|w| w.code == "CONFLICT_OVERWRITTEN");
            // The camel dialect has no per-record failures: a refusal is told as a warning.
            let refusals: Vec<Warning> = result.refused.iter().map(Warning::from_refused).collect();
            warnings.extend(refusals.iter());
            let conflicts = conflicts
                .into_iter()
                .map(|w| CamelConflict {
                    base_version: w.base_version,
                    code: &w.code,
                    id: &w.id,
                    message: &w.message,
                    server_version: w.server_version,
                })
                .collect();
            let warnings = warnings.into_iter().map(SortedWarning).collect();
            serde_json::to_vec(&CamelPush { conflicts, repository_generation, timestamp: head, warnings })
        }
    }
}

/// The whole-page encoder pull pages were written with before they were streamed
/// (`super::page`), kept as the reference its bytes are compared with.
#[cfg(test)]
pub(crate) mod reference {
    use serde::Serialize;
    use serde_json::value::RawValue;

    use super::{SynkronusRecord, WireTime};
    use crate::domain::page_token::{self, TokenKind};
    use crate::domain::sync::{Dialect, PullCursor, StoredRecord};

    observation_record!(CamelRecord, #[serde(rename_all = "camelCase")]);

    /// A pull page, before encoding.
    #[derive(Debug, Clone)]
    pub struct PullPage {
        pub records: Vec<StoredRecord>,
        /// S: the snapshot head.
        pub head: i64,
        pub repository_generation: i64,
        pub has_more: bool,
        pub types: Vec<String>,
    }

    impl PullPage {
        /// The page's last change_id, or S when the page is empty (docs/api.md §8.2 rule 4).
        fn change_cutoff(&self) -> i64 {
            self.records.last().map(|r| r.change_id).unwrap_or(self.head)
        }

        /// Where the next pull resumes: the cutoff while more remain, else S (rule 6).
        fn resume_after(&self) -> i64 {
            if self.has_more {
                self.change_cutoff()
            } else {
                self.head
            }
        }
    }

    #[derive(Serialize)]
    struct SpecRecord<'a> {
        id: &'a str,
        schema_type: &'a str,
        schema_version: &'a str,
        data: &'a RawValue,
        change_id: i64,
        last_modified: WireTime,
        deleted: bool,
    }

    /// The continuation token: resumes after the cutoff while more remain, else after S.
    fn next_page_token(page: &PullPage) -> String {
        page_token::encode(TokenKind::Pull, &PullCursor { a: page.resume_after(), t: page.types.clone() })
    }

    #[derive(Serialize)]
    struct SynkronusPull<'a> {
        current_version: i64,
        records: Vec<SynkronusRecord<'a>>,
        change_cutoff: i64,
        has_more: bool,
        #[serde(skip_serializing_if = "Option::is_none")]
        next_page_token: Option<String>,
        sync_format_version: &'static str,
        repository_generation: i64,
    }

    #[derive(Serialize)]
    struct SpecPull<'a> {
        records: Vec<SpecRecord<'a>>,
        change_cutoff: i64,
        next_page_token: String,
        has_more: bool,
        repository_generation: i64,
    }

    #[derive(Serialize)]
    struct CamelChanges<'a> {
        observations: Vec<CamelRecord<'a>>,
    }

    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct CamelPull<'a> {
        changes: CamelChanges<'a>,
        timestamp: i64,
        has_more: bool,
        change_cutoff: i64,
        #[serde(rename = "repository_generation")]
        repository_generation: i64,
    }

    /// The pull response body in `dialect`, serialised.
    pub fn pull_response(dialect: Dialect, page: &PullPage) -> serde_json::Result<Vec<u8>> {
        let cutoff = page.change_cutoff();
        match dialect {
            Dialect::Synkronus => serde_json::to_vec(&SynkronusPull {
                current_version: page.head,
                records: page.records.iter().map(SynkronusRecord::of).collect(),
                change_cutoff: cutoff,
                has_more: page.has_more,
                next_page_token: page.has_more.then(|| next_page_token(page)),
                sync_format_version: "1.0",
                repository_generation: page.repository_generation,
            }),
            Dialect::Spec => serde_json::to_vec(&SpecPull {
                records: page
                    .records
                    .iter()
                    .map(|r| SpecRecord {
                        id: &r.id,
                        schema_type: &r.form_type,
                        schema_version: &r.form_version,
                        data: &r.data,
                        change_id: r.change_id,
                        last_modified: WireTime(r.synced_at),
                        deleted: r.deleted,
                    })
                    .collect(),
                change_cutoff: cutoff,
                next_page_token: next_page_token(page),
                has_more: page.has_more,
                repository_generation: page.repository_generation,
            }),
            Dialect::Camel => serde_json::to_vec(&CamelPull {
                changes: CamelChanges { observations: page.records.iter().map(CamelRecord::of).collect() },
                timestamp: page.resume_after(),
                has_more: page.has_more,
                change_cutoff: cutoff,
                repository_generation: page.repository_generation,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::{json, Value};

    use super::*;
    use crate::domain::sync::Refused;

    /// The push answers as earlier releases wrote them: through a `Value`, whose map sorts keys.
    fn through_a_value(dialect: Dialect, result: &PushResult) -> Vec<u8> {
        let warnings: Vec<Value> = result.warnings.iter().map(|w| serde_json::to_value(w).unwrap()).collect();
        let value = match dialect {
            Dialect::Synkronus => json!({
                "current_version": result.head, "success_count": result.items.len(),
                "failed_records": result.refused.iter().map(|r| json!({"index": r.index, "id": r.id, "error": r.code,
                    "message": r.message})).collect::<Vec<_>>(),
                "warnings": warnings, "repository_generation": result.repository_generation,
            }),
            Dialect::Spec => json!({
                "successes": result.items.iter().map(|(id, c)| json!({"id": id, "change_id": c})).collect::<Vec<_>>(),
                "failures": result.refused.iter().map(|r| json!({"id": r.id, "code": r.code, "message": r.message,
                    "index": r.index})).collect::<Vec<_>>(),
                "warnings": warnings, "change_cutoff": result.head,
                "repository_generation": result.repository_generation,
            }),
            Dialect::Camel => {
                let (conflicts, mut warnings): (Vec<&Warning>, Vec<&Warning>) =
                    result.warnings.iter().partition(|w| w.code == "CONFLICT_OVERWRITTEN");
                let refusals: Vec<Warning> = result.refused.iter().map(Warning::from_refused).collect();
                warnings.extend(refusals.iter());
                json!({
                    "timestamp": result.head,
                    "conflicts": conflicts.iter().map(|w| json!({"id": w.id, "code": w.code, "message": w.message,
                        "serverVersion": w.server_version, "baseVersion": w.base_version})).collect::<Vec<_>>(),
                    "warnings": warnings, "repository_generation": result.repository_generation,
                })
            }
        };
        serde_json::to_vec(&value).unwrap()
    }

    fn arb_warning() -> impl Strategy<Value = Warning> {
        (
            "[a-z\"é]{0,4}",
            prop::sample::select(vec!["CONFLICT_OVERWRITTEN", "MISSING_FORM_TYPE", "SCHEMA_MISMATCH"]),
            proptest::option::of(any::<i64>()),
            proptest::option::of(any::<i64>()),
            proptest::option::of(crate::testing::json_value()),
        )
            .prop_map(|(id, code, base_version, server_version, errors)| Warning {
                id,
                code: code.to_string(),
                message: format!("{code}: \n\"text\""),
                base_version,
                server_version,
                errors,
            })
    }

    fn arb_result() -> impl Strategy<Value = PushResult> {
        (
            any::<i64>(),
            1i64..4,
            proptest::collection::vec(("[a-z0-9\\\\\"]{1,6}", any::<i64>()), 0..5),
            proptest::collection::vec(arb_warning(), 0..4),
            proptest::collection::vec((0usize..9, "[a-z\"é]{0,4}"), 0..3),
        )
            .prop_map(|(head, repository_generation, items, warnings, refused)| PushResult {
                head,
                repository_generation,
                items,
                warnings,
                refused: refused.into_iter().map(|(index, id)| Refused::out_of_scope(index, &id)).collect(),
            })
    }

    proptest! {
        #![proptest_config(crate::testing::config(256))]

        #[test]
        fn push_answers_are_the_bytes_a_value_wrote(result in arb_result()) {
            for dialect in [Dialect::Synkronus, Dialect::Spec, Dialect::Camel] {
                let written = push_response(dialect, &result).unwrap();
                prop_assert_eq!(String::from_utf8(written).unwrap(), String::from_utf8(through_a_value(dialect, &result)).unwrap());
            }
        }
    }
}
