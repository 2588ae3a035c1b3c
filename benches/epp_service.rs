//! The endpoint picker through the running service: picks per second and the latency
//! of a pick, side by side with the router's route step over its JSON API
//! (`POST /v1/route` then `finish`), for the same requests.
//!
//! It starts `kvroute serve --epp-addr` (2 cores) and a `kvroute-sim fleet` of 4
//! workers registered with their urls and publishing their KV events, then, for
//! `EPP_BENCH_SECS` seconds (default 5) per row, at 1 and at 16 requests in flight:
//! - `epp`: ext_proc streams as a gateway opens them (tonic client, Envoy's messages):
//!   request headers and a ~1.3 KB completion body (256 token ids: 16 prefix groups,
//!   so picks have cache to follow), latency to the pick (the request headers'
//!   answer), then response headers ending the response (`finish`) and the stream;
//! - `route`: the same token ids to `/v1/route` (HTTP/1.1 keep-alive, one connection
//!   per client), latency of the route call, then its `finish`.
//!
//! `cargo bench --bench epp_service` (release binaries; the figures are in
//! docs/ENDPOINT_PICKER.md).

use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_client::ExternalProcessorClient;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response;
use kvroute::epp::gateway::{self, headers, Phase};
use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(0)
}

struct Kill(Child);

impl Drop for Kill {
    fn drop(&mut self) {
        kvroute::process::terminate(&mut self.0, Duration::from_secs(10));
    }
}

fn tokens(i: u64) -> Vec<u32> {
    let group = (i % 16) as u32;
    let mut t: Vec<u32> = (0..224).map(|j| 1000 * (group + 1) + j).collect();
    t.extend((0..32).map(|j| 500_000 + (i as u32 % 10_000) * 32 + j));
    t
}

/// One gateway stream; the time to the pick.
async fn one_stream(
    client: &mut ExternalProcessorClient<tonic::transport::Channel>,
    i: u64,
) -> Result<Duration, String> {
    let body =
        serde_json::json!({"model": "sim-model", "prompt": tokens(i), "max_tokens": 8}).to_string();
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let t0 = Instant::now();
    let _ = tx
        .send(headers(
            Phase::Request,
            &[
                (":method", "POST"),
                (":path", "/v1/completions"),
                ("content-type", "application/json"),
            ],
            false,
        ))
        .await;
    let _ = tx
        .send(gateway::body(Phase::Request, body.as_bytes(), true))
        .await;
    let mut answers = client
        .process(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .map_err(|e| e.to_string())?
        .into_inner();
    let mut picked = None;
    while let Some(m) = answers.message().await.map_err(|e| e.to_string())? {
        match m.response {
            Some(Response::RequestHeaders(_)) => picked = Some(t0.elapsed()),
            Some(Response::ImmediateResponse(r)) => return Err(format!("refused: {r:?}")),
            Some(Response::RequestBody(b)) if picked.is_some() => {
                let eos = b
                    .response
                    .and_then(|c| c.body_mutation)
                    .and_then(|m| m.mutation)
                    .is_some_and(|m| match m {
                        envoy_types::pb::envoy::service::ext_proc::v3::body_mutation::Mutation::StreamedResponse(s) => s.end_of_stream,
                        _ => true,
                    });
                if eos {
                    break;
                }
            }
            _ => {}
        }
    }
    let _ = tx
        .send(headers(
            Phase::Response,
            &[(":status", "200"), ("content-type", "application/json")],
            true,
        ))
        .await;
    drop(tx);
    while let Ok(Some(_)) = answers.message().await {}
    picked.ok_or_else(|| "no pick".to_string())
}

struct Row {
    done: u64,
    secs: f64,
    lat: Vec<Duration>,
    errors: u64,
}

fn print(name: &str, conc: usize, mut r: Row) {
    r.lat.sort();
    let q = |p: f64| {
        r.lat
            .get(((r.lat.len() as f64 * p) as usize).min(r.lat.len().saturating_sub(1)))
            .map_or(0.0, |d| d.as_secs_f64() * 1e6)
    };
    println!(
        "| {name} | {conc} | {:.0} | {:.0} | {:.0} | {:.0} | {} |",
        r.done as f64 / r.secs,
        q(0.5),
        q(0.9),
        q(0.99),
        r.errors
    );
}

fn epp_row(addr: &str, conc: usize, secs: f64) -> Row {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let ch = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .expect("endpoint")
            .connect()
            .await
            .expect("connect");
        let lat = Arc::new(Mutex::new(Vec::new()));
        let errors = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let t0 = Instant::now();
        let mut tasks = Vec::new();
        for c in 0..conc {
            let (mut client, lat, errors) = (
                ExternalProcessorClient::new(ch.clone()),
                lat.clone(),
                errors.clone(),
            );
            tasks.push(tokio::spawn(async move {
                let mut i = c as u64 * 1_000_000;
                while t0.elapsed().as_secs_f64() < secs {
                    i += 1;
                    match one_stream(&mut client, i).await {
                        Ok(d) => lat.lock().unwrap_or_else(|e| e.into_inner()).push(d),
                        Err(e) => {
                            if errors.fetch_add(1, std::sync::atomic::Ordering::Relaxed) == 0 {
                                eprintln!("epp: {e}");
                            }
                        }
                    }
                }
            }));
        }
        for t in tasks {
            let _ = t.await;
        }
        let lat = std::mem::take(&mut *lat.lock().unwrap_or_else(|e| e.into_inner()));
        Row {
            done: lat.len() as u64,
            secs: t0.elapsed().as_secs_f64(),
            lat,
            errors: errors.load(std::sync::atomic::Ordering::Relaxed),
        }
    })
}

fn route_row(http: &str, conc: usize, secs: f64) -> Row {
    let t0 = Instant::now();
    let threads: Vec<_> = (0..conc)
        .map(|c| {
            let http = http.to_string();
            std::thread::spawn(move || {
                let agent = ureq::AgentBuilder::new().build();
                let (mut lat, mut errors) = (Vec::new(), 0u64);
                let mut i = c as u64 * 1_000_000;
                while t0.elapsed().as_secs_f64() < secs {
                    i += 1;
                    let id = format!("b{c}-{i}");
                    let t = Instant::now();
                    let r = agent.post(&format!("http://{http}/v1/route")).send_json(
                        serde_json::json!({"request_id": id, "model": "sim-model", "tokens": tokens(i)}),
                    );
                    let d = t.elapsed();
                    match r {
                        Ok(_) => lat.push(d),
                        Err(_) => errors += 1,
                    }
                    let _ = agent
                        .post(&format!("http://{http}/v1/requests/{id}/finish"))
                        .send_json(serde_json::json!({}));
                }
                (lat, errors)
            })
        })
        .collect();
    let mut row = Row {
        done: 0,
        secs: 0.0,
        lat: Vec::new(),
        errors: 0,
    };
    for t in threads {
        if let Ok((l, e)) = t.join() {
            row.lat.extend(l);
            row.errors += e;
        }
    }
    row.secs = t0.elapsed().as_secs_f64();
    row.done = row.lat.len() as u64;
    row
}

fn main() {
    let secs: f64 = std::env::var("EPP_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5.0);
    let (ev, api, http, epp) = (port(), port(), port(), port());
    let (events, http, epp) = (
        format!("127.0.0.1:{ev}"),
        format!("127.0.0.1:{http}"),
        format!("127.0.0.1:{epp}"),
    );
    let _router = Kill(
        Command::new(env!("CARGO_BIN_EXE_kvroute"))
            .args([
                "serve",
                "--cores",
                "2",
                "--block-size",
                "16",
                "--proxy-addr",
                "off",
            ])
            .args([
                "--events-addr",
                &events,
                "--http-addr",
                &http,
                "--epp-addr",
                &epp,
            ])
            .args(["--api-addr", &format!("127.0.0.1:{api}")])
            .stdout(Stdio::null())
            .spawn()
            .expect("kvroute"),
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while ureq::get(&format!("http://{http}/healthz")).call().is_err() {
        assert!(Instant::now() < deadline, "kvroute did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut fleet = Command::new(env!("CARGO_BIN_EXE_kvroute-sim"))
        .args([
            "fleet",
            "--workers",
            "4",
            "--events",
            "binary",
            "--block-size",
            "16",
        ])
        .args(["--router-events", &events, "--register", &http])
        .stdout(Stdio::piped())
        .spawn()
        .expect("kvroute-sim fleet");
    let out = fleet.stdout.take().expect("stdout");
    let _fleet = Kill(fleet);
    for l in BufReader::new(out).lines().map_while(Result::ok) {
        if l.starts_with("ready:") {
            break;
        }
    }
    println!("| path | in flight | picks/s | p50 µs | p90 µs | p99 µs | errors |");
    println!("|---|---|---|---|---|---|---|");
    for conc in [1, 16] {
        print(
            "epp (ext_proc stream → pick)",
            conc,
            epp_row(&epp, conc, secs),
        );
        print("route (POST /v1/route)", conc, route_row(&http, conc, secs));
    }
}
