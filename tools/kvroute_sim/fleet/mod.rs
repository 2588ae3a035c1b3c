//! `kvroute-sim fleet`: N simulated vLLM workers, each an OpenAI-compatible HTTP server
//! on its own loopback port with its own KV cache model (`kvroute::sim::live`),
//! publishing its KV events in vLLM's ZMQ format or kvroute's binary protocol
//! (`events`), optionally registered with a router over HTTP. Runs until SIGINT /
//! SIGTERM, then stops every server and publisher and exits 0.
//!
//! HTTP is hyper 1 on a tokio runtime (`server`): a tool, not the service, so the
//! glommio constraints (one executor per core, io_uring memlock) are not worth paying
//! here, and tokio's multi-threaded scheduler spreads N workers over the cores.

mod agent;
mod events;
mod server;

use clap::Args;
use events::{Events, Sink};
use hyper_util::rt::TokioIo;
use kvroute::sim::live::LiveWorker;
use kvroute::sim::TimingModel;
use kvroute::types::{Role, WorkerSpec};
use server::WorkerCtx;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Args, Debug)]
pub struct FleetArgs {
    /// Number of simulated workers.
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// The first P workers are prefill workers and the rest decode workers (NIXL flow);
    /// 0: every worker is aggregated.
    #[arg(long, default_value_t = 0)]
    prefill_workers: usize,
    /// Model served (`GET /v1/models`; other models get 404).
    #[arg(long, default_value = "sim-model")]
    model: String,
    /// Port of the first worker's HTTP server, the next ones follow; 0: free ports.
    #[arg(long, default_value_t = 0)]
    base_port: u16,
    /// ZMQ PUB port of the first worker (ZMQ events), the next ones follow; 0: free.
    #[arg(long, default_value_t = 0)]
    base_zmq_port: u16,
    /// KV events: `zmq` (vLLM's format, a PUB socket per worker), `binary` (to
    /// --router-events), or `none`.
    #[arg(long, default_value = "zmq", value_parser = ["zmq", "binary", "none"])]
    events: String,
    /// The router's binary event address (host:port) for `--events binary`.
    #[arg(long)]
    router_events: Option<String>,
    /// Shared-secret token of the router (binary events, --register).
    #[arg(long, default_value = "", env = "KVROUTE_AUTH_TOKEN")]
    auth_token: String,
    /// POST each worker (with its `url`) to this router's `/v1/workers` (host:port).
    #[arg(long)]
    register: Option<String>,
    /// Worker id prefix: workers are `{prefix}{i}`.
    #[arg(long, default_value = "sim-")]
    id_prefix: String,
    /// Tokens per KV block (must equal the router's block_size).
    #[arg(long, default_value_t = 128)]
    block_size: u32,
    /// KV cache capacity of each worker, in blocks.
    #[arg(long, default_value_t = 4096)]
    capacity_blocks: usize,
    /// Model time runs this many times faster than the wall clock.
    #[arg(long, default_value_t = 1.0)]
    time_scale: f64,
    /// Timing-model fields, `key=value,...` (TimingModel: prefill_base_us, ...).
    #[arg(long, default_value = "")]
    timing: String,
    /// Most requests generating at once per worker (429 beyond).
    #[arg(long, default_value_t = 256)]
    max_active: usize,
    /// Largest request body accepted, bytes (413 beyond).
    #[arg(long, default_value_t = 8 << 20)]
    max_body_bytes: usize,
    /// Largest `max_tokens` honoured (larger requests are capped).
    #[arg(long, default_value_t = 4096)]
    max_tokens_cap: u32,
    /// Fraction of generation requests answered 500 (fault injection).
    #[arg(long, default_value_t = 0.0)]
    fail_rate: f64,
    /// Abort every stream after this many chunks (fault injection; 0 = never).
    #[arg(long, default_value_t = 0)]
    die_after_chunks: u32,
    /// Apply --fail-rate / --die-after-chunks only to these worker indices (`0,2`);
    /// empty: every worker.
    #[arg(long, default_value = "")]
    faulty: String,
    /// Directory of a HF tokenizer (`tokenizer.json` + `tokenizer_config.json`, e.g.
    /// from `kvroute-sim tokenizer`): prompts are tokenized with it, chat template
    /// and BOS included, exactly as `kvroute serve --tokenizer` does, so the workers'
    /// block hashes match the router's. Without it, `t{N}` words are token N.
    #[arg(long)]
    tokenizer: Option<std::path::PathBuf>,
    /// Require this key as `Authorization: Bearer` on every `/v1` route, as vLLM's
    /// `--api-key` does (401 `{"error": "Unauthorized"}` without it; vLLM 0.33 reads no
    /// `x-api-key`, so Anthropic clients must send the key as a bearer token too).
    #[arg(long, env = "KVROUTE_SIM_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// Runtime threads (default: the machine's cores).
    #[arg(long)]
    threads: Option<usize>,
}

fn timing(s: &str) -> Result<TimingModel, String> {
    let mut t = toml::map::Map::new();
    for kv in s.split(',').filter(|x| !x.is_empty()) {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| format!("--timing: {kv:?} is not key=value"))?;
        let v: toml::Value = v.parse::<i64>().map(toml::Value::Integer).or_else(|_| {
            v.parse::<f64>()
                .map(toml::Value::Float)
                .map_err(|_| format!("--timing {k}: {v:?} is not a number"))
        })?;
        t.insert(k.to_string(), v);
    }
    let m: TimingModel = toml::Value::Table(t)
        .try_into()
        .map_err(|e| format!("--timing: {e}"))?;
    m.validate()?;
    Ok(m)
}

fn role_of(a: &FleetArgs, i: usize) -> Role {
    match (a.prefill_workers, i < a.prefill_workers) {
        (0, _) => Role::Aggregated,
        (_, true) => Role::Prefill,
        (_, false) => Role::Decode,
    }
}

/// Runs the fleet until SIGINT / SIGTERM.
pub fn run(a: FleetArgs) -> Result<(), String> {
    if a.workers == 0 || a.workers > 1024 {
        return Err("--workers must be 1..=1024".into());
    }
    if a.prefill_workers >= a.workers && a.prefill_workers > 0 {
        return Err("--prefill-workers must leave at least one decode worker".into());
    }
    if !(a.time_scale.is_finite() && a.time_scale > 0.0) {
        return Err("--time-scale must be > 0".into());
    }
    if !(0.0..=1.0).contains(&a.fail_rate) {
        return Err("--fail-rate must be in [0, 1]".into());
    }
    if a.block_size == 0 || a.block_size as usize > kvroute::hash::MAX_BLOCK_SIZE {
        return Err("--block-size must be 1..=4096".into());
    }
    if a.events == "binary" && a.router_events.is_none() {
        return Err("--events binary needs --router-events".into());
    }
    let faulty: Vec<usize> = a
        .faulty
        .split(',')
        .filter(|x| !x.is_empty())
        .map(|x| {
            x.trim()
                .parse()
                .map_err(|_| format!("--faulty: {x:?} is not an index"))
        })
        .collect::<Result<_, _>>()?;
    let tm = timing(&a.timing)?;
    let tokenizers = match &a.tokenizer {
        Some(dir) => Some(Arc::new(kvroute::tokenize::Tokenizers::load(&[(
            a.model.clone(),
            dir.clone(),
        )])?)),
        None => None,
    };
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone())
            .map_err(|e| format!("signal handler: {e}"))?;
    }
    let rt = crate::setup::tokio_runtime(a.threads)?;
    let mut ctxs = Vec::new();
    for i in 0..a.workers {
        let port = if a.base_port == 0 {
            0
        } else {
            a.base_port.saturating_add(i as u16)
        };
        let listener = rt
            .block_on(tokio::net::TcpListener::bind(("127.0.0.1", port)))
            .map_err(|e| format!("worker {i}: bind 127.0.0.1:{port}: {e}"))?;
        let port = listener.local_addr().map_err(|e| e.to_string())?.port();
        let id = format!("{}{i}", a.id_prefix);
        let role = role_of(&a, i);
        let worker = Arc::new(Mutex::new(LiveWorker::new(
            a.capacity_blocks,
            a.block_size as usize,
            tm.clone(),
            a.time_scale,
            a.max_active,
        )));
        let mut spec = WorkerSpec::new(id.clone());
        spec.role = role;
        spec.model = a.model.clone();
        spec.capacity_blocks = a.capacity_blocks as u64;
        // The proxy forwards to this URL (binary handshake, --register).
        spec.url = Some(format!("http://127.0.0.1:{port}"));
        let sink = match a.events.as_str() {
            "zmq" => {
                let zp = if a.base_zmq_port == 0 {
                    0
                } else {
                    a.base_zmq_port.saturating_add(i as u16)
                };
                Sink::Zmq {
                    bind: format!("127.0.0.1:{zp}"),
                }
            }
            "binary" => Sink::Binary {
                router: a.router_events.clone().unwrap_or_default(),
                token: a.auth_token.clone(),
                spec: spec.clone(),
            },
            _ => Sink::None,
        };
        let events = Events::start(sink, worker.clone())?;
        let is_faulty = faulty.is_empty() || faulty.contains(&i);
        let url = spec.url.clone().unwrap_or_default();
        let ctx = Arc::new(WorkerCtx {
            id,
            model: a.model.clone(),
            role,
            url,
            port,
            max_body: a.max_body_bytes,
            max_tokens_cap: a.max_tokens_cap.max(1),
            fail_rate: if is_faulty { a.fail_rate } else { 0.0 },
            die_after_chunks: if is_faulty { a.die_after_chunks } else { 0 },
            api_key: a.api_key.clone(),
            worker,
            tokenizers: tokenizers.clone(),
            events,
            epoch: tokio::time::Instant::now(),
            counter: AtomicU64::new(0),
            responses: Mutex::new(agent::Store::new(
                agent::STORE_CAPACITY,
                agent::STORE_TTL_MS,
            )),
        });
        rt.spawn(accept_loop(listener, ctx.clone()));
        announce(&a, &ctx, &spec);
        if let Some(r) = &a.register {
            register(r, &a.auth_token, &spec, &ctx.url)?;
        }
        ctxs.push(ctx);
    }
    println!("ready: {} workers", ctxs.len());
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(50));
    }
    rt.shutdown_timeout(Duration::from_secs(2));
    for c in ctxs {
        if let Ok(mut c) = Arc::try_unwrap(c) {
            c.events.stop();
        }
    }
    eprintln!("kvroute-sim fleet: stopped");
    Ok(())
}

/// One line per worker: its URL and how a router reaches it.
fn announce(a: &FleetArgs, ctx: &WorkerCtx, spec: &WorkerSpec) {
    let mut line = format!("worker {} role={} url={}", ctx.id, ctx.role.name(), ctx.url);
    if let Some(ep) = &ctx.events.zmq_endpoint {
        line.push_str(&format!(
            " engine=worker_id={},endpoint={ep},url={},role={},model={},capacity_blocks={},block_size={}",
            spec.id,
            ctx.url,
            spec.role.name(),
            spec.model,
            spec.capacity_blocks,
            a.block_size
        ));
    }
    println!("{line}");
}

fn register(router: &str, token: &str, spec: &WorkerSpec, url: &str) -> Result<(), String> {
    let mut v = serde_json::to_value(spec).map_err(|e| e.to_string())?;
    if let Some(o) = v.as_object_mut() {
        o.insert("url".into(), serde_json::json!(url));
    }
    let addr = format!("http://{router}/v1/workers");
    let post = |body: &serde_json::Value| {
        let mut r = ureq::post(&addr).timeout(Duration::from_secs(10));
        if !token.is_empty() {
            r = r.set("authorization", &format!("Bearer {token}"));
        }
        r.send_json(body.clone()).map_err(Box::new)
    };
    match post(&v) {
        Ok(_) => Ok(()),
        Err(e) if matches!(*e, ureq::Error::Status(400, _)) => {
            // A router without the proxy does not know `url`: register without it.
            if let Some(o) = v.as_object_mut() {
                o.remove("url");
            }
            eprintln!(
                "note: {router} refused `url`; registered {} without it",
                spec.id
            );
            post(&v)
                .map(|_| ())
                .map_err(|e| format!("register {}: {e}", spec.id))
        }
        Err(e) => Err(format!("register {} at {addr}: {e}", spec.id)),
    }
}

async fn accept_loop(l: tokio::net::TcpListener, ctx: Arc<WorkerCtx>) {
    loop {
        let (s, _) = match l.accept().await {
            Ok(x) => x,
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let _ = s.set_nodelay(true);
        let ctx = ctx.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| server::handle(ctx.clone(), req));
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(s), svc)
                .await;
        });
    }
}
