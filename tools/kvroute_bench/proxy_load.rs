//! Proxy traffic of a soak (`--proxy-clients N --proxy-rate R`): OpenAI completions
//! through the replicas' proxy ports to the simulated fleet, half streamed, with
//! prompts (token ids) that share prefixes so routing follows the cache.
//!
//! A client behaves like a load balancer in front of the tier: each request goes to
//! the next replica, and to the one after when a replica refuses the connection (it
//! is restarting). Each request is one fresh connection, so that "lost" means what it
//! says: the request was sent and its answer did not arrive in full (no pooled
//! connection found closed by the server counts against it).

use serde::Serialize;
use std::collections::BTreeMap;
use std::io::Read;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

#[derive(Debug, Default, Serialize)]
pub struct ProxyOut {
    pub sent: u64,
    pub ok: u64,
    /// Sent, and the answer did not arrive in full (cut, reset, timed out).
    pub lost: u64,
    /// Connections refused by a replica, the request then sent to another.
    pub failovers: u64,
    /// Answers other than 200 (by status and code), and requests no replica took.
    pub errors_by_kind: BTreeMap<String, u64>,
}

impl ProxyOut {
    pub fn add(&mut self, o: ProxyOut) {
        self.sent += o.sent;
        self.ok += o.ok;
        self.lost += o.lost;
        self.failovers += o.failovers;
        for (k, n) in o.errors_by_kind {
            *self.errors_by_kind.entry(k).or_insert(0) += n;
        }
    }

    fn error(&mut self, kind: String) {
        *self.errors_by_kind.entry(kind).or_insert(0) += 1;
    }
}

/// The model the simulated fleet serves.
pub const MODEL: &str = "sim-model";

/// A prompt of `group`'s shared 256-token prefix and `unique` tokens of its own.
pub fn prompt(group: u64, salt: u64, unique: usize) -> Vec<u64> {
    let mut p: Vec<u64> = (0..256).map(|t| 1_000 + group * 1_000 + t).collect();
    p.extend((0..unique as u64).map(|t| 100_000 + (salt * 64 + t) % 900_000));
    p
}

enum Sent {
    Answered(u16, String),
    /// The replica refused the connection: nothing was sent.
    Refused,
    /// Sent; the answer was cut.
    Lost,
}

fn send(agent: &ureq::Agent, proxy: &str, body: &serde_json::Value, stream: bool) -> Sent {
    let url = format!("http://{proxy}/v1/completions");
    let r = agent
        .post(&url)
        .set("content-type", "application/json")
        .send_string(&body.to_string());
    let resp = match r {
        Ok(r) => r,
        Err(ureq::Error::Status(code, r)) => {
            let text = r.into_string().unwrap_or_default();
            let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
            let c = v["error"]["code"].as_str().unwrap_or("").to_string();
            return Sent::Answered(code, c);
        }
        Err(ureq::Error::Transport(t)) if t.kind() == ureq::ErrorKind::ConnectionFailed => {
            return Sent::Refused
        }
        Err(_) => return Sent::Lost,
    };
    let mut text = String::new();
    if resp.into_reader().read_to_string(&mut text).is_err() {
        return Sent::Lost;
    }
    let complete = if stream {
        text.contains("data: [DONE]")
    } else {
        serde_json::from_str::<serde_json::Value>(&text)
            .is_ok_and(|v| v["choices"].as_array().is_some_and(|c| !c.is_empty()))
    };
    if complete {
        Sent::Answered(200, String::new())
    } else {
        Sent::Lost
    }
}

/// Client `c` of `clients`, `rate` requests/s over all of them, until `stop`.
pub fn client(
    proxies: &[String],
    c: usize,
    clients: usize,
    rate: u64,
    stop: &AtomicBool,
) -> ProxyOut {
    let agent = ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(60))
        .max_idle_connections(0)
        .build();
    let per = rate as f64 / clients.max(1) as f64;
    let interval = Duration::from_secs_f64(1.0 / per.max(0.001));
    let mut next = Instant::now() + interval.mul_f64(c as f64 / clients.max(1) as f64);
    let mut out = ProxyOut::default();
    let mut i = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        if next > now {
            std::thread::sleep((next - now).min(Duration::from_millis(200)));
            continue;
        }
        next += interval;
        let stream = i.is_multiple_of(2);
        let body = serde_json::json!({
            "model": MODEL,
            "prompt": prompt((i * 7 + c as u64) % 16, (c as u64) << 32 | i, 32),
            "max_tokens": 8,
            "stream": stream,
        });
        let first = (c + i as usize) % proxies.len().max(1);
        i += 1;
        let mut taken = false;
        for k in 0..proxies.len() {
            let proxy = &proxies[(first + k) % proxies.len()];
            match send(&agent, proxy, &body, stream) {
                Sent::Refused => {
                    out.failovers += 1;
                    continue;
                }
                Sent::Lost => {
                    out.sent += 1;
                    out.lost += 1;
                }
                Sent::Answered(200, _) => {
                    out.sent += 1;
                    out.ok += 1;
                }
                Sent::Answered(code, c) => {
                    out.sent += 1;
                    out.error(format!("{code} {c}"));
                }
            }
            taken = true;
            break;
        }
        if !taken {
            out.error("no replica took it".into());
        }
    }
    out
}
