//! Actors own the server's single-owner state. Handlers talk to them only through their typed
//! handles (`ChangeLogHandle`, `ExportJobsHandle`, ...), whose async methods send the message and
//! map a mailbox failure to an error once, in [`ask`]; no handler sees an `Addr`. Beside them,
//! the bundle and attachment stores are plain shared values whose work locks order, not
//! actors (docs/architecture.md, "The picture").

pub mod attachment_store;
pub mod bundle_store;
pub mod change_log;
pub mod export_jobs;
pub mod presence;
pub mod scope_sets;

use std::sync::Arc;
use std::time::Duration;

use std::pin::Pin;
use std::task::Poll;

use actix::dev::ToEnvelope;
use actix::fut::ActorFuture;
use actix::{Actor, Addr, Handler, MailboxError, Message, ResponseActFuture, ResponseFuture};
use tracing::Instrument;

use crate::clock::Clock;
use crate::config::Config;
use crate::error::{ApiError, ApiResult};

/// The handles of the running actors.
#[derive(Clone)]
pub struct Actors {
    pub change_log: change_log::ChangeLogHandle,
    pub presence: presence::PresenceHandle,
    pub bundles: bundle_store::BundleStore,
    pub attachments: attachment_store::AttachmentStore,
    pub export_jobs: export_jobs::ExportJobsHandle,
    pub scope_sets: scope_sets::ScopeSetsHandle,
}

/// An actor that did not take or answer a message: stopped, or its mailbox closed.
#[derive(Debug, thiserror::Error)]
#[error("the {actor} did not answer")]
pub struct NoAnswer {
    actor: &'static str,
    #[source]
    source: MailboxError,
}

/// Sends `msg` to `addr` and waits for the answer. The one place a mailbox failure becomes an
/// error: a 500, with the actor's name and the mailbox error kept as the cause; and where an
/// actor's own error (`CommitError`, ...) becomes an HTTP error. The message is handled in a span
/// of its own, a child of the sender's (the request's), with the sender's request id: the actor's
/// log lines and database calls for it are the request's (see [`Traced`]).
async fn ask<A, M, T, E>(addr: &Addr<A>, actor: &'static str, msg: M) -> ApiResult<T>
where
    A: Actor + Handler<Traced<M>>,
    A::Context: ToEnvelope<A, Traced<M>>,
    M: Message<Result = Result<T, E>> + Send + 'static,
    T: Send + 'static,
    E: Into<ApiError> + Send + 'static,
{
    let message = std::any::type_name::<M>().rsplit("::").next().unwrap_or("message");
    let span = tracing::info_span!("actor", otel.name = %format_args!("{actor}: {message}"), actor, message);
    let traced = Traced { msg, span: span.clone(), request_id: crate::telemetry::request_id::try_current() };
    addr.send(traced)
        .instrument(span)
        .await
        .map_err(|source| ApiError::internal(NoAnswer { actor, source }))?
        .map_err(Into::into)
}

/// The span of a call into one of the two stores, which are not actors but are traced as if they
/// were (`"{store}: {message}"`, a child of the request's span).
fn store_span(store: &'static str, message: &'static str) -> tracing::Span {
    tracing::info_span!("actor", otel.name = %format_args!("{store}: {message}"), actor = store, message)
}

/// Runs a store's part of a request in its span and to its end, even when the request goes away
/// meanwhile, as an actor's answer did: an upload, a switch or a reset half done would leave
/// files and rows apart. It is the request's work, not background work: the request awaits it,
/// and the drain at shutdown waits for the request, whose id its log lines and the actor
/// messages it sends carry.
async fn to_the_end<T: 'static>(
    store: &'static str,
    message: &'static str,
    work: impl std::future::Future<Output = ApiResult<T>> + 'static,
) -> ApiResult<T> {
    let work = work.instrument(store_span(store, message));
    let request_id = crate::telemetry::request_id::try_current();
    actix::spawn(async move {
        match request_id {
            Some(id) => crate::telemetry::request_id::scope(id, work).await,
            None => work.await,
        }
    })
    .await
    .map_err(ApiError::internal)?
}

/// A message and the span it is handled in. Every actor handles `Traced<M>` for each of its
/// messages `M` (the impls below): the handler runs inside the span, and so does the future it
/// answers with, whether it runs on its own or in the actor's context.
pub struct Traced<M> {
    msg: M,
    span: tracing::Span,
    /// The sender's, current while the handler runs (`request_id::try_current`).
    request_id: Option<String>,
}

impl<M: Message> Message for Traced<M> {
    type Result = M::Result;
}

impl<M> Traced<M> {
    /// Handles the message with `handle`, inside its span and with the sender's request id.
    pub fn handle_in<R>(self, handle: impl FnOnce(M) -> R) -> (R, tracing::Span) {
        let Traced { msg, span, request_id } = self;
        let answer = span.in_scope(|| crate::telemetry::request_id::sync_scope(request_id, || handle(msg)));
        (answer, span)
    }
}

/// An actor's answer, run inside a span.
pub trait InSpan {
    fn in_span(self, span: tracing::Span) -> Self;
}

impl<T: 'static> InSpan for ResponseFuture<T> {
    fn in_span(self, span: tracing::Span) -> Self {
        Box::pin(self.instrument(span))
    }
}

impl<A: Actor, T: 'static> InSpan for ResponseActFuture<A, T> {
    fn in_span(self, span: tracing::Span) -> Self {
        Box::pin(ActInSpan { inner: self, span })
    }
}

impl<T, E> InSpan for Result<T, E> {
    fn in_span(self, _: tracing::Span) -> Self {
        self
    }
}

impl InSpan for () {
    fn in_span(self, _: tracing::Span) -> Self {}
}

/// A future run in an actor's context (it may touch the actor's state), entered into its span
/// on every poll.
struct ActInSpan<A: Actor, T> {
    inner: ResponseActFuture<A, T>,
    span: tracing::Span,
}

impl<A: Actor, T> ActorFuture<A> for ActInSpan<A, T> {
    type Output = T;

    fn poll(
        self: Pin<&mut Self>,
        actor: &mut A,
        ctx: &mut A::Context,
        task: &mut std::task::Context<'_>,
    ) -> Poll<T> {
        let this = self.get_mut();
        let _entered = this.span.enter();
        this.inner.as_mut().poll(actor, ctx, task)
    }
}

/// `Traced<M>` for each message `M` listed: `M`'s handler, inside the message's span. Invoked
/// beside each actor's handlers: `traced!(Actor: MessageA, MessageB);`.
macro_rules! traced {
    ($actor:ty: $($message:ty),+ $(,)?) => {$(
        impl actix::Handler<$crate::actors::Traced<$message>> for $actor {
            type Result = <$actor as actix::Handler<$message>>::Result;

            fn handle(
                &mut self,
                traced: $crate::actors::Traced<$message>,
                ctx: &mut Self::Context,
            ) -> Self::Result {
                let (answer, span) =
                    traced.handle_in(|msg| <$actor as actix::Handler<$message>>::handle(self, msg, ctx));
                $crate::actors::InSpan::in_span(answer, span)
            }
        }
    )+};
}
pub(crate) use traced;

/// Starts every actor; called once by the app factory. `conn` is the database connection
/// string, for actors that need a dedicated connection (LISTEN) or a pool of their own (exports).
pub async fn start(
    config: &Config,
    pool: &deadpool_postgres::Pool,
    conn: &str,
    reads: &Arc<crate::db::replicas::ReadRouter>,
    clock: &Clock,
    storage: &crate::storage::Storage,
    tasks: &crate::shutdown::Tasks,
) -> anyhow::Result<Actors> {
    // The change log has connections of its own: its group commits send statements of many
    // megabytes, and a connection keeps buffers as large as the largest message it carried, so
    // sharing the request pool would leave every pooled connection holding that much memory.
    let change_log = change_log::ChangeLogHandle::start(crate::db::create_pool(conn, 2)?);
    let presence = presence::PresenceHandle(presence::Presence::new(pool.clone(), clock.clone()).start());
    let bundles = bundle_store::BundleStore::start(config, pool, conn, storage, tasks).await?;
    let attachments = attachment_store::AttachmentStore::start(
        pool.clone(),
        change_log.clone(),
        &config.attachments_path,
        storage.attachments.clone(),
        tasks,
    )?;
    let export_jobs =
        export_jobs::ExportJobs::start(config, pool, conn, reads, clock.clone(), tasks.clone())?;
    let scope_sets = scope_sets::ScopeSetsHandle(
        scope_sets::ScopeSets::new(pool.clone(), &config.node_id, clock.clone(), tasks.clone()).start(),
    );
    spawn_housekeeping(tasks, pool.clone(), config.transmission_retention_days, config.audit_retention_days);
    Ok(Actors { change_log, presence, bundles, attachments, export_jobs, scope_sets })
}

/// Hourly clean-up of what only ever grows: old transmission results, expired tokens and audit
/// log entries past `AUDIT_RETENTION_DAYS`.
fn spawn_housekeeping(
    tasks: &crate::shutdown::Tasks,
    pool: deadpool_postgres::Pool,
    retention_days: u32,
    audit_days: u32,
) {
    tasks.spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(3600));
        loop {
            tick.tick().await;
            let Ok(mut db) = pool.get().await else { continue };
            if let Err(e) = crate::db::records::purge_transmissions(&db, retention_days).await {
                tracing::warn!(error = %e, "purging old transmissions failed");
            }
            if let Err(e) = crate::db::users::purge_expired_tokens(&db).await {
                tracing::warn!(error = %e, "purging expired tokens failed");
            }
            match crate::db::audit::sweep(&mut db, audit_days).await {
                Ok(0) => {}
                Ok(removed) => tracing::info!(removed, "audit log entries past retention removed"),
                Err(e) => tracing::warn!(error = %e, "sweeping the audit log failed"),
            }
        }
    });
}
