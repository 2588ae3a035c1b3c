//! `kvroute-sim relay --http --route-tokenizer MODEL=DIR`: the HTTP relay doing a
//! router's own work on every request before it forwards it.
//!
//! The work is kvroute's, called as a library, in the order its proxy does it: the body
//! read whole and parsed in place (`proxy::request::parse`), engine-to-engine members
//! stripped, the prompt's token ids through the same tokenizer and chat template
//! (`proxy::prompt`), the routing request (`proxy::route_request`) and a decision of
//! the sans-I/O engine (`engine::Engine::route`: block hashes, index and load), whose
//! request is finished when the worker's answer head arrives. Only the runtime
//! differs: hyper on tokio's current-thread runtime here, glommio in `kvroute serve`.
//! Beside kvroute in the same run it is the control that splits kvroute's added
//! latency into its routing work and its runtime (docs/PERFORMANCE.md, "Router-tier
//! cost").
//!
//! What it leaves out, knowingly: no KV events are ingested (the index stays empty, so
//! the index query finds nothing), and there is one worker, the relay's upstream.
//!
//! Guarantees: a body that does not parse or tokenize, or goes to another path, is
//! forwarded as it came, without a decision (the control measures work, it refuses
//! nothing); one over [`MAX_BODY`] bytes ends its connection (`relay_http`).

use bytes::Bytes;
use kvroute::engine::{Engine, EngineLimits};
use kvroute::proxy::request::{self, Endpoint};
use kvroute::proxy::{prompt, route_request};
use kvroute::tokenize::Tokenizers;
use kvroute::types::WorkerSpec;
use std::cell::{Cell, RefCell};
use std::path::PathBuf;
use std::time::Instant;

/// The largest body read for the routing work.
pub const MAX_BODY: usize = 64 << 20;

/// The one worker the engine knows: the relay's upstream.
const WORKER: &str = "upstream";

/// A router's per-request work, on one thread (the relay's runtime is single-threaded).
pub struct RouteWork {
    tok: Tokenizers,
    engine: RefCell<Engine>,
    start: Instant,
    next: Cell<u64>,
}

impl RouteWork {
    /// `spec` is `MODEL=DIR` (a Hugging Face tokenizer directory, as `kvroute serve
    /// --tokenizer` takes it); the engine has block size `block_size` and one worker of
    /// that model.
    pub fn new(spec: &str, block_size: u32) -> Result<RouteWork, String> {
        let (model, dir) = spec
            .split_once('=')
            .ok_or_else(|| format!("--route-tokenizer {spec:?}: expected MODEL=DIR"))?;
        let tok = Tokenizers::load(&[(model.to_string(), PathBuf::from(dir))])?;
        let cfg = kvroute::config::RouterConfig {
            block_size,
            ..Default::default()
        };
        let mut engine = Engine::new(cfg, 0, EngineLimits::default(), 1)?;
        let w: WorkerSpec =
            serde_json::from_value(serde_json::json!({"id": WORKER, "model": model}))
                .map_err(|e| format!("worker spec: {e}"))?;
        engine.register(w).map_err(|e| e.to_string())?;
        Ok(RouteWork {
            tok,
            engine: RefCell::new(engine),
            start: Instant::now(),
            next: Cell::new(0),
        })
    }

    /// The work on one request body sent to `path`; the id of its decision, to finish
    /// when the answer's head arrives (`None`: nothing was routed).
    pub fn route(&self, path: &str, raw: &Bytes) -> Option<String> {
        let endpoint = match path {
            "/v1/chat/completions" => Endpoint::Chat,
            "/v1/completions" => Endpoint::Completions,
            _ => return None,
        };
        let mut creq = request::parse(raw.clone()).ok()?;
        creq.body.strip();
        let tokens =
            prompt::prompt_tokens(Some(&self.tok), endpoint, &creq.model, &creq.body).ok()?;
        let n = self.next.get();
        self.next.set(n + 1);
        let rid = format!("relay-{n}");
        let rr = route_request::route_request(
            Some(&self.tok),
            &creq,
            tokens,
            raw.len(),
            &rid,
            vec![WORKER.to_string()],
        );
        let d = self.engine.borrow_mut().route(&rr, self.now_us()).ok()?;
        Some(d.request_id)
    }

    /// The request's answer began: it leaves the engine's load.
    pub fn finish(&self, rid: &str) {
        let _ = self.engine.borrow_mut().finish(rid, self.now_us());
    }

    fn now_us(&self) -> u64 {
        self.start.elapsed().as_micros() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn work(dir: &std::path::Path) -> RouteWork {
        kvroute::tokenize::testing::write_dir(dir, 1000).unwrap();
        RouteWork::new(&format!("m={}", dir.display()), 16).unwrap()
    }

    /// A chat body is parsed, tokenized and routed to the upstream worker, and stays
    /// in the engine's load until its answer begins.
    #[test]
    fn a_chat_request_is_routed_and_finished() {
        let d = tempfile::tempdir().unwrap();
        let w = work(d.path());
        let words: Vec<String> = (0..64).map(|i| format!("t{i}")).collect();
        let body = serde_json::json!({
            "model": "m", "stream": true,
            "messages": [{"role": "user", "content": words.join(" ")}],
        });
        let raw = Bytes::from(serde_json::to_vec(&body).unwrap());
        let rid = w.route("/v1/chat/completions", &raw).expect("routed");
        assert_eq!(w.engine.borrow().active_requests(), 1);
        w.finish(&rid);
        assert_eq!(w.engine.borrow().active_requests(), 0);
    }

    /// What is not a completion, or not a body the proxy would route, is forwarded
    /// without a decision.
    #[test]
    fn other_paths_and_bad_bodies_are_not_routed() {
        let d = tempfile::tempdir().unwrap();
        let w = work(d.path());
        let ok = Bytes::from_static(br#"{"model":"m","prompt":"t1 t2"}"#);
        assert!(w.route("/v1/models", &ok).is_none());
        assert!(w
            .route("/v1/completions", &Bytes::from_static(b"{"))
            .is_none());
        assert!(w.route("/v1/completions", &ok).is_some());
        assert!(RouteWork::new("no-equals-sign", 16).is_err());
    }
}
