//! The `kvroute_cluster_*` metric families of router replicas: the cluster registers
//! them into the service's registry at start (`service::cluster::bridge::start`) and
//! keeps the handles in its link (`runtime::cluster_link::Cluster`);
//! `Shared::cluster_metrics` finds them from any core.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusedLabel {
    pub kind: &'static str,
    pub reason: &'static str,
}

/// `kvroute_cluster_*` metrics (registered with the others in `metrics`).
#[derive(Default)]
pub struct ClusterMetrics {
    /// 0 connecting, 1 catching up, 2 ready, 3 degraded; absent without `--cluster`.
    pub state: Gauge,
    /// Event records by outcome: published, applied, own, duplicate, gap, dropped
    /// (publish buffer full), unknown_worker, undecodable.
    pub records: Family<OutcomeLabel, Counter>,
    pub publish_backlog: Gauge,
    pub applied_seq: Gauge,
    /// Replicated registry writes applied (put, delete) and refused (conflict).
    pub registry: Family<OutcomeLabel, Counter>,
    /// Shared-load ops by outcome: published, applied, dropped, unknown_worker.
    pub load_ops: Family<OutcomeLabel, Counter>,
    /// `[[engines]]` whose lease this replica holds (it ingests them).
    pub engine_leases: Gauge,
    /// Messages refused by kind (record, registry, load, sync_request, sync_answer,
    /// lease) and reason (missing_tag, bad_tag, origin, key, owner, stale,
    /// undecodable): `cluster::auth`.
    pub refused: Family<RefusedLabel, Counter>,
}

impl ClusterMetrics {
    pub fn register(&self, r: &mut prometheus_client::registry::Registry) {
        crate::families::register_all!(r;
            "cluster_state", "Replica state: 0 connecting, 1 catching up (not ready), 2 ready, 3 degraded" => self.state;
            "cluster_records", "Replicated event records by outcome" => self.records;
            "cluster_publish_backlog", "Event records waiting to be published to NATS" => self.publish_backlog;
            "cluster_applied_seq", "Last stream sequence this replica applied" => self.applied_seq;
            "cluster_registry", "Replicated registry writes by outcome" => self.registry;
            "cluster_load_ops", "Shared-load ops (route, lifecycle) by outcome" => self.load_ops;
            "cluster_refused", "Messages from NATS refused (bad or missing tag, foreign origin, ownership, replay) by kind and reason" => self.refused;
            "cluster_engine_leases", "ZMQ engines whose lease this replica holds (it alone ingests them)" => self.engine_leases;
        );
    }

    pub fn load(&self, outcome: &'static str, n: u64) {
        self.load_ops
            .get_or_create(&OutcomeLabel { outcome })
            .inc_by(n);
    }

    pub fn record(&self, outcome: &'static str, n: u64) {
        self.records
            .get_or_create(&OutcomeLabel { outcome })
            .inc_by(n);
    }
}
