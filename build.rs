//! Records the commit, build time and compiler for `GET /version`.
use std::process::Command;

fn main() {
    let run = |cmd: &str, args: &[&str]| {
        Command::new(cmd)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .filter(|s| !s.is_empty())
    };
    // A build without .git (the container image's) is told the commit instead.
    let commit = std::env::var("SYNKRONUS_GIT_COMMIT")
        .ok()
        .filter(|c| !c.is_empty() && c != "unknown")
        .or_else(|| run("git", &["rev-parse", "--short", "HEAD"]))
        .unwrap_or_else(|| "unknown".into());
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let rustc_version = run(&rustc, &["--version"])
        .and_then(|v| v.split_whitespace().take(2).collect::<Vec<_>>().join(" ").into())
        .unwrap_or_else(|| "unknown".into());
    let build_time = run("date", &["-u", "+%Y-%m-%dT%H:%M:%SZ"]).unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=SYNKRONUS_GIT_COMMIT={commit}");
    println!("cargo:rustc-env=SYNKRONUS_RUSTC_VERSION={rustc_version}");
    println!("cargo:rustc-env=SYNKRONUS_BUILD_TIME={build_time}");
    println!("cargo:rerun-if-env-changed=SYNKRONUS_GIT_COMMIT");
    println!("cargo:rerun-if-changed=.git/HEAD");
    println!("cargo:rerun-if-changed=.git/refs/heads");
}
