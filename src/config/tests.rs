use std::collections::HashMap;

use secrecy::ExposeSecret;

use super::*;

const SECRET: &str = "0123456789abcdef0123456789abcdef";

fn load(pairs: &[(&str, &str)]) -> Result<Config, ConfigError> {
    let mut env: HashMap<String, String> =
        [("JWT_SECRET", SECRET), ("DB_CONNECTION", "postgres://u:p@localhost:5432/db")]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
    for (k, v) in pairs {
        env.insert(k.to_string(), v.to_string());
    }
    Config::from_lookup(|k| env.get(k).cloned())
}

/// Without `DB_CONNECTION` (the embedded database) and without `var`.
fn load_without(var: &str, pairs: &[(&str, &str)]) -> Result<Config, ConfigError> {
    let env: HashMap<&str, &str> = [("JWT_SECRET", SECRET)]
        .into_iter()
        .chain(pairs.iter().copied())
        .filter(|(k, _)| *k != var)
        .collect();
    Config::from_lookup(|k| env.get(k).map(|v| v.to_string()))
}

/// The value is refused, and the one-line message names the variable.
fn refused(pairs: &[(&str, &str)], var: &str) {
    let err = load(pairs).expect_err(&format!("{pairs:?} should be refused"));
    assert_eq!(err.var, var, "{err}");
    let line = err.to_string();
    assert!(line.starts_with(&format!("{var}: ")), "{line}");
    assert!(!line.contains('\n'), "{line}");
}

#[test]
fn defaults() {
    let c = load_without("DB_CONNECTION", &[]).expect("defaults");
    assert_eq!(c.port, 8080);
    assert_eq!(c.bind_address, IpAddr::from([0, 0, 0, 0]));
    assert!(c.node_id.ends_with(":8080") && c.node_id.len() > 5, "{}", c.node_id);
    assert!(
        matches!(&c.database, DatabaseConfig::Embedded { pg_run_as, pg_bin_dir: None } if pg_run_as == "postgres")
    );
    assert_eq!(c.db_pool_size, 16);
    assert_eq!(c.jwt_secret.as_ref().map(|k| k.expose_secret()), Some(SECRET.as_bytes()));
    assert_eq!(c.jwt_ttl, Duration::from_secs(3600));
    assert_eq!(c.refresh_ttl, Duration::from_secs(2_592_000));
    assert_eq!(c.log_level, "info");
    assert_eq!(c.log_format, LogFormat::Text);
    assert!(c.data_root.is_absolute() && c.data_root.ends_with("data"));
    assert_eq!(c.app_bundle_path, c.data_root.join("app-bundles"));
    assert_eq!(c.attachments_path, c.data_root.join("attachments"));
    assert_eq!(c.max_versions_kept, 5);
    assert_eq!(c.admin_username, "admin");
    assert_eq!(c.admin_password.expose_secret(), "admin");
    assert!(c.uses_default_admin_password());
    assert_eq!(c.public_url, None);
    assert!(c.trusted_proxies.is_empty());
    assert_eq!(c.cors_allowed_origins, ["*"]);
    assert_eq!(c.max_json_body_bytes, 33_554_432);
    assert_eq!(c.max_inflight_body_bytes, 536_870_912);
    assert_eq!(c.max_attachment_bytes, 67_108_864);
    assert_eq!(c.record_validation, RecordValidation::Warn);
    assert_eq!(c.rate_limit_login_per_min, 10);
    assert_eq!(c.rate_limit_per_user_per_sec, 0);
    assert_eq!(c.export_max_concurrent, 2);
    assert_eq!(c.transmission_retention_days, 30);
    assert_eq!(c.metrics_port, None);
}

#[test]
fn jwt_secret_is_at_least_32_bytes_and_required_only_with_db_connection() {
    refused(&[("JWT_SECRET", &"x".repeat(31))], "JWT_SECRET");
    // Bytes, not characters: 11 three-byte characters are 33 bytes.
    assert!(load(&[("JWT_SECRET", &"€".repeat(11))]).is_ok());
    let key = load(&[("JWT_SECRET", &"x".repeat(32))]).expect("32 bytes").signing_key().expect("key");
    assert_eq!((key.0.expose_secret(), key.1), ("x".repeat(32).as_bytes(), jwt_secret::Source::Variable));

    // Empty is unset; with DB_CONNECTION, the server cannot start and the line says why.
    let external = load(&[("JWT_SECRET", "")]).expect("parses: only serving needs the key");
    let err = external.signing_key().expect_err("no key with DB_CONNECTION");
    assert_eq!(err.var, "JWT_SECRET");
    let line = err.to_string();
    assert!(line.starts_with("JWT_SECRET: is required with DB_CONNECTION") && !line.contains('\n'), "{line}");
    assert!(line.contains("same secret"), "{line}");

    // On the embedded database, the data root's file.
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().display().to_string();
    let embedded = load_without("JWT_SECRET", &[("DATA_ROOT", &root)]).expect("embedded");
    let (generated, source) = embedded.signing_key().expect("generated");
    assert_eq!(source, jwt_secret::Source::Generated(dir.path().join("jwt-secret")));
    let (read, source) = embedded.signing_key().expect("read back");
    assert_eq!(source, jwt_secret::Source::ReadFrom(dir.path().join("jwt-secret")));
    assert_eq!(read.expose_secret(), generated.expose_secret());
}

#[test]
fn the_probe_reads_only_the_listen_address() {
    let probe = |pairs: &[(&str, &str)]| {
        let env: HashMap<String, String> =
            pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        probe_address(|k| env.get(k).cloned())
    };
    // Nothing else is read: no JWT_SECRET, a broken variable the server alone needs.
    assert_eq!(probe(&[("LOG_LEVEL", "loud")]).expect("defaults"), "127.0.0.1:8080".parse().unwrap());
    assert_eq!(
        probe(&[("PORT", "9001"), ("BIND_ADDRESS", "::")]).expect("v6"),
        "[::1]:9001".parse().unwrap()
    );
    assert_eq!(
        probe(&[("BIND_ADDRESS", "10.1.2.3")]).expect("given"),
        "10.1.2.3:8080".parse::<SocketAddr>().unwrap()
    );
    assert_eq!(probe(&[("PORT", "http")]).expect_err("bad port").var, "PORT");
}

#[test]
fn db_connection_accepts_urls_and_key_value_strings() {
    for conn in [
        "postgres://u:p@db.example:5432/synkronus?sslmode=disable",
        "postgresql://u@localhost/synkronus?sslmode=require&connect_timeout=3",
        "host=db user=u password=p dbname=synkronus sslmode=require",
        "host=/var/run/postgresql user=u dbname=x connect_timeout=10 sslmode=prefer",
    ] {
        let c = load(&[("DB_CONNECTION", conn)]).unwrap_or_else(|e| panic!("{conn}: {e}"));
        assert!(matches!(&c.database, DatabaseConfig::External(s) if s.expose_secret() == conn));
    }
    for conn in ["postgres://u@h:notaport/db", "host=db sslmode=sometimes", "host='unterminated", "nonsense"]
    {
        refused(&[("DB_CONNECTION", conn)], "DB_CONNECTION");
    }
    // Empty means unset: the embedded database.
    let c = load(&[("DB_CONNECTION", "  "), ("PG_RUN_AS", "pg"), ("PG_BIN_DIR", "/opt/pg/bin")])
        .expect("embedded");
    assert!(matches!(&c.database, DatabaseConfig::Embedded { pg_run_as, pg_bin_dir: Some(d) }
        if pg_run_as == "pg" && d == std::path::Path::new("/opt/pg/bin")));
}

#[test]
fn numbers_and_ranges() {
    assert_eq!(load(&[("PORT", "65535")]).expect("port").port, 65535);
    assert_eq!(load(&[("PORT", " 1 ")]).expect("port").port, 1);
    for v in ["0", "65536", "-1", "http", ""] {
        refused(&[("PORT", v)], "PORT");
    }
    for v in ["2", "100"] {
        assert!(load(&[("DB_POOL_SIZE", v)]).is_ok());
    }
    for v in ["1", "0", "x"] {
        refused(&[("DB_POOL_SIZE", v)], "DB_POOL_SIZE");
    }
    // Sync reads' share, rounded up; the two pools together hold DB_POOL_SIZE.
    for (size, sync, others) in [("2", 1, 1), ("5", 3, 2), ("16", 8, 8)] {
        let shares = load(&[("DB_POOL_SIZE", size)]).expect("pool size").request_connections();
        assert_eq!(shares, super::RequestConnections { sync, others }, "DB_POOL_SIZE={size}");
    }
    assert_eq!(load(&[]).expect("defaults").request_body_timeout, Duration::from_secs(30));
    for v in ["0", "-1", "x"] {
        refused(&[("REQUEST_BODY_TIMEOUT_SECONDS", v)], "REQUEST_BODY_TIMEOUT_SECONDS");
    }
    for var in ["JWT_TTL_SECONDS", "REFRESH_TTL_SECONDS"] {
        assert!(load(&[(var, "1")]).is_ok());
        for v in ["0", "-5", "1h", "1.5"] {
            refused(&[(var, v)], var);
        }
    }
    assert_eq!(load(&[("JWT_TTL_SECONDS", "86400")]).expect("ttl").jwt_ttl, Duration::from_secs(86400));
    for v in ["0", "-1", "x"] {
        refused(&[("MAX_VERSIONS_KEPT", v)], "MAX_VERSIONS_KEPT");
    }
    assert_eq!(load(&[("MAX_VERSIONS_KEPT", "1")]).expect("kept").max_versions_kept, 1);
    for v in ["0", "big"] {
        refused(&[("MAX_JSON_BODY_BYTES", v)], "MAX_JSON_BODY_BYTES");
    }
    refused(&[("MAX_ATTACHMENT_BYTES", "-1")], "MAX_ATTACHMENT_BYTES");
    refused(&[("EXPORT_MAX_CONCURRENT", "0")], "EXPORT_MAX_CONCURRENT");
    refused(&[("RATE_LIMIT_LOGIN_PER_MIN", "-1")], "RATE_LIMIT_LOGIN_PER_MIN");
    refused(&[("RATE_LIMIT_PER_USER_PER_SEC", "lots")], "RATE_LIMIT_PER_USER_PER_SEC");
    refused(&[("TRANSMISSION_RETENTION_DAYS", "-3")], "TRANSMISSION_RETENTION_DAYS");
    assert_eq!(load(&[("RATE_LIMIT_LOGIN_PER_MIN", "0")]).expect("off").rate_limit_login_per_min, 0);
    for v in ["0", "70000", "x"] {
        refused(&[("METRICS_PORT", v)], "METRICS_PORT");
    }
    assert_eq!(load(&[("METRICS_PORT", "9100")]).expect("metrics").metrics_port, Some(9100));
    assert_eq!(load(&[("METRICS_PORT", "")]).expect("metrics").metrics_port, None);
    assert_eq!(load(&[]).expect("no export").otlp_traces_endpoint, None);
    let base = load(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/")]).expect("otlp");
    assert_eq!(base.otlp_traces_endpoint.as_deref(), Some("http://collector:4318/v1/traces"));
    let full = load(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"),
        ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://other:9000/spans"),
    ])
    .expect("otlp traces");
    assert_eq!(full.otlp_traces_endpoint.as_deref(), Some("http://other:9000/spans"));
    refused(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "https://collector:4318")], "OTEL_EXPORTER_OTLP_ENDPOINT");
    refused(
        &[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "collector:4318")],
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    );
}

#[test]
fn enumerations() {
    for v in ["trace", "debug", "info", "warn", "error", "WARN"] {
        assert!(load(&[("LOG_LEVEL", v)]).is_ok(), "{v}");
    }
    refused(&[("LOG_LEVEL", "loud")], "LOG_LEVEL");
    assert_eq!(load(&[("LOG_FORMAT", "JSON")]).expect("json").log_format, LogFormat::Json);
    refused(&[("LOG_FORMAT", "xml")], "LOG_FORMAT");
    for (v, expected) in [
        ("off", RecordValidation::Off),
        ("warn", RecordValidation::Warn),
        ("Reject", RecordValidation::Reject),
    ] {
        assert_eq!(load(&[("RECORD_VALIDATION", v)]).expect("validation").record_validation, expected);
    }
    refused(&[("RECORD_VALIDATION", "strict")], "RECORD_VALIDATION");
}

#[test]
fn addresses_urls_proxies_and_origins() {
    assert_eq!(load(&[("BIND_ADDRESS", "::1")]).expect("v6").bind_address, "::1".parse::<IpAddr>().unwrap());
    refused(&[("BIND_ADDRESS", "localhost")], "BIND_ADDRESS");
    assert_eq!(load(&[("NODE_ID", " node-a ")]).expect("node").node_id, "node-a");
    assert!(load(&[("NODE_ID", "db1:9000"), ("PORT", "9000")]).is_ok());
    assert!(load(&[("PORT", "9001")]).expect("port").node_id.ends_with(":9001"));
    refused(&[("NODE_ID", "node a")], "NODE_ID");
    refused(&[("NODE_ID", &"n".repeat(101))], "NODE_ID");
    let c = load(&[("PUBLIC_URL", "https://sync.example.org/synk/")]).expect("public url");
    assert_eq!(c.public_url.as_deref(), Some("https://sync.example.org/synk"));
    assert_eq!(load(&[("PUBLIC_URL", "")]).expect("empty").public_url, None);
    refused(&[("PUBLIC_URL", "sync.example.org")], "PUBLIC_URL");
    let c = load(&[("TRUSTED_PROXIES", "10.0.0.0/8, 192.168.1.1 ,,::1")]).expect("proxies");
    assert_eq!(c.trusted_proxies.len(), 3);
    assert!(c.trusted_proxies[1].contains(&"192.168.1.1".parse::<IpAddr>().unwrap()));
    refused(&[("TRUSTED_PROXIES", "10.0.0.0/33")], "TRUSTED_PROXIES");
    refused(&[("TRUSTED_PROXIES", "proxy.local")], "TRUSTED_PROXIES");
    let c = load(&[("CORS_ALLOWED_ORIGINS", "https://a.example/, https://b.example ,")]).expect("origins");
    assert_eq!(c.cors_allowed_origins, ["https://a.example", "https://b.example"]);
}

#[test]
fn paths_and_admin() {
    let c = load(&[("DATA_ROOT", "/srv/synk"), ("ATTACHMENTS_PATH", "/mnt/att")]).expect("paths");
    assert_eq!(c.data_root, PathBuf::from("/srv/synk"));
    assert_eq!(c.app_bundle_path, PathBuf::from("/srv/synk/app-bundles"));
    assert_eq!(c.attachments_path, PathBuf::from("/mnt/att"));
    let c = load(&[("APP_BUNDLE_PATH", "bundles")]).expect("relative");
    assert!(c.app_bundle_path.is_absolute() && c.app_bundle_path.ends_with("bundles"));

    let c = load(&[("ADMIN_USERNAME", "boss"), ("ADMIN_PASSWORD", "pw")]).expect("admin");
    assert_eq!((c.admin_username.as_str(), c.admin_password.expose_secret()), ("boss", "pw"));
    assert!(!c.uses_default_admin_password());
    for v in ["", "a/b", " lead"] {
        refused(&[("ADMIN_USERNAME", v)], "ADMIN_USERNAME");
    }
    refused(&[("ADMIN_PASSWORD", "")], "ADMIN_PASSWORD");
}

/// The README's table, from its header row to the first line that is not a table row.
fn readme_table() -> String {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).expect("README");
    let start =
        readme.find("| Variable | Default | Meaning |").expect("the README has a configuration table");
    readme[start..].lines().take_while(|l| l.starts_with('|')).map(|l| format!("{l}\n")).collect()
}

#[test]
fn the_readme_table_is_the_variable_table() {
    let rendered = render_markdown_table();
    assert!(
        readme_table() == rendered,
        "README.md's configuration table differs from src/config/table.rs; it should read:\n\n{rendered}"
    );
}

#[test]
fn every_default_is_accepted_by_its_own_parser() {
    // `load` sets only what has no default; every other variable goes through its default.
    let c = load(&[]).expect("defaults parse");
    assert_eq!(c.password_hash_cost, crate::domain::user::BCRYPT_COST);
    let names: Vec<&str> = VARIABLES.iter().map(|v| v.name).collect();
    let mut distinct = names.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(distinct.len(), names.len(), "a variable is listed twice: {names:?}");
}

#[test]
fn the_test_only_bcrypt_cost_can_only_be_lowered() {
    let var = test_only::BCRYPT_COST_VAR;
    assert_eq!(load(&[(var, "4")]).expect("cost 4").password_hash_cost, 4);
    assert_eq!(load(&[(var, "12")]).expect("cost 12").password_hash_cost, 12);
    for v in ["3", "13", "fast"] {
        refused(&[(var, v)], var);
    }
}

#[test]
fn the_audited_configuration_is_every_variable_of_the_table_without_secrets() {
    let secrets = [
        ("JWT_SECRET", SECRET),
        ("ADMIN_PASSWORD", "hunter2-secret"),
        ("DB_CONNECTION", "postgres://u:pg-password@localhost:5432/db"),
        ("DB_READ_REPLICAS", "host=replica user=u password=replica-password"),
        ("AWS_ACCESS_KEY_ID", "AKIAEXAMPLEKEYID"),
        ("AWS_SECRET_ACCESS_KEY", "aws-secret-value"),
        ("AWS_SESSION_TOKEN", "aws-session-value"),
    ];
    let c = load(&secrets).expect("config");
    let shown = c.without_secrets();
    let text = shown.to_string();
    for (var, value) in secrets {
        assert!(!text.contains(value), "{var}: {text}");
        assert_eq!(shown[var], table::REDACTED, "{var}");
    }
    // Every variable, by name; a secret rendered the same whatever its value.
    for variable in VARIABLES {
        assert!(shown.get(variable.name).is_some(), "{} is missing: {text}", variable.name);
        assert_eq!(variable.secret, secrets.iter().any(|(v, _)| *v == variable.name), "{}", variable.name);
    }
    assert_eq!(shown.as_object().map(|o| o.len()), Some(VARIABLES.len()));
    assert_eq!(shown["AUDIT_RETENTION_DAYS"], "365", "a default");
    assert_eq!(shown["STORAGE_URL"], serde_json::Value::Null, "unset");
    let c = load(&[("MAX_VERSIONS_KEPT", "7")]).expect("config");
    assert_eq!(c.without_secrets()["MAX_VERSIONS_KEPT"], "7", "given");
    assert_eq!(
        load_without("JWT_SECRET", &[]).expect("embedded").without_secrets()["JWT_SECRET"],
        serde_json::Value::Null
    );
}

/// The configuration is read by every layer, so it reads none of them: the only modules it
/// uses are the database's connection-string parser and the domain's rules.
#[test]
fn config_is_a_leaf() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = vec![root.join("config.rs")];
    for entry in std::fs::read_dir(root.join("config")).expect("src/config") {
        files.push(entry.expect("entry").path());
    }
    for file in files {
        let text = std::fs::read_to_string(&file).expect("source");
        let path_of_this_crate = concat!("crate", "::");
        for (at, _) in text.match_indices(path_of_this_crate) {
            let rest = &text[at + path_of_this_crate.len()..];
            assert!(
                rest.starts_with("db::parse_connection") || rest.starts_with("domain::user::"),
                "{} reaches into {}",
                file.display(),
                rest.lines().next().unwrap_or_default()
            );
        }
    }
}

#[test]
fn debug_output_hides_secrets() {
    let c = load(&[
        ("ADMIN_PASSWORD", "hunter2-secret"),
        ("AWS_SECRET_ACCESS_KEY", "aws-secret-value"),
        ("DB_READ_REPLICAS", "host=replica password=replica-password"),
    ])
    .expect("config");
    let shown = format!("{c:?}");
    for secret in [SECRET, "hunter2-secret", "aws-secret-value", "replica-password", "u:p@localhost"] {
        assert!(!shown.contains(secret), "{secret}: {shown}");
    }
}
