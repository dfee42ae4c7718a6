//! Request ids (docs/api.md §1.6): echoed when well-formed, generated otherwise, visible to error bodies
//! and log lines through a task-local for the duration of the request.

use uuid::Uuid;

tokio::task_local! {
    static REQUEST_ID: String;
}

/// 1–128 characters from `[A-Za-z0-9._:-]`.
pub fn accept_or_generate(incoming: Option<&str>) -> String {
    match incoming {
        Some(id)
            if !id.is_empty()
                && id.len() <= 128
                && id.bytes().all(|b| b.is_ascii_alphanumeric() || b"._:-".contains(&b)) =>
        {
            id.to_string()
        }
        _ => Uuid::new_v4().simple().to_string()[..16].to_string(),
    }
}

/// The current request's id, or a fresh one outside a request.
pub fn current() -> String {
    REQUEST_ID.try_with(|id| id.clone()).unwrap_or_else(|_| accept_or_generate(None))
}

/// The current request's id, when there is a request.
pub fn try_current() -> Option<String> {
    REQUEST_ID.try_with(|id| id.clone()).ok()
}

/// Runs `f` as part of the request `id` (an actor handling a request's message).
pub fn sync_scope<R>(id: Option<String>, f: impl FnOnce() -> R) -> R {
    match id {
        Some(id) => REQUEST_ID.sync_scope(id, f),
        None => f(),
    }
}

pub async fn scope<F: std::future::Future>(id: String, fut: F) -> F::Output {
    REQUEST_ID.scope(id, fut).await
}
