//! A [`Picker`] for tests and benchmarks of the ext_proc side alone: fixed endpoints,
//! a per-worker capacity, and a record of everything asked of it.
//!
//! It behaves like the real pipeline where the protocol tests look: the prompt goes
//! through the proxy's `prompt::token_ids` (a bad token prompt is a 400), the same
//! prompt prefix (its first 64 tokens, or the first 256 bytes of its `prompt` /
//! `messages` JSON) always lands on the same allowed worker while that worker has
//! room, a request without a prompt goes to the least loaded one, no allowed worker is
//! a 503 and all allowed at capacity a 429. Load is counted from the pick to
//! `Finish`.

use super::pick::{EndpointInfo, Life, NoPick, Pick, PickFuture, PickRequest, Picker};
use crate::proxy::prompt;
use crate::proxy::request::Member;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

#[derive(Default)]
struct State {
    load: HashMap<String, u32>,
    /// Request id → worker, until `Finish`.
    live: HashMap<String, String>,
    log: Vec<(String, Life)>,
    requests: Vec<PickRequest>,
    counter: u64,
}

pub struct FakePicker {
    endpoints: Arc<[EndpointInfo]>,
    capacity: u32,
    state: Mutex<State>,
}

impl FakePicker {
    /// `endpoints`: (worker id, `ip:port`).
    pub fn new(endpoints: &[(&str, &str)], capacity: u32) -> FakePicker {
        FakePicker {
            endpoints: endpoints
                .iter()
                .map(|(w, e)| EndpointInfo {
                    worker: w.to_string(),
                    endpoint: e.to_string(),
                })
                .collect(),
            capacity,
            state: Mutex::new(State::default()),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Requests in flight on `worker`.
    pub fn load(&self, worker: &str) -> u32 {
        self.state().load.get(worker).copied().unwrap_or(0)
    }

    /// Requests in flight on every worker.
    pub fn total_load(&self) -> u32 {
        self.state().load.values().sum()
    }

    /// Every lifecycle signal received, in order.
    pub fn log(&self) -> Vec<(String, Life)> {
        self.state().log.clone()
    }

    /// Every request asked to be routed, in order.
    pub fn requests(&self) -> Vec<PickRequest> {
        self.state().requests.clone()
    }

    fn choose(&self, req: &PickRequest) -> Result<Pick, NoPick> {
        let key = prefix_key(req)?;
        let mut st = self.state();
        st.requests.push(req.clone());
        let allowed: Vec<&EndpointInfo> = self
            .endpoints
            .iter()
            .filter(|e| req.allow.as_ref().is_none_or(|a| a.contains(&e.worker)))
            .collect();
        if allowed.is_empty() {
            return Err(NoPick::NoEndpoint("no worker is allowed".into()));
        }
        let room: Vec<&EndpointInfo> = allowed
            .into_iter()
            .filter(|e| st.load.get(&e.worker).copied().unwrap_or(0) < self.capacity)
            .collect();
        let chosen = match (key, room.is_empty()) {
            (_, true) => return Err(NoPick::Busy("every allowed worker is at capacity".into())),
            (Some(k), _) => room[(k % room.len() as u64) as usize],
            (None, _) => *room
                .iter()
                .min_by_key(|e| st.load.get(&e.worker).copied().unwrap_or(0))
                .unwrap_or(&room[0]),
        };
        st.counter += 1;
        let id = format!("epp-fake-{}", st.counter);
        *st.load.entry(chosen.worker.clone()).or_default() += 1;
        st.live.insert(id.clone(), chosen.worker.clone());
        Ok(Pick {
            request_id: id,
            worker: chosen.worker.clone(),
            endpoint: chosen.endpoint.clone(),
            prefill: None,
        })
    }
}

/// A hash of the prompt's prefix; `None` without a prompt.
fn prefix_key(req: &PickRequest) -> Result<Option<u64>, NoPick> {
    let (Some(ep), Some(r)) = (req.endpoint, &req.request) else {
        return Ok(None);
    };
    let tokens = prompt::token_ids(ep, &r.model, &r.body).map_err(|e| NoPick::BadRequest(e.0))?;
    let bytes: Vec<u8> = match tokens {
        Some(t) => t.iter().take(64).flat_map(|x| x.to_le_bytes()).collect(),
        None => {
            let p = (r.body.get(Member::Prompt)).or_else(|| r.body.get(Member::Messages));
            match p {
                Some(v) => v.bytes().take(256).collect(),
                None => return Ok(None),
            }
        }
    };
    Ok(Some(xxhash_rust::xxh3::xxh3_64(&bytes)))
}

impl Picker for FakePicker {
    fn pick(&self, req: PickRequest) -> PickFuture {
        let r = self.choose(&req);
        Box::pin(async move { r })
    }

    fn life(&self, request_id: &str, life: Life) {
        let mut st = self.state();
        st.log.push((request_id.to_string(), life.clone()));
        if let Life::Finish(_) = life {
            if let Some(w) = st.live.remove(request_id) {
                if let Some(n) = st.load.get_mut(&w) {
                    *n = n.saturating_sub(1);
                }
            }
        }
    }

    fn endpoints(&self) -> Arc<[EndpointInfo]> {
        self.endpoints.clone()
    }
}
