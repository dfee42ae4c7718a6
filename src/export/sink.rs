//! Where an export's bytes go: the response body channel of a streamed export (or a job's file),
//! behind a guard that keeps an aborted ZIP from ending tidily.

use std::io::{self, Write};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit};

use crate::error::ApiResult;

/// Bytes gathered before a chunk goes into the body channel.
pub(super) const CHUNK_BYTES: usize = 64 * 1024;
/// Chunks in flight between the export thread and the response: with `CHUNK_BYTES` this bounds
/// what a slow client can make the server hold.
pub(super) const CHANNEL_CHUNKS: usize = 8;

pub(super) type Chunk = Result<Bytes, io::Error>;

/// The response body of a streamed export. It holds the export's slot: the slot is free again
/// once the body is fully sent or dropped (client gone) and the export thread has ended.
pub struct ExportBody {
    pub(super) rx: mpsc::Receiver<Chunk>,
    pub(super) slot: Option<Arc<OwnedSemaphorePermit>>,
}

impl futures_util::Stream for ExportBody {
    type Item = Chunk;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Chunk>> {
        let next = self.rx.poll_recv(cx);
        if let Poll::Ready(None) = next {
            // Released before the client can see the end of the body (see `Engine::try_stream`).
            self.slot = None;
        }
        next
    }
}

/// A streamed export that has started: `head` resolves once its snapshot is taken (or it failed
/// to start), before any row is read.
pub struct PendingExport {
    /// The snapshot head, and which database the snapshot was taken on.
    pub head: oneshot::Receiver<ApiResult<(i64, crate::db::replicas::Target)>>,
    pub body: ExportBody,
}

/// The export's output. Once `aborted` is set, writes are swallowed: a `ZipWriter` dropped on an
/// error path writes its central directory, and that must never reach the client as a tidy end.
pub(super) struct Sink<W> {
    pub(super) out: W,
    pub(super) aborted: Arc<AtomicBool>,
}

impl<W: Write> Write for Sink<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.aborted.load(Ordering::Relaxed) {
            return Ok(buf.len());
        }
        self.out.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        if self.aborted.load(Ordering::Relaxed) {
            return Ok(());
        }
        self.out.flush()
    }
}

/// Bytes into the response body channel, in chunks of about `CHUNK_BYTES`. Blocks while the
/// channel is full (the client is slower than the export) and fails once the body is gone.
pub(super) struct ChannelWriter {
    tx: mpsc::Sender<Chunk>,
    buf: Vec<u8>,
}

impl ChannelWriter {
    pub(super) fn new(tx: mpsc::Sender<Chunk>) -> Self {
        ChannelWriter { tx, buf: Vec::with_capacity(CHUNK_BYTES) }
    }

    /// Sends what is buffered (the last, short chunk at the end of an export).
    pub(super) fn send(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = Bytes::from(std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK_BYTES)));
        self.tx
            .blocking_send(Ok(chunk))
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "the client went away"))
    }
}

impl Write for ChannelWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.buf.extend_from_slice(buf);
        if self.buf.len() >= CHUNK_BYTES {
            self.send()?;
        }
        Ok(buf.len())
    }

    // Chunks go out when full or at the end; the encoders' intermediate flushes would only
    // make them smaller.
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
