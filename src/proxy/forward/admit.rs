//! Where a proxied request meets the admission queue (`proxy::queued`): before its
//! first routing attempt when others of its model already wait (it queues behind
//! them), and when routing finds every eligible worker busy (it waits for capacity
//! instead of an immediate answer), or when every worker it tried answered 429 at its
//! own limit (the same saturation, seen by the workers); and, once it is answered,
//! which prefill path a disaggregated request took.

use super::super::policies::{PathLabel, Policies, Queue};
use super::super::queued;
use super::super::retry::{self, Failure};
use super::super::watch::Gone;
use super::Job;
use crate::engine::{EngineError, RouteDecision, RouteRequest};
use crate::select::RouteError;
use crate::service::routing::errors::ApiError;
use std::sync::Arc;

pub(super) use super::super::queued::{Held, Turn};

impl Job {
    fn policies(&self) -> Option<&Policies> {
        let p = self.core.state.policies.get()?;
        (p.queueing() && self.front.is_some()).then_some(p)
    }

    fn model_of(rr: &RouteRequest) -> &str {
        rr.model.as_deref().unwrap_or("")
    }

    /// The epoch of the request's queue, read before a routing attempt.
    pub(super) fn queue_epoch(&self, rr: &RouteRequest) -> u64 {
        self.policies().map_or(0, |p| p.epoch(Self::model_of(rr)))
    }

    /// Whether the request goes to the queue without trying to route: others of its
    /// model wait, and it has no grant of its own (`turn`).
    pub(super) fn queued_before(&self, rr: &RouteRequest, turn: &Option<Held>) -> bool {
        turn.is_none()
            && self
                .policies()
                .is_some_and(|p| p.waiting(Self::model_of(rr)).is_some())
    }

    /// Whether a routing failure `e` (`None`: not tried, others wait) means waiting
    /// in the queue: every eligible worker is busy and the queue is on.
    pub(super) fn waits(&self, e: Option<&ApiError>, rr: &RouteRequest) -> bool {
        let busy = match e {
            None => true,
            Some(ApiError::Engine(EngineError::Route(RouteError::AllBusy { .. }))) => true,
            Some(_) => false,
        };
        busy && self.queue_of(rr).is_some()
    }

    /// Whether failure `f` on an attempt of `rr` is a worker's 429 that the admission
    /// queue waits out (so no backoff before the next try).
    pub(super) fn queue_waits(&self, f: Failure, rr: &RouteRequest) -> bool {
        retry::is_busy(f) && self.queue_of(rr).is_some()
    }

    fn queue_of(&self, rr: &RouteRequest) -> Option<Arc<Queue>> {
        self.policies()?.queue(Self::model_of(rr))
    }

    /// On a disaggregated fleet, says where the request's prefill ran: header
    /// `x-kvroute-prefill` (`remote`, `local-short`, `local-cached`) and the
    /// `proxy_prefill_path` metric. Nothing for an aggregated worker.
    pub(super) fn prefill_path(&self, r: &mut super::Resp, d: &RouteDecision) {
        let (path, header) = match (&d.local_prefill, &d.prefill_worker) {
            (Some(why), _) if why == "short" => ("local", "local-short"),
            (Some(_), _) => ("local", "local-cached"),
            (None, Some(_)) => ("remote", "remote"),
            (None, None) => return,
        };
        r.headers_mut().insert(
            "x-kvroute-prefill",
            hyper::header::HeaderValue::from_static(header),
        );
        if let Some(p) = self.core.state.policies.get() {
            p.metrics
                .prefill_path
                .get_or_create(&PathLabel { path })
                .inc();
        }
    }

    /// Every worker tried answered 429 (each at its own limit) on the attempt `at`
    /// (its model and the queue's epoch before it): the fleet is saturated as surely
    /// as when the router finds every worker busy, so with the queue on the request
    /// waits for capacity in the same queue (or goes back to its place with `prior`)
    /// instead of a 429 `workers_busy`. `None`: not that case (answer as before).
    /// The epoch is read after the last refusal, not before the attempt: a release
    /// during the attempt did not free the worker that then refused, and rechecking on
    /// it would grant the same request again at once, a loop of refusals while the
    /// worker finishes freeing its slot; a later release (or the 100 ms tick) does.
    pub(super) async fn wait_refused(
        &self,
        at: Option<(Option<String>, u64)>,
        prior: Option<Held>,
        gone: &mut Gone,
    ) -> Option<Turn> {
        let (model, seen) = at?;
        let model = model.as_deref().unwrap_or("");
        let (p, front) = (self.policies()?, self.front.as_ref()?);
        let q = p.queue(model)?;
        let st = &self.core.state;
        Some(queued::wait_turn(st, model, &q, front, seen, prior, gone).await)
    }

    /// Waits for the request's turn (see `proxy::queued`).
    pub(super) async fn wait_turn(
        &self,
        rr: &RouteRequest,
        seen: u64,
        prior: Option<Held>,
        gone: &mut Gone,
    ) -> Turn {
        let (Some(q), Some(front)) = (self.queue_of(rr), &self.front) else {
            return Turn::Left;
        };
        let st = &self.core.state;
        queued::wait_turn(st, Self::model_of(rr), &q, front, seen, prior, gone).await
    }
}
