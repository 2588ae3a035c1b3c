//! The tracing flags of `kvroute serve` (`--otlp-endpoint`, `--otlp-protocol`,
//! `--trace-*`; env `KVROUTE_OTLP_*` / `KVROUTE_TRACE_*`), flattened into its
//! arguments, and how they overlay `[trace]` ([`TraceArgs::apply`]): an unset flag
//! leaves the file's or the default value in place.

use super::config::{OtlpProtocol, TraceSettings};
use clap::Args;

#[derive(Args, Debug, Default, Clone)]
pub struct TraceArgs {
    /// OTLP collector URL for OpenTelemetry spans (default: tracing off).
    #[arg(
        id = "otlp_endpoint",
        long = "otlp-endpoint",
        env = "KVROUTE_OTLP_ENDPOINT"
    )]
    pub otlp_endpoint: Option<String>,
    /// OTLP transport: grpc or http (protobuf).
    #[arg(
        id = "otlp_protocol",
        long = "otlp-protocol",
        env = "KVROUTE_OTLP_PROTOCOL",
        value_enum
    )]
    pub otlp_protocol: Option<OtlpProtocol>,
    /// Share of new traces sampled, in [0, 1].
    #[arg(
        id = "trace_sample_ratio",
        long = "trace-sample-ratio",
        env = "KVROUTE_TRACE_SAMPLE_RATIO"
    )]
    pub sample_ratio: Option<f64>,
    /// `service.name` of the exported spans.
    #[arg(
        id = "trace_service_name",
        long = "trace-service-name",
        env = "KVROUTE_TRACE_SERVICE_NAME"
    )]
    pub service_name: Option<String>,
    /// Finished spans waiting for export (more are dropped and counted).
    #[arg(
        id = "trace_queue_spans",
        long = "trace-queue-spans",
        env = "KVROUTE_TRACE_QUEUE_SPANS"
    )]
    pub queue_spans: Option<usize>,
    /// Longest one export may take (ms).
    #[arg(
        id = "trace_export_timeout_ms",
        long = "trace-export-timeout-ms",
        env = "KVROUTE_TRACE_EXPORT_TIMEOUT_MS"
    )]
    pub export_timeout_ms: Option<u64>,
}

impl TraceArgs {
    pub fn apply(&self, t: &mut TraceSettings) {
        if self.otlp_endpoint.is_some() {
            t.otlp_endpoint.clone_from(&self.otlp_endpoint);
        }
        if let Some(p) = self.otlp_protocol {
            t.otlp_protocol = p;
        }
        if let Some(r) = self.sample_ratio {
            t.sample_ratio = r;
        }
        if let Some(n) = &self.service_name {
            t.service_name.clone_from(n);
        }
        if let Some(q) = self.queue_spans {
            t.queue_spans = q;
        }
        if let Some(ms) = self.export_timeout_ms {
            t.export_timeout_ms = ms;
        }
    }
}
