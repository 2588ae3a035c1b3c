//! `[trace]` settings (flags `--otlp-*` / `--trace-*`, env `KVROUTE_OTLP_*` /
//! `KVROUTE_TRACE_*`): where OpenTelemetry spans go and how many. `otlp_endpoint`
//! unset (the default) = no tracing: no exporter thread, no spans, nothing exported.

use serde::{Deserialize, Serialize};

/// OTLP transport.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum OtlpProtocol {
    /// OTLP/gRPC (collectors listen on 4317).
    Grpc,
    /// OTLP/HTTP with protobuf bodies (collectors listen on 4318, path `/v1/traces`).
    Http,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TraceSettings {
    /// Collector URL (`http://HOST:PORT`; for `http`, a URL without a path gets
    /// `/v1/traces`). Default none: tracing off.
    pub otlp_endpoint: Option<String>,
    /// `grpc` or `http`. Default `grpc`.
    pub otlp_protocol: OtlpProtocol,
    /// Share of new traces sampled, in [0, 1]; a client's `traceparent` decides for its
    /// own trace (parent-based). Default 1.0.
    pub sample_ratio: f64,
    /// `service.name` of the exported spans. Default `kvroute`.
    pub service_name: String,
    /// Finished spans waiting for export; when full, new ones are dropped and counted
    /// (`kvroute_trace_spans_dropped_total`), never waited for. Default 8192.
    pub queue_spans: usize,
    /// Longest one export may take before its spans count as dropped. Default 10,000 ms.
    pub export_timeout_ms: u64,
}

impl Default for TraceSettings {
    fn default() -> Self {
        TraceSettings {
            otlp_endpoint: None,
            otlp_protocol: OtlpProtocol::Grpc,
            sample_ratio: 1.0,
            service_name: "kvroute".into(),
            queue_spans: 8192,
            export_timeout_ms: 10_000,
        }
    }
}

impl TraceSettings {
    pub fn enabled(&self) -> bool {
        self.otlp_endpoint.is_some()
    }

    pub fn validate(&self) -> Result<(), String> {
        if !(0.0..=1.0).contains(&self.sample_ratio) {
            return Err("trace.sample_ratio must be in [0, 1]".into());
        }
        if self.service_name.is_empty() || self.service_name.len() > 256 {
            return Err("trace.service_name must be 1..=256 bytes".into());
        }
        if !(1..=1 << 20).contains(&self.queue_spans) {
            return Err("trace.queue_spans must be 1..=1048576".into());
        }
        if !(1..=600_000).contains(&self.export_timeout_ms) {
            return Err("trace.export_timeout_ms must be 1..=600000".into());
        }
        if let Some(e) = &self.otlp_endpoint {
            let rest = e
                .strip_prefix("http://")
                .or_else(|| e.strip_prefix("https://"))
                .ok_or_else(|| {
                    format!("trace.otlp_endpoint {e:?}: must start with http:// or https://")
                })?;
            if rest.is_empty() || rest.starts_with('/') {
                return Err(format!("trace.otlp_endpoint {e:?}: no host"));
            }
            if e.starts_with("https://") {
                return Err(format!(
                    "trace.otlp_endpoint {e:?}: TLS is not built in; export to a local collector over http://"
                ));
            }
        }
        Ok(())
    }

    /// The URL the exporter posts to: for `http`, `/v1/traces` when the URL has no path.
    pub fn export_url(&self) -> Option<String> {
        let e = self.otlp_endpoint.as_ref()?;
        Some(match self.otlp_protocol {
            OtlpProtocol::Grpc => e.clone(),
            OtlpProtocol::Http => {
                let rest = e.split_once("://").map_or(e.as_str(), |(_, r)| r);
                if rest.trim_end_matches('/').contains('/') {
                    e.clone()
                } else {
                    format!("{}/v1/traces", e.trim_end_matches('/'))
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate_and_urls() {
        let mut s = TraceSettings::default();
        assert!(s.validate().is_ok() && !s.enabled() && s.export_url().is_none());
        s.otlp_endpoint = Some("http://127.0.0.1:4318".into());
        s.otlp_protocol = OtlpProtocol::Http;
        assert_eq!(s.export_url().unwrap(), "http://127.0.0.1:4318/v1/traces");
        s.otlp_endpoint = Some("http://c:4318/custom/path".into());
        assert_eq!(s.export_url().unwrap(), "http://c:4318/custom/path");
        s.otlp_protocol = OtlpProtocol::Grpc;
        assert_eq!(s.export_url().unwrap(), "http://c:4318/custom/path");
        for bad in ["127.0.0.1:4317", "http://", "https://c:4317"] {
            s.otlp_endpoint = Some(bad.into());
            assert!(s.validate().is_err(), "{bad}");
        }
        let mut s = TraceSettings {
            sample_ratio: 1.5,
            ..Default::default()
        };
        assert!(s.validate().is_err());
        s.sample_ratio = 0.5;
        s.queue_spans = 0;
        assert!(s.validate().is_err());
        let t: TraceSettings =
            toml::from_str("otlp_endpoint = \"http://c:4317\"\notlp_protocol = \"http\"").unwrap();
        assert_eq!(t.otlp_protocol, OtlpProtocol::Http);
    }
}
