//! One simulated field device of the capacity scenario: a timer, not a loop as fast as it can.
//! Every period (jittered) it pushes a batch, then pulls from its own cursor until nothing is
//! left (its team's form type, everything, or under a scope set what its district's user
//! receives); with `--attachment-manifest` it then asks for the attachments it lacks, as
//! Formulus does at every sync; every tenth push it also uploads a photo, and every few minutes
//! it checks the bundle manifest with the ETag of the bundle it has installed.

use super::super::{backoff, check_push, Ctx, PullLoop};
use super::district::{record_key, Check, District, Names, Seen};
use crate::api::{Api, ManifestAnswer, ScopedRecord};
use crate::cli::CapacityArgs;
use crate::payload::{self, RecordPool};
use bytes::Bytes;
use rand::Rng;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// A pull loop that has not caught up after this many pages stops for this cycle: the cursor is
/// kept, so the next cycle continues where it stopped.
const MAX_PAGES_PER_CYCLE: u32 = 20;

/// What a device shares with its team and the fleet.
pub struct Shared {
    pub ctx: Arc<Ctx>,
    pub args: Arc<CapacityArgs>,
    pub stop: Arc<AtomicBool>,
    /// The manifest ETag of the bundle every device has installed.
    pub etag: Option<String>,
    /// The head when the run started: every device is in sync with it when it joins.
    pub head: i64,
    /// With `--photo-variants`, the photos every upload picks from.
    pub photos: Vec<Bytes>,
    /// With `--scoped`: how the run names its records.
    pub names: Option<Names>,
}

/// What a device pushes and pulls.
pub enum Mode {
    /// Pushes its team's form type; pulls `types` (its team's, or none: everything).
    Team { pool: Arc<RecordPool>, types: Vec<String> },
    /// Pushes its district's households and visits as its district's user and pulls with no
    /// `schema_types`, checking what it receives.
    District(Arc<District>),
}

pub struct Device {
    pub id: u64,
    pub api: Arc<Api>,
    pub mode: Mode,
}

impl Device {
    /// Runs until `stop` is set (checked at each wake-up) or the task is aborted.
    pub async fn run(self, s: Arc<Shared>) {
        let a = &s.args;
        let mut rng = s.ctx.rng();
        let client_id = format!("cap-{}-d{}", s.ctx.run, self.id);
        let period = Duration::from_secs(a.period_secs);
        // A scoped device is a fresh install: it syncs from cursor 0 and receives its district's
        // history; a team device starts in sync with the head.
        let first_cursor = if s.names.is_some() { 0 } else { s.head };
        let mut pull = PullLoop::new(first_cursor);
        let mut attachments_since = first_cursor;
        let mut check = Check::new(s.names.as_ref().map_or(0, |n| n.shared_records));
        let mut last_head = 0i64;
        let mut etag = s.etag.clone();
        // Random phases, so a step's new devices arrive spread over one period, photos and
        // manifest checks at their steady rate from the start.
        let start = Instant::now();
        let mut next = start + period.mul_f64(rng.gen_range(0.0..1.0));
        let mut next_manifest = start + Duration::from_secs(a.manifest_secs).mul_f64(rng.gen_range(0.0..1.0));
        let mut pushes: u64 = if a.photo_every > 0 { rng.gen_range(0..a.photo_every) } else { 0 };
        let mut seq = 0u64;
        loop {
            tokio::time::sleep_until(next).await;
            if s.stop.load(Ordering::Relaxed) {
                return;
            }
            let n = rng.gen_range(a.batch_min..=a.batch_max.max(a.batch_min));
            let first = seq + 1;
            seq += n;
            let ids: Vec<String> = (first..=seq)
                .map(|q| match &s.names {
                    Some(names) => names.device_record(self.id, q),
                    None => format!("obs_cap_{}_{}_{q}", s.ctx.run, self.id),
                })
                .collect();
            let acked = self.push(&s, &client_id, &ids, &mut last_head, &mut rng).await;
            match &self.mode {
                Mode::Team { types, .. } => self.pull(&s, &client_id, &mut pull, types).await,
                Mode::District(d) => {
                    if let Some(head) = acked {
                        let keys = (first..=seq).map(|q| record_key(self.id, q)).collect();
                        d.ledger.lock().unwrap_or_else(|p| p.into_inner()).push(head, keys);
                    }
                    self.pull_scoped(&s, d, &client_id, &mut pull, &mut check).await;
                }
            }
            if a.attachment_manifest {
                self.attachment_manifest(&s, &client_id, &mut attachments_since).await;
            }
            pushes += 1;
            if a.photo_every > 0 && pushes.is_multiple_of(a.photo_every) {
                self.photo(&s, &mut rng).await;
            }
            if Instant::now() >= next_manifest {
                self.manifest(&s, &mut etag).await;
                next_manifest += Duration::from_secs(a.manifest_secs);
            }
            let j = a.jitter_pct as f64 / 100.0;
            next += period.mul_f64(if j > 0.0 { rng.gen_range(1.0 - j..=1.0 + j) } else { 1.0 });
            // A device that fell behind (slow answers) does not burst to catch up.
            next = next.max(Instant::now());
        }
    }

    /// The head the push was acknowledged at; `None` when it failed.
    async fn push(
        &self,
        s: &Shared,
        client_id: &str,
        ids: &[String],
        head: &mut i64,
        rng: &mut impl Rng,
    ) -> Option<i64> {
        let tx = uuid::Uuid::new_v4().to_string();
        let pool = match &self.mode {
            Mode::Team { pool, .. } => pool,
            Mode::District(d) => d.pool(rng),
        };
        let body = Bytes::from(pool.push_body(&tx, client_id, ids, rng));
        match self.api.push_raw("push", body).await {
            Ok(res) => {
                check_push(&s.ctx.stats, &res, ids.len(), head);
                s.ctx.stats.add("records_pushed", ids.len() as u64);
                Some(res.current_version)
            }
            Err(f) => {
                backoff(&f).await;
                None
            }
        }
    }

    /// A pull loop with no `schema_types` under the scope set, checking every record against
    /// the device's district and, once complete, the district's ledger (see `district`).
    async fn pull_scoped(
        &self,
        s: &Shared,
        d: &District,
        client_id: &str,
        pull: &mut PullLoop,
        check: &mut Check,
    ) {
        let Some(names) = &s.names else { return };
        let stats = &s.ctx.stats;
        for _ in 0..MAX_PAGES_PER_CYCLE {
            let (records, done) =
                match pull.page_of::<ScopedRecord>(&self.api, "pull", client_id, 500, &[]).await {
                    Ok(page) => page,
                    Err(f) => {
                        backoff(&f).await;
                        return;
                    }
                };
            for r in &records {
                let seen = names.classify(r, &d.name);
                match seen {
                    Seen::Foreign(kind) => stats.violation(
                        kind,
                        format!(
                            "device {} of {} received {} ({})",
                            self.id, d.name, r.observation_id, r.form_type
                        ),
                    ),
                    Seen::Tombstone => stats.violation(
                        "unexpected_tombstone",
                        format!(
                            "device {} of {} received a tombstone of {}",
                            self.id, d.name, r.observation_id
                        ),
                    ),
                    Seen::District(_) => stats.add("district_records_received", 1),
                    Seen::Shared(_) => stats.add("shared_records_received", 1),
                }
                check.receive(&seen);
            }
            if done {
                let missed =
                    check.after_sync(pull.cursor, &d.ledger.lock().unwrap_or_else(|p| p.into_inner()));
                stats.add("complete_syncs_checked", 1);
                if let Some(k) = missed.district.first() {
                    stats.violation(
                        "district_record_missed",
                        format!(
                            "device {} of {}: a sync to {} lacks {} records of the district (first: device {}, seq {})",
                            self.id,
                            d.name,
                            pull.cursor,
                            missed.district.len(),
                            k >> 32,
                            k & 0xffff_ffff
                        ),
                    );
                }
                if !missed.shared.is_empty() {
                    stats.violation(
                        "shared_record_missed",
                        format!(
                            "device {} of {}: first sync lacks shared records {:?}",
                            self.id, d.name, missed.shared
                        ),
                    );
                }
                return;
            }
        }
        stats.add("pull_cycles_cut_short", 1);
    }

    async fn pull(&self, s: &Shared, client_id: &str, pull: &mut PullLoop, types: &[String]) {
        for _ in 0..MAX_PAGES_PER_CYCLE {
            match pull.page(&self.api, "pull", client_id, 500, types).await {
                Ok(p) if p.done => return,
                Ok(_) => {}
                Err(f) => {
                    backoff(&f).await;
                    return;
                }
            }
        }
        s.ctx.stats.add("pull_cycles_cut_short", 1);
    }

    /// The attachment operations since the device's last answer; the answer's version is where
    /// the next one starts.
    async fn attachment_manifest(&self, s: &Shared, client_id: &str, since: &mut i64) {
        match self.api.attachment_manifest(client_id, *since).await {
            Ok(m) => {
                s.ctx.stats.add("attachment_operations_listed", m.operations.len() as u64);
                *since = m.current_version;
            }
            Err(f) => backoff(&f).await,
        }
    }

    async fn photo(&self, s: &Shared, rng: &mut impl Rng) {
        let bytes = if s.photos.is_empty() {
            Bytes::from(payload::random_bytes(s.args.photo_bytes as usize, rng))
        } else {
            s.photos[rng.gen_range(0..s.photos.len())].clone()
        };
        let sha = payload::sha256_hex(&bytes);
        let id = format!("{}.jpg", uuid::Uuid::new_v4());
        match self.api.upload_attachment("upload", &id, bytes).await {
            Ok(r) => {
                s.ctx.stats.add("photo_bytes_uploaded", s.args.photo_bytes);
                if r.sha256.as_deref().is_some_and(|h| h != sha) {
                    s.ctx.stats.violation("upload_sha_mismatch", format!("{id}: server sha differs"));
                }
            }
            Err(f) => backoff(&f).await,
        }
    }

    async fn manifest(&self, s: &Shared, etag: &mut Option<String>) {
        match self.api.manifest("manifest", etag.as_deref()).await {
            Ok(ManifestAnswer::NotModified) => s.ctx.stats.add("manifest_not_modified", 1),
            Ok(ManifestAnswer::Fresh { etag: fresh, .. }) => {
                // Nothing switches bundles during the run: a full answer means the device's
                // ETag did not match, which the report should show.
                s.ctx.stats.add("manifest_full_answers", 1);
                *etag = fresh;
            }
            Err(f) => backoff(&f).await,
        }
    }
}
