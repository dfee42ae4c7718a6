//! Structured shutdown (docs/operations.md, "Stopping"), through the real binary: on SIGTERM,
//! `/ready` answers 503 at once while the request in flight is answered, then the process exits
//! within its deadlines.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::helpers::ChildServer;

/// The body budget's gauge (bytes of request bodies being read), once it is above zero: the
/// server is reading the body of a request.
async fn wait_until_a_body_is_being_read(server: &ChildServer, token: &str) {
    let started = Instant::now();
    loop {
        let res = server.client.get(server.url("/metrics")).bearer_auth(token).send().await.expect("scrape");
        let text = res.text().await.expect("metrics text");
        let held = text
            .lines()
            .find(|l| l.starts_with("synkronus_body_budget_in_use_bytes"))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0);
        if held > 0.0 {
            return;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "the push's body is not being read");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[actix_web::test]
async fn sigterm_answers_the_request_in_flight_while_ready_says_503_then_exits() {
    let mut server = ChildServer::spawn(&[("LOG_LEVEL", "info")]).await;
    let token = server.admin_token().await;

    // A push whose body is half sent: in flight until the rest arrives.
    let body = r#"{"client_id":"dev-drain","transmission_id":"drain-1","records":[{"observation_id":"drained","form_type":"survey","form_version":"1","data":{"answer":42}}]}"#;
    let (first, rest) = body.split_at(body.len() / 2);
    let addr = server.base.trim_start_matches("http://").to_string();
    let mut push = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let head = format!(
        "POST /sync/push HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{first}",
        body.len()
    );
    push.write_all(head.as_bytes()).await.expect("send the head and half the body");
    wait_until_a_body_is_being_read(&server, &token).await;

    let signalled = Instant::now();
    server.signal(nix::sys::signal::Signal::SIGTERM);
    // Not ready at once, while still answering (a refused connection would not be a 503).
    loop {
        let ready = server.client.get(server.url("/ready")).send().await.expect("the server still answers");
        if ready.status() == StatusCode::SERVICE_UNAVAILABLE {
            break;
        }
        assert_eq!(ready.status(), StatusCode::OK);
        assert!(signalled.elapsed() < Duration::from_secs(2), "/ready still answers 200 after SIGTERM");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let not_ready_after = signalled.elapsed();
    let health = server.client.get(server.url("/health")).send().await.expect("health during the drain");
    assert_eq!(health.status(), StatusCode::OK, "requests are still answered during the drain");
    assert!(server.is_running(), "the process waits for the request in flight");

    // The request in flight completes, whole.
    push.write_all(rest.as_bytes()).await.expect("send the rest of the body");
    let mut answer = String::new();
    push.read_to_string(&mut answer).await.expect("the push's answer");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");

    // Then the process exits by itself, within its deadlines (20 s drain + 5 s close + 5 s tasks).
    let completed = Instant::now();
    let status = server.exit_status(Duration::from_secs(30)).await;
    let exited_after = completed.elapsed();
    assert!(status.success(), "exit status {status}: {}", server.log_text());
    eprintln!("SIGTERM: /ready 503 after {not_ready_after:?}; exited {exited_after:?} after the last answer");
    let log = server.log_text();
    assert!(log.contains("stopping: /ready answers 503"), "{log}");
    assert!(log.contains("stopped") && !log.contains("did not stop"), "{log}");
    let stored = crate::helpers::connect(&server.db_conn)
        .await
        .query_one("SELECT count(*) FROM records WHERE id = 'drained'", &[])
        .await
        .map(|row| row.get::<_, i64>(0));
    assert_eq!(stored.ok(), Some(1), "the answered push was committed");
}
