//! The pipelined, open-loop routing client of `kvroute-bench` (`--connections N`):
//! how a real frontend talks to the router — a few connections, each carrying many
//! requests at once, matched to their answers by correlation id.
//!
//! Guarantees:
//! - open loop: request `k` of a connection is due at `start + phase + k·interval`
//!   and is sent then (or at once when the sender is late), whatever is outstanding;
//! - latency is measured from that *scheduled* time to the answer's arrival, so a
//!   slow router or a late sender shows in the figures (no coordinated omission); the
//!   sender's own lateness is reported separately (`send lag`);
//! - every decision is followed by its `Finish` lifecycle call on the same connection
//!   (sent with the next due request), as a frontend does when the request ends;
//! - bounded: at most `MAX_OUTSTANDING` routes are in flight per connection (a router
//!   that stops answering makes the sender skip slots; skipped slots count as lost).
//!
//! Correlation ids: route `k` is `2k + 2`, its finish `2k + 3`, so the receiver finds
//! the schedule slot of an answer without shared state.

use crate::Args;
use bytes::BytesMut;
use kvroute::codec::{self, FrameDecoder, LifecycleOp, Prompt, RequestMsg, ResponseMsg};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Routes in flight per connection before the sender skips slots.
const MAX_OUTSTANDING: u64 = 1 << 16;

/// What one connection measured.
#[derive(Default)]
pub struct ConnResult {
    /// Decisions that arrived before the stop (the throughput figure).
    pub decisions: u64,
    /// Every decision that arrived, the ones in the grace period included.
    pub decisions_total: u64,
    pub latencies_us: Vec<u32>,
    pub send_lag_us: Vec<u32>,
    pub errors: u64,
    pub errors_by_kind: std::collections::BTreeMap<String, u64>,
    pub lost: u64,
}

fn mix(x: u64) -> u64 {
    kvroute::index::mix(x ^ 0x5151_5151)
}

/// The prompt of request `k` on connection `c`: half a shared group prefix (32 groups),
/// half unique blocks — the blocking clients' workload.
fn hashes(args: &Args, c: u64, k: u64) -> Vec<u64> {
    let group = (k * 7 + c) % 32;
    let half = args.request_blocks as u64 / 2;
    (0..args.request_blocks as u64)
        .map(|b| {
            if b < half {
                mix((group << 20) ^ b)
            } else {
                mix(((c + 1_000) << 40) ^ (k << 12) ^ b)
            }
        })
        .collect()
}

fn request_id(c: u64, k: u64) -> String {
    format!("p{c}-{k}")
}

/// Lets `sleep` wake within a few µs of its deadline (the default 50 µs timer slack
/// would show up as router latency).
fn tight_timer_slack() {
    // SAFETY: prctl with integer arguments only affects this thread's timer slack.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1_000u64, 0u64, 0u64, 0u64);
    }
}

fn handshake(api: &str) -> Result<(TcpStream, BytesMut, FrameDecoder), String> {
    let mut s = TcpStream::connect(api).map_err(|e| e.to_string())?;
    s.set_nodelay(true).map_err(|e| e.to_string())?;
    let mut out = BytesMut::new();
    RequestMsg::Hello {
        auth_token: String::new(),
    }
    .try_encode(&mut out)
    .map_err(|e| e.to_string())?;
    s.write_all(&out).map_err(|e| e.to_string())?;
    let mut buf = BytesMut::new();
    let mut dec = FrameDecoder::new(64 << 20);
    loop {
        if let Some(f) = dec.decode(&mut buf).map_err(|e| e.to_string())? {
            return match ResponseMsg::decode(&f).map_err(|e| e.to_string())? {
                ResponseMsg::HelloAck { .. } => Ok((s, buf, dec)),
                other => Err(format!("handshake: {other:?}")),
            };
        }
        let mut tmp = [0u8; 4096];
        let n = s.read(&mut tmp).map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("closed during handshake".into());
        }
        buf.extend_from_slice(&tmp[..n]);
    }
}

/// Appends the Finish of request `i` of connection `c` to `out`.
fn finish(c: usize, i: u64, out: &mut BytesMut) -> Result<(), String> {
    RequestMsg::Lifecycle {
        corr: 2 * i + 3,
        op: LifecycleOp::Finish,
        request_id: request_id(c as u64, i),
        output_tokens: 0,
    }
    .try_encode(out)
    .map_err(|e| e.to_string())
}

/// Runs connection `c` of `conns` until `stop`, then collects the answers still in
/// flight (up to 2 s).
pub fn connection(
    args: &Args,
    api: &str,
    c: usize,
    conns: usize,
    stop: &AtomicBool,
) -> Result<ConnResult, String> {
    let (s, buf, dec) = handshake(api)?;
    let mut rs = s.try_clone().map_err(|e| e.to_string())?;
    let per_conn = args.rate as f64 / conns.max(1) as f64;
    let interval = Duration::from_secs_f64(1.0 / per_conn.max(0.001));
    let start = Instant::now() + interval.mul_f64(c as f64 / conns.max(1) as f64);
    let sched = move |k: u64| start + interval.mul_f64(k as f64);
    let sent = AtomicU64::new(0);
    let sender_done = AtomicBool::new(false);
    let (fin_tx, fin_rx) = mpsc::channel::<u64>();
    std::thread::scope(|scope| {
        let (sent_w, done_r) = (&sent, &sender_done);
        let send = scope.spawn(move || -> Result<Vec<u32>, String> {
            tight_timer_slack();
            let mut s = s;
            let mut out = BytesMut::new();
            let mut lag = Vec::new();
            let mut k = 0u64;
            let mut answered_floor = 0u64;
            while !stop.load(Ordering::Relaxed) {
                for i in fin_rx.try_iter() {
                    answered_floor = answered_floor.max(i + 1);
                    finish(c, i, &mut out)?;
                }
                let now = Instant::now();
                while sched(k) <= now {
                    if k.saturating_sub(answered_floor) < MAX_OUTSTANDING {
                        let r = codec::Route::new(
                            2 * k + 2,
                            request_id(c as u64, k),
                            Prompt::from_hashes(&hashes(args, c as u64, k)),
                        );
                        RequestMsg::Route(r)
                            .try_encode(&mut out)
                            .map_err(|e| e.to_string())?;
                        lag.push((now - sched(k)).as_micros().min(u32::MAX as u128) as u32);
                    }
                    k += 1;
                }
                sent_w.store(k, Ordering::Release);
                if !out.is_empty() {
                    s.write_all(&out).map_err(|e| e.to_string())?;
                    out.clear();
                }
                let next = sched(k);
                let now = Instant::now();
                if next > now {
                    // Wake at least every 200 µs to pass finishes on promptly.
                    std::thread::sleep((next - now).min(Duration::from_micros(200)));
                }
            }
            // Finish what was decided during the grace period too.
            let grace = Instant::now() + Duration::from_secs(2);
            while !done_r.load(Ordering::Acquire) && Instant::now() < grace {
                for i in fin_rx.try_iter() {
                    finish(c, i, &mut out)?;
                }
                if !out.is_empty() {
                    s.write_all(&out).map_err(|e| e.to_string())?;
                    out.clear();
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            Ok(lag)
        });
        let mut r = ConnResult::default();
        let (mut buf, mut dec) = (buf, dec);
        let _ = rs.set_read_timeout(Some(Duration::from_millis(50)));
        let mut routes_answered = 0u64;
        let mut finishes_answered = 0u64;
        let mut deadline: Option<Instant> = None;
        let mut tmp = vec![0u8; 64 << 10];
        let outcome = 'read: loop {
            loop {
                let f = match dec.decode(&mut buf) {
                    Ok(Some(f)) => f,
                    Ok(None) => break,
                    Err(e) => break 'read Err(e.to_string()),
                };
                let now = Instant::now();
                let msg = match ResponseMsg::decode(&f) {
                    Ok(m) => m,
                    Err(e) => break 'read Err(e.to_string()),
                };
                let corr = match &msg {
                    ResponseMsg::Decision(d) => d.corr,
                    ResponseMsg::Ack { corr } | ResponseMsg::Error { corr, .. } => *corr,
                    _ => continue,
                };
                let is_route = corr >= 2 && corr % 2 == 0;
                let k = corr.saturating_sub(2) / 2;
                match msg {
                    ResponseMsg::Decision(_) if is_route => {
                        routes_answered += 1;
                        r.decisions_total += 1;
                        if !stop.load(Ordering::Relaxed) {
                            r.decisions += 1;
                        }
                        let lat = now.saturating_duration_since(sched(k));
                        r.latencies_us
                            .push(lat.as_micros().min(u32::MAX as u128) as u32);
                        let _ = fin_tx.send(k);
                    }
                    ResponseMsg::Ack { .. } if !is_route => finishes_answered += 1,
                    ResponseMsg::Error { code, .. } => {
                        if is_route {
                            routes_answered += 1;
                        } else {
                            finishes_answered += 1;
                        }
                        r.errors += 1;
                        let name = codec::ErrorCode::from_u16(code)
                            .map(|c| c.name().to_string())
                            .unwrap_or_else(|| format!("code {code}"));
                        *r.errors_by_kind.entry(name).or_insert(0) += 1;
                    }
                    _ => {}
                }
            }
            if stop.load(Ordering::Relaxed) {
                let d = *deadline.get_or_insert_with(|| Instant::now() + Duration::from_secs(2));
                let all_in = routes_answered >= sent.load(Ordering::Acquire)
                    && finishes_answered >= r.decisions_total;
                if all_in || Instant::now() > d {
                    break Ok(());
                }
            }
            match rs.read(&mut tmp) {
                Ok(0) => break Err("router closed the connection".into()),
                Ok(n) => buf.extend_from_slice(&tmp[..n]),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(e) => break Err(e.to_string()),
            }
        };
        sender_done.store(true, Ordering::Release);
        let lag = send.join().map_err(|_| "sender panicked".to_string())??;
        outcome?;
        r.send_lag_us = lag;
        r.lost = sent.load(Ordering::Acquire).saturating_sub(routes_answered);
        Ok(r)
    })
}
