//! Structured shutdown (docs/operations.md, "Stopping"): the server's own background tasks are
//! spawned through one [`Tasks`] (a tracker and a cancellation token), and the requests whose
//! answer is not sent yet are counted ([`InFlight`]). On SIGTERM or SIGINT the server answers
//! `/ready` with 503 at once and keeps answering requests until those in flight are done (a load
//! balancer takes a moment to notice), then closes its listener, stops its tasks within a
//! deadline, and stops the embedded database last.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use actix_web::body::{BodySize, BoxBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::middleware::Next;
use actix_web::web::{Bytes, Data};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// How long the requests in flight get to finish after the signal.
pub const DRAIN_DEADLINE: Duration = Duration::from_secs(20);
/// How long the listener's connections get to close once it stops accepting (idle kept-alive
/// ones, answers still being written after the drain deadline).
pub const CLOSE_DEADLINE: Duration = Duration::from_secs(5);
/// How long the background tasks get to stop once asked.
pub const TASKS_DEADLINE: Duration = Duration::from_secs(5);

/// The server's own background work: hourly sweeps, listeners, ticks. Each task ends when it
/// finishes or when [`Tasks::stop`] cancels it, whichever comes first.
#[derive(Clone, Default)]
pub struct Tasks {
    tracker: TaskTracker,
    stop: CancellationToken,
}

impl Tasks {
    pub fn spawn(&self, work: impl Future<Output = ()> + Send + 'static) {
        let stop = self.stop.clone();
        self.tracker.spawn(async move {
            tokio::select! {
                () = stop.cancelled() => {}
                () = work => {}
            }
        });
    }

    /// For work the compiler cannot prove `Send`: run on the current thread's local set (an
    /// actor's arbiter).
    pub fn spawn_local(&self, work: impl Future<Output = ()> + 'static) {
        let stop = self.stop.clone();
        self.tracker.spawn_local(async move {
            tokio::select! {
                () = stop.cancelled() => {}
                () = work => {}
            }
        });
    }

    /// Cancels every task and waits for them for at most `deadline`; false when some are left.
    pub async fn stop(&self, deadline: Duration) -> bool {
        self.stop.cancel();
        self.tracker.close();
        tokio::time::timeout(deadline, self.tracker.wait()).await.is_ok()
    }

    /// Tasks not finished yet.
    pub fn running(&self) -> usize {
        self.tracker.len()
    }
}

/// The requests being answered: counted from the moment the application sees one until its
/// answer's last byte is handed to the connection (or the client goes away).
#[derive(Clone, Default)]
pub struct InFlight(Arc<Counter>);

#[derive(Default)]
struct Counter {
    count: AtomicUsize,
    idle: Notify,
}

/// One request in flight; dropping it ends the request.
struct Entered(Arc<Counter>);

impl Drop for Entered {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

impl InFlight {
    fn enter(&self) -> Entered {
        self.0.count.fetch_add(1, Ordering::AcqRel);
        Entered(self.0.clone())
    }

    pub fn count(&self) -> usize {
        self.0.count.load(Ordering::Acquire)
    }

    /// Waits until no request is in flight, for at most `deadline`; false when some still are.
    pub async fn drained(&self, deadline: Duration) -> bool {
        let wait = async {
            loop {
                let idle = self.0.idle.notified();
                tokio::pin!(idle);
                // Registered before the check, so a request ending in between is not missed.
                idle.as_mut().enable();
                if self.count() == 0 {
                    return;
                }
                idle.await;
            }
        };
        tokio::time::timeout(deadline, wait).await.is_ok()
    }
}

/// The outermost middleware: counts the request until its body is sent. The counter is the
/// app's `Data<InFlight>`.
pub async fn count_in_flight(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<BoxBody>, actix_web::Error> {
    let entered = req.app_data::<Data<InFlight>>().map(|in_flight| in_flight.enter());
    let res = next.call(req).await?.map_into_boxed_body();
    Ok(match entered {
        Some(entered) => res.map_body(|_, body| BoxBody::new(Counted { body, _entered: entered })),
        None => res,
    })
}

/// A response body that holds its request's place in the count until it is dropped.
struct Counted {
    body: BoxBody,
    _entered: Entered,
}

impl MessageBody for Counted {
    type Error = <BoxBody as MessageBody>::Error;

    fn size(&self) -> BodySize {
        self.body.size()
    }

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, Self::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_next(cx)
    }

    /// A body that is one buffer is handed over whole (and the request counted as done).
    fn try_into_bytes(self) -> Result<Bytes, Self> {
        let Counted { body, _entered } = self;
        body.try_into_bytes().map_err(|body| Counted { body, _entered })
    }
}

/// SIGTERM or SIGINT, as a stream of "stop" requests.
pub struct Signals {
    terminate: tokio::signal::unix::Signal,
    interrupt: tokio::signal::unix::Signal,
}

impl Signals {
    pub fn listen() -> std::io::Result<Self> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Signals {
            terminate: signal(SignalKind::terminate())?,
            interrupt: signal(SignalKind::interrupt())?,
        })
    }

    pub async fn next(&mut self) -> &'static str {
        tokio::select! {
            _ = self.terminate.recv() => "SIGTERM",
            _ = self.interrupt.recv() => "SIGINT",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn stopping_cancels_every_task_within_the_deadline() {
        let tasks = Tasks::default();
        for _ in 0..3 {
            tasks.spawn(std::future::pending());
        }
        tasks.spawn(async {});
        assert!(tasks.stop(Duration::from_secs(5)).await, "every task stopped");
        assert_eq!(tasks.running(), 0);
    }

    #[tokio::test]
    async fn drained_waits_for_the_last_request_and_no_longer() {
        let in_flight = InFlight::default();
        assert!(in_flight.drained(Duration::ZERO).await, "nothing in flight");
        let (first, second) = (in_flight.enter(), in_flight.enter());
        assert!(!in_flight.drained(Duration::from_millis(10)).await, "two in flight");
        drop(first);
        assert_eq!(in_flight.count(), 1);
        let waiter = tokio::spawn({
            let in_flight = in_flight.clone();
            async move { in_flight.drained(Duration::from_secs(10)).await }
        });
        drop(second);
        assert!(waiter.await.expect("waiter"), "the last one ended the wait");
    }
}
