//! The database layer's own error: what went wrong, in the terms callers act on. The HTTP status
//! of each kind is decided once, by `From<DbError> for ApiError` in `crate::error`.

use std::error::Error as StdError;

/// Any error, kept as the source of a `DbError` so the chain reaches the log intact.
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

pub type DbResult<T> = Result<T, DbError>;

#[derive(Debug, thiserror::Error)]
pub enum DbError {
    /// No connection could be had, or it was lost: the caller should retry later.
    #[error("database unavailable")]
    Unavailable(#[source] BoxError),
    /// SQLSTATE class 22: a value PostgreSQL cannot hold (for example a NUL character), which
    /// can only have come from the request.
    #[error("the database refused a value")]
    DataException(#[source] tokio_postgres::Error),
    /// A rule the statement enforces refused the change.
    #[error("{0}")]
    Conflict(Conflict),
    /// Anything else: a bug or a database in a state we do not expect.
    #[error("database error")]
    Other(#[source] BoxError),
}

/// The conflicts the SQL layer detects itself.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Conflict {
    #[error("Username '{0}' is already taken")]
    UsernameTaken(String),
    /// Deleting or demoting the only remaining admin.
    #[error("The last admin cannot be deleted or demoted")]
    LastAdmin,
}

impl DbError {
    pub fn is_unavailable(&self) -> bool {
        matches!(self, DbError::Unavailable(_))
    }

    pub fn other(cause: impl Into<BoxError>) -> Self {
        DbError::Other(cause.into())
    }

    /// A lock was waited for longer than the transaction's `lock_timeout` (SQLSTATE 55P03).
    pub fn is_lock_timeout(&self) -> bool {
        let DbError::Other(cause) = self else { return false };
        let code = cause.downcast_ref::<tokio_postgres::Error>().and_then(tokio_postgres::Error::code);
        code == Some(&tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE)
    }
}

impl From<tokio_postgres::Error> for DbError {
    fn from(e: tokio_postgres::Error) -> Self {
        if is_connection_error(&e) {
            DbError::Unavailable(Box::new(e))
        } else if e.code().is_some_and(|c| c.code().starts_with("22")) {
            DbError::DataException(e)
        } else {
            DbError::Other(Box::new(e))
        }
    }
}

impl From<deadpool_postgres::PoolError> for DbError {
    /// Every pool failure means no connection could be had: deadpool reports `Backend` only when
    /// creating one fails, whatever the server said (for example "database is not currently
    /// accepting connections", SQLSTATE 55000, which is not a connection-class code).
    fn from(e: deadpool_postgres::PoolError) -> Self {
        DbError::Unavailable(Box::new(e))
    }
}

/// Errors that mean "the database is not reachable" rather than "the query is wrong".
pub fn is_connection_error(e: &tokio_postgres::Error) -> bool {
    if e.is_closed() {
        return true;
    }
    match e.code() {
        Some(code) => {
            let c = code.code();
            // Class 08: connection exceptions; 57P0x: admin/crash shutdown, cannot connect now.
            c.starts_with("08") || c.starts_with("57P")
        }
        None => {
            let text = e.to_string();
            text.contains("connection") || text.contains("timed out") || text.contains("io error")
        }
    }
}

/// NUL in text (22021) or in a JSON string cast to jsonb (22P05): PostgreSQL cannot store them.
pub fn is_unstorable_text(e: &tokio_postgres::Error) -> bool {
    e.code().is_some_and(|c| matches!(c.code(), "22021" | "22P05"))
}
