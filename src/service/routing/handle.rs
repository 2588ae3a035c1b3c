//! The routing handle: the one door through which a front end that runs on the cores
//! (the OpenAI proxy today; other HTTP front ends and admission policies next) reaches
//! the routing pipeline. One per core, cheap to clone (an `Rc`), `!Send`: it lives on
//! the executor of its core, and its futures run there.
//!
//! The phases a front end goes through, as in a Pingora-like proxy:
//! 1. request filter: the front end's own checks (auth with [`Handle::credentials`],
//!    limits from [`Handle::settings`], admission), and the prompt's token ids
//!    ([`Handle::tokenizers`], long ones off the core with [`Handle::off_core`]);
//! 2. upstream peer: [`Handle::route`] — a decision (worker, legs) or an error;
//!    [`Handle::registry`] maps a worker to its URL and model;
//! 3. response filter: [`Handle::lifecycle`] as the answer streams (first token,
//!    progress, finish; a prefill failure re-routes decode-only);
//! 4. logging: the front end's own metric families, registered once into
//!    [`Handle::metrics`]'s registry.
//!
//! Guarantees: every method is the same call the binary and JSON APIs make (same
//! limits, same lifecycle, same error mapping through `routing::errors`), so a front
//! end adds no routing semantics of its own. The handle hides the core's state (`Core`,
//! `Shared`) and the cross-core messages (`runtime::msg`): a front end names only this
//! file, `routing::errors`, `net` and `metrics` (checked by `tests/layers.rs`).
//!
//! A front end on its own thread (the Gateway API endpoint picker on tokio) cannot
//! hold a handle; it reaches a core through a bounded queue, as the NATS bridge does
//! (`cluster::bridge`), and a task on that core calls the handle.
//!
//! May import: `runtime`, `routing`, `net`, `metrics` and the pure library.

use crate::credentials::Credentials;
use crate::engine::request::LifeOp;
use crate::engine::{RouteDecision, RouteRequest};
use crate::registry::Registry;
use crate::service::metrics::Metrics;
use crate::service::net::conn_slot::Slot;
use crate::service::net::hyper_io::HttpConn;
use crate::service::routing::errors::ApiError;
use crate::service::routing::router;
use crate::service::runtime::core::Core;
use crate::settings::Settings;
use crate::tokenize::Tokenizers;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The routing pipeline of one core, as a front end sees it.
#[derive(Clone)]
pub struct Handle {
    core: Rc<Core>,
}

impl Handle {
    /// The handle of `core` (the service wires it; a front end is given one).
    pub(crate) fn new(core: Rc<Core>) -> Handle {
        Handle { core }
    }

    /// The core this handle runs on (0-based).
    pub fn core_id(&self) -> usize {
        self.core.id
    }

    /// Routes a request whose id the front end minted (`crate::ids`): the decision,
    /// or why not (overloaded, bad request, no worker...). With more than one core the
    /// other cores' shards are asked; the returned future runs on this core.
    pub async fn route(&self, req: &RouteRequest) -> Result<RouteDecision, ApiError> {
        router::route_proxied(&self.core, req).await
    }

    /// A lifecycle step of a routed request: `FirstToken`, `Progress(n)`, `Finish`
    /// (releases its load), or `PrefillFailed` (a disaggregated request is re-routed
    /// decode-only: the new decision is returned).
    pub async fn lifecycle(&self, op: LifeOp, id: &str) -> Result<Option<RouteDecision>, ApiError> {
        router::lifecycle(&self.core, op, id).await
    }

    /// A read snapshot of the worker registry (ids, URLs, models, roles): consistent
    /// for as long as it is held, and not updated meanwhile.
    pub fn registry(&self) -> Arc<Registry> {
        self.core.shared.registry.load_full()
    }

    /// The settings the service runs with.
    pub fn settings(&self) -> &Settings {
        &self.core.shared.settings
    }

    /// The shared token and the per-worker tokens.
    pub fn credentials(&self) -> &Credentials {
        &self.core.shared.creds
    }

    /// The models' tokenizers (`None`: no `--tokenizer`, route on the text).
    pub fn tokenizers(&self) -> Option<&Arc<Tokenizers>> {
        self.core.shared.tokenizers.get()
    }

    /// The service's metrics: front ends register their families into its registry
    /// once (`Metrics::with_registry`) and keep their own handles to them.
    pub fn metrics(&self) -> &Metrics {
        &self.core.shared.metrics
    }

    /// Milliseconds since the service started (the clock of breakers and deadlines).
    pub fn now_ms(&self) -> u64 {
        self.core.shared.now_ms()
    }

    /// Set at the first shutdown signal: front ends drain (close connections after
    /// their answer, say so on `/health`).
    pub fn draining(&self) -> bool {
        self.core.shared.draining.load(Ordering::Relaxed)
    }

    /// Tells the other cores a route is coming, so their wake-up overlaps the work the
    /// front end does before it routes (tokenizing; `answer_spin`).
    pub fn announce(&self) {
        router::announce(&self.core);
    }

    /// Runs `f` on this core's blocking thread (below the executors' priority), while
    /// the core serves its other work; for work too long for the core (a long prompt's
    /// tokens).
    pub async fn off_core<F, R>(&self, f: F) -> R
    where
        F: FnOnce() -> R + Send + 'static,
        R: Send + 'static,
    {
        crate::service::runtime::blocking::run(f).await
    }

    /// The HTTP connection state of an accepted connection holding `slot`, with the
    /// service's header, idle and body deadlines (`net::hyper_io`).
    pub fn http_conn(&self, slot: Rc<Slot>) -> Rc<HttpConn> {
        HttpConn::new(self.core.shared.clone(), slot)
    }
}
