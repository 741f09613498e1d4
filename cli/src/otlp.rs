//! OTLP trace export (cargo feature `otlp`, off by default): when
//! `OTEL_EXPORTER_OTLP_ENDPOINT` is set, every `tracing` span — `session`, `iteration`,
//! `chat <model>` with its `gen_ai.*` attributes, `execute_tool <name>` — is also sent to
//! that collector over OTLP/HTTP (protobuf). The exporter reads the standard `OTEL_*`
//! variables itself (endpoint, headers, timeout); the service name defaults to `agentq`
//! unless `OTEL_SERVICE_NAME` says otherwise. Which spans are exported is filtered apart
//! from the log lines (`RUST_LOG`): by `AGENTQ_OTLP_FILTER`, default `info` (every span
//! agentq opens), so that quiet logs do not mean missing traces.

use std::sync::OnceLock;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::{EnvFilter, Layer};

static PROVIDER: OnceLock<SdkTracerProvider> = OnceLock::new();

/// The OpenTelemetry layer, or `None` when no endpoint is configured or the exporter
/// cannot be built (reported on stderr: logging is not up yet). Must be called outside
/// the async runtime: the blocking HTTP client owns a runtime of its own.
pub fn layer<S>() -> Option<Box<dyn Layer<S> + Send + Sync>>
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a> + Send + Sync,
{
    let endpoint = std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT").ok()?;
    if endpoint.trim().is_empty() {
        return None;
    }
    let exporter = match opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .build()
    {
        Ok(e) => e,
        Err(e) => {
            eprintln!("agentq: OTLP export disabled: cannot build the exporter: {e}");
            return None;
        }
    };
    let mut resource = Resource::builder();
    if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
        resource = resource.with_service_name("agentq");
    }
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource.build())
        .build();
    let tracer = provider.tracer("agentq");
    let _ = PROVIDER.set(provider);
    let filter = std::env::var("AGENTQ_OTLP_FILTER")
        .ok()
        .and_then(|f| EnvFilter::try_new(f).ok())
        .unwrap_or_else(|| EnvFilter::new("info"));
    Some(
        tracing_opentelemetry::layer()
            .with_tracer(tracer)
            .with_filter(filter)
            .boxed(),
    )
}

/// Flush and stop the exporter (spans still buffered are sent). Call outside the runtime.
pub fn shutdown() {
    if let Some(p) = PROVIDER.get()
        && let Err(e) = p.shutdown()
    {
        eprintln!("agentq: flushing OTLP spans failed: {e}");
    }
}
