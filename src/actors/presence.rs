//! The `Presence` actor owns what the server knows about devices (docs/api.md §17.4). Requests report
//! sightings with `try_send` (a full mailbox drops a heartbeat, never blocks a request); the actor
//! folds them in memory and writes dirty devices in one batched upsert per second. Plain
//! sightings are throttled to one write per device per 30 s; sync events (which carry the cursor)
//! are always written.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use actix::prelude::*;
use chrono::{DateTime, Utc};
use deadpool_postgres::Pool;

use crate::clock::Clock;
use crate::db::presence::{self, PresenceUpsert};

const FLUSH_EVERY: Duration = Duration::from_secs(1);
const SIGHTING_THROTTLE: Duration = Duration::from_secs(30);
const MAILBOX: usize = 10_000;

/// A request from a (username, client id) pair.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Seen {
    pub username: String,
    pub client_id: String,
    pub client_version: Option<String>,
    /// Set by pull, push and the bundle manifest: the device's cursor.
    pub data_version: Option<i64>,
    /// Set by the bundle manifest (and sync when known): the bundle version the device was told about.
    pub app_bundle_version: Option<String>,
}

impl Seen {
    fn is_sync_event(&self) -> bool {
        self.data_version.is_some() || self.app_bundle_version.is_some()
    }
}

struct Device {
    last_seen: DateTime<Utc>,
    client_version: Option<String>,
    data_version: Option<i64>,
    app_bundle_version: Option<String>,
    dirty: bool,
    urgent: bool,
    last_written: Option<Instant>,
}

/// The presence tracker's front door.
#[derive(Clone)]
pub struct PresenceHandle(pub(super) Addr<Presence>);

impl PresenceHandle {
    /// Notes a sighting without waiting: when the mailbox is full the sighting is dropped, as
    /// presence is best effort and must never slow a request down.
    pub fn seen(&self, seen: Seen) {
        let _ = self.0.try_send(seen);
    }
}

pub struct Presence {
    pool: Pool,
    /// Stamps sightings: the `/devices` staleness filter compares them with the same clock.
    clock: Clock,
    devices: HashMap<(String, String), Device>,
    flushing: bool,
}

impl Presence {
    pub fn new(pool: Pool, clock: Clock) -> Self {
        Presence { pool, clock, devices: HashMap::new(), flushing: false }
    }

    fn flush(&mut self, ctx: &mut Context<Self>) {
        if self.flushing {
            return;
        }
        let now = Instant::now();
        let mut batch = Vec::new();
        for ((username, client_id), d) in self.devices.iter_mut() {
            let due = d.urgent || d.last_written.is_none_or(|t| now.duration_since(t) >= SIGHTING_THROTTLE);
            if d.dirty && due {
                batch.push(PresenceUpsert {
                    username: username.clone(),
                    client_id: client_id.clone(),
                    last_seen_at: d.last_seen,
                    last_data_version: d.data_version,
                    app_bundle_version: d.app_bundle_version.clone(),
                    client_version: d.client_version.clone(),
                });
                d.dirty = false;
                d.urgent = false;
                d.last_written = Some(now);
            }
        }
        // Forget devices idle for a day: the database keeps them; memory stays bounded.
        self.devices.retain(|_, d| {
            d.dirty || d.last_written.is_none_or(|t| now.duration_since(t) < Duration::from_secs(86_400))
        });
        if batch.is_empty() {
            return;
        }
        self.flushing = true;
        let pool = self.pool.clone();
        let write = async move {
            let result = async {
                let db = pool.get().await?;
                presence::upsert_many(&db, &batch).await
            }
            .await;
            if let Err(e) = result {
                // Presence is advisory: a lost write is repaired by the next sighting.
                tracing::debug!(error = %e, devices = batch.len(), "presence write failed");
            }
        };
        ctx.spawn(actix::fut::wrap_future::<_, Self>(write).map(|_, act, _| act.flushing = false));
    }
}

impl Actor for Presence {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(MAILBOX);
        ctx.run_interval(FLUSH_EVERY, |act, ctx| act.flush(ctx));
    }

    fn stopping(&mut self, ctx: &mut Self::Context) -> Running {
        for d in self.devices.values_mut() {
            d.urgent = true;
        }
        self.flush(ctx);
        Running::Stop
    }
}

impl Handler<Seen> for Presence {
    type Result = ();

    fn handle(&mut self, seen: Seen, _: &mut Self::Context) {
        let urgent = seen.is_sync_event();
        let now = self.clock.now();
        let device = self.devices.entry((seen.username, seen.client_id)).or_insert_with(|| Device {
            last_seen: now,
            client_version: None,
            data_version: None,
            app_bundle_version: None,
            dirty: true,
            urgent: true,
            last_written: None,
        });
        device.last_seen = now;
        device.dirty = true;
        device.urgent |= urgent;
        if seen.client_version.is_some() {
            device.client_version = seen.client_version;
        }
        if seen.data_version.is_some() {
            device.data_version = seen.data_version;
        }
        if seen.app_bundle_version.is_some() {
            device.app_bundle_version = seen.app_bundle_version;
        }
    }
}
