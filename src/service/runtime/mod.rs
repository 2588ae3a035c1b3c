//! The runtime: the glommio executors (one per core) and what they share. It owns the
//! per-core state ([`core::Core`]), the process-wide state ([`shared::Shared`]), the
//! cross-core mailboxes and their messages ([`msg`]), each core's run loop
//! (`run_loop`, applying index batches preemptibly with `ingest_slice`; batches cut
//! by `index_batch`), a core's snapshot dump (`dump`), the start checks (`preflight`,
//! `pinning`, `core_start`) and settings (`huge_pages`: THP off), the blocking threads
//! (`blocking`), the answer spin (`answer_spin`), an idle core's spin before parking
//! (`idle_spin`), the tests of the executors' latency-ring timer (`latency_timer`)
//! and of their timer map (`timer_map`),
//! the replicated request-id register (`claims`), the routed-traffic recorder
//! (`recorder`), the schedule-lag probe (`schedule_lag`), the cores' scheduler slice
//! (`sched_slice`), and the cores' side of router replication: the link
//! (`cluster_link`), the hooks that publish into it (`cluster_hooks`) and its metric
//! families (`cluster_metrics`). The status page's state is the library's
//! `crate::status`.
//!
//! May import: `net`, `metrics`, the pure library.

pub mod answer_spin;
pub mod blocking;
pub mod claims;
pub mod cluster_hooks;
pub mod cluster_link;
pub mod cluster_metrics;
pub mod core;
pub mod core_start;
pub mod cpu_clock;
pub mod dump;
pub mod huge_pages;
pub mod idle_spin;
pub mod index_batch;
pub mod ingest_slice;
pub mod latency_timer;
pub mod msg;
pub mod pinning;
pub mod preflight;
pub mod recorder;
pub mod run_loop;
pub mod sched_slice;
pub mod schedule_lag;
pub mod shared;
pub mod timer_map;
