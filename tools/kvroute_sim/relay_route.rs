//! `kvroute-sim relay --http --route-tokenizer MODEL=DIR`: the HTTP relay doing a
//! router's own work on every request before it forwards it.
//!
//! The work is kvroute's, called as a library, in the order its proxy does it: the body
//! read whole and parsed in place (`proxy::request::parse`), engine-to-engine members
//! stripped, the prompt's token ids through the same tokenizer and chat template
//! (`proxy::prompt`), the routing request (`proxy::route_request`) and a decision of
//! the sans-I/O engine (`engine::Engine::route`: block hashes, index and load). The
//! request's first output marks its first token and its answer's end finishes it.
//! Only the runtime differs: hyper on tokio's current-thread runtime here, glommio in
//! `kvroute serve`. Beside kvroute in the same run it is the control that splits
//! kvroute's added latency into its routing work and its runtime (docs/PERFORMANCE.md,
//! "Router-tier cost").
//!
//! Two fleets:
//! - one upstream (`--upstream`): the engine knows one worker and no KV events, so the
//!   index query finds nothing;
//! - workers that register by kvroute's binary event protocol (`--events-addr`,
//!   `relay_events.rs`): their events fill the index, each request goes to the worker
//!   decided, and the decisions' wall time (`kvroute_decision_latency_seconds`, the
//!   same buckets as kvroute's) is served at `GET /metrics`. That makes it the control
//!   for kvroute's decision latency: the same decisions, at the same moments of the
//!   same replay, on another runtime.
//!
//! Guarantees: a body that does not parse or tokenize, or goes to another path, is
//! forwarded as it came, without a decision (the control measures work, it refuses
//! nothing), to the one upstream or the first worker registered; one over
//! [`MAX_BODY`] bytes ends its connection (`relay_http`).

use bytes::Bytes;
use kvroute::engine::{Engine, EngineLimits, KvEvent};
use kvroute::proxy::request::{self, Endpoint};
use kvroute::proxy::url::UpstreamUrl;
use kvroute::proxy::{prompt, route_request};
use kvroute::tokenize::Tokenizers;
use kvroute::types::WorkerSpec;
use prometheus_client::metrics::histogram::Histogram;
use std::cell::{Cell, RefCell};
use std::path::PathBuf;
use std::time::Instant;

/// The largest body read for the routing work.
pub const MAX_BODY: usize = 64 << 20;

/// The one worker the engine knows without events: the relay's upstream.
const WORKER: &str = "upstream";

/// A router's per-request work, on one thread (the relay's runtime is single-threaded).
pub struct RouteWork {
    tok: Tokenizers,
    model: String,
    engine: RefCell<Engine>,
    /// The workers routed among, in registration order, with the `host:port` each is
    /// forwarded to (`None`: the relay's `--upstream`).
    workers: RefCell<Vec<(String, Option<String>)>>,
    /// Wall time of each decision (`Engine::route`), seconds.
    decisions: Histogram,
    start: Instant,
    next: Cell<u64>,
}

/// A routed request: its decision's id and where it goes (`host:port`; `None`: the
/// relay's `--upstream`).
pub struct Routed {
    pub rid: String,
    pub to: Option<String>,
}

impl RouteWork {
    /// `spec` is `MODEL=DIR` (a Hugging Face tokenizer directory, as `kvroute serve
    /// --tokenizer` takes it); the engine has block size `block_size`. With `upstream`
    /// it knows one worker of that model, the relay's upstream; without, none until
    /// workers register (`register`).
    pub fn new(spec: &str, block_size: u32, upstream: bool) -> Result<RouteWork, String> {
        let (model, dir) = spec
            .split_once('=')
            .ok_or_else(|| format!("--route-tokenizer {spec:?}: expected MODEL=DIR"))?;
        let tok = Tokenizers::load(&[(model.to_string(), PathBuf::from(dir))])?;
        let cfg = kvroute::config::RouterConfig {
            block_size,
            ..Default::default()
        };
        let engine = Engine::new(cfg, 0, EngineLimits::default(), 1)?;
        let w = RouteWork {
            tok,
            model: model.to_string(),
            engine: RefCell::new(engine),
            workers: RefCell::new(Vec::new()),
            // kvroute's buckets: 1 µs .. ~33 ms in powers of two.
            decisions: Histogram::new((0..16).map(|i| 1e-6 * f64::from(1u32 << i))),
            start: Instant::now(),
            next: Cell::new(0),
        };
        if upstream {
            let w0: WorkerSpec =
                serde_json::from_value(serde_json::json!({"id": WORKER, "model": model}))
                    .map_err(|e| format!("worker spec: {e}"))?;
            w.register(w0)?;
        }
        Ok(w)
    }

    /// Adds (or replaces) worker `spec`, forwarded to its `url` (parsed as the proxy
    /// parses a worker's, `proxy::url`). A worker of another model is refused (the
    /// relay routes one model), and so is a URL with a base path (the relay forwards
    /// paths as they came).
    pub fn register(&self, spec: WorkerSpec) -> Result<(), String> {
        if spec.model != self.model {
            return Err(format!(
                "worker {:?} serves {:?}, not {:?}",
                spec.id, spec.model, self.model
            ));
        }
        let url = spec.url.as_deref().map(UpstreamUrl::parse).transpose()?;
        if let Some(u) = url.as_ref().filter(|u| !u.base.is_empty()) {
            return Err(format!("worker {:?}: base path {:?}", spec.id, u.base));
        }
        let (id, url) = (spec.id.clone(), url.map(|u| u.authority));
        self.engine
            .borrow_mut()
            .register(spec)
            .map_err(|e| e.to_string())?;
        let mut ws = self.workers.borrow_mut();
        ws.retain(|(w, _)| *w != id);
        ws.push((id, url));
        Ok(())
    }

    /// Applies worker `id`'s cache event; an unknown worker's is dropped.
    pub fn apply(&self, id: &str, ev: &KvEvent) {
        let _ = self.engine.borrow_mut().apply(id, ev);
    }

    /// Where a request without a decision goes: the first worker registered (`None`:
    /// the relay's `--upstream`, or no worker yet).
    pub fn fallback(&self) -> Option<String> {
        self.workers
            .borrow()
            .first()
            .and_then(|(_, url)| url.clone())
    }

    /// The work on one request body sent to `path`: the decision's id, to finish when
    /// the answer ends, and where it goes (`None`: nothing was routed).
    pub fn route(&self, path: &str, raw: &Bytes) -> Option<Routed> {
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
        let allow = self
            .workers
            .borrow()
            .iter()
            .map(|(w, _)| w.clone())
            .collect();
        let rr =
            route_request::route_request(Some(&self.tok), &creq, tokens, raw.len(), &rid, allow);
        let started = Instant::now();
        let d = self.engine.borrow_mut().route(&rr, self.now_us());
        self.decisions.observe(started.elapsed().as_secs_f64());
        let d = d.ok()?;
        let to = self
            .workers
            .borrow()
            .iter()
            .find(|(w, _)| *w == d.decode_worker)
            .and_then(|(_, url)| url.clone());
        Some(Routed {
            rid: d.request_id,
            to,
        })
    }

    /// The request's first output arrived.
    pub fn first_token(&self, rid: &str) {
        let _ = self.engine.borrow_mut().first_token(rid, self.now_us());
    }

    /// The request's answer ended: it leaves the engine's load.
    pub fn finish(&self, rid: &str) {
        let _ = self.engine.borrow_mut().finish(rid, self.now_us());
    }

    /// The decisions' wall time in Prometheus' text format, named as kvroute names it.
    pub fn metrics(&self) -> String {
        let mut reg = prometheus_client::registry::Registry::with_prefix("kvroute");
        reg.register(
            "decision_latency_seconds",
            "Wall time of the control's decisions",
            self.decisions.clone(),
        );
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &reg);
        out
    }

    fn now_us(&self) -> u64 {
        self.start.elapsed().as_micros() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn work(dir: &std::path::Path, upstream: bool) -> RouteWork {
        kvroute::tokenize::testing::write_dir(dir, 1000).unwrap();
        RouteWork::new(&format!("m={}", dir.display()), 16, upstream).unwrap()
    }

    fn chat(words: usize) -> Bytes {
        let words: Vec<String> = (0..words).map(|i| format!("t{i}")).collect();
        let body = serde_json::json!({
            "model": "m", "stream": true,
            "messages": [{"role": "user", "content": words.join(" ")}],
        });
        Bytes::from(serde_json::to_vec(&body).unwrap())
    }

    fn spec(id: &str, model: &str, url: &str) -> WorkerSpec {
        serde_json::from_value(serde_json::json!({"id": id, "model": model, "url": url})).unwrap()
    }

    /// A chat body is parsed, tokenized and routed to the upstream worker, and stays
    /// in the engine's load until its answer ends.
    #[test]
    fn a_chat_request_is_routed_and_finished() {
        let d = tempfile::tempdir().unwrap();
        let w = work(d.path(), true);
        let r = w.route("/v1/chat/completions", &chat(64)).expect("routed");
        assert_eq!(r.to, None, "the relay's own upstream");
        assert_eq!(w.engine.borrow().active_requests(), 1);
        w.first_token(&r.rid);
        w.finish(&r.rid);
        assert_eq!(w.engine.borrow().active_requests(), 0);
        assert!(w
            .metrics()
            .contains("kvroute_decision_latency_seconds_count 1"));
    }

    /// What is not a completion, or not a body the proxy would route, is forwarded
    /// without a decision.
    #[test]
    fn other_paths_and_bad_bodies_are_not_routed() {
        let d = tempfile::tempdir().unwrap();
        let w = work(d.path(), true);
        let ok = Bytes::from_static(br#"{"model":"m","prompt":"t1 t2"}"#);
        assert!(w.route("/v1/models", &ok).is_none());
        assert!(w
            .route("/v1/completions", &Bytes::from_static(b"{"))
            .is_none());
        assert!(w.route("/v1/completions", &ok).is_some());
        assert!(RouteWork::new("no-equals-sign", 16, true).is_err());
    }

    /// Registered workers' events fill the index: a prompt goes to the worker that
    /// holds its blocks, whichever registered first, and to its `url`.
    #[test]
    fn events_steer_requests_to_the_worker_holding_the_prefix() {
        let d = tempfile::tempdir().unwrap();
        let w = work(d.path(), false);
        assert!(
            w.route("/v1/chat/completions", &chat(8)).is_none(),
            "no workers"
        );
        assert_eq!(w.fallback(), None);
        w.register(spec("a", "m", "http://127.0.0.1:1")).unwrap();
        w.register(spec("b", "m", "http://127.0.0.1:2")).unwrap();
        assert!(w
            .register(spec("c", "other", "http://127.0.0.1:3"))
            .is_err());
        assert!(w
            .register(spec("d", "m", "http://127.0.0.1:4/base"))
            .is_err());
        assert!(w.register(spec("e", "m", "https://127.0.0.1:5")).is_err());
        assert_eq!(w.fallback().as_deref(), Some("127.0.0.1:1"));
        // The blocks of a 256-word prompt, as the engine hashes them, stored on `b`.
        let body = chat(256);
        let creq = request::parse(body.clone()).unwrap();
        let toks = prompt::prompt_tokens(Some(&w.tok), Endpoint::Chat, "m", &creq.body)
            .unwrap()
            .unwrap();
        let rr = route_request::route_request(Some(&w.tok), &creq, Some(toks), 0, "x", vec![]);
        let hashes = rr.prepare(16, 1 << 20).unwrap().hashes;
        assert!(hashes.len() >= 8);
        for _ in 0..4 {
            w.apply(
                "b",
                &KvEvent::Stored {
                    tier: kvroute::types::Tier::Device,
                    parent: None,
                    block_hashes: hashes.clone(),
                },
            );
            let r = w.route("/v1/chat/completions", &body).unwrap();
            assert_eq!(r.to.as_deref(), Some("127.0.0.1:2"));
            w.finish(&r.rid);
        }
    }
}
