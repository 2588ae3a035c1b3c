//! Preemptible ingest (`ingest_slice_hashes`) through the real
//! binary: index batches applied a few hashes at a time, with routing queries served
//! between the slices, still apply every worker's operations in order; and the
//! setting is validated from flag, environment and TOML alike.

mod common;
use common::{hashes, req, spec, Server};
use kvroute::client::{EventPublisher, RequestClient};
use kvroute::types::Tier;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Generous: the test machine is shared and loaded.
fn wait(s: &Server, what: &str, f: impl Fn(&Server) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !f(s) {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Stores, removes and re-stores of two workers, each event several index batches
/// long, applied one hash per slice on two cores while a client keeps routing: the
/// final index must be what the operations give in order (a reordered or dropped
/// slice would leave a different count or overlap).
#[test]
fn one_hash_slices_keep_per_worker_order_while_routing() {
    let s = Server::start(2, &["--ingest-slice-hashes", "1"]);
    let mut a = EventPublisher::connect(&s.events, spec("a"), "").unwrap();
    let mut b = EventPublisher::connect(&s.events, spec("b"), "").unwrap();
    let ha = hashes(11, 3000);
    let hb = hashes(12, 3000);
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|sc| {
        // Routing traffic during the whole ingest: queries land between slices.
        let api = s.api.clone();
        let (qa, stop) = (&ha, &stop);
        let router = sc.spawn(move || {
            let mut c = RequestClient::connect(&api, "").unwrap();
            let mut n = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let id = format!("q{n}");
                let d = c.route(&req(&id, &qa[..64])).unwrap();
                assert!(d.decode_worker == "a" || d.decode_worker == "b");
                c.finish(&id).unwrap();
                n += 1;
            }
            n
        });
        for (p, h) in [(&mut a, &ha), (&mut b, &hb)] {
            p.stored(Tier::Device, None, h);
            p.removed(Tier::Device, &h[1000..]);
            p.stored(Tier::Device, Some(h[1999]), &h[2000..2500]);
            p.flush().unwrap();
        }
        wait(&s, "both workers' final state", |s| {
            s.cached("a") == 1500 && s.cached("b") == 1500
        });
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(router.join().unwrap() > 0, "no routing during the test");
    });
    // Positions 0..1000 held (1000..2000 removed, 2000..2500 stored again after it).
    let mut c = RequestClient::connect(&s.api, "").unwrap();
    for (id, h, w) in [("fa", &ha, "a"), ("fb", &hb, "b")] {
        let d = c.route(&req(id, h)).unwrap();
        assert_eq!((d.decode_worker.as_str(), d.overlap.device), (w, 1000));
        c.finish(id).unwrap();
    }
}

/// `serve` with an invalid `ingest_slice_hashes` from `how` must exit with an error
/// naming the setting (it never starts serving).
fn refused(args: &[&str], env: Option<&str>, toml: Option<&str>) {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kvroute"));
    let (e, a, h) = (
        common::free_port(),
        common::free_port(),
        common::free_port(),
    );
    cmd.args(["serve", "--cores", "1"])
        .args(["--events-addr", &format!("127.0.0.1:{e}")])
        .args(["--api-addr", &format!("127.0.0.1:{a}")])
        .args(["--http-addr", &format!("127.0.0.1:{h}")])
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if let Some(v) = env {
        cmd.env("KVROUTE_INGEST_SLICE_HASHES", v);
    }
    if let Some(t) = toml {
        let path = dir.path().join("kvroute.toml");
        std::fs::write(&path, t).unwrap();
        cmd.arg("--config").arg(&path);
    }
    let mut child = cmd.spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("serve {args:?} env {env:?} toml {toml:?} kept running");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        use std::io::Read;
        let _ = e.read_to_string(&mut err);
    }
    assert!(!status.success(), "accepted {args:?} {env:?} {toml:?}");
    assert!(err.contains("ingest_slice_hashes"), "stderr: {err}");
}

#[test]
fn zero_slice_is_refused_from_flag_env_and_toml() {
    refused(&["--ingest-slice-hashes", "0"], None, None);
    refused(&[], Some("0"), None);
    refused(&[], None, Some("ingest_slice_hashes = 0\n"));
}
