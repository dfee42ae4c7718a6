//! Logging: LOG_LEVEL and LOG_FORMAT (text or one JSON object per line), and the request id every
//! log line and error body of a request carries; with `OTEL_EXPORTER_OTLP_ENDPOINT`, the spans go
//! to an OpenTelemetry collector too (`otlp`).

mod otlp;
pub mod request_id;

use std::fmt::{self, Debug};
use std::sync::{Arc, OnceLock};

use tracing::callsite::{DefaultCallsite, Identifier};
use tracing::dispatcher::WeakDispatch;
use tracing::field::{Field, FieldSet, Visit};
use tracing::metadata::Kind;
use tracing::{Dispatch, Event, Level, Metadata, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, MakeWriter};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::EnvFilter;

use crate::config::{Config, LogFormat};

/// Keeps the span export running; dropping it sends what is still queued and stops the export.
#[must_use = "dropping it stops the span export"]
pub struct Telemetry {
    exporter: Option<otlp::Exporter>,
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Some(exporter) = self.exporter.take() {
            exporter.shut_down();
        }
    }
}

/// Logging at `LOG_LEVEL` in `LOG_FORMAT`, every line naming `NODE_ID` (so the logs of several
/// nodes can be merged), and the span export when an OTLP endpoint is configured. An exporter
/// that cannot be built is reported and logging goes on without it.
pub fn init(config: &Config) -> Telemetry {
    // Also routes the `log` records of dependencies into the same output.
    // Noisy dependencies stay at warn unless RUST_LOG says otherwise.
    let level = &config.log_level;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        EnvFilter::new(format!("{level},actix_server=warn,tokio_postgres=warn,refinery_core=warn"))
    });
    let (exporter, failed) = match &config.otlp_traces_endpoint {
        None => (None, None),
        Some(endpoint) => match otlp::Exporter::start(endpoint, &config.otel_service_name, &config.node_id) {
            Ok(exporter) => (Some(exporter), None),
            Err(e) => (None, Some(e)),
        },
    };
    let tracer = exporter.as_ref().map(otlp::Exporter::tracer);
    let _ = dispatch(filter, config.log_format, &config.node_id, std::io::stdout, tracer).try_init();
    if let Some(e) = failed {
        tracing::error!(error = %e, "cannot export spans to OTEL_EXPORTER_OTLP_ENDPOINT; logging only");
    }
    Telemetry { exporter }
}

/// The whole logging stack, writing to `writer` (stdout in production, a buffer in tests), and
/// exporting spans to `tracer` when there is one. Each output has its own filter: `LOG_LEVEL`
/// decides the log lines, while the export also takes this crate's DEBUG spans (every database
/// and storage call); without an export those spans are disabled where they are created.
fn dispatch<W>(
    filter: EnvFilter,
    format: LogFormat,
    node: &str,
    writer: W,
    tracer: Option<opentelemetry_sdk::trace::Tracer>,
) -> Dispatch
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let output = tracing_subscriber::fmt::layer().with_target(false).with_writer(writer);
    let output = match format {
        LogFormat::Json => output
            .json()
            .flatten_event(true)
            .map_event_format(|inner| WithNode::new(inner, node, LogFormat::Json))
            .boxed(),
        LogFormat::Text => {
            output.map_event_format(|inner| WithNode::new(inner, node, LogFormat::Text)).boxed()
        }
    };
    let demoter = ClientFaultsAtDebug::default();
    let own_dispatch = demoter.dispatch.clone();
    let spans = tracer.map(otlp::layer);
    let dispatch = Dispatch::new(
        tracing_subscriber::registry().with(output.with_filter(filter)).with(demoter).with(spans),
    );
    let _ = own_dispatch.set(dispatch.downgrade());
    dispatch
}

/// actix-http logs a malformed request head at ERROR although the client gets a 400 and the server
/// is fine: alerting on ERROR would page for every port scanner. Such an event is dropped and the
/// same message sent again at DEBUG. It is sent straight to the dispatcher handling the original
/// event, since tracing silently discards events emitted while another is being dispatched.
#[derive(Default)]
struct ClientFaultsAtDebug {
    /// The dispatcher this layer is part of (weak: it owns the layer).
    dispatch: Arc<OnceLock<WeakDispatch>>,
}

static DEMOTED_CALLSITE: DefaultCallsite = DefaultCallsite::new(&DEMOTED);
static DEMOTED: Metadata<'static> = Metadata::new(
    "client fault",
    "synkronus::http",
    Level::DEBUG,
    Some(file!()),
    Some(line!()),
    Some(module_path!()),
    FieldSet::new(&["message"], Identifier(&DEMOTED_CALLSITE)),
    Kind::EVENT,
);

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for ClientFaultsAtDebug {
    fn event_enabled(&self, event: &Event<'_>, _ctx: Context<'_, S>) -> bool {
        let meta = event.metadata();
        if *meta.level() != Level::ERROR || !meta.target().starts_with("actix_http::h1") {
            return true;
        }
        let mut message = MessageText::default();
        event.record(&mut message);
        if !message.0.contains("parse error") {
            return true;
        }
        let text = format!("malformed request from a client: {}", message.0);
        let fields = DEMOTED.fields();
        let Some(field) = fields.field("message") else { return false };
        let values = [(&field, Some(&text as &dyn tracing::Value))];
        let values = fields.value_set(&values);
        let demoted = Event::new(&DEMOTED, &values);
        if let Some(dispatch) = self.dispatch.get().and_then(WeakDispatch::upgrade) {
            if dispatch.enabled(&DEMOTED) {
                dispatch.event(&demoted);
            }
        }
        false
    }
}

/// Adds the node to every line, whichever thread or task logs it (a span would reach only the
/// code running inside it): a `"node"` key first in a JSON object, a `node=` field last in text.
struct WithNode<F> {
    inner: F,
    /// The JSON key and value, or the text field, ready to splice in.
    field: String,
    format: LogFormat,
}

impl<F> WithNode<F> {
    fn new(inner: F, node: &str, format: LogFormat) -> Self {
        let field = match format {
            LogFormat::Json => format!("\"node\":{},", serde_json::Value::from(node)),
            LogFormat::Text => format!(" node={node}"),
        };
        WithNode { inner, field, format }
    }
}

impl<S, N, F> FormatEvent<S, N> for WithNode<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut line = String::new();
        self.inner.format_event(ctx, Writer::new(&mut line), event)?;
        match self.format {
            LogFormat::Json if line.starts_with('{') => line.insert_str(1, &self.field),
            _ => {
                let end = line.trim_end_matches('\n').len();
                line.insert_str(end, &self.field);
            }
        }
        writer.write_str(&line)
    }
}

#[derive(Default)]
struct MessageText(String);

impl Visit for MessageText {
    fn record_debug(&mut self, field: &Field, value: &dyn Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn logged_at(level: &str) -> String {
        let out = Captured::default();
        let writer = out.clone();
        let dispatch = dispatch(EnvFilter::new(level), LogFormat::Text, "n1", move || writer.clone(), None);
        tracing::dispatcher::with_default(&dispatch, || {
            tracing::error!(
                target: "actix_http::h1::dispatcher",
                "stream error: request parse error: invalid Header provided"
            );
            tracing::error!(target: "actix_http::h1::dispatcher", "write zero; closing");
        });
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        text
    }

    fn logged_as(format: LogFormat) -> String {
        let out = Captured::default();
        let writer = out.clone();
        let dispatch = dispatch(EnvFilter::new("info"), format, "node \"b\"", move || writer.clone(), None);
        tracing::dispatcher::with_default(&dispatch, || {
            tracing::info_span!("request", request_id = "r1")
                .in_scope(|| tracing::info!(status = 200, "done"));
            tracing::warn!("outside any span");
        });
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        text
    }

    #[test]
    fn every_line_names_the_node() {
        let text = logged_as(LogFormat::Text);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(lines.iter().all(|l| l.ends_with(" node=node \"b\"")), "{text}");
        assert!(lines[0].contains("status=200"), "{text}");
        let json = logged_as(LogFormat::Json);
        for line in json.lines() {
            let v: serde_json::Value = serde_json::from_str(line).expect("one JSON object per line");
            assert_eq!(v["node"], "node \"b\"", "{line}");
            assert!(v["message"].is_string(), "{line}");
        }
        assert_eq!(json.lines().count(), 2);
    }

    #[test]
    fn a_malformed_request_head_is_not_a_server_error() {
        let info = logged_at("info");
        assert!(!info.contains("parse error"), "{info}");
        assert!(info.contains("ERROR") && info.contains("write zero"), "{info}");
        let debug = logged_at("debug");
        assert!(debug.contains("DEBUG") && debug.contains("malformed request from a client"), "{debug}");
        assert!(!debug.contains("ERROR stream error"), "{debug}");
    }
}
