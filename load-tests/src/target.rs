//! Target validation: which base URLs and database hosts the tool may hit.
//!
//! A load generator pointed at the wrong host is a denial-of-service tool, so by default only
//! loopback targets are accepted and anything else needs an explicit `--allow-remote`.

use anyhow::{bail, Context, Result};
use std::net::IpAddr;
use url::{Host, Url};

/// A validated server base URL, kept without a trailing slash so paths can be appended directly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BaseUrl(String);

impl BaseUrl {
    /// Joins an absolute API path (`/sync/pull`) onto the base, keeping any base path prefix
    /// (`http://host/api` + `/sync/pull`).
    pub fn join(&self, path: &str) -> String {
        format!("{}{}", self.0, path)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Parses and validates `--base-url`.
pub fn check_base_url(raw: &str, allow_remote: bool) -> Result<BaseUrl> {
    let url = Url::parse(raw.trim()).with_context(|| format!("invalid --base-url {raw:?}"))?;
    match url.scheme() {
        "http" => {}
        "https" if cfg!(feature = "tls") => {}
        "https" => {
            bail!("https base URLs need the `tls` cargo feature (build with --features tls)")
        }
        other => bail!("unsupported scheme {other:?} in --base-url (use http)"),
    }
    if url.query().is_some() || url.fragment().is_some() {
        bail!("--base-url must not carry a query or fragment");
    }
    let host = url.host().ok_or_else(|| anyhow::anyhow!("--base-url has no host"))?;
    if !allow_remote && !host_is_loopback(&host) {
        bail!("refusing non-loopback target {}: pass --allow-remote to load-test a remote server", host);
    }
    let mut s = url.as_str().to_string();
    while s.ends_with('/') {
        s.pop();
    }
    Ok(BaseUrl(s))
}

fn host_is_loopback(host: &Host<&str>) -> bool {
    match host {
        Host::Domain(d) => name_is_loopback(d),
        Host::Ipv4(ip) => ip.is_loopback(),
        Host::Ipv6(ip) => ip.is_loopback(),
    }
}

/// `localhost` (and `*.localhost`, which RFC 6761 reserves for loopback) or a loopback literal.
pub fn name_is_loopback(name: &str) -> bool {
    let lower = name.trim_end_matches('.').to_ascii_lowercase();
    if lower == "localhost" || lower.ends_with(".localhost") {
        return true;
    }
    let bare = lower.trim_start_matches('[').trim_end_matches(']');
    bare.parse::<IpAddr>().map(|ip| ip.is_loopback()).unwrap_or(false)
}

/// Validates the hosts of a PostgreSQL connection config: Unix-socket directories are local by
/// construction; TCP hosts must be loopback unless remote targets are allowed.
pub fn check_db_hosts(config: &tokio_postgres::Config, allow_remote: bool) -> Result<()> {
    if allow_remote {
        return Ok(());
    }
    for host in config.get_hosts() {
        match host {
            tokio_postgres::config::Host::Tcp(name) => {
                if !name_is_loopback(name) {
                    bail!("refusing non-loopback database host {name:?}: pass --allow-remote");
                }
            }
            #[cfg(unix)]
            tokio_postgres::config::Host::Unix(_) => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_urls_accepted_and_normalised() {
        let b = check_base_url("http://127.0.0.1:8080/", false).unwrap();
        assert_eq!(b.as_str(), "http://127.0.0.1:8080");
        assert_eq!(b.join("/sync/pull"), "http://127.0.0.1:8080/sync/pull");
        let b = check_base_url("http://localhost:18080/api/", false).unwrap();
        assert_eq!(b.join("/sync/pull"), "http://localhost:18080/api/sync/pull");
        assert!(check_base_url("http://[::1]:8080", false).is_ok());
        assert!(check_base_url("http://127.8.9.10", false).is_ok());
        assert!(check_base_url("http://app.localhost:80", false).is_ok());
    }

    #[test]
    fn remote_urls_need_allow_remote() {
        assert!(check_base_url("http://10.0.0.5:8080", false).is_err());
        assert!(check_base_url("http://example.org", false).is_err());
        assert!(check_base_url("http://localhost.example.org", false).is_err());
        assert!(check_base_url("http://example.org", true).is_ok());
    }

    #[test]
    fn bad_urls_rejected() {
        assert!(check_base_url("ftp://127.0.0.1", false).is_err());
        assert!(check_base_url("127.0.0.1:8080", false).is_err());
        assert!(check_base_url("http://127.0.0.1:8080/?x=1", false).is_err());
        assert!(check_base_url("not a url", false).is_err());
    }

    #[test]
    fn db_hosts_checked() {
        let local: tokio_postgres::Config = "host=127.0.0.1 user=u dbname=d".parse().unwrap();
        assert!(check_db_hosts(&local, false).is_ok());
        let sock: tokio_postgres::Config = "host=/tmp/srv/postgres user=u".parse().unwrap();
        assert!(check_db_hosts(&sock, false).is_ok());
        let url: tokio_postgres::Config = "postgres://u:p@localhost:5432/db".parse().unwrap();
        assert!(check_db_hosts(&url, false).is_ok());
        let remote: tokio_postgres::Config = "host=db.example.org user=u".parse().unwrap();
        assert!(check_db_hosts(&remote, false).is_err());
        assert!(check_db_hosts(&remote, true).is_ok());
    }
}
