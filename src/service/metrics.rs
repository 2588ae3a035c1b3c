//! Prometheus metrics of the service (`GET /metrics`).
//!
//! Counters and the latency histogram are updated on the hot path (atomic adds inside
//! prometheus-client). Per-worker gauges are filled at scrape time from the load board,
//! so the hot path never touches them.

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;
use std::sync::Mutex;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    pub mode: &'static str,
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ListenerLabel {
    pub listener: &'static str,
}

/// Engine (ZMQ) stream events: gap, replay, replay_failure, clear, restart, ...
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EngineStreamLabels {
    pub worker: String,
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WorkerLabel {
    pub worker: String,
}

pub struct Metrics {
    registry: Mutex<Registry>,
    pub routes: Family<RouteLabels, Counter>,
    pub decision_latency: Histogram,
    /// A decision's own CPU time (`runtime::cpu_clock`), its waits left out.
    pub decision_cpu: Histogram,
    /// How late each core's periodic probe timer ran (`runtime::schedule_lag`).
    pub schedule_lag: Histogram,
    pub events: Family<KindLabel, Counter>,
    pub protocol_errors: Family<KindLabel, Counter>,
    pub connections: Family<ListenerLabel, Gauge>,
    pub connections_total: Family<ListenerLabel, Counter>,
    pub sequence_gaps: Counter,
    pub overlap_blocks: Counter,
    pub request_blocks: Counter,
    pub index_blocks: Gauge,
    pub workers: Gauge,
    pub active_requests: Gauge,
    pub hit_ratio: Gauge<f64, AtomicU64>,
    pub worker_active_requests: Family<WorkerLabel, Gauge>,
    pub worker_prefill_tokens: Family<WorkerLabel, Gauge>,
    pub worker_decode_blocks: Family<WorkerLabel, Gauge>,
    pub worker_cached_blocks: Family<WorkerLabel, Gauge>,
    pub worker_live: Family<WorkerLabel, Gauge>,
    /// Prompt blocks routed to each worker's prefill, and of those the blocks found
    /// cached there (since the worker's registration), and their ratio: the
    /// block-weighted hit rate as routed (scrape-time, from the status counters).
    pub worker_routed_prompt_blocks: Family<WorkerLabel, Gauge>,
    pub worker_routed_cached_blocks: Family<WorkerLabel, Gauge>,
    pub worker_hit_rate: Family<WorkerLabel, Gauge<f64, std::sync::atomic::AtomicU64>>,
    /// The same, fleet-wide.
    pub routed_prompt_blocks: Gauge,
    pub routed_cached_blocks: Gauge,
    pub hit_rate: Gauge<f64, std::sync::atomic::AtomicU64>,
    /// Decisions that sent a request to a worker with no KV cache event in the last
    /// minute (or ever): routing to it has silently become load-only.
    pub routed_without_events: Family<WorkerLabel, Counter>,
    pub engine_stream: Family<EngineStreamLabels, Counter>,
    /// Snapshots written (periodic and shutdown).
    pub snapshots: Counter,
    /// Snapshot attempts that failed.
    pub snapshot_failures: Counter,
    /// Failed attempts since the last success (> 0: `/healthz` says degraded).
    pub snapshot_consecutive_failures: Gauge,
    /// Unix time (s) of the last snapshot written by this process; 0 = none yet.
    pub snapshot_last_success: Gauge,
    /// Size in bytes of the last snapshot written.
    pub snapshot_bytes: Gauge,
    /// Stores refused by `max_blocks_per_worker` / capacity (`worker_limit`) or by
    /// `max_index_entries` (`index_budget`).
    pub index_refused: Family<KindLabel, Counter>,
    /// Entries counted against `max_index_entries` (live, plus batches being applied).
    pub index_budget_used: Gauge,
    /// `max_index_entries` (each copy's bound when replicated), for dashboards.
    pub index_budget_limit: Gauge,
    /// Sampled prompts whose lean ids differed from HF's (`tokenize::lean`; set at
    /// scrape time). Named `proxy_` since the proxy is where prompts are tokenized.
    pub tokenize_lean_mismatches: Gauge,
    /// Sums over kinds of `events` and `protocol_errors`, for the status page.
    pub events_total: AtomicU64,
    pub protocol_errors_total: AtomicU64,
    /// Blocks of routed requests credited as pending (speculative) on the chosen
    /// worker.
    pub speculative_blocks: Counter,
    /// Approximate mode: 1 for a worker whose cache is modelled (no event source),
    /// its modelled blocks (scrape-time), the blocks credited from the model to the
    /// chosen workers, and the workers switched to exact by their first event.
    pub worker_approximate: Family<WorkerLabel, Gauge>,
    pub worker_approximate_blocks: Family<WorkerLabel, Gauge>,
    pub approximate_credited_blocks: Counter,
    pub approximate_switches: Counter,
    /// `--record`: lines written, records dropped (channel full), stopped by a limit.
    pub record_lines: Counter,
    pub record_dropped: Counter,
    pub record_stopped: Gauge,
    /// Run-loop parks and spins while an answer from another core was outstanding
    /// (`answer_spin`): `parked`, `parked_long` (longer than `spin_before_park_us`,
    /// so the executor likely slept), `spin_expired` (`answer_spin_us` ran out);
    /// and queries other cores announced: `expected` (announcements received),
    /// `expect_expired` (announced queries that did not come within `answer_spin_us`).
    pub answer_waits: Family<KindLabel, Counter>,
    /// In-flight requests that left without a finish: `ttl` (no lifecycle call for
    /// `request_ttl_ms`), `restart` (restored from a snapshot, but routed by the dead
    /// process's own proxy).
    pub requests_expired: Family<ReasonLabel, Counter>,
    /// Reads of the engines file that changed the engines or found them unchanged
    /// (`applied`), or were refused and changed nothing (`rejected`).
    pub engines_file_reloads: Family<KindLabel, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// Counts `n` requests that expired for `reason` (`requests_expired`).
    pub fn expired(&self, reason: &'static str, n: u64) {
        self.requests_expired
            .get_or_create(&ReasonLabel { reason })
            .inc_by(n);
    }

    pub fn new() -> Metrics {
        // 1 µs .. ~33 ms in powers of two.
        let buckets = (0..16).map(|i| 1e-6 * f64::from(1u32 << i));
        let m = Metrics {
            registry: Mutex::new(Registry::with_prefix("kvroute")),
            routes: Family::default(),
            decision_latency: Histogram::new(buckets.clone()),
            decision_cpu: Histogram::new(buckets.clone()),
            schedule_lag: Histogram::new(buckets),
            events: Family::default(),
            protocol_errors: Family::default(),
            connections: Family::default(),
            connections_total: Family::default(),
            sequence_gaps: Counter::default(),
            overlap_blocks: Counter::default(),
            request_blocks: Counter::default(),
            index_blocks: Gauge::default(),
            workers: Gauge::default(),
            active_requests: Gauge::default(),
            hit_ratio: Gauge::default(),
            worker_active_requests: Family::default(),
            worker_prefill_tokens: Family::default(),
            worker_decode_blocks: Family::default(),
            worker_cached_blocks: Family::default(),
            worker_live: Family::default(),
            worker_routed_prompt_blocks: Family::default(),
            worker_routed_cached_blocks: Family::default(),
            worker_hit_rate: Family::default(),
            routed_prompt_blocks: Gauge::default(),
            routed_cached_blocks: Gauge::default(),
            hit_rate: Gauge::default(),
            routed_without_events: Family::default(),
            engine_stream: Family::default(),
            snapshots: Counter::default(),
            snapshot_failures: Counter::default(),
            snapshot_consecutive_failures: Gauge::default(),
            snapshot_last_success: Gauge::default(),
            snapshot_bytes: Gauge::default(),
            index_refused: Family::default(),
            index_budget_used: Gauge::default(),
            index_budget_limit: Gauge::default(),
            tokenize_lean_mismatches: Gauge::default(),
            events_total: AtomicU64::new(0),
            protocol_errors_total: AtomicU64::new(0),
            speculative_blocks: Counter::default(),
            worker_approximate: Family::default(),
            worker_approximate_blocks: Family::default(),
            approximate_credited_blocks: Counter::default(),
            approximate_switches: Counter::default(),
            record_lines: Counter::default(),
            record_dropped: Counter::default(),
            record_stopped: Gauge::default(),
            answer_waits: Family::default(),
            requests_expired: Family::default(),
            engines_file_reloads: Family::default(),
        };
        if let Ok(mut r) = m.registry.lock() {
            crate::families::register_all!(r;
                "routes", "Routing decisions by mode and outcome" => m.routes;
                "decision_latency_seconds", "Time from request parsed to decision ready, per decision" => m.decision_latency;
                "decision_cpu_seconds", "CPU time of a decision's own steps (its waits for other cores' answers left out): a control for decision latency" => m.decision_cpu;
                "core_schedule_lag_seconds", "How late a core's periodic probe timer ran: the control for decision latency" => m.schedule_lag;
                "events", "KV events ingested by type" => m.events;
                "protocol_errors", "Protocol errors by kind" => m.protocol_errors;
                "connections", "Open connections by listener" => m.connections;
                "connections_accepted", "Accepted connections" => m.connections_total;
                "sequence_gaps", "Event sequence gaps detected" => m.sequence_gaps;
                "overlap_blocks", "Blocks of routed requests found cached on the chosen worker" => m.overlap_blocks;
                "request_blocks", "Blocks of routed requests" => m.request_blocks;
                "index_blocks", "Indexed (block, worker, tier) entries" => m.index_blocks;
                "workers", "Registered workers" => m.workers;
                "active_requests", "Tracked in-flight requests" => m.active_requests;
                "overlap_hit_ratio", "overlap_blocks / request_blocks" => m.hit_ratio;
                "worker_active_requests", "In-flight requests per worker" => m.worker_active_requests;
                "worker_prefill_tokens", "Prompt tokens in prefill per worker" => m.worker_prefill_tokens;
                "worker_decode_blocks", "Active KV blocks per worker" => m.worker_decode_blocks;
                "worker_cached_blocks", "Indexed cached blocks per worker" => m.worker_cached_blocks;
                "worker_live", "1 if the worker is eligible for routing" => m.worker_live;
                "worker_routed_prompt_blocks", "Prompt blocks routed to the worker's prefill since it registered" => m.worker_routed_prompt_blocks;
                "worker_routed_cached_blocks", "Of those, blocks the index found cached on the worker (any tier)" => m.worker_routed_cached_blocks;
                "worker_hit_rate", "Block-weighted hit rate as routed: routed cached blocks / routed prompt blocks" => m.worker_hit_rate;
                "routed_prompt_blocks", "Prompt blocks routed, fleet-wide (workers registered now)" => m.routed_prompt_blocks;
                "routed_cached_blocks", "Of those, blocks found cached on the worker that prefills them" => m.routed_cached_blocks;
                "hit_rate", "Block-weighted hit rate as routed, fleet-wide" => m.hit_rate;
                "routed_without_events", "Decisions that sent a request to a worker with no KV event in the last minute (routing to it is load-only)" => m.routed_without_events;
                "engine_stream", "ZMQ engine event streams: gaps, replays, replay failures, clears, restarts, batches" => m.engine_stream;
                "snapshots", "Warm-restart snapshots written (periodic and shutdown)" => m.snapshots;
                "snapshot_failures", "Warm-restart snapshot attempts that failed" => m.snapshot_failures;
                "snapshot_consecutive_failures", "Snapshot attempts failed since the last success (> 0: /healthz degraded)" => m.snapshot_consecutive_failures;
                "snapshot_last_success_timestamp_seconds", "Unix time of the last snapshot written by this process (0: none yet)" => m.snapshot_last_success;
                "snapshot_bytes", "Size of the last snapshot written" => m.snapshot_bytes;
                "index_refused", "Block stores refused: worker_limit (capacity / max_blocks_per_worker) or index_budget (max_index_entries)" => m.index_refused;
                "index_budget_used", "Index entries counted against max_index_entries" => m.index_budget_used;
                "requests_expired", "In-flight requests ended without a finish: ttl (no lifecycle call for request_ttl_ms) or restart (their proxy died with the previous process)" => m.requests_expired;
                "index_budget_limit", "max_index_entries: the index entries the budget allows (each copy's, with index_layout replicated)" => m.index_budget_limit;
                "proxy_tokenize_lean_mismatches", "Sampled prompts whose token ids by the lean walk differed from the HF pipeline's (each turns the lean walk off for its model)" => m.tokenize_lean_mismatches;
                "speculative_blocks", "Blocks of routed requests credited as pending (speculative) on the chosen worker" => m.speculative_blocks;
                "worker_approximate", "1 when the worker publishes no KV events and its cache is modelled from the prompts routed to it (approximate mode)" => m.worker_approximate;
                "worker_approximate_blocks", "Approximate mode: blocks modelled in the worker's cache" => m.worker_approximate_blocks;
                "approximate_credited_blocks", "Blocks of routed requests credited from the approximate model on the chosen worker" => m.approximate_credited_blocks;
                "approximate_switches", "Approximate workers switched to exact by their first KV event" => m.approximate_switches;
                "record_lines", "Lines written to the --record trace" => m.record_lines;
                "record_dropped", "Ended requests not recorded because the writer's channel was full" => m.record_dropped;
                "record_stopped", "1 once the --record trace stopped at a limit or a write error" => m.record_stopped;
                "answer_waits", "Run-loop parks (parked, parked_long) and ended spins (spin_expired) while an answer from another core was outstanding; queries announced by other cores (expected) and announced queries that did not come in time (expect_expired)" => m.answer_waits;
                "engines_file_reloads", "Reads of the engines file applied (changes made, or none needed) or rejected (unusable file, nothing changed)" => m.engines_file_reloads;
            );
        }
        m
    }

    pub fn route(&self, mode: &'static str, outcome: &'static str) {
        self.routes
            .get_or_create(&RouteLabels { mode, outcome })
            .inc();
    }

    /// Counts `rejected` refused stores, `over_budget` of them by the global budget.
    pub fn index_refused(&self, rejected: u32, over_budget: u32) {
        let budget = u64::from(over_budget.min(rejected));
        let worker = u64::from(rejected) - budget;
        for (kind, n) in [("worker_limit", worker), ("index_budget", budget)] {
            if n > 0 {
                self.index_refused
                    .get_or_create(&KindLabel { kind })
                    .inc_by(n);
            }
        }
    }

    pub fn event(&self, kind: &'static str, n: u64) {
        self.events.get_or_create(&KindLabel { kind }).inc_by(n);
        self.events_total
            .fetch_add(n, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn protocol_error(&self, kind: &'static str) {
        self.protocol_errors
            .get_or_create(&KindLabel { kind })
            .inc();
        self.protocol_errors_total
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Registers more metrics (the proxy's, `crate::proxy::state`) in this registry.
    pub fn with_registry(&self, f: impl FnOnce(&mut Registry)) {
        if let Ok(mut r) = self.registry.lock() {
            f(&mut r);
        }
    }

    /// Renders the text exposition. `fill` sets the scrape-time gauges first.
    pub fn render(&self, fill: impl FnOnce(&Metrics)) -> String {
        let Ok(reg) = self.registry.lock() else {
            return String::new();
        };
        fill(self);
        let total = self.request_blocks.get();
        if total > 0 {
            self.hit_ratio
                .set(self.overlap_blocks.get() as f64 / total as f64);
        }
        let mut out = String::new();
        if encode(&mut out, &reg).is_err() {
            out.clear();
        }
        out
    }
}
