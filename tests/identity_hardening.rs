//! Identity and ownership hardening (issue 13 items 4, 6, 7, 17), against the real
//! `kvroute serve` binary over loopback:
//! - one process per port (no split brain between two routers);
//! - registration stays linear (4,096 workers with maximum-size specs);
//! - per-worker credentials, conflicting registrations refused, liveness never
//!   switched off by a registration;
//! - the per-worker limit and the global index budget enforced exactly.

mod common;
use common::{hashes, Server};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Waits for a child to exit (bounded); kills it and fails if it does not.
fn wait_exit(child: &mut std::process::Child, within: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + within;
    loop {
        if let Some(st) = child.try_wait().expect("try_wait") {
            return st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("process did not exit within {within:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

// ---------------------------------------------------------------- item 7: split brain

#[test]
fn second_instance_on_the_same_ports_exits_and_the_first_keeps_serving() {
    let s = Server::start(2, &[]);
    s.register(serde_json::json!({"id": "w1", "capacity_blocks": 100}));
    // Same three ports; only the events port would be enough, all three must be refused.
    for (taken, port) in [
        ("events", s.events.clone()),
        ("api", s.api.clone()),
        ("http", s.http.clone()),
    ] {
        let free = |a: &str| {
            if a == port {
                a.to_string()
            } else {
                "127.0.0.1:0".into()
            }
        };
        let mut second = Command::new(env!("CARGO_BIN_EXE_kvroute"))
            .args([
                "serve",
                "--cores",
                "2",
                "--events-addr",
                &free(&s.events),
                "--api-addr",
                &free(&s.api),
                "--http-addr",
                &free(&s.http),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn second kvroute");
        let st = wait_exit(&mut second, Duration::from_secs(20));
        let mut err = String::new();
        use std::io::Read;
        second
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        assert!(
            !st.success(),
            "second instance ({taken} port taken) started"
        );
        assert!(
            err.contains(&port),
            "message should name the port {port}: {err:?}"
        );
    }
    // Every new connection still reaches the first router (the only one holding it).
    for _ in 0..32 {
        let (code, body) = s.get("/v1/workers");
        assert_eq!(code, 200);
        assert!(body.contains("\"w1\""), "{body}");
    }
}

#[test]
fn port_zero_gives_one_port_shared_by_every_core() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvroute"))
        .args([
            "serve",
            "--cores",
            "2",
            "--events-addr",
            "127.0.0.1:0",
            "--api-addr",
            "127.0.0.1:0",
            "--http-addr",
            "127.0.0.1:0",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn kvroute");
    let mut line = String::new();
    use std::io::BufRead;
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    // "... http 127.0.0.1:PORT (JSON ..."
    let http = line
        .split("http ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .unwrap_or_default()
        .to_string();
    assert!(!http.ends_with(":0") && http.contains(':'), "{line}");
    for _ in 0..16 {
        let r = ureq::get(&format!("http://{http}/healthz")).call();
        assert!(r.is_ok(), "{r:?}");
    }
    kvroute::process::terminate(&mut child, Duration::from_secs(10));
}
