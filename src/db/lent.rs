//! A pooled connection lent to one pull page, held until the page is dropped so that it is not
//! lent out again while rows still arrive.
//!
//! It may be set to plan generically. PostgreSQL plans a prepared statement anew for each
//! execution (a "custom" plan, knowing its parameters) until it judges a generic plan no more
//! expensive, which for a statement of many parts it may never do. The scoped pull page
//! (`db::scope::pull`) is written so that every plan reads each source along its index from the
//! cursor, and measured at 1.8M records its generic plan was faster than the custom ones (3 ms
//! against 12 for a full page) while planning alone took 1.1 ms of a 1.4 ms empty pull. So that
//! statement runs with `plan_cache_mode = force_generic_plan`: planned once per connection, then
//! reused. The setting is the connection's, and the connection goes back to a shared pool: it is
//! reset before that happens, and a connection whose reset fails is closed rather than lent out
//! as it is.

use deadpool_postgres::Object;

use crate::db::{DbError, DbResult};

pub const GENERIC_PLANS_SQL: &str = "SET plan_cache_mode = force_generic_plan";

pub struct Lent {
    db: Option<Object>,
    generic_plans: bool,
}

impl Lent {
    pub fn plain(db: Object) -> Lent {
        Lent { db: Some(db), generic_plans: false }
    }

    /// A connection the caller sets to plan generically ([`GENERIC_PLANS_SQL`], sent before its
    /// statement): dropping the lent connection resets it (or closes it), whether or not the
    /// setting was sent.
    pub fn with_generic_plans(db: Object) -> Lent {
        Lent { db: Some(db), generic_plans: true }
    }

    /// The connection (only `drop` takes it out).
    pub fn client(&self) -> DbResult<&Object> {
        self.db.as_ref().ok_or_else(|| DbError::Other("a lent connection was used after its return".into()))
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        let Some(db) = self.db.take() else { return };
        if !self.generic_plans {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            drop(Object::take(db));
            return;
        };
        runtime.spawn(async move {
            if let Err(e) = db.batch_execute("RESET plan_cache_mode").await {
                tracing::debug!(error = %e, "closing a connection whose plan mode could not be reset");
                drop(Object::take(db));
            }
        });
    }
}
