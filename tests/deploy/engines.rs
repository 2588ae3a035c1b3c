//! Engines that come and go, as engine pods do in Kubernetes, through the real binary:
//! a worker whose event endpoint stays unreachable goes `down` and comes back by
//! itself; a DNS name is resolved again on reconnect, so an engine that moved to
//! another address is followed (the name's address is changed in a private
//! `/etc/hosts`, bind-mounted in a mount namespace of kvroute's own); and the engines
//! file adds, retires and changes engines without a restart (on change, and on SIGHUP).

use crate::common::fleet::Fleet;
use crate::common::run::{serve, serve_args, Run, BIN};
use kvroute::engines::config::EngineEndpoint;
use kvroute::zmtp::publisher::Publisher;
use serde_json::Value;
use std::process::{Command, Stdio};
use std::time::Duration;

const SEC: Duration = Duration::from_secs(1);

fn worker(r: &Run, id: &str) -> Option<Value> {
    r.workers().into_iter().find(|w| w["id"] == id)
}

fn state(r: &Run, id: &str) -> String {
    worker(r, id)
        .and_then(|w| w["state"].as_str().map(str::to_string))
        .unwrap_or_default()
}

fn metric(r: &Run, prefix: &str) -> Option<f64> {
    r.get("/metrics")
        .1
        .lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[test]
fn an_unreachable_engine_goes_down_and_comes_back_by_itself() {
    let p = Publisher::bind("127.0.0.1:0").unwrap();
    let port = p.local_addr().port();
    let eng = format!("worker_id=e0,endpoint=tcp://127.0.0.1:{port},model=m");
    let r = Run::spawn(serve(&[
        "--cores",
        "1",
        "--heartbeat-timeout-ms",
        "500",
        "--engine",
        &eng,
    ]))
    .started();
    assert!(p.wait_subscribers(1, 10 * SEC), "no subscription");
    r.wait_until("e0 live", 10 * SEC, |r| state(r, "e0") == "live");
    // The pod goes away: its connections close, new ones are refused.
    drop(p);
    r.wait_until("e0 down", 15 * SEC, |r| state(r, "e0") == "down");
    let w = worker(&r, "e0").unwrap();
    assert!(
        w["engine_issue"]
            .as_str()
            .unwrap_or("")
            .starts_with("unreachable"),
        "{w}"
    );
    assert_eq!(metric(&r, "kvroute_worker_live{worker=\"e0\"}"), Some(0.0));
    // It comes back on the same address: routed again, without anyone's help.
    let p = Publisher::bind(&format!("127.0.0.1:{port}")).unwrap();
    assert!(p.wait_subscribers(1, 15 * SEC), "no new subscription");
    r.wait_until("e0 live again", 10 * SEC, |r| state(r, "e0") == "live");
    assert_eq!(worker(&r, "e0").unwrap()["engine_issue"], Value::Null);
    assert_eq!(metric(&r, "kvroute_worker_live{worker=\"e0\"}"), Some(1.0));
    let err = r.stderr();
    assert!(err.iter().any(|l| l.contains("unreachable for")), "{err:?}");
    assert!(err.iter().any(|l| l.contains("reachable again")), "{err:?}");
}

/// `unshare` arguments giving kvroute a mount namespace of its own (root: a mount
/// namespace; otherwise inside a user namespace), if this machine allows one.
fn private_mounts() -> Option<Vec<&'static str>> {
    for args in [
        &["--mount", "--propagation", "private"][..],
        &[
            "--user",
            "--map-root-user",
            "--mount",
            "--propagation",
            "private",
        ][..],
    ] {
        let ok = Command::new("unshare")
            .args(args)
            .arg("true")
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            return Some(args.to_vec());
        }
    }
    None
}

#[test]
fn a_dns_name_is_resolved_again_when_the_engine_moves() {
    let Some(ns) = private_mounts() else {
        assert!(
            std::env::var("CI").is_err(),
            "CI is set but unshare cannot make a mount namespace"
        );
        eprintln!("SKIPPED: unshare cannot make a mount namespace here");
        return;
    };
    let name = "engine-0.vllm.test";
    let hosts = std::env::temp_dir().join(format!("kvroute-dns-{}-hosts", std::process::id()));
    // Written in place (same inode), so the bind mount sees every version.
    let point = |ip: Option<&str>| {
        let line = ip.map(|ip| format!("{ip} {name}\n")).unwrap_or_default();
        std::fs::write(&hosts, format!("127.0.0.1 localhost\n{line}")).unwrap();
    };
    point(Some("127.0.0.2"));
    let a = Publisher::bind("127.0.0.2:0").unwrap();
    let port = a.local_addr().port();
    let eng = format!("worker_id=e0,endpoint=tcp://{name}:{port},model=m");
    let mut c = Command::new("unshare");
    c.args(&ns)
        .args(["sh", "-c", "mount --bind \"$0\" /etc/hosts && exec \"$@\""])
        .arg(&hosts)
        .arg(BIN)
        .args(serve_args())
        .args(["--cores", "1", "--heartbeat-timeout-ms", "500"])
        .args(["--engine", &eng]);
    let r = Run::spawn(c).started();
    assert!(
        a.wait_subscribers(1, 10 * SEC),
        "no subscription to 127.0.0.2"
    );
    r.wait_until("subscribed to the first address", 5 * SEC, |r| {
        r.stderr()
            .iter()
            .any(|l| l.contains(&format!("subscribed (127.0.0.2:{port})")))
    });
    // The pod is deleted: its address goes, and its name with it for a while.
    drop(a);
    point(None);
    r.wait_until(
        "e0 down while its name resolves to nothing",
        15 * SEC,
        |r| state(r, "e0") == "down",
    );
    // Rescheduled elsewhere under the same name.
    let b = Publisher::bind(&format!("127.0.0.3:{port}")).unwrap();
    point(Some("127.0.0.3"));
    assert!(
        b.wait_subscribers(1, 15 * SEC),
        "the new address was not followed"
    );
    r.wait_until("e0 live at its new address", 10 * SEC, |r| {
        state(r, "e0") == "live"
    });
    let err = r.stderr();
    assert!(
        err.iter()
            .any(|l| l.contains(&format!("subscribed (127.0.0.3:{port})"))),
        "{err:?}"
    );
    drop(r);
    let _ = std::fs::remove_file(&hosts);
}

/// The TOML of an engines file holding `engines` (compact `--engine` forms).
fn engines_toml(engines: &[&str]) -> String {
    #[derive(serde::Serialize)]
    struct Doc {
        engines: Vec<EngineEndpoint>,
    }
    let engines = engines
        .iter()
        .map(|e| EngineEndpoint::parse_compact(e).unwrap())
        .collect();
    toml::to_string(&Doc { engines }).unwrap()
}

/// Replaces `path` at once (a new file renamed over it, as a ConfigMap update does).
fn replace(path: &std::path::Path, text: &str) {
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

fn chat(proxy: &str, prompt: &str) -> u16 {
    let body = serde_json::json!({
        "model": "sim-model",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": 4,
    });
    match ureq::post(&format!("http://{proxy}/v1/chat/completions"))
        .timeout(Duration::from_secs(30))
        .send_json(body)
    {
        Ok(r) => r.status(),
        Err(ureq::Error::Status(c, _)) => c,
        Err(e) => panic!("chat: {e}"),
    }
}

fn requests(f: &Fleet, i: usize) -> u64 {
    f.stats(i)["requests"].as_u64().unwrap_or(0)
}

#[test]
fn the_engines_file_adds_and_retires_engines_without_a_restart() {
    let fleet = Fleet::start(&["--workers", "2", "--block-size", "4"]);
    let e: Vec<&str> = fleet
        .workers
        .iter()
        .map(|w| w.engine.as_deref().unwrap())
        .collect();
    let file = std::env::temp_dir().join(format!("kvroute-engines-{}.toml", std::process::id()));
    replace(&file, &engines_toml(&e[..1]));
    let path = file.to_str().unwrap();
    let r = Run::spawn(serve(&[
        "--cores",
        "1",
        "--block-size",
        "4",
        "--engines-file",
        path,
    ]))
    .started();
    let pid = r.child.id();
    let proxy = r.addr("proxy");
    r.wait_until("sim-0 live", 10 * SEC, |r| state(r, "sim-0") == "live");
    assert_eq!(r.workers().len(), 1);
    assert_eq!(chat(&proxy, "t1 t2 t3 t4 t5"), 200);
    assert_eq!((requests(&fleet, 0), requests(&fleet, 1)), (1, 0));

    // A new engine pod: added to the file, followed within the poll.
    replace(&file, &engines_toml(&e));
    r.wait_until("sim-1 live", 10 * SEC, |r| state(r, "sim-1") == "live");

    // The first one retired, applied at SIGHUP: only sim-1 is left to route to.
    replace(&file, &engines_toml(&e[1..]));
    r.signal(libc::SIGHUP);
    r.wait_until("sim-0 removed", 10 * SEC, |r| worker(r, "sim-0").is_none());
    assert_eq!(chat(&proxy, "t9 t8 t7 t6 t5"), 200);
    assert_eq!((requests(&fleet, 0), requests(&fleet, 1)), (1, 1));

    // SIGHUP with nothing changed says so.
    r.signal(libc::SIGHUP);
    r.wait_until("unchanged", 10 * SEC, |r| {
        r.stderr()
            .iter()
            .any(|l| l.contains("unchanged (1 engines)"))
    });

    // A broken file changes nothing, and says why once.
    replace(&file, "[[engines]]\nworker_id = \"x\"\n");
    r.wait_until("rejected", 10 * SEC, |r| {
        metric(r, "kvroute_engines_file_reloads_total{kind=\"rejected\"}") == Some(1.0)
    });
    std::thread::sleep(3 * SEC);
    assert_eq!(
        metric(&r, "kvroute_engines_file_reloads_total{kind=\"rejected\"}"),
        Some(1.0)
    );
    let err = r.stderr();
    assert!(
        err.iter()
            .any(|l| l.contains("missing field `endpoint`") && l.contains("keeping the 1 engines")),
        "{err:?}"
    );
    assert_eq!(state(&r, "sim-1"), "live");
    // A missing file too (it is not "no engines").
    std::fs::remove_file(&file).unwrap();
    r.wait_until("missing file rejected", 10 * SEC, |r| {
        metric(r, "kvroute_engines_file_reloads_total{kind=\"rejected\"}") == Some(2.0)
    });
    assert_eq!(state(&r, "sim-1"), "live");
    // An empty file: no engines.
    replace(&file, "");
    r.wait_until("sim-1 removed", 10 * SEC, |r| r.workers().is_empty());
    assert_eq!(r.child.id(), pid);
    let mut r = r;
    assert_eq!(r.stop().code(), Some(0));
    let _ = std::fs::remove_file(&file);
}

#[test]
fn an_unusable_engines_file_stops_the_start() {
    let file =
        std::env::temp_dir().join(format!("kvroute-engines-bad-{}.toml", std::process::id()));
    for text in [
        "[[engines]]\nworker_id = \"a\"\nendpoint = \"tcp://h:1\"\n[[engines]]\nworker_id = \"a\"\nendpoint = \"tcp://h:2\"\n",
        "not toml",
    ] {
        std::fs::write(&file, text).unwrap();
        let mut r = Run::spawn(serve(&["--engines-file", file.to_str().unwrap()]));
        let st = r.exit_or_listen(10 * SEC);
        assert_eq!(st.and_then(|s| s.code()), Some(2), "{:?}", r.stderr());
    }
    let _ = std::fs::remove_file(&file);
    let mut r = Run::spawn(serve(&["--engines-file", "/nonexistent/engines.toml"]));
    let st = r.exit_or_listen(10 * SEC);
    assert_eq!(st.and_then(|s| s.code()), Some(2));
    assert!(r
        .stderr()
        .last()
        .unwrap()
        .contains("/nonexistent/engines.toml"));
}

/// With `--cluster` (NATS replicas) the file's engines join the static list at start,
/// under the engine leases; a change needs a restart, which SIGHUP says.
#[test]
fn with_replicas_on_nats_the_engines_file_is_read_at_start() {
    if !crate::common::cluster::nats_available() {
        return;
    }
    let nats = crate::common::cluster::NatsServer::start();
    let p = Publisher::bind("127.0.0.1:0").unwrap();
    let eng = format!("worker_id=e0,endpoint={},model=m", p.endpoint());
    let file =
        std::env::temp_dir().join(format!("kvroute-engines-nats-{}.toml", std::process::id()));
    replace(&file, &engines_toml(&[&eng]));
    let r = Run::spawn(serve(&[
        "--cores",
        "1",
        "--cluster",
        &nats.url(),
        "--engines-file",
        file.to_str().unwrap(),
    ]))
    .started();
    assert!(p.wait_subscribers(1, 10 * SEC), "no subscription");
    r.wait_until("e0 registered", 10 * SEC, |r| state(r, "e0") == "live");
    r.wait_until("lease held", 15 * SEC, |r| {
        metric(r, "kvroute_cluster_engine_leases") == Some(1.0)
    });
    r.signal(libc::SIGHUP);
    r.wait_until("SIGHUP answered", 10 * SEC, |r| {
        r.stderr().iter().any(|l| {
            l.contains("SIGHUP ignored: with [cluster] the engines file is read only at start")
        })
    });
    let _ = std::fs::remove_file(&file);
}
