//! Settings that only the test suite may use, kept out of the operators' table: they trade a
//! production guarantee for test speed. A debug build (what `cargo test` runs, in process or as a
//! child) honours them; a release build refuses to start when one is set, naming it, so none can
//! weaken a deployed server by accident.

use super::{invalid, Config, ConfigError};
use crate::domain::user::BCRYPT_COST;

/// Lowers the bcrypt cost of new password hashes (4 to 12): spawned test servers hash the
/// initial admin's password and tests create users by the hundred, at 0.25 s a hash at cost 12.
pub const BCRYPT_COST_VAR: &str = "SYNKRONUS_TEST_BCRYPT_COST";
/// bcrypt's own lower bound.
const MIN_BCRYPT_COST: u32 = 4;

pub(super) fn apply(
    config: &mut Config,
    lookup: &impl Fn(&str) -> Option<String>,
) -> Result<(), ConfigError> {
    let Some(raw) = lookup(BCRYPT_COST_VAR) else { return Ok(()) };
    if !cfg!(debug_assertions) {
        return Err(invalid(BCRYPT_COST_VAR, "is for the test suite only; a release build refuses it"));
    }
    match raw.trim().parse::<u32>() {
        Ok(cost) if (MIN_BCRYPT_COST..=BCRYPT_COST).contains(&cost) => {
            config.password_hash_cost = cost;
            Ok(())
        }
        _ => Err(invalid(BCRYPT_COST_VAR, format!("must be between {MIN_BCRYPT_COST} and {BCRYPT_COST}"))),
    }
}
