//! `kvroute_epp_*` metrics: streams open, requests by outcome, picks per worker,
//! refusals and errors by kind, subset entries naming no known worker, and the time
//! from the request headers to the pick. [`EppMetrics::register`] adds them to the
//! service's registry (`kvroute_` prefix).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WorkerLabel {
    pub worker: String,
}

pub struct EppMetrics {
    /// ext_proc streams open.
    pub streams: Gauge,
    /// Streams refused because `max_streams` were open.
    pub streams_refused: Counter,
    /// Routed requests, by how they ended: ok, cut, refused.
    pub finished: Family<KindLabel, Counter>,
    /// Picks per worker.
    pub picks: Family<WorkerLabel, Counter>,
    /// Requests refused or streams failed, by kind (too_large, bad_request,
    /// bad_content_type, missing_body, headers_too_large, bad_subset, gateway_mode,
    /// no_endpoint, busy, bad_prompt, internal, protocol).
    pub errors: Family<KindLabel, Counter>,
    /// Subset hint entries that named no known worker (ignored).
    pub subset_unknown: Counter,
    /// Seconds from the request headers to the pick (the body's arrival included).
    pub pick_seconds: Histogram,
    /// Seconds the picker took (tokenize and route).
    pub route_seconds: Histogram,
}

impl Default for EppMetrics {
    fn default() -> Self {
        let buckets = || (0..20).map(|i| 1e-6 * f64::from(1u32 << i));
        EppMetrics {
            streams: Gauge::default(),
            streams_refused: Counter::default(),
            finished: Family::default(),
            picks: Family::default(),
            errors: Family::default(),
            subset_unknown: Counter::default(),
            pick_seconds: Histogram::new(buckets()),
            route_seconds: Histogram::new(buckets()),
        }
    }
}

impl EppMetrics {
    pub fn register(&self, r: &mut prometheus_client::registry::Registry) {
        crate::families::register_all!(r;
            "epp_streams", "ext_proc streams open" => self.streams;
            "epp_streams_refused", "ext_proc streams refused (max_streams open)" => self.streams_refused;
            "epp_finished", "Requests routed by the endpoint picker, by how they ended (ok, cut, refused)" => self.finished;
            "epp_picks", "Endpoint picks per worker" => self.picks;
            "epp_errors", "Endpoint picker refusals and stream errors by kind" => self.errors;
            "epp_subset_unknown", "Subset hint entries naming no known worker (ignored)" => self.subset_unknown;
            "epp_pick_seconds", "Seconds from the request headers to the pick" => self.pick_seconds;
            "epp_route_seconds", "Seconds the picker took (tokenize and route)" => self.route_seconds;
        );
    }

    pub fn error(&self, kind: &'static str) {
        self.errors.get_or_create(&KindLabel { kind }).inc();
    }
}
