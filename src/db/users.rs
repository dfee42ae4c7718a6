//! SQL for users, refresh tokens and the access-token denylist.

use chrono::{DateTime, Utc};
use deadpool_postgres::GenericClient;
use tokio_postgres::error::SqlState;
use tokio_postgres::Row;
use uuid::Uuid;

use crate::db::{audit, scope, Conflict, DbError, DbResult};
use crate::domain::audit::{user_update_entries, Action, Entry, Origin};
use crate::domain::role::Role;
use crate::domain::scope::{UserAttributes, UserFacts};

#[derive(Debug, Clone)]
pub struct UserRow {
    pub id: Uuid,
    pub username: String,
    pub email: Option<String>,
    pub role: Role,
    pub password_hash: String,
    pub token_generation: i64,
    pub created_at: DateTime<Utc>,
    pub last_login: Option<DateTime<Utc>>,
    /// Validated on the way in (docs/api.md §20.1); shown as stored.
    pub attributes: serde_json::Value,
}

const USER_COLUMNS: &str =
    "id, username, email, role, password_hash, token_generation, created_at, last_login, attributes";

fn user_from_row(row: &Row) -> UserRow {
    let role: String = row.get("role");
    UserRow {
        id: row.get("id"),
        username: row.get("username"),
        email: row.get("email"),
        // The CHECK constraint only admits the three names; read-only is the safe fallback.
        role: Role::parse(&role).unwrap_or(Role::ReadOnly),
        password_hash: row.get("password_hash"),
        token_generation: row.get("token_generation"),
        created_at: row.get("created_at"),
        last_login: row.get("last_login"),
        attributes: row.get("attributes"),
    }
}

/// Serialises admin-count-sensitive changes so two concurrent demotions cannot remove the last admin.
const ADMIN_CHANGE_LOCK: i64 = 0x5359_4e4b_0002;

#[tracing::instrument(name = "db.users.count", level = "debug", skip_all)]
pub async fn count(db: &impl GenericClient) -> DbResult<i64> {
    Ok(db.query_one("SELECT count(*) FROM users", &[]).await?.get(0))
}

#[tracing::instrument(name = "db.users.insert", level = "debug", skip_all)]
pub async fn insert(
    db: &impl GenericClient,
    username: &str,
    email: Option<&str>,
    password_hash: &str,
    role: Role,
) -> DbResult<UserRow> {
    let sql = format!(
        "INSERT INTO users (username, email, password_hash, role) VALUES ($1, $2, $3, $4) RETURNING {USER_COLUMNS}"
    );
    match db.query_one(&sql, &[&username, &email, &password_hash, &role.as_str()]).await {
        Ok(row) => Ok(user_from_row(&row)),
        Err(e) if e.code() == Some(&SqlState::UNIQUE_VIOLATION) => {
            Err(DbError::Conflict(Conflict::UsernameTaken(username.to_string())))
        }
        Err(e) => Err(e.into()),
    }
}

/// Creates a user and records it in the audit log, in one transaction.
#[tracing::instrument(name = "db.users.create", level = "debug", skip_all)]
pub async fn create(
    db: &mut deadpool_postgres::Object,
    username: &str,
    email: Option<&str>,
    password_hash: &str,
    role: Role,
    origin: &Origin,
) -> DbResult<UserRow> {
    let tx = db.transaction().await?;
    let user = insert(&tx, username, email, password_hash, role).await?;
    if scope::read::is_scoped(&tx).await? {
        scope::users::apply(&tx, None, &facts(&user)?).await?;
    }
    let details = serde_json::json!({"role": role.as_str()});
    audit::append(&tx, &origin.entry(Action::UserCreated, Some(username), details)).await?;
    tx.commit().await?;
    Ok(user)
}

#[tracing::instrument(name = "db.users.find_by_username", level = "debug", skip_all)]
pub async fn find_by_username(db: &impl GenericClient, username: &str) -> DbResult<Option<UserRow>> {
    let sql = format!("SELECT {USER_COLUMNS} FROM users WHERE username = $1");
    Ok(db.query_opt(&sql, &[&username]).await?.map(|r| user_from_row(&r)))
}

#[tracing::instrument(name = "db.users.find_by_id", level = "debug", skip_all)]
pub async fn find_by_id(db: &impl GenericClient, id: Uuid) -> DbResult<Option<UserRow>> {
    let sql = format!("SELECT {USER_COLUMNS} FROM users WHERE id = $1");
    Ok(db.query_opt(&sql, &[&id]).await?.map(|r| user_from_row(&r)))
}

#[tracing::instrument(name = "db.users.list", level = "debug", skip_all)]
pub async fn list(db: &impl GenericClient) -> DbResult<Vec<UserRow>> {
    let sql = format!("SELECT {USER_COLUMNS} FROM users ORDER BY username COLLATE \"C\"");
    Ok(db.query(&sql, &[]).await?.iter().map(user_from_row).collect())
}

#[tracing::instrument(name = "db.users.token_generation", level = "debug", skip_all)]
pub async fn token_generation(db: &impl GenericClient, id: Uuid) -> DbResult<Option<i64>> {
    Ok(db.query_opt("SELECT token_generation FROM users WHERE id = $1", &[&id]).await?.map(|r| r.get(0)))
}

#[tracing::instrument(name = "db.users.touch_last_login", level = "debug", skip_all)]
pub async fn touch_last_login(db: &impl GenericClient, id: Uuid) -> DbResult<DateTime<Utc>> {
    Ok(db
        .query_one("UPDATE users SET last_login = now() WHERE id = $1 RETURNING last_login", &[&id])
        .await?
        .get(0))
}

/// The changes `PUT /users/{username}` may make; `None` leaves a field alone.
pub struct UserUpdate {
    pub role: Option<Role>,
    pub email: Option<Option<String>>,
    pub password_hash: Option<String>,
    pub attributes: Option<UserAttributes>,
}

/// What scope rules know of a stored user.
fn facts(user: &UserRow) -> DbResult<UserFacts> {
    let attributes = UserAttributes::parse(&user.attributes).map_err(|_| {
        DbError::Other(format!("user {}: stored attributes do not parse", user.username).into())
    })?;
    Ok(UserFacts { username: user.username.clone(), role: user.role, attributes })
}

/// Applies an update atomically, with its audit entries; refuses to demote the last admin.
/// Returns `None` for an unknown user.
#[tracing::instrument(name = "db.users.update", level = "debug", skip_all)]
pub async fn update(
    db: &mut deadpool_postgres::Object,
    username: &str,
    change: UserUpdate,
    origin: &Origin,
) -> DbResult<Option<UserRow>> {
    let tx = db.transaction().await?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&ADMIN_CHANGE_LOCK]).await?;
    let Some(current) = find_by_username(&tx, username).await? else {
        return Ok(None);
    };
    if current.role == Role::Admin && change.role.is_some_and(|r| r != Role::Admin) {
        ensure_other_admin_exists(&tx, current.id).await?;
    }
    let role_changed = change.role.is_some_and(|r| r != current.role);
    let revoke_tokens = role_changed || change.password_hash.is_some();
    let email = match change.email {
        Some(e) => e,
        None => current.email.clone(),
    };
    let role = change.role.unwrap_or(current.role);
    let hash = change.password_hash.clone().unwrap_or(current.password_hash.clone());
    let attributes =
        change.attributes.as_ref().map_or_else(|| current.attributes.clone(), UserAttributes::to_json);
    let sql = format!(
        "UPDATE users SET role = $2, email = $3, password_hash = $4, attributes = $6,
            token_generation = token_generation + CASE WHEN $5 THEN 1 ELSE 0 END
         WHERE id = $1 RETURNING {USER_COLUMNS}"
    );
    let row = tx
        .query_one(&sql, &[&current.id, &role.as_str(), &email, &hash, &revoke_tokens, &attributes])
        .await?;
    let updated = user_from_row(&row);
    let attributes_changed = attributes != current.attributes;
    if role_changed || attributes_changed {
        // What the user receives follows at once, in this transaction (docs/api.md §20.1).
        scope::users::apply(&tx, Some(&facts(&current)?), &facts(&updated)?).await?;
    }
    if change.password_hash.is_some() {
        revoke_refresh_tokens_of_user(&tx, current.id).await?;
    }
    let mut entries =
        user_update_entries(origin, username, (current.role, role), change.password_hash.is_some());
    if attributes_changed {
        let details = serde_json::json!({"from": current.attributes, "to": updated.attributes});
        entries.push(origin.entry(Action::AttributesChanged, Some(username), details));
    }
    audit::append_all(&tx, &entries).await?;
    if let (true, Some(actor)) = (entries.is_empty(), &origin.actor) {
        // An e-mail change is not audited, but it is a write its author reads back.
        super::marks::mark_write(&tx, actor).await?;
    }
    tx.commit().await?;
    Ok(Some(updated))
}

/// Sets a new password, invalidates the user's access tokens and revokes all refresh tokens;
/// `entry` (a reset or a change) is appended in the same transaction.
#[tracing::instrument(name = "db.users.set_password", level = "debug", skip_all)]
pub async fn set_password(
    db: &mut deadpool_postgres::Object,
    id: Uuid,
    password_hash: &str,
    entry: &Entry,
) -> DbResult<bool> {
    let tx = db.transaction().await?;
    let n = tx
        .execute(
            "UPDATE users SET password_hash = $2, token_generation = token_generation + 1 WHERE id = $1",
            &[&id, &password_hash],
        )
        .await?;
    revoke_refresh_tokens_of_user(&tx, id).await?;
    if n == 1 {
        audit::append(&tx, entry).await?;
    }
    tx.commit().await?;
    Ok(n == 1)
}

/// Deletes a user (refresh tokens go with it) and appends `entry`; refuses to delete the last admin.
#[tracing::instrument(name = "db.users.delete", level = "debug", skip_all)]
pub async fn delete(db: &mut deadpool_postgres::Object, id: Uuid, entry: &Entry) -> DbResult<bool> {
    let tx = db.transaction().await?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&ADMIN_CHANGE_LOCK]).await?;
    let Some(user) = find_by_id(&tx, id).await? else {
        return Ok(false);
    };
    if user.role == Role::Admin {
        ensure_other_admin_exists(&tx, id).await?;
    }
    tx.execute("DELETE FROM users WHERE id = $1", &[&id]).await?;
    audit::append(&tx, entry).await?;
    tx.commit().await?;
    Ok(true)
}

async fn ensure_other_admin_exists(db: &impl GenericClient, except: Uuid) -> DbResult<()> {
    let others: i64 = db
        .query_one("SELECT count(*) FROM users WHERE role = 'admin' AND id <> $1", &[&except])
        .await?
        .get(0);
    if others == 0 {
        return Err(DbError::Conflict(Conflict::LastAdmin));
    }
    Ok(())
}

// ---- refresh tokens ----

/// A refresh token's row: only its hash is stored.
pub struct NewRefreshToken {
    pub token_hash: Vec<u8>,
    pub user_id: Uuid,
    pub family_id: Uuid,
    pub expires_at: DateTime<Utc>,
}

#[tracing::instrument(name = "db.users.insert_refresh_token", level = "debug", skip_all)]
pub async fn insert_refresh_token(db: &impl GenericClient, token: &NewRefreshToken) -> DbResult<()> {
    db.execute(
        "INSERT INTO refresh_tokens (token_hash, user_id, family_id, expires_at) VALUES ($1, $2, $3, $4)",
        &[&token.token_hash, &token.user_id, &token.family_id, &token.expires_at],
    )
    .await?;
    Ok(())
}

/// A successful sign-in: the last-login time, the new refresh token and the audit entry, in one
/// transaction. Returns the new last-login time.
#[tracing::instrument(name = "db.users.sign_in", level = "debug", skip_all)]
pub async fn sign_in(
    db: &mut deadpool_postgres::Object,
    token: &NewRefreshToken,
    entry: &Entry,
) -> DbResult<DateTime<Utc>> {
    let tx = db.transaction().await?;
    let last_login = touch_last_login(&tx, token.user_id).await?;
    insert_refresh_token(&tx, token).await?;
    audit::append(&tx, entry).await?;
    tx.commit().await?;
    Ok(last_login)
}

/// What presenting a refresh token found.
pub enum RefreshLookup {
    Unknown,
    /// Already used or revoked: the caller must revoke the family.
    Reused {
        family_id: Uuid,
        /// Whose family it is.
        username: String,
    },
    Expired,
    /// Valid, and now revoked so that it cannot be used again (rotation).
    Consumed {
        user_id: Uuid,
        family_id: Uuid,
    },
}

/// Looks the token up and, when it is valid at `now` (the server's clock), revokes it.
#[tracing::instrument(name = "db.users.consume_refresh_token", level = "debug", skip_all)]
pub async fn consume_refresh_token(
    db: &impl GenericClient,
    token_hash: &[u8],
    now: DateTime<Utc>,
) -> DbResult<RefreshLookup> {
    // Revoke-and-return in one statement: two racing refreshes cannot both succeed.
    let consumed = db
        .query_opt(
            "UPDATE refresh_tokens SET revoked_at = now()
             WHERE token_hash = $1 AND revoked_at IS NULL AND expires_at > $2
             RETURNING user_id, family_id",
            &[&token_hash, &now],
        )
        .await?;
    if let Some(row) = consumed {
        return Ok(RefreshLookup::Consumed { user_id: row.get(0), family_id: row.get(1) });
    }
    let existing = db
        .query_opt(
            "SELECT r.family_id, r.revoked_at IS NOT NULL, r.expires_at <= $2, u.username
             FROM refresh_tokens r JOIN users u ON u.id = r.user_id WHERE r.token_hash = $1",
            &[&token_hash, &now],
        )
        .await?;
    Ok(match existing {
        None => RefreshLookup::Unknown,
        Some(row) if row.get::<_, bool>(1) => {
            RefreshLookup::Reused { family_id: row.get(0), username: row.get(3) }
        }
        Some(_) => RefreshLookup::Expired,
    })
}

/// Revokes a whole refresh-token family after a reuse, and records the reuse (`entry`).
#[tracing::instrument(name = "db.users.revoke_refresh_family", level = "debug", skip_all)]
pub async fn revoke_refresh_family(
    db: &mut deadpool_postgres::Object,
    family_id: Uuid,
    entry: &Entry,
) -> DbResult<()> {
    let tx = db.transaction().await?;
    tx.execute(
        "UPDATE refresh_tokens SET revoked_at = now() WHERE family_id = $1 AND revoked_at IS NULL",
        &[&family_id],
    )
    .await?;
    audit::append(&tx, entry).await?;
    tx.commit().await?;
    Ok(())
}

#[tracing::instrument(name = "db.users.revoke_refresh_token", level = "debug", skip_all)]
pub async fn revoke_refresh_token(db: &impl GenericClient, token_hash: &[u8], user_id: Uuid) -> DbResult<()> {
    db.execute(
        "UPDATE refresh_tokens SET revoked_at = now() WHERE token_hash = $1 AND user_id = $2 AND revoked_at IS NULL",
        &[&token_hash, &user_id],
    )
    .await?;
    Ok(())
}

async fn revoke_refresh_tokens_of_user(db: &impl GenericClient, user_id: Uuid) -> DbResult<()> {
    db.execute(
        "UPDATE refresh_tokens SET revoked_at = now() WHERE user_id = $1 AND revoked_at IS NULL",
        &[&user_id],
    )
    .await?;
    Ok(())
}

// ---- access-token denylist ----

#[tracing::instrument(name = "db.users.revoke_access_token", level = "debug", skip_all)]
pub async fn revoke_access_token(
    db: &impl GenericClient,
    jti: &str,
    expires_at: DateTime<Utc>,
) -> DbResult<()> {
    db.execute(
        "INSERT INTO revoked_tokens (jti, expires_at) VALUES ($1, $2) ON CONFLICT (jti) DO NOTHING",
        &[&jti, &expires_at],
    )
    .await?;
    Ok(())
}

#[tracing::instrument(name = "db.users.is_access_token_revoked", level = "debug", skip_all)]
pub async fn is_access_token_revoked(db: &impl GenericClient, jti: &str) -> DbResult<bool> {
    Ok(db.query_opt("SELECT 1 FROM revoked_tokens WHERE jti = $1", &[&jti]).await?.is_some())
}

/// Housekeeping: forget denylisted tokens and refresh tokens that have expired anyway.
/// What a token check needs in one round trip: the user's token generation (`None` when the user
/// no longer exists) and whether this access token was revoked.
#[tracing::instrument(name = "db.users.token_state", level = "debug", skip_all)]
pub async fn token_state(db: &impl GenericClient, user_id: Uuid, jti: &str) -> DbResult<(Option<i64>, bool)> {
    let row = db
        .query_one(
            "SELECT (SELECT token_generation FROM users WHERE id = $1),
                    EXISTS (SELECT 1 FROM revoked_tokens WHERE jti = $2)",
            &[&user_id, &jti],
        )
        .await?;
    Ok((row.get(0), row.get(1)))
}

#[tracing::instrument(name = "db.users.purge_expired_tokens", level = "debug", skip_all)]
pub async fn purge_expired_tokens(db: &impl GenericClient) -> DbResult<()> {
    db.execute("DELETE FROM revoked_tokens WHERE expires_at < now()", &[]).await?;
    db.execute("DELETE FROM refresh_tokens WHERE expires_at < now() - interval '1 day'", &[]).await?;
    Ok(())
}

pub fn is_unique_violation(e: &tokio_postgres::Error) -> bool {
    e.code() == Some(&SqlState::UNIQUE_VIOLATION)
}
