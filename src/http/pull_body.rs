//! A pull page's response body (docs/api.md §8.2). Each record is written as PostgreSQL sends its
//! row, and the page goes out in chunks while later rows are still on their way, so the database,
//! the server and the client work on one page at the same time instead of in turn. A page that
//! fits in one chunk is sent whole, with its length, as before.
//!
//! The page is read by a task of its own, spawned beside the connection's driver (see
//! `db::drivers`), as fast as PostgreSQL sends the rows rather than as fast as the client takes
//! the chunks: a slow client must not hold a database connection (and its snapshot) for the
//! length of its download. What waits for the client is at most the page itself, which is what
//! the whole-page encoder held as well.

use std::future::poll_fn;
use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use deadpool_postgres::Object;
use futures_util::{Stream, StreamExt};
use tokio::sync::{mpsc, oneshot};

use crate::db::records::{self, pulled_record, Head, PageRows};
use crate::db::{DbError, DbResult};
use crate::domain::sync::page::PageWriter;
use crate::domain::sync::PullRequest;
use crate::http::compress::GzipStream;

/// JSON bytes gathered into one chunk (the last record may go a little over). Each chunk is one
/// hand-over to the HTTP worker and one write to the socket, and each write one wake-up of the
/// client: 32 KiB chunks, or sending what was ready whenever rows were late, cost the client
/// (on the same two cores) about twice the CPU of 128 KiB ones (docs/benchmarks-history.md,
/// "Pull pages streamed").
const CHUNK: usize = 128 * 1024;

/// A piece of the body, and whether it is the last one.
type Piece = Result<(Bytes, bool), io::Error>;

/// A page whose first chunk is ready: the head it was read at, and how it is to be sent.
pub struct PageStart {
    pub head: Head,
    /// Whether it was read as a scoped page (`records::ScopedReaders`).
    pub read_scoped: bool,
    pub body: StartedBody,
}

pub enum StartedBody {
    /// The whole page, which fitted in one chunk, and its number of records.
    Whole(Vec<u8>, usize),
    /// A larger page, chunk by chunk (gzipped if asked), the first one ready.
    Streamed(PageBody),
}

/// Starts reading the page `pull` asks for on `db` and waits for its first chunk. A failure until
/// then is returned (and answered as any error); after it, it breaks the streamed body.
/// `span` is the request's, for the log line of such a failure.
pub async fn start(
    db: Object,
    (username, known_scoped): (String, bool),
    pull: PullRequest,
    gzip: bool,
    span: tracing::Span,
) -> DbResult<PageStart> {
    let (started, start) = oneshot::channel();
    crate::db::drivers::spawn_beside(db, move |db| {
        read(db, (username, known_scoped), pull, gzip, span, started)
    });
    start.await.map_err(|_| DbError::other("the page reader stopped before the first chunk"))?
}

/// The page task: the first chunk, then the rest into the body's channel.
async fn read(
    db: Object,
    (username, known_scoped): (String, bool),
    pull: PullRequest,
    gzip: bool,
    span: tracing::Span,
    started: oneshot::Sender<DbResult<PageStart>>,
) {
    let first = async {
        let rows = records::pull_page(
            db,
            (&username, &pull.client_id),
            pull.after,
            &pull.types,
            (pull.limit, known_scoped),
        )
        .await?;
        let Head { change_id: head, repository_generation } = rows.head;
        let writer =
            PageWriter::new(pull.dialect, head, repository_generation, pull.limit, pull.types.clone());
        let mut buf = Vec::with_capacity(CHUNK + CHUNK / 8);
        writer.open(&mut buf);
        let mut page =
            Page { rows, writer: Some(writer), records: 0, buf, gzip: gzip.then(GzipStream::default) };
        poll_fn(|cx| page.fill(cx, CHUNK)).await?;
        Ok::<_, DbError>(page)
    };
    let mut page = match first.await {
        Ok(page) => page,
        Err(e) => return drop(started.send(Err(e))),
    };
    let (head, read_scoped) = (page.rows.head, page.rows.read_scoped);
    if page.writer.is_none() {
        let body = StartedBody::Whole(std::mem::take(&mut page.buf), page.records);
        return drop(started.send(Ok(PageStart { head, read_scoped, body })));
    }
    let chunk = match page.take_chunk(false) {
        Ok(chunk) => chunk,
        Err(e) => return drop(started.send(Err(DbError::other(e)))),
    };
    let (tx, rx) = mpsc::unbounded_channel();
    let _ = tx.send(Ok((chunk, false)));
    let body = StartedBody::Streamed(PageBody { rx, complete: false });
    // Nobody waits for the page any more: another generation (409), a replica behind the cursor.
    if started.send(Ok(PageStart { head, read_scoped, body })).is_err() {
        return;
    }
    page.rest(tx, pull, span).await;
}

/// The page being read.
struct Page {
    rows: PageRows,
    /// `None` once the page is complete.
    writer: Option<PageWriter>,
    records: usize,
    buf: Vec<u8>,
    gzip: Option<GzipStream>,
}

impl Page {
    /// Writes rows until `buf` holds `until` bytes or the page is complete (`Ready`), or until the
    /// next row has not arrived yet (`Pending`).
    fn fill(&mut self, cx: &mut Context<'_>, until: usize) -> Poll<DbResult<()>> {
        while self.buf.len() < until {
            let Some(writer) = self.writer.as_mut() else { break };
            match self.rows.poll_next_unpin(cx) {
                Poll::Ready(Some(row)) => writer.record(&mut self.buf, &pulled_record(&row?)?),
                Poll::Ready(None) => {
                    self.records = writer.records();
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
    async fn rest(mut self, tx: mpsc::UnboundedSender<Piece>, pull: PullRequest, span: tracing::Span) {
        loop {
            let filled = poll_fn(|cx| self.fill(cx, CHUNK)).await;
            let last = self.writer.is_none();
            let chunk = match filled {
                Ok(()) => self.take_chunk(last),
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
                crate::monitoring::records_pulled(pull.dialect, self.records);
                return;
            }
        }
    }

    /// What `buf` holds, as the next chunk of the body (gzipped when asked).
    fn take_chunk(&mut self, last: bool) -> io::Result<Bytes> {
        let Some(gzip) = self.gzip.as_mut() else {
            return Ok(Bytes::from(std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK + CHUNK / 8))));
        };
        let mut packed = gzip.push(&self.buf)?;
        self.buf.clear();
        if !last {
            return Ok(packed);
        }
        if let Some(gzip) = self.gzip.take() {
            let rest = gzip.finish()?;
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
                // The task ended without the page's last piece (its runtime is stopping): the body
                // must not end like a complete one.
                None => Poll::Ready(Some(Err(io::Error::other("the pull page was cut short")))),
            };
        }
    }
}
