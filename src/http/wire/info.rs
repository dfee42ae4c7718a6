//! Service descriptor, health, readiness, versions and status (docs/api.md §5).

use serde::Serialize;
use utoipa::ToSchema;

/// `GET /` at the root: what this server is and where to look next.
#[derive(Serialize, ToSchema)]
pub struct ServiceDescriptor {
    pub api_version: &'static str,
    pub health: &'static str,
    pub openapi: &'static str,
    pub service: &'static str,
    pub version: &'static str,
}

/// `GET /health` while the database answers.
#[derive(Serialize, ToSchema)]
pub struct Health {
    pub database: &'static str,
    /// `NODE_ID`: which node answered (docs/api.md §18.2).
    pub node: String,
    /// Each read replica of `DB_READ_REPLICAS`, in that order (docs/api.md §18.3); absent when
    /// none is configured.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub replicas: Vec<ReplicaHealth>,
    pub status: &'static str,
    /// `up` or `down`: whether the file storage answers (docs/api.md §18.1); never makes /health fail.
    pub storage: &'static str,
    #[schema(format = DateTime)]
    pub timestamp: String,
    pub version: &'static str,
}

/// One read replica as the background checker last saw it. Named by position, not by host:
/// `/health` is public.
#[derive(Serialize, ToSchema)]
pub struct ReplicaHealth {
    /// Replay lag in seconds (0 when everything received is replayed); null when unknown.
    pub lag_seconds: Option<f64>,
    /// `replica-1`, `replica-2`, ... in `DB_READ_REPLICAS` order.
    pub name: String,
    /// `pg_last_wal_replay_lsn()` at the last check.
    pub replay_lsn: Option<String>,
    /// `healthy` (in rotation), `lagging`, `unreachable` or `starting` (not checked yet).
    pub state: &'static str,
}

/// `GET /ready` once start-up is done and the database answers.
#[derive(Serialize, ToSchema)]
pub struct Ready {
    pub status: &'static str,
}

/// `GET /version`. `go_version` names the compiler for clients written against Synkronus 1.0.
#[derive(Serialize, ToSchema)]
pub struct Version {
    pub build: BuildInfo,
    pub build_time: &'static str,
    pub database: DatabaseInfo,
    pub git_commit: &'static str,
    pub go_version: &'static str,
    pub server: ServerInfo,
    pub system: SystemInfo,
    pub version: &'static str,
}

#[derive(Serialize, ToSchema)]
pub struct BuildInfo {
    pub build_time: &'static str,
    pub commit: &'static str,
    pub go_version: &'static str,
}

#[derive(Serialize, ToSchema)]
pub struct DatabaseInfo {
    pub database_name: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub version: String,
}

#[derive(Serialize, ToSchema)]
pub struct ServerInfo {
    pub version: &'static str,
}

#[derive(Serialize, ToSchema)]
pub struct SystemInfo {
    pub architecture: &'static str,
    pub cpus: usize,
    pub os: &'static str,
}

/// `GET /versions`: the API versions this server speaks.
#[derive(Serialize, ToSchema)]
pub struct ApiVersions {
    pub current: &'static str,
    pub versions: Vec<ApiVersionStatus>,
}

#[derive(Serialize, ToSchema)]
pub struct ApiVersionStatus {
    pub status: &'static str,
    pub version: &'static str,
}

/// `GET /status`: counters and the current change_id.
#[derive(Serialize, ToSchema)]
pub struct Status {
    pub active_bundle_version: Option<String>,
    /// Null for a non-admin while a scope set is in force (docs/api.md §20.4).
    pub attachment_count: Option<i64>,
    pub current_change_id: i64,
    pub database: &'static str,
    /// Null for a non-admin while a scope set is in force (docs/api.md §20.4).
    pub observation_count: Option<i64>,
    pub status: &'static str,
    pub uptime_seconds: u64,
    pub version: &'static str,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::wire::tests::assert_map_order;

    #[test]
    fn fields_are_in_map_order() {
        assert_map_order(&ServiceDescriptor {
            api_version: "",
            health: "",
            openapi: "",
            service: "",
            version: "",
        });
        assert_map_order(&ReplicaHealth {
            lag_seconds: None,
            name: String::new(),
            replay_lsn: None,
            state: "",
        });
        assert_map_order(&Health {
            database: "",
            node: String::new(),
            replicas: vec![ReplicaHealth {
                lag_seconds: None,
                name: String::new(),
                replay_lsn: None,
                state: "",
            }],
            status: "",
            storage: "",
            timestamp: String::new(),
            version: "",
        });
        assert_map_order(&Version {
            build: BuildInfo { build_time: "", commit: "", go_version: "" },
            build_time: "",
            database: DatabaseInfo { database_name: String::new(), kind: "", version: String::new() },
            git_commit: "",
            go_version: "",
            server: ServerInfo { version: "" },
            system: SystemInfo { architecture: "", cpus: 1, os: "" },
            version: "",
        });
        assert_map_order(&ApiVersions {
            current: "",
            versions: vec![ApiVersionStatus { status: "", version: "" }],
        });
        assert_map_order(&Status {
            active_bundle_version: None,
            attachment_count: Some(0),
            current_change_id: 0,
            database: "",
            observation_count: Some(0),
            status: "",
            uptime_seconds: 0,
            version: "",
        });
    }
}
