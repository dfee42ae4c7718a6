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

#[derive(Serialize)]
struct SynkronusPush<'a> {
    current_version: i64,
    success_count: usize,
    failed_records: Vec<FailedRecord<'a>>,
    warnings: &'a [Warning],
    repository_generation: i64,
}

/// A record refused alone (docs/api.md §20.4), as the synkronus dialect's `failed_records`
/// lists it; the spec dialect's `failures` add the code and message under their own names.
#[derive(Serialize)]
struct FailedRecord<'a> {
    index: usize,
    id: &'a str,
    error: &'a str,
    message: &'a str,
}

#[derive(Serialize)]
struct SpecFailure<'a> {
    id: &'a str,
    code: &'a str,
    message: &'a str,
    index: usize,
}

#[derive(Serialize)]
struct SpecPush<'a> {
    successes: Vec<SpecSuccess<'a>>,
    failures: Vec<SpecFailure<'a>>,
    warnings: &'a [Warning],
    change_cutoff: i64,
    repository_generation: i64,
}

#[derive(Serialize)]
struct SpecSuccess<'a> {
    id: &'a str,
    change_id: i64,
}

#[derive(Serialize)]
struct CamelPush<'a> {
    timestamp: i64,
    conflicts: Vec<CamelConflict<'a>>,
    warnings: Vec<&'a Warning>,
    repository_generation: i64,
}

/// A conflict as camel clients read it: both versions always present, `null` when unknown.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct CamelConflict<'a> {
    id: &'a str,
    code: &'a str,
    message: &'a str,
    server_version: Option<i64>,
    base_version: Option<i64>,
}

/// The push response body in `dialect`. A JSON value: its keys are written in map order, the
/// layout clients have always received.
pub fn push_response(dialect: Dialect, result: &PushResult) -> Value {
    let head = result.head;
    let repository_generation = result.repository_generation;
    let body = match dialect {
        Dialect::Synkronus => serde_json::to_value(SynkronusPush {
            current_version: head,
            success_count: result.items.len(),
            failed_records: result
                .refused
                .iter()
                .map(|r| FailedRecord { index: r.index, id: &r.id, error: &r.code, message: &r.message })
                .collect(),
            warnings: &result.warnings,
            repository_generation,
        }),
        Dialect::Spec => serde_json::to_value(SpecPush {
            successes: result
                .items
                .iter()
                .map(|(id, change_id)| SpecSuccess { id, change_id: *change_id })
                .collect(),
            failures: result
                .refused
                .iter()
                .map(|r| SpecFailure { id: &r.id, code: &r.code, message: &r.message, index: r.index })
                .collect(),
            warnings: &result.warnings,
            change_cutoff: head,
            repository_generation,
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
                    id: &w.id,
                    code: &w.code,
                    message: &w.message,
                    server_version: w.server_version,
                    base_version: w.base_version,
                })
                .collect();
            serde_json::to_value(CamelPush { timestamp: head, conflicts, warnings, repository_generation })
        }
    };
    // Plain data throughout: serialising it cannot fail.
    body.unwrap_or(Value::Null)
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
