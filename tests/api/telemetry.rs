//! Spans exported to an OpenTelemetry collector (docs/operations.md, "Tracing"): the server binary
//! with `OTEL_EXPORTER_OTLP_ENDPOINT` pointing at a receiver in this test, which decodes the
//! OTLP/HTTP protobuf export the way a collector does.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix_web::{web, App, HttpResponse, HttpServer};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use reqwest::StatusCode;
use serde_json::json;

use crate::helpers::ChildServer;

/// What the receiver got: every span, and the resources' attributes.
#[derive(Default)]
struct Received {
    spans: Vec<Span>,
    resource: HashMap<String, String>,
}

/// An OTLP/HTTP receiver on a free port: `POST /v1/traces` with a protobuf body.
async fn receiver() -> (String, Arc<Mutex<Received>>, actix_web::dev::ServerHandle) {
    let received = Arc::new(Mutex::new(Received::default()));
    let data = web::Data::from(Arc::clone(&received));
    let server = HttpServer::new(move || {
        App::new().app_data(data.clone()).route(
            "/v1/traces",
            web::post().to(|body: web::Bytes, into: web::Data<Mutex<Received>>| async move {
                let request = ExportTraceServiceRequest::decode(body).expect("an OTLP protobuf export");
                let mut into = into.lock().unwrap();
                for resource_spans in request.resource_spans {
                    for kv in resource_spans.resource.map(|r| r.attributes).unwrap_or_default() {
                        into.resource.insert(kv.key.clone(), text(&kv.value));
                    }
                    for scope in resource_spans.scope_spans {
                        into.spans.extend(scope.spans);
                    }
                }
                HttpResponse::Ok().content_type("application/x-protobuf").finish()
            }),
        )
    })
    .workers(1)
    .bind("127.0.0.1:0")
    .expect("bind the receiver");
    let url = format!("http://{}", server.addrs()[0]);
    let server = server.run();
    let handle = server.handle();
    actix_web::rt::spawn(server);
    (url, received, handle)
}

fn text(value: &Option<opentelemetry_proto::tonic::common::v1::AnyValue>) -> String {
    match value.as_ref().and_then(|v| v.value.as_ref()) {
        Some(AnyValue::StringValue(s)) => s.clone(),
        Some(AnyValue::IntValue(i)) => i.to_string(),
        Some(AnyValue::BoolValue(b)) => b.to_string(),
        other => format!("{other:?}"),
    }
}

fn attribute(span: &Span, key: &str) -> Option<String> {
    span.attributes.iter().find(|kv| kv.key == key).map(|kv| text(&kv.value))
}

/// The span of the request with `request_id`, and whether some span named `child` descends from
/// it (its own trace, parent by parent).
fn request_with_descendant(spans: &[Span], request_id: &str, child: &str) -> Option<bool> {
    let request = spans
        .iter()
        .find(|s| s.name == "request" && attribute(s, "request_id").as_deref() == Some(request_id))?;
    let by_id: HashMap<&[u8], &Span> = spans.iter().map(|s| (s.span_id.as_slice(), s)).collect();
    Some(
        spans
            .iter()
            .filter(|s| s.name == child)
            .any(|s| s.trace_id == request.trace_id && descends(&by_id, s, &request.span_id)),
    )
}

fn descends<'a>(by_id: &HashMap<&[u8], &'a Span>, mut span: &'a Span, ancestor: &[u8]) -> bool {
    loop {
        if span.span_id == ancestor {
            return true;
        }
        match by_id.get(span.parent_span_id.as_slice()) {
            Some(parent) => span = parent,
            None => return false,
        }
    }
}

/// A request's span carries its request id, and the database, storage and actor calls made for it
/// arrive as its descendants, in the same trace; a group commit's span lists the request ids of
/// its pushes and links to their spans; the resource names the service and the node.
#[actix_web::test]
async fn spans_reach_an_otlp_collector_with_their_request_and_database_calls() {
    let (url, received, receiver) = receiver().await;
    let server = ChildServer::spawn(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", &url),
        ("OTEL_SERVICE_NAME", "synkronus-under-test"),
        ("NODE_ID", "node-otel"),
        // The SDK's batch delay, read by the SDK itself: the test need not wait 5 s for a batch.
        ("OTEL_BSP_SCHEDULE_DELAY", "100"),
    ])
    .await;
    let admin = server.admin_token().await;
    let with_id = |method: reqwest::Method, path: &str, id: &str| {
        server.client.request(method, server.url(path)).bearer_auth(&admin).header("x-request-id", id)
    };
    let res = with_id(reqwest::Method::GET, "/stats/observations", "otel-stats").send().await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let res = with_id(reqwest::Method::PUT, "/attachments/otel.bin", "otel-upload")
        .body(b"traced".to_vec())
        .send()
        .await
        .unwrap();
    assert!(res.status().is_success(), "{}", res.text().await.unwrap());
    let push = json!({"transmission_id": "t-otel", "client_id": "c", "records": [{"observation_id": "o1", "form_type": "f", "data": {}}]});
    let res = with_id(reqwest::Method::POST, "/sync/push", "otel-push").json(&push).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);

    let expected = [
        ("otel-stats", "db.stats.observation_stats"),
        ("otel-upload", "attachment store: Store"),
        ("otel-upload", "storage.put_file"),
        ("otel-push", "change log: Push"),
    ];
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let missing: Vec<_> = {
            let received = received.lock().unwrap();
            expected
                .iter()
                .filter(|(id, child)| request_with_descendant(&received.spans, id, child) != Some(true))
                .collect()
        };
        if missing.is_empty() {
            break;
        }
        if Instant::now() > deadline {
            let received = received.lock().unwrap();
            let names: Vec<String> = received
                .spans
                .iter()
                .map(|s| format!("{} {:?}", s.name, attribute(s, "request_id")))
                .collect();
            panic!("not exported: {missing:?}; spans: {names:?}; log: {}", server.log_text());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The group commit that answered the push names its request and links to the push's span;
    // the commit's database calls are inside it.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let found = {
            let received = received.lock().unwrap();
            let spans = &received.spans;
            let by_id: HashMap<&[u8], &Span> = spans.iter().map(|s| (s.span_id.as_slice(), s)).collect();
            let push = spans.iter().find(|s| s.name == "change log: Push");
            spans
                .iter()
                .filter(|s| s.name == "group commit")
                .filter(|g| {
                    attribute(g, "request_ids").is_some_and(|ids| ids.split(',').any(|id| id == "otel-push"))
                })
                .any(|group| {
                    let linked = push.is_some_and(|p| group.links.iter().any(|l| l.span_id == p.span_id));
                    let marks = spans
                        .iter()
                        .any(|s| s.name == "db.marks.mark_changes" && descends(&by_id, s, &group.span_id));
                    linked && marks
                })
        };
        if found {
            break;
        }
        assert!(Instant::now() < deadline, "no group commit span for the push; log: {}", server.log_text());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    {
        let received = received.lock().unwrap();
        let resource = |key: &str| received.resource.get(key).cloned();
        assert_eq!(resource("service.name").as_deref(), Some("synkronus-under-test"));
        assert_eq!(resource("service.instance.id").as_deref(), Some("node-otel"));
        let actor =
            received.spans.iter().find(|s| s.name == "attachment store: Store").expect("the actor's span");
        assert_eq!(attribute(actor, "message").as_deref(), Some("Store"), "the span names its message");
    }
    receiver.stop(true).await;
}
