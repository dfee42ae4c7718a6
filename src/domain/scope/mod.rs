//! Scoped sync (docs/api.md §20): which records each user receives. Pure rules: parsing the scope
//! set and user attributes, the keys records and users meet in, and what changes when either
//! changes. The storage and delivery of those keys is `db::scope`; why it keeps the pull
//! protocol's guarantees is docs/architecture.md, "Scoped sync".

pub mod attributes;
pub mod extract;
pub mod keys;
pub mod refs;
pub mod rules;

pub use attributes::UserAttributes;
pub use keys::{changed_keys, personal_key, Family, KeyPlan, Touched, UserFacts, Visibility, ALL};
pub use rules::ScopeRules;
