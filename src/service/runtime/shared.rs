//! State every core can reach: settings, registry snapshot, per-worker cells, the load
//! board, mailboxes + doorbells, metrics. Everything here is `Sync` and lock-free on the
//! hot path; the only mutex serialises control-plane registry writes.
//!
//! Each core has two inboxes ([`Lane`]) behind one doorbell: `Urgent` carries
//! everything on a routing request's path (queries, answers, commits, lifecycle,
//! active blocks, worker forgets) and `Bulk` carries index batches and snapshot dumps.
//! The core's run loop drains the urgent inbox before every bulk message, so a backlog
//! of index work never sits in front of a routing query.

use crate::credentials::Credentials;
use crate::index::Budget;
use crate::registry::Registry;
use crate::service::metrics::Metrics;
use crate::service::runtime::msg::{Lane, Msg};
use crate::settings::Settings;
use crate::sync::board::LoadBoard;
use crate::sync::mailbox::Mailbox;
use crate::types::WorkerSlot;
use arc_swap::ArcSwap;
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Per-worker atomics (liveness, integrity, binding generation).
#[derive(Default)]
pub struct WorkerCells {
    /// Milliseconds since service start of the last frame from the worker.
    pub last_seen_ms: AtomicU64,
    /// 1 while a binary event connection is bound to the worker: set under the registry
    /// write lock by the registration of its `Hello`, cleared when it closes.
    pub connected: AtomicU32,
    /// Subject to the heartbeat window (registered over the event protocol). Only ever
    /// switched on by a registration; off again only when the worker is removed.
    pub heartbeat: AtomicBool,
    /// Index state suspect (sequence gap, resync pending).
    pub suspect: AtomicBool,
    /// Bumped whenever the slot's identity or epoch changes; index messages carrying an
    /// older generation are dropped by the shards.
    pub gen: AtomicU64,
    /// Next event sequence number expected from the worker (resume point).
    pub next_seq: AtomicU64,
    /// ZMQ engine workers: the block size of the engine's last refused `BlockStored`
    /// (it differs from the router's), 0 when its stored events are accepted.
    pub engine_block_size_mismatch: AtomicU32,
    /// ZMQ engine workers: the engine's event endpoint has not answered for
    /// `heartbeat_timeout_ms` (`zmq_reach`); the worker is down until it does.
    pub engine_unreachable: AtomicBool,
    /// ZMQ engine workers: 1 + the data-parallel rank of the engine's last batch,
    /// refused because the entry serves another rank; 0 when its batches are accepted.
    pub engine_dp_rank_mismatch: AtomicU32,
    /// Approximate mode (`index::approx`): the worker has no event source and the
    /// cores model its cache from the prompts routed to it. Set by its registration
    /// (`control`), cleared by its first KV event (`core::index`).
    pub approximate: AtomicBool,
}

pub struct Shared {
    pub settings: Settings,
    pub cores: usize,
    /// Bits of a hash that name its shard: `log2(cores)` sharded, 0 replicated (every
    /// core's copy holds every hash).
    pub shard_bits: u32,
    /// `index_layout = "replicated"` with more than one core: every core holds the
    /// whole index (see [`Shared::shard_index`]).
    pub replicated: bool,
    /// Replicated: the service-wide request-id register (`claims`), so a route need
    /// not ask the other cores whether they know its id. `None` when sharded or on
    /// one core.
    pub claims: Option<crate::service::runtime::claims::Claims>,
    /// Per core: `[urgent, bulk]` inboxes, indexed by [`Lane`].
    mailboxes: Vec<[Mailbox<Msg>; 2]>,
    /// Per core: the doorbell write end (one for both inboxes).
    doorbells: Vec<UnixStream>,
    pub registry: ArcSwap<Registry>,
    pub registry_write: Mutex<()>,
    pub workers: Box<[WorkerCells]>,
    pub board: LoadBoard,
    pub metrics: Metrics,
    pub shutdown: AtomicBool,
    /// Stop accepting connections and stop the snapshot thread.
    pub stopping: AtomicBool,
    /// Set at the first shutdown signal (`service::Running::drain`): front ends drain
    /// (`[proxy] drain_ms`: `/health` and `/readyz` say so, every answer closes its
    /// connection, the proxy's listener stops accepting).
    pub draining: AtomicBool,
    /// The shared token and the per-worker tokens (`credentials`).
    pub creds: Credentials,
    /// Entry counters a core's shard reserves from: exact per-worker caps and the
    /// global `max_index_entries` (`index::Budget`). One for all cores when sharded;
    /// one per core when replicated (each copy is bounded on its own). Use
    /// [`Shared::budget_of`].
    budgets: Vec<Arc<Budget>>,
    pub inflight: AtomicUsize,
    /// Round-robin cursor shared by all cores.
    pub rr: AtomicU64,
    /// Route-time prefix affinity shared by all cores (`affinity_max_entries`).
    pub affinity: crate::select::Affinity,
    /// Session affinity shared by all cores (`session_max_entries`).
    pub sessions: crate::select::Sessions,
    pub started: Instant,
    /// Status page counters, history and cached document (`status`).
    pub status: crate::status::StatusState,
    /// `--record`: the trace writer (set once at start).
    pub recorder: std::sync::OnceLock<crate::service::runtime::recorder::Recorder>,
    /// The models' tokenizers (`settings.tokenizers`, loaded once at start; set before
    /// any core runs, so `get()` is Some on every core).
    pub tokenizers: std::sync::OnceLock<Arc<crate::tokenize::Tokenizers>>,
    /// `--cluster`: the bridge to the other replicas (set once at start).
    pub cluster: std::sync::OnceLock<Arc<crate::service::runtime::cluster_link::Cluster>>,
}

/// Without `--cluster` (or before the bridge is up): counted nowhere that is listed.
static NO_CLUSTER: std::sync::LazyLock<crate::service::runtime::cluster_metrics::ClusterMetrics> =
    std::sync::LazyLock::new(Default::default);

impl Shared {
    /// `kvroute_cluster_*` of this replica (a sink that is never listed without
    /// `--cluster`).
    pub fn cluster_metrics(&self) -> &crate::service::runtime::cluster_metrics::ClusterMetrics {
        self.cluster.get().map_or(&NO_CLUSTER, |c| &c.metrics)
    }

    /// `(shard_bits, replicated)` for `cores` executors under `settings.index_layout`.
    pub fn layout(settings: &Settings, cores: usize) -> (u32, bool) {
        let replicated =
            cores > 1 && settings.index_layout == crate::settings::IndexLayout::Replicated;
        let bits = if replicated {
            0
        } else {
            cores.trailing_zeros()
        };
        (bits, replicated)
    }

    /// Builds the shared state; returns the doorbell read ends, one per core.
    pub fn new(
        settings: Settings,
        cores: usize,
        registry: Registry,
        creds: Credentials,
    ) -> std::io::Result<(Arc<Shared>, Vec<UnixStream>)> {
        let (shard_bits, replicated) = Shared::layout(&settings, cores);
        let mut doorbells = Vec::new();
        let mut readers = Vec::new();
        for _ in 0..cores {
            let (w, r) = UnixStream::pair()?;
            w.set_nonblocking(true)?;
            r.set_nonblocking(true)?;
            doorbells.push(w);
            readers.push(r);
        }
        let max_workers = settings.limits.max_workers;
        let depth = settings.limits.queue_depth;
        let metrics = Metrics::new();
        let shared = Shared {
            cores,
            shard_bits,
            replicated,
            claims: replicated.then(crate::service::runtime::claims::Claims::new),
            mailboxes: (0..cores)
                .map(|_| [Mailbox::new(depth), Mailbox::new(depth)])
                .collect(),
            doorbells,
            registry: ArcSwap::from_pointee(registry),
            registry_write: Mutex::new(()),
            workers: (0..max_workers).map(|_| WorkerCells::default()).collect(),
            board: LoadBoard::new(cores, max_workers),
            metrics,
            shutdown: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
            draining: AtomicBool::new(false),
            creds,
            budgets: (0..if replicated { cores } else { 1 })
                .map(|_| Arc::new(Budget::new(max_workers, settings.limits.max_index_entries)))
                .collect(),
            inflight: AtomicUsize::new(0),
            rr: AtomicU64::new(0),
            affinity: crate::select::Affinity::new(settings.router.affinity_max_entries),
            sessions: crate::select::Sessions::new(
                settings.router.session_max_entries,
                settings.router.session_ttl_ms,
            ),
            started: Instant::now(),
            status: crate::status::StatusState::new(cores, max_workers),
            recorder: std::sync::OnceLock::new(),
            tokenizers: std::sync::OnceLock::new(),
            cluster: std::sync::OnceLock::new(),
            settings,
        };
        Ok((Arc::new(shared), readers))
    }

    pub fn now_us(&self) -> u64 {
        self.started.elapsed().as_micros() as u64
    }

    pub fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Non-blocking enqueue to core `to`, in the message's lane. Rings the doorbell if
    /// the core may be parked.
    pub fn try_send(&self, to: usize, msg: Msg) -> Result<(), Msg> {
        let mailbox = &self.mailboxes[to][msg.lane() as usize];
        if msg.is_quiet() {
            return mailbox.push_quiet(msg);
        }
        match mailbox.push(msg) {
            Ok(true) => {
                // A full doorbell socket means a wake-up is already pending.
                let _ = (&self.doorbells[to]).write(&[1]);
                Ok(())
            }
            Ok(false) => Ok(()),
            Err(m) => Err(m),
        }
    }

    pub fn cells(&self, slot: WorkerSlot) -> Option<&WorkerCells> {
        self.workers.get(slot as usize)
    }

    /// Eligible for routing: not subject to heartbeats, or heard from recently; and,
    /// for a ZMQ engine, its event endpoint reachable.
    pub fn is_live(&self, slot: WorkerSlot, now_ms: u64) -> bool {
        match self.cells(slot) {
            Some(c) if c.engine_unreachable.load(Ordering::Relaxed) => false,
            Some(c) => {
                !c.heartbeat.load(Ordering::Relaxed)
                    || now_ms.saturating_sub(c.last_seen_ms.load(Ordering::Relaxed))
                        < self.settings.heartbeat_timeout_ms
            }
            None => false,
        }
    }

    /// Index shard owning a block hash: the core that holds it when sharded; 0 when
    /// replicated (compare with [`Shared::shard_index`], not with a core id).
    pub fn shard_of(&self, h: u64) -> usize {
        crate::index::shard_of(h, self.shard_bits)
    }

    /// The shard `core` holds, in [`Shared::shard_of`]'s numbering: itself when
    /// sharded, the only shard (0) when replicated.
    pub fn shard_index(&self, core: usize) -> usize {
        if self.replicated {
            0
        } else {
            core
        }
    }

    /// Whether `core` reports the index-derived figures (cached and unique active
    /// blocks, index refusals): every core when sharded (the figures add up over
    /// shards), core 0 only when replicated (every copy has the same).
    pub fn reports_index(&self, core: usize) -> bool {
        !self.replicated || core == 0
    }

    /// The entry budget `core`'s shard reserves from.
    pub fn budget_of(&self, core: usize) -> &Arc<Budget> {
        let i = if self.replicated { core } else { 0 };
        &self.budgets[i.min(self.budgets.len() - 1)]
    }

    /// Core that re-admits a restored in-flight request into its tracker (`persist`).
    /// Requests routed while running live on the core that routed them.
    pub fn owner_of(&self, request_id: &str) -> usize {
        let h = xxhash_rust::xxh3::xxh3_64(request_id.as_bytes());
        (h as usize) & (self.cores - 1)
    }
}

impl Shared {
    /// Whether a presented token is the shared one (constant-time compare; always true
    /// when authentication is off). Worker-scoped operations check
    /// [`Credentials::may_act_on`] instead.
    pub fn authorized(&self, presented: &str) -> bool {
        self.creds.is_admin(presented)
    }

    pub fn auth_enabled(&self) -> bool {
        self.creds.enabled()
    }

    /// Wakes core `to` if it may be parked.
    pub fn wake(&self, to: usize) {
        let _ = (&self.doorbells[to]).write(&[1]);
    }

    /// Core `to`'s inbox for `lane`.
    pub fn mailbox(&self, to: usize, lane: Lane) -> &Mailbox<Msg> {
        &self.mailboxes[to][lane as usize]
    }
}

impl crate::service::net::hyper_io::ConnHost for Shared {
    fn now_ms(&self) -> u64 {
        Shared::now_ms(self)
    }

    fn timeouts(&self) -> crate::service::net::http_clock::Timeouts {
        let s = &self.settings;
        crate::service::net::http_clock::Timeouts {
            header_ms: s.http_header_timeout_ms,
            idle_ms: s.http_idle_timeout_ms,
            body_ms: s.http_body_timeout_ms,
            body_min_rate: s.http_body_min_rate,
        }
    }

    fn protocol_error(&self, what: &'static str) {
        self.metrics.protocol_error(what);
    }
}
