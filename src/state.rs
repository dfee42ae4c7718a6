//! What handlers share: configuration, the pool, the auth service and the actors' handles.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crate::auth::rate_limit::LoginLimiter;
use crate::auth::AuthService;
use crate::config::Config;

#[derive(Clone)]
pub struct AppState {
    pub config: Arc<Config>,
    pub pool: deadpool_postgres::Pool,
    /// Where routed reads go: a replica or the primary (docs/api.md §18.3).
    pub reads: Arc<crate::db::replicas::ReadRouter>,
    /// Whose pull pages start on the scoped statement (docs/api.md §20.3).
    pub scoped_readers: Arc<crate::db::records::ScopedReaders>,
    pub auth: Arc<AuthService>,
    pub login_limiter: Arc<LoginLimiter>,
    pub user_limiter: Arc<crate::auth::user_rate::UserLimiter>,
    pub started_at: Instant,
    pub ready: Arc<AtomicBool>,
    pub actors: crate::actors::Actors,
    /// Where attachment, bundle and export files live (docs/api.md §18.1).
    pub storage: Arc<crate::storage::Storage>,
    pub schemas: Arc<crate::schema_check::SchemaCache>,
    /// What expiry is measured on (see `crate::clock`).
    pub clock: crate::clock::Clock,
    /// Room for request bodies in flight (`MAX_INFLIGHT_BODY_BYTES`).
    pub body_budget: crate::http::body_budget::BodyBudget,
}

impl AppState {
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }
}
