//! The bundled load tool `kvroute-sim` end to end: a slice of the Mooncake trace
//! through the REAL service (fleet simulator on the event protocol + load generator on
//! the request protocol, in real time), and the offline A/B path. Checks the figures
//! are sane: every request finished, no errors, kv hits on the workers.

mod common;

use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;

use common::sim::SLICE;

fn tmp(name: &str) -> PathBuf {
    common::sim::tmp("tools", name)
}

fn sim(args: &[&str]) -> (String, Value) {
    common::sim::run_json("tools", args[0], args)
}

fn check_sane(r: &Value, n: u64) {
    assert_eq!(r["requests"], n, "{r}");
    assert_eq!(r["finished"], n, "{r}");
    assert_eq!(r["errors"], 0, "{}", r["error_samples"]);
    assert!(r["ttft_us"]["p50"].as_f64().unwrap() > 0.0);
}

#[test]
fn realtime_run_through_the_real_service() {
    let s = common::Server::start(1, &[]);
    let (stdout, v) = sim(&[
        "run",
        "--trace",
        SLICE,
        "--limit",
        "150",
        "--workers",
        "4",
        "--speed",
        "2",
        "--time-scale",
        "40",
        "--router-api",
        &s.api,
        "--router-events",
        &s.events,
        "--no-progress",
    ]);
    let r = &v["reports"][0];
    check_sane(r, 150);
    assert!(
        r["hit_rate"].as_f64().unwrap() > 0.01,
        "kv hit rate {}",
        r["hit_rate"]
    );
    assert!(r["events"].as_u64().unwrap() > 0);
    assert!(r["decision_us"]["count"].as_u64().unwrap() == 150);
    assert!(stdout.contains("real time x40"), "{stdout}");
    // The simulated workers registered by their handshakes and are live.
    let workers = s.workers();
    assert_eq!(workers.len(), 4, "{workers:?}");
    // Their cache events came over the binary event protocol.
    assert!(s.metric("kvroute_events_total{kind=\"stored\"}") > 0.0);
}

#[test]
fn restart_mid_run_keeps_hits_and_loses_only_decisions_made_while_down() {
    let (stdout, log, v) = common::sim::run_json_logged(
        "tools",
        "restart",
        &[
            "run",
            "--trace",
            SLICE,
            "--limit",
            "200",
            "--workers",
            "4",
            "--time-scale",
            "5",
            "--spawn-router",
            env!("CARGO_BIN_EXE_kvroute"),
            "--restart-at-secs",
            "30",
            "--window-secs",
            "25",
            "--no-progress",
        ],
    );
    // Model time runs x5: 60 s of trace in 12 s of wall time, the restart at 6 s, so a
    // restart slowed by a loaded machine still leaves ~6 s of requests after it.
    let r = &v["reports"][0];
    let st = &v["pacing"][0]["restart"];
    assert!(st["at_us"].as_u64().is_some(), "{st}\n{log}");
    assert!(st["back_at_us"].as_u64().is_some(), "{st}\n{log}");
    // The only errors are the route calls made while the router was down; every
    // lifecycle call held meanwhile was accepted by the restarted router (it restored
    // the in-flight requests), and every routed request finished.
    let lost = st["lost_routes"].as_u64().unwrap();
    assert_eq!(
        r["errors"].as_u64().unwrap(),
        lost,
        "{}",
        r["error_samples"]
    );
    assert_eq!(st["replay_failures"], 0, "{st}");
    assert_eq!(r["finished"].as_u64().unwrap() + lost, 200, "{r}");
    // About 100 requests arrive after 30 s: some were routed by the restarted router
    // (the downtime, shutdown plus start, is well under the 6 s of wall time left).
    assert!(lost < 100, "{st}\n{log}");
    assert!(stdout.contains("restart at 30.0 s"), "{stdout}");
    assert!(r["hit_rate"].as_f64().unwrap() > 0.01, "{r}");
}

#[test]
fn offline_ab_compares_modes_on_the_slice() {
    let svg = tmp("ab.svg");
    let (stdout, v) = sim(&[
        "ab",
        "--offline",
        "--trace",
        SLICE,
        "--limit",
        "400",
        "--workers",
        "4",
        "--kv-variant",
        "overlap_score_credit=0.5",
        "--svg",
        svg.to_str().unwrap(),
    ]);
    let reps = v["reports"].as_array().unwrap();
    let names: Vec<&str> = reps.iter().map(|r| r["label"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "kv",
            "round-robin",
            "random",
            "least-loaded",
            "kv[overlap_score_credit=0.5]"
        ]
    );
    for r in reps {
        check_sane(r, 400);
    }
    let hit = |i: usize| reps[i]["hit_rate"].as_f64().unwrap();
    assert!(
        hit(0) > hit(1) && hit(0) > hit(2),
        "kv {} rr {} random {}",
        hit(0),
        hit(1),
        hit(2)
    );
    assert!(v["bound"]["ratio"].as_f64().unwrap() >= hit(0));
    assert!(stdout.contains("least-loaded"));
    let chart = std::fs::read_to_string(&svg).unwrap();
    assert!(chart.starts_with("<svg") || chart.contains("<svg"));
    let _ = std::fs::remove_file(&svg);
}

/// `--max-output-tokens` caps every answer as the live replay does, and
/// `--sglang-knobs` reaches the gateway model's row (an unknown knob is an error).
#[test]
fn offline_ab_models_the_live_benchmark() {
    let run = |extra: &[&str]| {
        let mut args = vec![
            "ab",
            "--offline",
            "--trace",
            SLICE,
            "--limit",
            "200",
            "--workers",
            "2",
            "--sglang-baseline",
        ];
        args.extend_from_slice(extra);
        sim(&args).1
    };
    let tokens = |v: &Value, i: usize| {
        let r = &v["reports"][i];
        r["output_tok_per_s"].as_f64().unwrap() * r["duration_us"].as_f64().unwrap() / 1e6
    };
    let full = run(&[]);
    let capped = run(&["--max-output-tokens", "2"]);
    for i in 0..2 {
        // 200 requests of at most 2 tokens each, against the trace's own lengths.
        assert!(tokens(&capped, i) <= 400.5, "{}", capped["reports"][i]);
        assert!(tokens(&full, i) > 1000.0, "{}", full["reports"][i]);
    }
    let labels = |v: &Value| {
        v["reports"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["label"].as_str().unwrap().to_string())
            .collect::<Vec<_>>()
    };
    let knobbed = run(&[
        "--sglang-knobs",
        "balance_abs_threshold=0,balance_rel_threshold=0",
    ]);
    assert_eq!(
        labels(&knobbed).last().map(String::as_str),
        Some("sglang-cache-aware")
    );
    // Imbalance 0 on every decision: the model is plain least-loaded, so its counts
    // differ from its default form's on this slice.
    let jobs =
        |v: &Value| v["reports"].as_array().unwrap().last().unwrap()["jobs_per_worker"].clone();
    assert_ne!(jobs(&knobbed), jobs(&full));
    let out = Command::new(env!("CARGO_BIN_EXE_kvroute-sim"))
        .args([
            "ab",
            "--offline",
            "--trace",
            SLICE,
            "--limit",
            "10",
            "--sglang-baseline",
        ])
        .args(["--sglang-knobs", "bogus=1"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(r#"unknown --sglang-knobs key "bogus""#),
        "{err}"
    );
}

#[test]
fn bad_input_is_an_error_not_a_panic() {
    let out = Command::new(env!("CARGO_BIN_EXE_kvroute-sim"))
        .args(["offline", "--trace", "/nonexistent.jsonl"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("kvroute-sim:") && !err.contains("panicked"),
        "{err}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_kvroute-sim"))
        .args([
            "offline",
            "--trace",
            SLICE,
            "--knobs",
            "overlap_score_credit=9",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
}

/// A running `kvroute-sim relay`, killed when dropped.
struct Relay(std::process::Child);

impl Drop for Relay {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `kvroute-sim relay` (with `extra` flags) to `upstream`; its address.
fn start_relay(upstream: &str, extra: &[&str]) -> (Relay, String) {
    use std::io::BufRead;
    let mut c = Command::new(env!("CARGO_BIN_EXE_kvroute-sim"))
        .args(["relay", "--upstream", upstream])
        .args(extra)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(c.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    // "relay listening on ADDR -> UPSTREAM"
    let addr = line.split_whitespace().nth(3).unwrap().to_string();
    (Relay(c), addr)
}

/// An address where nothing listens.
fn dead_addr() -> String {
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    dead.local_addr().unwrap().to_string()
}

/// A relay to a dead upstream closes its client (EOF, not a hang).
fn closes_on_a_dead_upstream(extra: &[&str]) {
    use std::io::Read;
    let (_relay, addr) = start_relay(&dead_addr(), extra);
    let mut c = std::net::TcpStream::connect(&addr).unwrap();
    c.set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .unwrap();
    let mut buf = [0u8; 8];
    assert_eq!(c.read(&mut buf).unwrap_or(0), 0, "closed");
}

/// `kvroute-sim relay` copies bytes both ways, over several connections at once, and
/// closes a client whose upstream cannot be reached.
#[test]
fn relay_copies_both_ways_and_closes_on_a_dead_upstream() {
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    // An upstream that answers each read with its bytes reversed.
    let up = TcpListener::bind("127.0.0.1:0").unwrap();
    let up_addr = up.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for s in up.incoming().flatten() {
            std::thread::spawn(move || {
                let mut s = s;
                let mut buf = [0u8; 1024];
                while let Ok(n) = s.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    let r: Vec<u8> = buf[..n].iter().rev().copied().collect();
                    if s.write_all(&r).is_err() {
                        break;
                    }
                }
            });
        }
    });
    let (_relay, addr) = start_relay(&up_addr, &[]);
    let mut clients: Vec<TcpStream> = (0..3).map(|_| TcpStream::connect(&addr).unwrap()).collect();
    for round in 0..3 {
        for (i, c) in clients.iter_mut().enumerate() {
            let msg = format!("c{i}r{round}");
            c.write_all(msg.as_bytes()).unwrap();
            let mut got = vec![0u8; msg.len()];
            c.read_exact(&mut got).unwrap();
            let want: Vec<u8> = msg.bytes().rev().collect();
            assert_eq!(got, want);
        }
    }
    closes_on_a_dead_upstream(&[]);
}

/// `kvroute-sim relay --http` forwards each request of a kept-alive connection to
/// the upstream and streams its answer back, and closes a client whose upstream
/// cannot be reached.
#[test]
fn http_relay_forwards_requests_on_a_kept_alive_connection() {
    http_relay_forwards(&["--http"]);
}

/// The same with a router's work on every request (`--route-tokenizer`): the bodies,
/// routed or not, reach the upstream unchanged.
#[test]
fn routing_http_relay_forwards_requests_unchanged() {
    let d = tempfile::tempdir().unwrap();
    kvroute::tokenize::testing::write_dir(d.path(), 1000).unwrap();
    let spec = format!("m={}", d.path().display());
    http_relay_forwards(&["--http", "--route-tokenizer", &spec]);
}

fn http_relay_forwards(flags: &[&str]) {
    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::{TcpListener, TcpStream};
    /// One HTTP/1.1 message from `r`: its head's lines and its body (content-length).
    fn message(r: &mut BufReader<TcpStream>) -> Option<(Vec<String>, Vec<u8>)> {
        let mut head = Vec::new();
        loop {
            let mut line = String::new();
            if r.read_line(&mut line).ok()? == 0 {
                return None;
            }
            let line = line.trim_end().to_string();
            if line.is_empty() {
                break;
            }
            head.push(line);
        }
        let len = head
            .iter()
            .find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("content-length:")
                    .map(|v| v.trim().parse::<usize>())
            })
            .and_then(Result::ok)
            .unwrap_or(0);
        let mut body = vec![0u8; len];
        r.read_exact(&mut body).ok()?;
        Some((head, body))
    }
    // An upstream that answers each request with its path and its body reversed.
    let up = TcpListener::bind("127.0.0.1:0").unwrap();
    let up_addr = up.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for s in up.incoming().flatten() {
            std::thread::spawn(move || {
                let mut w = s.try_clone().unwrap();
                let mut r = BufReader::new(s);
                while let Some((head, body)) = message(&mut r) {
                    let path = head[0].split_whitespace().nth(1).unwrap_or("");
                    // The first header as it arrived: hyper writes names in lowercase.
                    let first = head.get(1).map_or("", String::as_str);
                    let mut out: Vec<u8> = format!("{first}|{path}").into_bytes();
                    out.extend(body.iter().rev());
                    let resp = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", out.len());
                    if w.write_all(resp.as_bytes())
                        .and_then(|_| w.write_all(&out))
                        .is_err()
                    {
                        break;
                    }
                }
            });
        }
    });
    let (_relay, addr) = start_relay(&up_addr, flags);
    let c = TcpStream::connect(&addr).unwrap();
    c.set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .unwrap();
    let mut w = c.try_clone().unwrap();
    let mut r = BufReader::new(c);
    let asks = [
        ("/p0", "hello0".to_string()),
        (
            "/v1/completions",
            r#"{"model":"m","prompt":"t1 t2 t3"}"#.to_string(),
        ),
        (
            "/v1/chat/completions",
            r#"{"model":"m","messages":[{"role":"user","content":"t4 t5"}]}"#.to_string(),
        ),
    ];
    for (path, body) in asks {
        let req = format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        w.write_all(req.as_bytes()).unwrap();
        let (head, got) = message(&mut r).expect("an answer on the same connection");
        assert!(head[0].starts_with("HTTP/1.1 200"), "{head:?}");
        // Parsed and written again by hyper, not copied: the name comes lowercased.
        let want: String = format!("host: x|{path}{}", body.chars().rev().collect::<String>());
        assert_eq!(String::from_utf8_lossy(&got), want);
    }
    closes_on_a_dead_upstream(flags);
}
