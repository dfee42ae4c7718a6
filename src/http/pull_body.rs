//! A pull page's response body (docs/api.md §8.2). Each record is written as PostgreSQL sends its
//! row, and the page goes out in chunks while later rows are still on their way, so the database,
//! the server and the client work on one page at the same time instead of in turn. A page that
//! fits in one chunk is sent whole, with its length, as before.
//!
//! The rows are read on a task of their own, as fast as PostgreSQL sends them, not as fast as the
//! client takes the chunks: a slow client must not hold a database connection (and its snapshot)
//! for the length of its download. What waits for the client is at most the page itself, which is
//! what the whole-page encoder held as well.

use std::future::poll_fn;
use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use tokio::sync::mpsc;

use crate::db::records::{pulled_record, Head, PageRows};
use crate::db::DbResult;
use crate::domain::sync::page::PageWriter;
use crate::domain::sync::{Dialect, PullRequest};
use crate::http::compress::GzipStream;

/// JSON bytes gathered into one chunk: actix writes to the socket once it holds 32 KiB.
const CHUNK: usize = 32 * 1024;
/// While the next rows are on their way, what is ready goes out if there is at least this much.
const EARLY: usize = 8 * 1024;

/// A piece of the body, and whether it is the last one.
type Piece = Result<(Bytes, bool), io::Error>;

/// A page whose first rows have been read: up to a chunk of it, or all of it.
pub struct PageStart {
    rows: PageRows,
    /// `None` once the page is complete.
    writer: Option<PageWriter>,
    dialect: Dialect,
    buf: Vec<u8>,
}

impl PageStart {
    /// Writes the page's opening and its rows until a chunk is full or the page is complete.
    pub async fn read(rows: PageRows, pull: &PullRequest) -> DbResult<PageStart> {
        let Head { change_id: head, repository_generation } = rows.head;
        let writer =
            PageWriter::new(pull.dialect, head, repository_generation, pull.limit, pull.types.clone());
        let mut buf = Vec::with_capacity(CHUNK + CHUNK / 4);
        writer.open(&mut buf);
        let mut page = PageStart { rows, writer: Some(writer), dialect: pull.dialect, buf };
        poll_fn(|cx| page.fill(cx, CHUNK)).await?;
        Ok(page)
    }

    /// The snapshot head and the repository generation the page is read in.
    pub fn head(&self) -> Head {
        self.rows.head
    }

    /// The whole page, when it fitted in the first chunk.
    pub fn take_whole(&mut self) -> Option<Vec<u8>> {
        self.writer.is_none().then(|| std::mem::take(&mut self.buf))
    }

    /// The response body of a page larger than a chunk, gzipped when `gzip`; the rest of the page
    /// is read on a task of this worker. `span` is the request's, for the log line of a failure.
    pub fn into_body(self, gzip: bool, span: tracing::Span) -> PageBody {
        let (tx, rx) = mpsc::unbounded_channel();
        actix_web::rt::spawn(self.produce(gzip.then(GzipStream::default), tx, span));
        PageBody { rx, complete: false }
    }

    /// Writes rows until `buf` holds `until` bytes or the page is complete (`Ready`), or until the
    /// next row has not arrived yet (`Pending`).
    fn fill(&mut self, cx: &mut Context<'_>, until: usize) -> Poll<DbResult<()>> {
        while self.buf.len() < until {
            let Some(writer) = self.writer.as_mut() else { break };
            match self.rows.poll_next_unpin(cx) {
                Poll::Ready(Some(row)) => writer.record(&mut self.buf, &pulled_record(&row?)?),
                Poll::Ready(None) => {
                    crate::monitoring::records_pulled(self.dialect, writer.records());
                    if let Some(writer) = self.writer.take() {
                        writer.close(&mut self.buf);
                    }
                }
                Poll::Pending => return Poll::Pending,
            }
        }
        Poll::Ready(Ok(()))
    }

    /// Reads the rest of the page into chunks, sent to the body as they fill up; a failure ends
    /// the body with an error, which makes actix drop the connection.
    async fn produce(
        mut self,
        mut gzip: Option<GzipStream>,
        tx: mpsc::UnboundedSender<Piece>,
        span: tracing::Span,
    ) {
        loop {
            let filled = poll_fn(|cx| match self.fill(cx, CHUNK) {
                Poll::Pending if self.buf.len() >= EARLY => Poll::Ready(Ok(())),
                other => other,
            })
            .await;
            let last = self.writer.is_none();
            let chunk = match filled {
                Ok(()) => self.take_chunk(&mut gzip, last),
                Err(e) => Err(io::Error::other(e)),
            };
            match chunk {
                Ok(chunk) if chunk.is_empty() && !last => {}
                Ok(chunk) => {
                    if tx.send(Ok((chunk, last))).is_err() {
                        return; // the client is gone
                    }
                }
                Err(e) => {
                    // The status line is out: the only honest end is a broken body, which the
                    // client cannot mistake for a complete page, and retries.
                    span.in_scope(
                        || tracing::error!(error = %e, "pull page failed after its first bytes were sent"),
                    );
                    let _ = tx.send(Err(e));
                    return;
                }
            }
            if last {
                return;
            }
        }
    }

    /// What `buf` holds, as the next chunk of the body (gzipped when `gzip` is set).
    fn take_chunk(&mut self, gzip: &mut Option<GzipStream>, last: bool) -> io::Result<Bytes> {
        let Some(stream) = gzip else {
            return Ok(Bytes::from(std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK + CHUNK / 4))));
        };
        let mut packed = stream.push(&self.buf)?;
        self.buf.clear();
        if !last {
            return Ok(packed);
        }
        if let Some(stream) = gzip.take() {
            let rest = stream.finish()?;
            packed = if packed.is_empty() { rest } else { [packed, rest].concat().into() };
        }
        Ok(packed)
    }
}

/// The chunks of a page larger than one, as the task reading it makes them.
pub struct PageBody {
    rx: mpsc::UnboundedReceiver<Piece>,
    complete: bool,
}

impl Stream for PageBody {
    type Item = Result<Bytes, io::Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            return match ready!(self.rx.poll_recv(cx)) {
                Some(Ok((chunk, last))) => {
                    self.complete = last;
                    if chunk.is_empty() {
                        continue;
                    }
                    Poll::Ready(Some(Ok(chunk)))
                }
                Some(Err(e)) => Poll::Ready(Some(Err(e))),
                None if self.complete => Poll::Ready(None),
                // The task ended without the page's last piece (the worker is stopping): the body
                // must not end like a complete one.
                None => Poll::Ready(Some(Err(io::Error::other("the pull page was cut short")))),
            };
        }
    }
}
