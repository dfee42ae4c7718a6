//! A real S3-compatible server on loopback for the storage tests: moto's server (installed by
//! `make test-deps`), one process per test that needs one, killed when its guard drops.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A running `moto_server`; dropping it stops the process.
pub struct S3Server {
    child: Option<Child>,
    pub port: u16,
    pub endpoint: String,
}

impl S3Server {
    pub async fn start() -> S3Server {
        Self::start_on(super::free_port()).await
    }

    /// On a given port, so a test can stop the store and start it again at the same address.
    pub async fn start_on(port: u16) -> S3Server {
        let child = Command::new("moto_server")
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("moto_server (run `make test-deps`)");
        let server = S3Server { child: Some(child), port, endpoint: format!("http://127.0.0.1:{port}") };
        let client = reqwest::Client::new();
        for _ in 0..300 {
            if client.get(&server.endpoint).send().await.is_ok() {
                return server;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("moto_server did not start on port {port}");
    }

    /// A new bucket with a unique name.
    pub async fn bucket(&self) -> String {
        let name = format!("synk-{}", &uuid::Uuid::new_v4().simple().to_string()[..16]);
        self.create_bucket(&name).await;
        name
    }

    /// Creates `name` (again, after a restart: moto keeps its buckets in memory).
    pub async fn create_bucket(&self, name: &str) {
        let status = reqwest::Client::new()
            .put(format!("{}/{name}", self.endpoint))
            .send()
            .await
            .expect("create bucket")
            .status();
        assert!(status.is_success(), "create bucket: {status}");
    }

    /// The variables that point a server at `bucket` of this store.
    pub fn env(&self, bucket: &str) -> Vec<(String, String)> {
        [
            ("STORAGE_URL", format!("s3://{bucket}")),
            ("AWS_ENDPOINT_URL", self.endpoint.clone()),
            ("AWS_ALLOW_HTTP", "true".to_string()),
            ("AWS_ACCESS_KEY_ID", "test".to_string()),
            ("AWS_SECRET_ACCESS_KEY", "test".to_string()),
            ("AWS_REGION", "us-east-1".to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    /// Freezes the process (SIGSTOP): its port still accepts connections, nothing is answered,
    /// as from a store that hangs; [`S3Server::thaw`] resumes it with its data.
    pub fn freeze(&self) {
        self.signal(nix::sys::signal::Signal::SIGSTOP);
    }

    pub fn thaw(&self) {
        self.signal(nix::sys::signal::Signal::SIGCONT);
    }

    fn signal(&self, signal: nix::sys::signal::Signal) {
        let child = self.child.as_ref().expect("moto_server runs");
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        nix::sys::signal::kill(pid, signal).expect("signal moto_server");
    }

    /// Stops the process (an outage); the data it held is gone.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        self.stop();
    }
}
