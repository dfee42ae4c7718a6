//! The database side of one export: a task on the export runtime that holds the export's
//! connection and snapshot, and answers its encoding thread.
//!
//! Why a task, and not the encoding thread's own `block_on` or a helper thread: tokio-postgres
//! hands a query's messages from the connection's task to the caller through a one-slot channel,
//! one socket read (a few rows) at a time. With the caller on another thread every few rows cost
//! two wake-ups across threads, and that hand-off was the largest share of an export's CPU (the
//! runtime's worker and the fetching thread took turns sleeping and waking each other). The
//! runtime has a single worker, and the connection's own task runs there too, so on it the
//! hand-off is a queue push; only whole batches of decoded rows cross to the encoding thread.

use chrono::{DateTime, Utc};
use deadpool_postgres::Object;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_postgres::IsolationLevel;
use tracing::Instrument;

use super::engine::{Engine, RunError};
use crate::db::export as sql;
use crate::domain::export::{ExportFilter, ExportRow};

/// Rows fetched per round trip (from a portal, or a keyset page), and so per batch.
const FETCH_ROWS: i32 = 1000;

type Batch<T> = Result<Vec<T>, tokio_postgres::Error>;

/// What the encoding thread asks of its reader, answered inside the snapshot.
enum Request {
    FormTypes(oneshot::Sender<Result<Vec<String>, tokio_postgres::Error>>),
    Count(oneshot::Sender<Result<i64, tokio_postgres::Error>>),
    /// The `data` texts of one form type's rows (the inference pass).
    Data(String, mpsc::Sender<Batch<String>>),
    /// The rows, of one form type or of all.
    Rows(Option<String>, mpsc::Sender<Batch<ExportRow>>),
}

/// The encoding thread's handle on its reader task.
pub(super) struct Reader<'e> {
    engine: &'e Engine,
    snapshot: Snapshot,
    requests: Option<mpsc::Sender<Request>>,
    task: Option<JoinHandle<()>>,
}

/// Where a snapshot starts: its head and the database's time.
pub(super) struct Snapshot {
    pub(super) head: i64,
    pub(super) taken_at: DateTime<Utc>,
}

impl<'e> Reader<'e> {
    /// Hands `client` to a new reader task, which opens the export's snapshot on it. The
    /// connection goes back to the pool when the reader is closed, or is dropped if a statement
    /// failed (it may be dead).
    pub(super) fn start(
        engine: &'e Engine,
        client: Object,
        filter: &ExportFilter,
    ) -> Result<Reader<'e>, RunError> {
        let (requests, inbox) = mpsc::channel(1);
        let (started_tx, started) = oneshot::channel();
        // The reader's queries are children of the export's span, current on this thread.
        let span = tracing::debug_span!("db.export.reader");
        let task = engine.runtime().spawn(serve(client, filter.clone(), started_tx, inbox).instrument(span));
        match started.blocking_recv() {
            Ok(Ok(snapshot)) => Ok(Reader { engine, snapshot, requests: Some(requests), task: Some(task) }),
            Ok(Err(e)) => Err(e.into()),
            Err(_) => Err(RunError::ReaderGone),
        }
    }

    pub(super) fn snapshot(&self) -> &Snapshot {
        &self.snapshot
    }

    pub(super) fn form_types(&self) -> Result<Vec<String>, RunError> {
        let (tx, rx) = oneshot::channel();
        self.ask(Request::FormTypes(tx))?;
        Ok(rx.blocking_recv().map_err(|_| RunError::ReaderGone)??)
    }

    pub(super) fn count(&self) -> Result<i64, RunError> {
        let (tx, rx) = oneshot::channel();
        self.ask(Request::Count(tx))?;
        Ok(rx.blocking_recv().map_err(|_| RunError::ReaderGone)??)
    }

    /// Hands each batch of `form_type`'s `data` texts to `consume`, in change order.
    pub(super) fn data(
        &self,
        form_type: &str,
        consume: impl FnMut(Vec<String>) -> Result<(), RunError>,
    ) -> Result<(), RunError> {
        let (tx, rx) = mpsc::channel(1);
        self.ask(Request::Data(form_type.to_owned(), tx))?;
        receive(rx, consume)
    }

    /// Hands each batch of rows (of `form_type`, or all) to `consume`, in change order.
    pub(super) fn rows(
        &self,
        form_type: Option<&str>,
        consume: impl FnMut(Vec<ExportRow>) -> Result<(), RunError>,
    ) -> Result<(), RunError> {
        let (tx, rx) = mpsc::channel(1);
        self.ask(Request::Rows(form_type.map(str::to_owned), tx))?;
        receive(rx, consume)
    }

    fn ask(&self, request: Request) -> Result<(), RunError> {
        let requests = self.requests.as_ref().ok_or(RunError::ReaderGone)?;
        requests.blocking_send(request).map_err(|_| RunError::ReaderGone)
    }

    /// Ends the snapshot and waits until the connection is back in the pool (or dropped), so a
    /// client that has seen the end of an export finds the connection free for its next one.
    pub(super) fn close(mut self) {
        self.requests = None;
        if let Some(task) = self.task.take() {
            let _ = self.engine.block(task);
        }
    }
}

impl Drop for Reader<'_> {
    fn drop(&mut self) {
        // An unclosed reader's task ends on its own once `requests` is gone.
        self.requests = None;
    }
}

/// Reads a pass's batches until the short one that ends it. Between the batch being consumed
/// and the one in the channel, the reader already fetches the next: at most three exist.
fn receive<T>(
    mut rx: mpsc::Receiver<Batch<T>>,
    mut consume: impl FnMut(Vec<T>) -> Result<(), RunError>,
) -> Result<(), RunError> {
    loop {
        // A closed channel before the short batch means the task is gone: never a clean end.
        let batch = rx.blocking_recv().ok_or(RunError::ReaderGone)??;
        let last = batch.len() < FETCH_ROWS as usize;
        consume(batch)?;
        if last {
            return Ok(());
        }
    }
}

/// The reader task: the snapshot, then one request at a time until the encoding thread is done.
async fn serve(
    mut client: Object,
    filter: ExportFilter,
    started: oneshot::Sender<Result<Snapshot, tokio_postgres::Error>>,
    mut inbox: mpsc::Receiver<Request>,
) {
    if !answer_in_snapshot(&mut client, &filter, started, &mut inbox).await {
        // Possibly a dead connection: never hand it to the next export.
        drop(Object::take(client));
    }
}

/// Opens the snapshot on `client` and answers requests in it until the encoding thread is done;
/// false once a statement has failed. Without a commit the read-only transaction rolls back as it
/// drops.
async fn answer_in_snapshot(
    client: &mut Object,
    filter: &ExportFilter,
    started: oneshot::Sender<Result<Snapshot, tokio_postgres::Error>>,
    inbox: &mut mpsc::Receiver<Request>,
) -> bool {
    let opened = async {
        let tx = client
            .build_transaction()
            .isolation_level(IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .await?;
        let (head, taken_at) = sql::snapshot_head(&tx, filter).await?;
        Ok::<_, tokio_postgres::Error>((tx, head, taken_at))
    }
    .await;
    let (tx, head) = match opened {
        Ok((tx, head, taken_at)) => {
            let _ = started.send(Ok(Snapshot { head, taken_at }));
            (tx, head)
        }
        Err(e) => {
            let _ = started.send(Err(e));
            return false;
        }
    };
    while let Some(request) = inbox.recv().await {
        if answer(&tx, filter, head, request).await.is_err() {
            return false;
        }
    }
    true
}

/// Answers one request; `Err` once a statement has failed (the encoding thread has the error).
async fn answer(
    tx: &tokio_postgres::Transaction<'_>,
    filter: &ExportFilter,
    head: i64,
    request: Request,
) -> Result<(), ()> {
    match request {
        Request::FormTypes(to) => reply(to, sql::form_types(tx, filter, head).await)?,
        Request::Count(to) => reply(to, sql::count(tx, filter, head).await)?,
        Request::Data(form_type, out) => match sql::open_rows(tx, filter, head, Some(&form_type), true).await
        {
            Ok(portal) => pass(&out, || sql::fetch_data(tx, &portal, FETCH_ROWS)).await?,
            Err(e) => return refuse(&out, e).await,
        },
        Request::Rows(Some(form_type), out) => {
            match sql::TypeRows::open(tx, filter, head, &form_type).await {
                Ok(pages) => pass(&out, || pages.next(tx, FETCH_ROWS)).await?,
                Err(e) => return refuse(&out, e).await,
            }
        }
        Request::Rows(None, out) => match sql::open_rows(tx, filter, head, None, false).await {
            Ok(portal) => pass(&out, || sql::fetch_rows(tx, &portal, FETCH_ROWS)).await?,
            Err(e) => return refuse(&out, e).await,
        },
    }
    Ok(())
}

fn reply<T>(
    to: oneshot::Sender<Result<T, tokio_postgres::Error>>,
    result: Result<T, tokio_postgres::Error>,
) -> Result<(), ()> {
    let failed = result.is_err();
    let _ = to.send(result);
    if failed {
        Err(())
    } else {
        Ok(())
    }
}

/// Sends a portal's batches to `out` until the short one, fetching each while the encoding
/// thread works on the one before. A closed `out` is the encoding thread stopping early: the
/// pass ends there, and the snapshot waits for its next request (or for the end).
async fn pass<T, F>(out: &mpsc::Sender<Batch<T>>, fetch: impl Fn() -> F) -> Result<(), ()>
where
    F: std::future::Future<Output = Batch<T>>,
{
    loop {
        let batch = fetch().await;
        let failed = batch.is_err();
        let last = !matches!(&batch, Ok(rows) if rows.len() == FETCH_ROWS as usize);
        if out.send(batch).await.is_err() {
            return Ok(());
        }
        if failed {
            return Err(());
        }
        if last {
            return Ok(());
        }
    }
}

/// A pass whose portal could not be opened: its error, and the end of the snapshot.
async fn refuse<T>(out: &mpsc::Sender<Batch<T>>, e: tokio_postgres::Error) -> Result<(), ()> {
    let _ = out.send(Err(e)).await;
    Err(())
}
