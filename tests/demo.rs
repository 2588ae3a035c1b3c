//! `kvroute-sim demo`, the README's first command, end to end with the real binaries:
//! a smaller slice of the bundled trace through `kvroute serve`'s proxy and through
//! round-robin on simulated workers. The table must hold well-formed figures for both
//! rows, kvroute must find more cached blocks than round-robin, the chart and the
//! reports must be written, and whatever the demo started must be gone when it ends:
//! after a normal run, on Ctrl-C, and when the router cannot start. No timing is
//! asserted.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn out_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kvroute-demo-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn demo(out: &Path, extra: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_kvroute-sim"));
    c.args(["demo", "--out"]).arg(out).args(extra);
    c
}

/// The pids the demo announced (`(pid N)`), in order.
fn pids(stdout: &str) -> Vec<u32> {
    stdout
        .split("(pid ")
        .skip(1)
        .filter_map(|s| s.split(')').next()?.parse().ok())
        .collect()
}

/// Whether `pid` is still one of the demo's processes (a reused pid would run
/// something else).
fn running(pid: u32) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|c| String::from_utf8_lossy(&c).contains("kvroute"))
        .unwrap_or(false)
}

fn assert_gone(pids: &[u32], what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while pids.iter().any(|&p| running(p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    for &p in pids {
        assert!(!running(p), "{what}: process {p} is still running");
    }
}

/// One table row (the lines after the header `router ...`): its cells.
fn row<'a>(stdout: &'a str, router: &str) -> Vec<&'a str> {
    let line = stdout
        .lines()
        .skip_while(|l| !l.starts_with("router "))
        .find(|l| l.split_whitespace().next() == Some(router))
        .unwrap_or_else(|| panic!("no {router} row in:\n{stdout}"));
    line.split_whitespace().collect()
}

/// `hit rate` cell (`12.3 %`) as a fraction.
fn hit(cells: &[&str]) -> f64 {
    assert_eq!(cells[4], "%", "{cells:?}");
    let h: f64 = cells[3].parse().unwrap();
    assert!((0.0..=100.0).contains(&h), "{cells:?}");
    h / 100.0
}

#[test]
fn demo_prints_hit_rate_ttft_and_e2e_side_by_side_and_writes_the_chart() {
    let out = out_dir("table");
    // 400 requests (the first 200 share little), prompts cut to 4,096 tokens for a
    // debug build, 8 workers: round-robin rarely lands a turn on its history's worker.
    let o = demo(
        &out,
        &[
            "--limit",
            "400",
            "--workers",
            "8",
            "--max-input-tokens",
            "4096",
        ],
    )
    .output()
    .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout).to_string();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "demo failed:\n{stdout}\n{stderr}");
    let header = stdout
        .lines()
        .find(|l| l.starts_with("router "))
        .unwrap_or_else(|| panic!("no table in:\n{stdout}"));
    for col in [
        "requests",
        "errors",
        "hit rate",
        "TTFT p50",
        "TTFT p99",
        "E2E p50",
        "E2E p99",
        "imbalance",
    ] {
        assert!(header.contains(col), "{col} missing from {header:?}");
    }
    let kv = row(&stdout, "kvroute");
    let rr = row(&stdout, "round-robin");
    for cells in [&kv, &rr] {
        assert_eq!(cells.len(), 10, "{cells:?}");
        assert_eq!(cells[1], "400", "requests: {cells:?}");
        assert_eq!(cells[2], "0", "errors: {cells:?}");
        for ms in &cells[5..9] {
            let v: f64 = ms.parse().unwrap_or_else(|_| panic!("{ms} in {cells:?}"));
            assert!(v.is_finite() && v > 0.0, "{cells:?}");
        }
        let imbalance: f64 = cells[9].parse().unwrap();
        assert!(imbalance >= 1.0, "{cells:?}");
    }
    let (hk, hr) = (hit(&kv), hit(&rr));
    assert!(
        hk > hr,
        "kvroute's hit rate {hk} is not above round-robin's {hr}:\n{stdout}"
    );
    assert!(stdout.contains("kvroute against round-robin:"), "{stdout}");
    let svg = std::fs::read_to_string(out.join("demo.svg")).unwrap();
    assert!(
        svg.starts_with("<svg") && svg.contains("round-robin"),
        "{svg}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("demo.json")).unwrap()).unwrap();
    assert_eq!(json["rows"].as_array().unwrap().len(), 2);
    assert!(json["commands"][0]
        .as_str()
        .unwrap()
        .contains("serve --cores 1"));
    // Both fleets and both routers were stopped before the demo returned.
    let p = pids(&stdout);
    assert_eq!(p.len(), 4, "{stdout}");
    assert_gone(&p, "after the demo");
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn ctrl_c_stops_the_router_and_the_fleet() {
    let out = out_dir("ctrl-c");
    let mut child = demo(&out, &["--limit", "1000"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut reader = BufReader::new(child.stdout.take().unwrap());
    let mut seen = String::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    while pids(&seen).len() < 2 {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 || Instant::now() > deadline {
            let _ = child.kill();
            panic!("the demo did not start its router:\n{seen}");
        }
        seen.push_str(&line);
    }
    let started = pids(&seen);
    assert!(started.iter().all(|&p| running(p)), "{seen}");
    // SAFETY: kill(2) on our own child's pid.
    unsafe {
        libc::kill(child.id() as libc::pid_t, libc::SIGINT);
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the demo did not stop on SIGINT");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(!status.success(), "an interrupted demo reports failure");
    assert_gone(&started, "after Ctrl-C");
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn a_router_that_cannot_start_leaves_no_fleet_behind() {
    let out = out_dir("no-router");
    let o = demo(&out, &["--kvroute", "/bin/false", "--limit", "10"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout).to_string();
    let stderr = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(!o.status.success(), "{stdout}\n{stderr}");
    assert!(stderr.contains("exited"), "{stderr}");
    let p = pids(&stdout);
    assert_eq!(p.len(), 1, "the fleet's pid: {stdout}");
    assert_gone(&p, "after the router failed");
    let _ = std::fs::remove_dir_all(&out);
}
