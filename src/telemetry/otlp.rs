//! The optional span export to an OpenTelemetry collector (docs/operations.md, "Tracing"): OTLP
//! over HTTP with protobuf bodies. The SDK's batch processor queues finished spans and sends them
//! from a thread of its own, so a request never waits for the collector; when the queue is full
//! (a collector away for long), spans are dropped rather than memory grown.

use opentelemetry::trace::TracerProvider as _;
use opentelemetry::KeyValue;
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::trace::{SdkTracerProvider, Tracer};
use opentelemetry_sdk::Resource;
use tracing::{Level, Metadata, Subscriber};
use tracing_subscriber::filter::FilterFn;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// The running export.
pub(super) struct Exporter {
    provider: SdkTracerProvider,
}

impl Exporter {
    /// Spans of this process go to `endpoint` (the full traces URL) as `service_name`, with the
    /// node as `service.instance.id`. Batching, sampling, headers and time-outs follow the standard
    /// `OTEL_BSP_*`, `OTEL_TRACES_SAMPLER*`, `OTEL_EXPORTER_OTLP_HEADERS` and `*_TIMEOUT` variables,
    /// which the OpenTelemetry SDK reads itself.
    pub(super) fn start(endpoint: &str, service_name: &str, node: &str) -> anyhow::Result<Self> {
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(endpoint)
            .build()?;
        let resource = Resource::builder()
            .with_service_name(service_name.to_owned())
            .with_attributes([
                KeyValue::new("service.version", env!("CARGO_PKG_VERSION")),
                KeyValue::new("service.instance.id", node.to_owned()),
            ])
            .build();
        let provider =
            SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource).build();
        Ok(Exporter { provider })
    }

    pub(super) fn tracer(&self) -> Tracer {
        self.provider.tracer("synkronus")
    }

    /// Sends what is queued (bounded by the SDK's export time-out) and stops.
    pub(super) fn shut_down(self) {
        if let Err(e) = self.provider.shutdown() {
            eprintln!("synkronus: the span export did not shut down cleanly: {e}");
        }
    }
}

/// The layer that turns spans into OpenTelemetry spans (events inside become span events). It
/// takes every span at INFO and this crate's at DEBUG too (database, storage and export calls),
/// and events at INFO and above, whatever `LOG_LEVEL` says.
pub(super) fn layer<S>(tracer: Tracer) -> impl Layer<S>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    tracing_opentelemetry::layer().with_tracer(tracer).with_filter(FilterFn::new(exported))
}

fn exported(meta: &Metadata<'_>) -> bool {
    let level = *meta.level();
    level <= Level::INFO
        || (meta.is_span() && level <= Level::DEBUG && meta.target().starts_with("synkronus"))
}
