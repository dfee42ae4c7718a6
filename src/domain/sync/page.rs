//! A pull page written record by record as the rows arrive (docs/api.md §8.2, §8.7–8.9), so the
//! database, the server and the client work on one page at the same time.
//!
//! Every dialect puts what is known only at the end of the page (`change_cutoff`, `has_more`,
//! `next_page_token`, `timestamp`) after the record list, and the head (`current_version`) comes
//! with the first row: the bytes are those the serde structs of `encode` wrote for a whole page,
//! key for key (the tests compare the two on arbitrary pages).

use super::{Dialect, PullCursor};
use crate::domain::page_token::{self, TokenKind};
use crate::domain::time::UnixMicros;

/// One record of a pull page as its row holds it, borrowed: the JSON columns are the stored text.
#[derive(Debug, Clone, Copy)]
pub struct PulledRecord<'a> {
    pub id: &'a str,
    pub form_type: &'a str,
    pub form_version: &'a str,
    /// Written as stored, not parsed again: the server parsed and re-serialised every `data` it
    /// stored (a push decodes each record; the Go import reads PostgreSQL's `jsonb`; a restore
    /// brings back what the server wrote), and PostgreSQL's `json` type checked `geolocation`
    /// and `tags` on the way in. Re-validating 1 KB of JSON per record on every read cost more
    /// than the rest of the record's encoding and only guarded against hand-edited rows.
    pub data: &'a str,
    pub deleted: bool,
    pub created_at: Option<UnixMicros>,
    pub updated_at: Option<UnixMicros>,
    pub synced_at: UnixMicros,
    pub geolocation: Option<&'a str>,
    pub author: Option<&'a str>,
    pub device_id: Option<&'a str>,
    pub tags: Option<&'a str>,
    pub change_id: i64,
}

/// The keys of the Observation (8.7): the synkronus dialect's snake_case, or camel. Each one
/// carries the separator and quotes around it.
struct ObservationKeys {
    id: &'static [u8],
    form_type: &'static [u8],
    form_version: &'static [u8],
    created_at: &'static [u8],
    updated_at: &'static [u8],
    synced_at: &'static [u8],
    device_id: &'static [u8],
}

const SNAKE: ObservationKeys = ObservationKeys {
    id: b"{\"observation_id\":",
    form_type: b",\"form_type\":",
    form_version: b",\"form_version\":",
    created_at: b",\"created_at\":",
    updated_at: b",\"updated_at\":",
    synced_at: b",\"synced_at\":",
    device_id: b",\"device_id\":",
};

const CAMEL: ObservationKeys = ObservationKeys {
    id: b"{\"observationId\":",
    form_type: b",\"formType\":",
    form_version: b",\"formVersion\":",
    created_at: b",\"createdAt\":",
    updated_at: b",\"updatedAt\":",
    synced_at: b",\"syncedAt\":",
    device_id: b",\"deviceId\":",
};

/// Writes one pull page into byte buffers as its records arrive: [`PageWriter::open`] once, then
/// [`PageWriter::record`] per row, then [`PageWriter::close`].
#[derive(Debug)]
pub struct PageWriter {
    dialect: Dialect,
    /// S, the snapshot head.
    head: i64,
    repository_generation: i64,
    limit: usize,
    types: Vec<String>,
    written: usize,
    last_change_id: Option<i64>,
    has_more: bool,
}

impl PageWriter {
    /// A page of at most `limit` records read in the snapshot whose head is `head`; `types` is the
    /// filter the continuation token carries.
    pub fn new(
        dialect: Dialect,
        head: i64,
        repository_generation: i64,
        limit: i64,
        types: Vec<String>,
    ) -> Self {
        PageWriter {
            dialect,
            head,
            repository_generation,
            limit: usize::try_from(limit).unwrap_or(0),
            types,
            written: 0,
            last_change_id: None,
            has_more: false,
        }
    }

    /// Records written so far.
    pub fn records(&self) -> usize {
        self.written
    }

    /// Everything before the first record.
    pub fn open(&self, out: &mut Vec<u8>) {
        match self.dialect {
            Dialect::Synkronus => {
                out.extend_from_slice(b"{\"current_version\":");
                put_i64(out, self.head);
                out.extend_from_slice(b",\"records\":[");
            }
            Dialect::Spec => out.extend_from_slice(b"{\"records\":["),
            Dialect::Camel => out.extend_from_slice(b"{\"changes\":{\"observations\":["),
        }
    }

    /// Writes `r`, unless the page already holds `limit` records: the row read past the limit only
    /// tells that more remain (§8.2 rule 3), and is never sent.
    pub fn record(&mut self, out: &mut Vec<u8>, r: &PulledRecord) {
        if self.written >= self.limit {
            self.has_more = true;
            return;
        }
        if self.written > 0 {
            out.push(b',');
        }
        match self.dialect {
            Dialect::Synkronus => observation(out, &SNAKE, r),
            Dialect::Camel => observation(out, &CAMEL, r),
            Dialect::Spec => spec_record(out, r),
        }
        self.written += 1;
        self.last_change_id = Some(r.change_id);
    }

    /// Everything after the last record; the page is complete.
    pub fn close(self, out: &mut Vec<u8>) {
        // §8.2 rules 4 and 5: the last record's change_id, or S for an empty page; the next page
        // resumes after the cutoff while more remain, else after S.
        let cutoff = self.last_change_id.unwrap_or(self.head);
        let resume_after = if self.has_more { cutoff } else { self.head };
        let token =
            || page_token::encode(TokenKind::Pull, &PullCursor { a: resume_after, t: self.types.clone() });
        match self.dialect {
            Dialect::Synkronus => {
                out.extend_from_slice(b"],\"change_cutoff\":");
                put_i64(out, cutoff);
                out.extend_from_slice(b",\"has_more\":");
                put_bool(out, self.has_more);
                if self.has_more {
                    out.extend_from_slice(b",\"next_page_token\":");
                    put_str(out, &token());
                }
                out.extend_from_slice(b",\"sync_format_version\":\"1.0\",\"repository_generation\":");
            }
            Dialect::Spec => {
                out.extend_from_slice(b"],\"change_cutoff\":");
                put_i64(out, cutoff);
                out.extend_from_slice(b",\"next_page_token\":");
                put_str(out, &token());
                out.extend_from_slice(b",\"has_more\":");
                put_bool(out, self.has_more);
                out.extend_from_slice(b",\"repository_generation\":");
            }
            Dialect::Camel => {
                out.extend_from_slice(b"]},\"timestamp\":");
                put_i64(out, resume_after);
                out.extend_from_slice(b",\"hasMore\":");
                put_bool(out, self.has_more);
                out.extend_from_slice(b",\"changeCutoff\":");
                put_i64(out, cutoff);
                out.extend_from_slice(b",\"repository_generation\":");
            }
        }
        put_i64(out, self.repository_generation);
        out.push(b'}');
    }
}

/// The Observation of the synkronus and camel dialects, fields in the order of §8.7.
fn observation(out: &mut Vec<u8>, keys: &ObservationKeys, r: &PulledRecord) {
    out.extend_from_slice(keys.id);
    put_str(out, r.id);
    out.extend_from_slice(keys.form_type);
    put_str(out, r.form_type);
    out.extend_from_slice(keys.form_version);
    put_str(out, r.form_version);
    out.extend_from_slice(b",\"data\":");
    put_json(out, Some(r.data));
    out.extend_from_slice(keys.created_at);
    put_time(out, r.created_at);
    out.extend_from_slice(keys.updated_at);
    put_time(out, r.updated_at);
    out.extend_from_slice(keys.synced_at);
    put_time(out, Some(r.synced_at));
    out.extend_from_slice(b",\"deleted\":");
    put_bool(out, r.deleted);
    out.extend_from_slice(b",\"geolocation\":");
    put_json(out, r.geolocation);
    out.extend_from_slice(b",\"version\":");
    put_i64(out, r.change_id);
    out.extend_from_slice(b",\"author\":");
    put_opt_str(out, r.author);
    out.extend_from_slice(keys.device_id);
    put_opt_str(out, r.device_id);
    out.extend_from_slice(b",\"tags\":");
    put_json(out, r.tags);
    out.push(b'}');
}

/// The spec dialect's record (§8.8).
fn spec_record(out: &mut Vec<u8>, r: &PulledRecord) {
    out.extend_from_slice(b"{\"id\":");
    put_str(out, r.id);
    out.extend_from_slice(b",\"schema_type\":");
    put_str(out, r.form_type);
    out.extend_from_slice(b",\"schema_version\":");
    put_str(out, r.form_version);
    out.extend_from_slice(b",\"data\":");
    put_json(out, Some(r.data));
    out.extend_from_slice(b",\"change_id\":");
    put_i64(out, r.change_id);
    out.extend_from_slice(b",\"last_modified\":");
    put_time(out, Some(r.synced_at));
    out.extend_from_slice(b",\"deleted\":");
    put_bool(out, r.deleted);
    out.push(b'}');
}

/// A JSON string, escaped by serde_json itself, as the whole-page encoder did.
fn put_str(out: &mut Vec<u8>, s: &str) {
    // Into a Vec, serialising a string cannot fail.
    let _ = serde_json::to_writer(&mut *out, s);
}

fn put_opt_str(out: &mut Vec<u8>, s: Option<&str>) {
    match s {
        Some(s) => put_str(out, s),
        None => out.extend_from_slice(b"null"),
    }
}

fn put_i64(out: &mut Vec<u8>, n: i64) {
    // Into a Vec, serialising an integer cannot fail.
    let _ = serde_json::to_writer(&mut *out, &n);
}

fn put_bool(out: &mut Vec<u8>, b: bool) {
    out.extend_from_slice(if b { b"true" } else { b"false" });
}

fn put_time(out: &mut Vec<u8>, t: Option<UnixMicros>) {
    match t {
        Some(t) => t.write_json(out),
        None => out.extend_from_slice(b"null"),
    }
}

/// Stored JSON text as is (see [`PulledRecord::data`]), without the whitespace around it that
/// a parsed value would not have kept.
fn put_json(out: &mut Vec<u8>, text: Option<&str>) {
    match text {
        Some(text) => out.extend_from_slice(text.trim_matches([' ', '\t', '\n', '\r']).as_bytes()),
        None => out.extend_from_slice(b"null"),
    }
}

#[cfg(test)]
#[path = "page/tests.rs"]
mod tests;
