//! Tokens and passwords: JWT issue/verify, refresh-token minting, bcrypt off the executor, and the
//! per-token revocation cache that keeps the database out of the hot path (docs/api.md §6.1).

pub mod rate_limit;
pub mod user_rate;

#[cfg(test)]
mod fuzz;

use std::sync::Mutex;
use std::time::{Duration, Instant};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use chrono::{DateTime, TimeZone, Utc};
use dashmap::DashMap;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use rand::RngCore;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use uuid::Uuid;

use crate::clock::Clock;
use crate::db::users::UserRow;
use crate::db::DbError;
use crate::domain::role::Role;
use crate::domain::user::{BCRYPT_COST, DEFAULT_ADMIN_PASSWORD};

/// A real cost-12 bcrypt hash, so unknown users cost the same time as wrong passwords; a constant
/// because hashing one at every start costs 0.3 s of CPU (and every CLI command starts one).
const DUMMY_HASH: &str = "$2b$12$1uQNreaTKiKt.KfU00UNSO3Dm2iWMfcGruyBpIBSIOu2pZvPVWNKe";
/// Generations and denylist entries are re-read at least this often (the contract allows 5 s).
const REVOCATION_CACHE_TTL: Duration = Duration::from_secs(2);

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Claims {
    pub sub: String,
    pub username: String,
    pub email: Option<String>,
    pub role: String,
    pub roles: Vec<String>,
    pub iat: i64,
    pub exp: i64,
    pub jti: String,
}

/// Why a caller is not let in, or why the machinery failed; `crate::error` maps each to its HTTP
/// answer.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// A bad signature, algorithm or claim, or a revoked token.
    #[error("invalid token")]
    InvalidToken,
    #[error("token expired")]
    TokenExpired,
    /// Authenticated, but the role does not allow the action.
    #[error("the caller's role does not allow this")]
    Forbidden,
    /// The revocation check could not read the database.
    #[error(transparent)]
    Db(#[from] DbError),
    /// Signing or hashing failed (never the caller's fault).
    #[error("{0}")]
    Internal(String),
}

impl AuthError {
    fn internal(cause: impl std::fmt::Display) -> Self {
        AuthError::Internal(cause.to_string())
    }
}

pub type AuthResult<T> = Result<T, AuthError>;

/// A verified caller, as handlers see it.
#[derive(Debug, Clone)]
pub struct AuthUser {
    pub id: Uuid,
    pub username: String,
    pub role: Role,
    pub jti: String,
    pub expires_at: DateTime<Utc>,
}

impl AuthUser {
    /// Authorization after authentication: a 401 always wins over a 403.
    pub fn require(&self, role: Role) -> AuthResult<()> {
        if self.role.allows(role) {
            Ok(())
        } else {
            Err(AuthError::Forbidden)
        }
    }
}

/// A freshly signed access token.
pub struct IssuedToken {
    pub token: String,
    pub expires_at: i64,
}

#[derive(Clone, Copy)]
struct CachedCheck {
    generation: Option<i64>,
    revoked: bool,
    fetched: Instant,
}

pub struct AuthService {
    encoding: EncodingKey,
    decoding: DecodingKey,
    validation: Validation,
    pub access_ttl: Duration,
    pub refresh_ttl: Duration,
    checks: DashMap<String, CachedCheck>,
    /// bcrypt cost of new hashes; below `BCRYPT_COST` only in tests (`config::test_only`).
    password_cost: u32,
    /// Verified when the user is unknown, at the cost of a real hash.
    dummy_hash: String,
    /// Token lifetimes are measured on it.
    clock: Clock,
    /// The last password hash compared with the shipped default password, and the answer: one
    /// bcrypt run costs a quarter of a second, and a hash only changes with its password.
    default_password_check: Mutex<Option<(String, bool)>>,
}

impl AuthService {
    pub fn new(secret: &[u8], access_ttl: Duration, refresh_ttl: Duration) -> anyhow::Result<Self> {
        let mut validation = Validation::new(Algorithm::HS256);
        // Expiry is checked against the server's clock in `decode`, not the library's.
        validation.validate_exp = false;
        validation.set_required_spec_claims(&["exp", "sub"]);
        Ok(AuthService {
            encoding: EncodingKey::from_secret(secret),
            decoding: DecodingKey::from_secret(secret),
            validation,
            access_ttl,
            refresh_ttl,
            checks: DashMap::new(),
            password_cost: BCRYPT_COST,
            dummy_hash: DUMMY_HASH.to_string(),
            clock: Clock::default(),
            default_password_check: Mutex::new(None),
        })
    }

    /// The service the configuration asks for, signing with `key` ([`crate::config::Config::signing_key`]).
    pub fn from_config(config: &crate::config::Config, key: &[u8], clock: Clock) -> anyhow::Result<Self> {
        let mut auth = Self::new(key, config.jwt_ttl, config.refresh_ttl)?;
        auth.clock = clock;
        if config.password_hash_cost != BCRYPT_COST {
            auth.password_cost = config.password_hash_cost;
            auth.dummy_hash = bcrypt::hash("not-a-real-password", auth.password_cost)?;
        }
        Ok(auth)
    }

    pub fn issue_access_token(&self, user: &UserRow) -> AuthResult<IssuedToken> {
        let iat = self.clock.now().timestamp();
        let exp = iat + self.access_ttl.as_secs() as i64;
        // The generation rides in the jti so revocation needs no claim of its own.
        let jti = format!("{}.{}", Uuid::new_v4().simple(), user.token_generation);
        let claims = Claims {
            sub: user.id.to_string(),
            username: user.username.clone(),
            email: user.email.clone(),
            role: user.role.as_str().to_string(),
            roles: vec![user.role.as_str().to_string()],
            iat,
            exp,
            jti,
        };
        let token = jsonwebtoken::encode(&Header::new(Algorithm::HS256), &claims, &self.encoding)
            .map_err(AuthError::internal)?;
        Ok(IssuedToken { token, expires_at: exp })
    }

    /// Signature, algorithm and expiry; revocation is checked separately (it needs the database).
    /// A token is valid up to and including the second of its `exp`.
    pub fn decode(&self, token: &str) -> AuthResult<Claims> {
        let claims = jsonwebtoken::decode::<Claims>(token, &self.decoding, &self.validation)
            .map_err(|_| AuthError::InvalidToken)?
            .claims;
        if claims.exp < self.clock.now().timestamp() {
            return Err(AuthError::TokenExpired);
        }
        Ok(claims)
    }

    /// Full verification: decode, then the per-user generation and the logout denylist.
    pub async fn verify(&self, token: &str, pool: &deadpool_postgres::Pool) -> AuthResult<AuthUser> {
        let claims = self.decode(token)?;
        let invalid = || AuthError::InvalidToken;
        let id = Uuid::parse_str(&claims.sub).map_err(|_| invalid())?;
        let role = Role::parse(&claims.role).ok_or_else(invalid)?;
        let token_generation: i64 =
            claims.jti.rsplit_once('.').and_then(|(_, g)| g.parse().ok()).ok_or_else(invalid)?;
        let check = self.revocation_check(&claims.jti, id, pool).await?;
        if check.revoked || check.generation != Some(token_generation) {
            return Err(invalid());
        }
        let expires_at = Utc.timestamp_opt(claims.exp, 0).single().ok_or_else(invalid)?;
        Ok(AuthUser { id, username: claims.username, role, jti: claims.jti, expires_at })
    }

    async fn revocation_check(
        &self,
        jti: &str,
        user_id: Uuid,
        pool: &deadpool_postgres::Pool,
    ) -> AuthResult<CachedCheck> {
        // Keyed by user as well: the jti alone would let a cached check vouch for another `sub`.
        let key = cache_key(user_id, jti);
        if let Some(hit) = self.checks.get(&key) {
            if hit.fetched.elapsed() < REVOCATION_CACHE_TTL {
                return Ok(*hit);
            }
        }
        let db = pool.get().await.map_err(DbError::from)?;
        let (generation, revoked) = crate::db::users::token_state(&db, user_id, jti).await?;
        let check = CachedCheck { generation, revoked, fetched: Instant::now() };
        if self.checks.len() > 100_000 {
            self.checks.retain(|_, c| c.fetched.elapsed() < REVOCATION_CACHE_TTL);
        }
        self.checks.insert(key, check);
        Ok(check)
    }

    /// Makes a logout effective in this process at once (other processes within the cache TTL).
    pub fn forget_token(&self, user_id: Uuid, jti: &str) {
        self.checks.insert(
            cache_key(user_id, jti),
            CachedCheck { generation: None, revoked: true, fetched: Instant::now() },
        );
    }

    /// Drops every cached check after an admin change that revokes tokens, so this process
    /// enforces it at once; jti-keyed entries cannot be dropped per user, and these changes are rare.
    pub fn forget_cached_checks(&self) {
        self.checks.clear();
    }

    pub async fn hash_password(&self, password: String) -> AuthResult<String> {
        hash_password(password, self.password_cost).await
    }

    /// Checks a password against a stored hash (or the dummy hash when the user is unknown).
    pub async fn verify_password(&self, password: String, hash: Option<String>) -> AuthResult<bool> {
        let known = hash.is_some();
        let hash = hash.unwrap_or_else(|| self.dummy_hash.clone());
        let ok = tokio::task::spawn_blocking(move || bcrypt::verify(password, &hash).unwrap_or(false))
            .await
            .map_err(AuthError::internal)?;
        Ok(known && ok)
    }

    /// Whether `hash` is a hash of the shipped default password (`admin`).
    pub async fn is_default_password(&self, hash: &str) -> AuthResult<bool> {
        let known = self.default_password_check.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some((checked, answer)) = known {
            if checked == hash {
                return Ok(answer);
            }
        }
        let answer = self.verify_password(DEFAULT_ADMIN_PASSWORD.to_string(), Some(hash.to_string())).await?;
        self.remember_default_password(hash, answer);
        Ok(answer)
    }

    /// Records what is known without a bcrypt run (the bootstrap admin was just created with a
    /// password that is or is not the default one).
    pub fn remember_default_password(&self, hash: &str, is_default: bool) {
        *self.default_password_check.lock().unwrap_or_else(|e| e.into_inner()) =
            Some((hash.to_string(), is_default));
    }
}

/// A bcrypt hash of `password` at `cost`, off the executor (the CLI hashes without a signing key).
pub async fn hash_password(password: String, cost: u32) -> AuthResult<String> {
    tokio::task::spawn_blocking(move || bcrypt::hash(password, cost))
        .await
        .map_err(AuthError::internal)?
        .map_err(AuthError::internal)
}

fn cache_key(user_id: Uuid, jti: &str) -> String {
    format!("{user_id}/{jti}")
}

/// A new refresh token: the opaque value for the client and the hash we store.
pub fn new_refresh_token() -> (String, Vec<u8>) {
    let mut bytes = [0u8; 32];
    rand::thread_rng().fill_bytes(&mut bytes);
    let token = URL_SAFE_NO_PAD.encode(bytes);
    let hash = hash_refresh_token(&token);
    (token, hash)
}

pub fn hash_refresh_token(token: &str) -> Vec<u8> {
    Sha256::digest(token.as_bytes()).to_vec()
}

/// `Authorization: Bearer <token>` with a case-insensitive scheme; anything else is "missing".
pub fn bearer_token(header: Option<&str>) -> Option<&str> {
    let value = header?.trim();
    let (scheme, token) = value.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let token = token.trim();
    (!token.is_empty()).then_some(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dummy_hash_costs_as_much_as_a_real_one() {
        assert!(DUMMY_HASH.starts_with(&format!("$2b${BCRYPT_COST}$")));
        assert!(bcrypt::verify("not-a-real-password", DUMMY_HASH).unwrap());
    }

    /// Hashes imported from Go Synkronus carry the `$2a$` prefix (docs/api.md §19.2).
    #[test]
    fn go_style_2a_hashes_verify() {
        let hash =
            bcrypt::hash_with_result("go-password", 4).unwrap().format_for_version(bcrypt::Version::TwoA);
        assert!(hash.starts_with("$2a$04$"));
        assert!(bcrypt::verify("go-password", &hash).unwrap());
        assert!(!bcrypt::verify("other", &hash).unwrap());
    }

    #[test]
    fn bearer_parsing() {
        assert_eq!(bearer_token(Some("Bearer abc")), Some("abc"));
        assert_eq!(bearer_token(Some("bearer   abc ")), Some("abc"));
        assert_eq!(bearer_token(Some("Basic abc")), None);
        assert_eq!(bearer_token(Some("Bearer ")), None);
        assert_eq!(bearer_token(None), None);
    }
}
