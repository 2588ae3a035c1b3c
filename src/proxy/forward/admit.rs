//! Where a proxied request meets the admission queue (`proxy::queued`): before its
//! first routing attempt when others of its model already wait (it queues behind
//! them), and when routing finds every eligible worker busy (it waits for capacity
//! instead of an immediate answer).

use super::super::policies::{Policies, Queue};
use super::super::queued;
use super::super::watch::Gone;
use super::Job;
use crate::engine::{EngineError, RouteRequest};
use crate::select::RouteError;
use crate::service::router::ApiError;
use std::sync::Arc;

pub(super) use super::super::queued::Turn;

impl Job {
    fn policies(&self) -> Option<&Policies> {
        let p = self.core.shared.proxy.policies.get()?;
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
    pub(super) fn queued_before(&self, rr: &RouteRequest, turn: &Option<queued_grant::G>) -> bool {
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

    fn queue_of(&self, rr: &RouteRequest) -> Option<Arc<Queue>> {
        self.policies()?.queue(Self::model_of(rr))
    }

    /// The request was routed: a grant it held is used up (its wait measured).
    pub(super) fn served(&self, turn: Option<queued_grant::G>) {
        if let (Some(g), Some(p)) = (turn, self.policies()) {
            p.admitted(&g);
        }
    }

    /// Waits for the request's turn (see `proxy::queued`).
    pub(super) async fn wait_turn(
        &self,
        rr: &RouteRequest,
        seen: u64,
        prior: Option<queued_grant::G>,
        gone: &mut Gone,
    ) -> Turn {
        let (Some(p), Some(q), Some(front)) = (self.policies(), self.queue_of(rr), &self.front)
        else {
            return Turn::Left;
        };
        queued::wait_turn(p, Self::model_of(rr), &q, front, seen, prior, gone).await
    }
}

pub(super) mod queued_grant {
    /// A grant from the admission queue.
    pub type G = crate::admission::shared::Grant<super::super::super::policies::Wake>;
}
