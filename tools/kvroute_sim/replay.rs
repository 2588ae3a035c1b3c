//! `kvroute-sim replay`: replays a Mooncake trace as OpenAI requests against any
//! HTTP endpoint (a simulated worker, kvroute's proxy, SGLang Model Gateway), paced
//! open-loop (trace timestamps divided by `--time-scale`, or a fixed `--rate`), and
//! measures TTFT (first body chunk), inter-chunk latency, E2E, the longest gap between
//! two chunks of one stream (a stall), errors, and the hit rate measured at the workers
//! (`GET /stats` of each before and after).
//!
//! Prompts: every hash id becomes `--trace-block` words `t{N}`, N drawn from the hash id
//! and the position, so requests sharing hash ids share a prefix of text (and of
//! tokens, for a tokenizer where `t{N}` is token N); `--token-ids` sends the ids as a
//! token-id prompt instead. Bodies are built before the clock starts.
//!
//! Bounded: at most `--max-inflight` requests in flight (later ones wait, and their
//! lateness is reported); every response body is read through a size limit.

use bytes::Bytes;
use clap::Args;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use kvroute::sim::openai::VOCAB;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

#[derive(Args, Debug)]
pub struct ReplayArgs {
    /// Mooncake JSONL trace (`timestamp` ms, `input_length`, `output_length`, `hash_ids`).
    #[arg(long)]
    trace: PathBuf,
    /// Base URL of the endpoint, e.g. `http://127.0.0.1:8000`.
    #[arg(long)]
    target: String,
    /// Replay at most this many requests.
    #[arg(long)]
    limit: Option<usize>,
    /// Trace time runs this many times faster than the wall clock.
    #[arg(long, default_value_t = 1.0)]
    time_scale: f64,
    /// Ignore the timestamps: send R requests per second, evenly spaced.
    #[arg(long)]
    rate: Option<f64>,
    /// Stream the responses (SSE).
    #[arg(long)]
    stream: bool,
    /// `/v1/chat/completions` (one user message) instead of `/v1/completions`.
    #[arg(long)]
    chat: bool,
    /// A new TCP connection per request (default: a keep-alive pool).
    #[arg(long)]
    new_connections: bool,
    /// Workers whose `GET /stats` give the hit rate (comma-separated base URLs).
    #[arg(long, default_value = "")]
    workers_stats: String,
    /// Send token-id prompts instead of `t{N}` text.
    #[arg(long)]
    token_ids: bool,
    /// Tokens per trace hash id (Mooncake: 512).
    #[arg(long, default_value_t = 512)]
    trace_block: usize,
    /// Truncate prompts to this many tokens (keeps shared prefixes shared).
    #[arg(long)]
    max_input_tokens: Option<usize>,
    /// Cap each request's `max_tokens` (the trace's `output_length`).
    #[arg(long)]
    max_output_tokens: Option<u32>,
    #[arg(long, default_value = "sim-model")]
    model: String,
    /// Most requests in flight.
    #[arg(long, default_value_t = 4096)]
    max_inflight: usize,
    /// Per-request timeout, seconds.
    #[arg(long, default_value_t = 120.0)]
    timeout_secs: f64,
    /// Largest response body read, bytes.
    #[arg(long, default_value_t = 64 << 20)]
    max_response_bytes: usize,
    /// `Authorization: Bearer` token.
    #[arg(long, default_value = "")]
    api_key: String,
    /// Write the JSON report here (default: stdout, after the table).
    #[arg(long)]
    json: Option<PathBuf>,
    /// Runtime threads (default: the machine's cores).
    #[arg(long)]
    threads: Option<usize>,
    #[command(flatten)]
    classes: crate::classes::ClassArgs,
}

impl ReplayArgs {
    /// The arguments of `kvroute-sim replay ARGV...` (`argv[0]` is `replay`), parsed
    /// as the command line would be: the demo replays exactly what a user can type.
    pub fn parse_argv(argv: &[String]) -> Result<ReplayArgs, String> {
        #[derive(clap::Parser)]
        struct Cmd {
            #[command(flatten)]
            a: ReplayArgs,
        }
        <Cmd as clap::Parser>::try_parse_from(argv)
            .map(|c| c.a)
            .map_err(|e| e.to_string())
    }
}

/// One trace line.
struct Line {
    at_ms: f64,
    input: usize,
    output: u32,
    hash_ids: Vec<u64>,
}

fn read_trace(a: &ReplayArgs) -> Result<Vec<Line>, String> {
    let text =
        std::fs::read_to_string(&a.trace).map_err(|e| format!("{}: {e}", a.trace.display()))?;
    let mut out = Vec::new();
    for (n, l) in text.lines().enumerate() {
        if l.trim().is_empty() {
            continue;
        }
        if a.limit.is_some_and(|k| out.len() >= k) {
            break;
        }
        let v: Value = serde_json::from_str(l).map_err(|e| format!("trace line {}: {e}", n + 1))?;
        let num = |k: &str| v.get(k).and_then(Value::as_f64);
        let ids = v
            .get("hash_ids")
            .and_then(Value::as_array)
            .ok_or_else(|| format!("trace line {}: no hash_ids", n + 1))?;
        out.push(Line {
            at_ms: num("timestamp").unwrap_or(0.0),
            input: num("input_length").unwrap_or(0.0).max(1.0) as usize,
            output: num("output_length").unwrap_or(1.0).max(1.0) as u32,
            hash_ids: ids.iter().filter_map(Value::as_u64).collect(),
        });
    }
    Ok(out)
}

/// Token `j` of the block of hash id `h` (deterministic).
pub fn block_token(h: u64, j: usize) -> u32 {
    let x = kvroute::hash::mix_external_id(h.wrapping_mul(0x9E37_79B9).wrapping_add(j as u64));
    (x % VOCAB as u64) as u32
}

fn prompt_ids(l: &Line, a: &ReplayArgs) -> Vec<u32> {
    let n = a.max_input_tokens.map_or(l.input, |m| l.input.min(m));
    let mut t = Vec::with_capacity(n);
    'outer: for &h in &l.hash_ids {
        for j in 0..a.trace_block {
            if t.len() >= n {
                break 'outer;
            }
            t.push(block_token(h, j));
        }
    }
    t
}

fn body(l: &Line, a: &ReplayArgs, i: usize) -> Bytes {
    let ids = prompt_ids(l, a);
    let max_tokens = a
        .max_output_tokens
        .map_or(l.output, |m| l.output.min(m))
        .max(1);
    let text = || {
        ids.iter()
            .map(|t| format!("t{t}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let mut v = if a.chat {
        json!({"model": a.model, "messages": [{"role": "user", "content": text()}]})
    } else if a.token_ids {
        json!({"model": a.model, "prompt": ids})
    } else {
        json!({"model": a.model, "prompt": text()})
    };
    v["max_tokens"] = json!(max_tokens);
    v["ignore_eos"] = json!(true);
    a.classes.mark(i, &mut v);
    if a.stream {
        v["stream"] = json!(true);
        v["stream_options"] = json!({"include_usage": true});
    }
    Bytes::from(v.to_string())
}

/// What one request measured.
#[derive(Default, Clone)]
struct Sample {
    ok: bool,
    error: Option<String>,
    ttft_us: u64,
    e2e_us: u64,
    max_gap_us: u64,
    gaps_us: Vec<u64>,
    late_us: u64,
    /// Retries on a stale pooled connection (0 or 1).
    stale_retries: u64,
}

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

struct Client {
    host: String,
    authority: String,
    base_path: String,
    pool: Mutex<Vec<Sender>>,
    keep_alive: bool,
    api_key: String,
    max_response: usize,
}

impl Client {
    fn new(target: &str, a: &ReplayArgs) -> Result<Client, String> {
        let rest = target
            .strip_prefix("http://")
            .ok_or_else(|| format!("--target {target:?}: only http:// URLs"))?;
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
            None => (rest, ""),
        };
        Ok(Client {
            host: authority.to_string(),
            authority: authority.to_string(),
            base_path: path.to_string(),
            pool: Mutex::new(Vec::new()),
            keep_alive: !a.new_connections,
            api_key: a.api_key.clone(),
            max_response: a.max_response_bytes,
        })
    }

    async fn connect(&self) -> Result<Sender, String> {
        let s = tokio::net::TcpStream::connect(&self.host)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let _ = s.set_nodelay(true);
        let (tx, conn) = hyper::client::conn::http1::handshake(TokioIo::new(s))
            .await
            .map_err(|e| format!("handshake: {e}"))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(tx)
    }

    /// A pooled connection (`true`) or a new one.
    async fn sender(&self) -> Result<(Sender, bool), String> {
        if self.keep_alive {
            loop {
                let s = self.pool.lock().unwrap_or_else(|p| p.into_inner()).pop();
                let Some(mut s) = s else { break };
                if s.ready().await.is_ok() {
                    return Ok((s, true));
                }
            }
        }
        Ok((self.connect().await?, false))
    }

    fn give_back(&self, s: Sender) {
        if self.keep_alive && !s.is_closed() {
            self.pool.lock().unwrap_or_else(|p| p.into_inner()).push(s);
        }
    }

    fn request(&self, path: &str, body: Bytes) -> Result<hyper::Request<Full<Bytes>>, String> {
        let mut req = hyper::Request::post(format!("{}{path}", self.base_path))
            .header(hyper::header::HOST, &self.authority)
            .header(hyper::header::CONTENT_TYPE, "application/json");
        if !self.keep_alive {
            req = req.header(hyper::header::CONNECTION, "close");
        }
        if !self.api_key.is_empty() {
            req = req.header(
                hyper::header::AUTHORIZATION,
                format!("Bearer {}", self.api_key),
            );
        }
        req.body(Full::new(body))
            .map_err(|e| format!("request: {e}"))
    }

    /// Sends one request and reads the whole response, timing every body chunk.
    async fn send(&self, path: &str, body: Bytes, stream: bool) -> Sample {
        let t0 = Instant::now();
        let mut s = Sample::default();
        let (mut sender, mut reused) = match self.sender().await {
            Ok(x) => x,
            Err(e) => {
                s.error = Some(e);
                return s;
            }
        };
        let resp = loop {
            let req = match self.request(path, body.clone()) {
                Ok(r) => r,
                Err(e) => {
                    s.error = Some(e);
                    return s;
                }
            };
            match sender.send_request(req).await {
                Ok(r) => break r,
                // A pooled connection the server closed meanwhile (the keep-alive race):
                // nothing was answered, so retry once on a new connection, as HTTP
                // clients do (counted in the report).
                Err(_) if reused => {
                    s.stale_retries += 1;
                    reused = false;
                    sender = match self.connect().await {
                        Ok(x) => x,
                        Err(e) => {
                            s.error = Some(e);
                            return s;
                        }
                    };
                }
                Err(e) => {
                    s.error = Some(format!("send: {e}"));
                    return s;
                }
            }
        };
        let status = resp.status();
        let mut b = resp.into_body();
        let mut last = t0;
        let mut size = 0usize;
        let mut tail: Vec<u8> = Vec::new();
        let mut first = true;
        loop {
            match b.frame().await {
                None => break,
                Some(Err(e)) => {
                    s.error = Some(format!("body: {e}"));
                    break;
                }
                Some(Ok(f)) => {
                    let Ok(d) = f.into_data() else { continue };
                    if d.is_empty() {
                        continue;
                    }
                    let now = Instant::now();
                    if first {
                        s.ttft_us = (now - t0).as_micros() as u64;
                        first = false;
                    } else {
                        let g = (now - last).as_micros() as u64;
                        s.gaps_us.push(g);
                        s.max_gap_us = s.max_gap_us.max(g);
                    }
                    last = now;
                    size += d.len();
                    if size > self.max_response {
                        s.error = Some("response too large".into());
                        break;
                    }
                    // Keep only the end of the body: enough to see `[DONE]` or an error.
                    tail.extend_from_slice(&d);
                    if tail.len() > 4096 {
                        tail.drain(..tail.len() - 4096);
                    }
                }
            }
        }
        s.e2e_us = t0.elapsed().as_micros() as u64;
        if s.error.is_none() {
            let t = String::from_utf8_lossy(&tail);
            if !status.is_success() {
                s.error = Some(format!("HTTP {}", status.as_u16()));
            } else if stream && !t.contains("[DONE]") {
                s.error = Some("stream ended without [DONE]".into());
            } else if stream && t.contains("\"error\"") {
                s.error = Some("error event in stream".into());
            } else {
                s.ok = true;
            }
        }
        if s.error.is_none() {
            self.give_back(sender);
        }
        s
    }
}

/// Per worker: (prompt blocks, cached blocks, requests) from `GET /stats`.
fn worker_stats(urls: &[String]) -> Vec<(u64, u64, u64)> {
    urls.iter()
        .map(|u| {
            let v: Value = ureq::get(&format!("{u}/stats"))
                .timeout(Duration::from_secs(5))
                .call()
                .ok()
                .and_then(|r| r.into_json().ok())
                .unwrap_or(Value::Null);
            let n = |k: &str| v[k].as_u64().unwrap_or(0);
            (n("prompt_blocks"), n("cached_blocks"), n("requests"))
        })
        .collect()
}

fn pct(v: &mut [u64], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_unstable();
    let i = ((v.len() as f64 - 1.0) * q).round() as usize;
    v[i.min(v.len() - 1)] as f64 / 1000.0
}

fn dist(v: &mut [u64]) -> Value {
    let mean = if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<u64>() as f64 / v.len() as f64 / 1000.0
    };
    let max = v.iter().max().map_or(0.0, |&m| m as f64 / 1000.0);
    json!({"p50": pct(v, 0.5), "p90": pct(v, 0.9), "p99": pct(v, 0.99), "max": max, "mean": mean})
}

pub fn run(a: ReplayArgs) -> Result<(), String> {
    let report = measure(&a)?;
    println!("{}", one_line(&report));
    let text = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
    match &a.json {
        Some(p) => std::fs::write(p, text).map_err(|e| format!("{}: {e}", p.display()))?,
        None => println!("{text}"),
    }
    Ok(())
}

/// Replays the trace as `a` says and returns the JSON report (printed by [`run`]; the
/// demo builds its table from it).
pub fn measure(a: &ReplayArgs) -> Result<Value, String> {
    if !(a.time_scale.is_finite() && a.time_scale > 0.0) {
        return Err("--time-scale must be > 0".into());
    }
    if let Some(r) = a.rate {
        if !(r.is_finite() && r > 0.0) {
            return Err("--rate must be > 0".into());
        }
    }
    if a.trace_block == 0 {
        return Err("--trace-block must be > 0".into());
    }
    a.classes.check()?;
    let lines = read_trace(a)?;
    if lines.is_empty() {
        return Err("the trace has no requests".into());
    }
    let t_first = lines.iter().map(|l| l.at_ms).fold(f64::INFINITY, f64::min);
    let plan: Vec<(u64, Bytes)> = lines
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let at_us = match a.rate {
                Some(r) => (i as f64 * 1e6 / r) as u64,
                None => ((l.at_ms - t_first) * 1000.0 / a.time_scale).max(0.0) as u64,
            };
            (at_us, body(l, a, i))
        })
        .collect();
    let stats_urls: Vec<String> = a
        .workers_stats
        .split(',')
        .filter(|x| !x.is_empty())
        .map(|x| x.trim_end_matches('/').to_string())
        .collect();
    let before = worker_stats(&stats_urls);
    let client = Arc::new(Client::new(&a.target, a)?);
    let path = if a.chat {
        "/v1/chat/completions"
    } else {
        "/v1/completions"
    };
    let rt = crate::setup::tokio_runtime(a.threads)?;
    let timeout = Duration::from_secs_f64(a.timeout_secs.max(0.001));
    let stream = a.stream;
    let n = plan.len();
    let (samples, wall) = rt.block_on(async move {
        let sem = Arc::new(tokio::sync::Semaphore::new(a.max_inflight.max(1)));
        let start = Instant::now();
        let mut handles = Vec::with_capacity(n);
        for (at_us, body) in plan {
            let due = start + Duration::from_micros(at_us);
            crate::clock::sleep_until(due).await;
            let permit = sem.clone().acquire_owned().await;
            let late = (Instant::now() - due).as_micros() as u64;
            let c = client.clone();
            handles.push(tokio::spawn(async move {
                let _p = permit;
                let mut s = match tokio::time::timeout(timeout, c.send(path, body, stream)).await {
                    Ok(s) => s,
                    Err(_) => Sample {
                        error: Some("timeout".into()),
                        ..Sample::default()
                    },
                };
                s.late_us = late;
                s
            }));
        }
        let mut out = Vec::with_capacity(n);
        for h in handles {
            out.push(h.await.unwrap_or_else(|_| Sample {
                error: Some("task failed".into()),
                ..Sample::default()
            }));
        }
        (out, start.elapsed())
    });
    let after = worker_stats(&stats_urls);
    Ok(summarize(a, &samples, wall, &before, &after))
}

type Stats = [(u64, u64, u64)];

fn summarize(a: &ReplayArgs, s: &[Sample], wall: Duration, before: &Stats, after: &Stats) -> Value {
    let ok: Vec<&Sample> = s.iter().filter(|x| x.ok).collect();
    let mut ttft: Vec<u64> = ok.iter().map(|x| x.ttft_us).collect();
    let mut e2e: Vec<u64> = ok.iter().map(|x| x.e2e_us).collect();
    let mut gaps: Vec<u64> = ok.iter().flat_map(|x| x.gaps_us.iter().copied()).collect();
    let mut late: Vec<u64> = s.iter().map(|x| x.late_us).collect();
    let max_stall = ok.iter().map(|x| x.max_gap_us).max().unwrap_or(0) as f64 / 1000.0;
    let mut kinds: std::collections::BTreeMap<String, u64> = Default::default();
    for x in s.iter().filter_map(|x| x.error.as_ref()) {
        *kinds.entry(x.clone()).or_default() += 1;
    }
    let delta: Vec<(u64, u64, u64)> = after
        .iter()
        .zip(before)
        .map(|(a, b)| {
            (
                a.0.saturating_sub(b.0),
                a.1.saturating_sub(b.1),
                a.2.saturating_sub(b.2),
            )
        })
        .collect();
    let prompt: u64 = delta.iter().map(|d| d.0).sum();
    let cached: u64 = delta.iter().map(|d| d.1).sum();
    let hit = if prompt > 0 {
        Some(cached as f64 / prompt as f64)
    } else {
        None
    };
    json!({
        "target": a.target,
        "stream": a.stream,
        "chat": a.chat,
        "connections": if a.new_connections { "new" } else { "keep-alive" },
        "requests": s.len(),
        "ok": ok.len(),
        "errors": s.len() - ok.len(),
        "error_kinds": kinds,
        "wall_secs": wall.as_secs_f64(),
        "achieved_rps": s.len() as f64 / wall.as_secs_f64().max(1e-9),
        "ttft_ms": dist(&mut ttft),
        "e2e_ms": dist(&mut e2e),
        "itl_ms": dist(&mut gaps),
        "max_stall_ms": max_stall,
        "send_late_ms": dist(&mut late),
        "stale_connection_retries": s.iter().map(|x| x.stale_retries).sum::<u64>(),
        "worker_prompt_blocks": prompt,
        "worker_cached_blocks": cached,
        "hit_rate": hit,
        "worker_requests": delta.iter().map(|d| d.2).collect::<Vec<_>>(),
        "classes": a.classes.report(&s.iter().map(|x| (x.ok, x.ttft_us)).collect::<Vec<_>>(), dist),
    })
}

fn one_line(r: &Value) -> String {
    let f = |p: &str| r.pointer(p).and_then(Value::as_f64).unwrap_or(0.0);
    let hit = r["hit_rate"]
        .as_f64()
        .map_or("-".to_string(), |h| format!("{:.3}", h));
    format!(
        "replay {} {}: {} req, {} err, {:.0} req/s | TTFT p50 {:.2} p99 {:.2} ms | E2E p50 {:.2} p99 {:.2} ms | ITL p50 {:.2} p99 {:.2} ms | max stall {:.1} ms | hit {}",
        r["target"].as_str().unwrap_or(""),
        r["connections"].as_str().unwrap_or(""),
        r["requests"],
        r["errors"],
        f("/achieved_rps"),
        f("/ttft_ms/p50"),
        f("/ttft_ms/p99"),
        f("/e2e_ms/p50"),
        f("/e2e_ms/p99"),
        f("/itl_ms/p50"),
        f("/itl_ms/p99"),
        f("/max_stall_ms"),
        hit
    )
}
