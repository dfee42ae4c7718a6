//! The memory budget for request bodies (docs/api.md §18.4): the JSON bodies being read and
//! decoded and the pushes waiting for the change log together hold at most
//! `MAX_INFLIGHT_BODY_BYTES`, counted by body size. Without it, a few dozen concurrent
//! maximum-size pushes exhaust the machine's memory; with it, the excess waits briefly, then gets
//! a 503 the client retries.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use memmap2::MmapMut;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::{ApiError, ApiResult, ErrorCode};

/// Permits count KiB: one acquisition asks for a u32 of them, which covers any budget.
const UNIT: usize = 1024;
/// How long a request waits for room before it is refused.
const WAIT: Duration = Duration::from_secs(5);
/// A body of unknown length reserves at least this much at a time as it grows, so that a
/// chunked body does not touch the semaphore for every chunk.
const MIN_GROWTH: usize = 256 * UNIT;

/// The process-wide budget, shared by every worker.
#[derive(Clone)]
pub struct BodyBudget {
    room: Arc<Semaphore>,
    /// The whole budget, in units: no reservation asks for more, so a body between the budget and
    /// `MAX_JSON_BODY_BYTES` waits for an idle server instead of waiting forever.
    units: u32,
    wait: Duration,
}

/// Room held for one body, given back when dropped.
pub struct BodyPermit {
    budget: BodyBudget,
    held: Option<OwnedSemaphorePermit>,
}

impl BodyBudget {
    pub fn new(bytes: usize) -> Self {
        Self::with_wait(bytes, WAIT)
    }

    fn with_wait(bytes: usize, wait: Duration) -> Self {
        let units = u32::try_from(bytes.div_ceil(UNIT).max(1)).unwrap_or(u32::MAX);
        BodyBudget { room: Arc::new(Semaphore::new(units as usize)), units, wait }
    }

    /// Room for a body of `bytes` (its Content-Length), or a permit holding nothing yet for a body
    /// of unknown length, to be grown with [`BodyPermit::cover`] as it arrives.
    pub async fn reserve(&self, bytes: usize) -> ApiResult<BodyPermit> {
        let mut permit = BodyPermit { budget: self.clone(), held: None };
        permit.cover(bytes).await?;
        Ok(permit)
    }

    /// What requests hold now, in bytes (the `/metrics` gauge).
    pub fn in_use_bytes(&self) -> usize {
        (self.units as usize).saturating_sub(self.room.available_permits()) * UNIT
    }

    fn units_for(&self, bytes: usize) -> u32 {
        u32::try_from(bytes.div_ceil(UNIT)).unwrap_or(u32::MAX).min(self.units)
    }
}

impl BodyPermit {
    /// The bytes this permit holds room for.
    pub fn bytes(&self) -> usize {
        self.held.as_ref().map_or(0, |p| p.num_permits() * UNIT)
    }

    /// Grows the reservation to cover `bytes` in all (never beyond the whole budget), waiting for
    /// room up to the budget's wait; then 503 with `Retry-After: 1`.
    pub async fn cover(&mut self, bytes: usize) -> ApiResult<()> {
        let held = self.held.as_ref().map_or(0, |p| p.num_permits() as u32);
        let wanted = self.budget.units_for(bytes);
        if wanted <= held {
            return Ok(());
        }
        let more = self.budget.room.clone().acquire_many_owned(wanted - held);
        let permit = match tokio::time::timeout(self.budget.wait, more).await {
            Ok(Ok(permit)) => permit,
            // The semaphore is never closed; a closed one is as good as a full one.
            Ok(Err(_)) | Err(_) => return Err(no_room()),
        };
        match &mut self.held {
            Some(held) => held.merge(permit),
            None => self.held = Some(permit),
        }
        Ok(())
    }

    /// Grows the reservation of a body of unknown length that has reached `received` bytes: by
    /// doubling, so that a body growing to n bytes asks O(log n) times, never beyond `limit`.
    pub async fn cover_growing(&mut self, received: usize, limit: usize) -> ApiResult<()> {
        if received <= self.bytes() {
            return Ok(());
        }
        let target = received.max(self.bytes() * 2).max(MIN_GROWTH).min(limit.max(received));
        self.cover(target).await
    }
}

/// Bodies declared at least this long are read into memory mapped for them alone.
const OWN_MAPPING: usize = 1 << 20;

/// Where a body's bytes are gathered as they arrive. A big body lives in an anonymous mapping of
/// its own, unmapped as soon as the last reference to it is dropped: from the allocator, a 23 MB
/// push body stayed resident for the allocator's purge delay (a second or two) after it was
/// decoded, while the commit's own memory grew, and counted twice in the peak (docs/api.md §18.4).
pub enum BodyBuffer {
    Heap(BytesMut),
    Mapped(MappedBody),
}

/// A body read into a mapping of its declared length; `len` bytes of it received.
pub struct MappedBody {
    map: MmapMut,
    len: usize,
}

impl AsRef<[u8]> for MappedBody {
    fn as_ref(&self) -> &[u8] {
        &self.map[..self.len]
    }
}

impl BodyBuffer {
    /// Room for a body of `declared` bytes (0 when unknown).
    pub fn with_capacity(declared: usize) -> Self {
        if declared >= OWN_MAPPING {
            // A mapping that cannot be made (address space exhausted) leaves the allocator to try.
            if let Ok(map) = MmapMut::map_anon(declared) {
                return BodyBuffer::Mapped(MappedBody { map, len: 0 });
            }
        }
        BodyBuffer::Heap(BytesMut::with_capacity(declared))
    }

    /// The bytes received so far.
    pub fn received(&self) -> usize {
        match self {
            BodyBuffer::Heap(bytes) => bytes.len(),
            BodyBuffer::Mapped(mapped) => mapped.len,
        }
    }

    pub fn extend_from_slice(&mut self, chunk: &[u8]) {
        match self {
            BodyBuffer::Heap(bytes) => bytes.extend_from_slice(chunk),
            BodyBuffer::Mapped(mapped) => match mapped.map.get_mut(mapped.len..mapped.len + chunk.len()) {
                Some(room) => {
                    room.copy_from_slice(chunk);
                    mapped.len += chunk.len();
                }
                // More than the declared length (which the HTTP layer does not let through): the
                // body moves to the heap and goes on growing there.
                None => {
                    let mut bytes = BytesMut::with_capacity(mapped.len + chunk.len());
                    bytes.extend_from_slice(mapped.as_ref());
                    bytes.extend_from_slice(chunk);
                    *self = BodyBuffer::Heap(bytes);
                }
            },
        }
    }

    pub fn freeze(self) -> Bytes {
        match self {
            BodyBuffer::Heap(bytes) => bytes.freeze(),
            BodyBuffer::Mapped(mapped) => Bytes::from_owner(mapped),
        }
    }
}

/// The answer when the budget stays full for the whole wait: nothing was read or stored, and the
/// same request sent again a moment later is expected to succeed.
fn no_room() -> ApiError {
    crate::monitoring::body_budget_refused();
    ApiError::new(
        ErrorCode::ServiceUnavailable,
        "The server is busy with other large requests; retry shortly",
    )
    .with_header(actix_web::http::header::RETRY_AFTER, "1")
    .caused_by("MAX_INFLIGHT_BODY_BYTES is in use by other requests")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn reservations_wait_for_room_then_give_up() {
        let budget = BodyBudget::with_wait(10 * UNIT, Duration::from_millis(50));
        let first = budget.reserve(6 * UNIT).await.unwrap();
        assert_eq!(first.bytes(), 6 * UNIT);
        let err = budget.reserve(6 * UNIT).await.err().unwrap();
        assert_eq!(err.code, ErrorCode::ServiceUnavailable);
        drop(first);
        assert_eq!(budget.in_use_bytes(), 0);
        assert!(budget.reserve(6 * UNIT).await.is_ok());
    }

    #[tokio::test]
    async fn a_body_larger_than_the_budget_takes_all_of_it() {
        let budget = BodyBudget::with_wait(10 * UNIT, Duration::from_millis(50));
        let all = budget.reserve(1 << 30).await.unwrap();
        assert_eq!(all.bytes(), 10 * UNIT);
        assert_eq!(budget.in_use_bytes(), 10 * UNIT);
    }

    #[test]
    fn a_big_body_is_mapped_and_reads_back_as_sent() {
        let sent: Vec<u8> = (0..OWN_MAPPING + 10).map(|i| (i % 251) as u8).collect();
        let mut body = BodyBuffer::with_capacity(sent.len() - 5);
        assert!(matches!(body, BodyBuffer::Mapped(_)));
        for chunk in sent.chunks(4096) {
            body.extend_from_slice(chunk);
        }
        assert_eq!(body.received(), sent.len());
        assert!(matches!(body, BodyBuffer::Heap(_)), "beyond its declared length it moves to the heap");
        assert_eq!(body.freeze(), sent);
        let mut body = BodyBuffer::with_capacity(OWN_MAPPING);
        body.extend_from_slice(b"{}");
        assert_eq!(body.freeze(), &b"{}"[..]);
        let mut small = BodyBuffer::with_capacity(10);
        small.extend_from_slice(b"{}");
        assert!(matches!(small, BodyBuffer::Heap(_)));
    }

    #[tokio::test]
    async fn growing_bodies_double_within_their_limit() {
        let budget = BodyBudget::with_wait(4096 * UNIT, Duration::from_millis(50));
        let mut permit = budget.reserve(0).await.unwrap();
        assert_eq!(permit.bytes(), 0);
        permit.cover_growing(10, 1 << 30).await.unwrap();
        assert_eq!(permit.bytes(), MIN_GROWTH);
        permit.cover_growing(MIN_GROWTH + 1, 1 << 30).await.unwrap();
        assert_eq!(permit.bytes(), 2 * MIN_GROWTH);
        permit.cover_growing(2 * MIN_GROWTH + 1, 2 * MIN_GROWTH + 10).await.unwrap();
        assert_eq!(permit.bytes(), 2 * MIN_GROWTH + UNIT);
        drop(permit);
        assert_eq!(budget.in_use_bytes(), 0);
    }
}
