//! Warm-restart state under a careless operator, against the
//! real `kvroute serve` binary over loopback:
//! - restore is all or nothing: an invalid or repeated worker, or a restart with a lower
//!   `--max-workers`, stops the start (exit 2, nothing bound) with a message naming it,
//!   and leaves the snapshot as it was;
//! - a state dir that cannot hold files stops the start; snapshot failures while
//!   running are counted in `/metrics`, make `/healthz` say degraded, leave no
//!   temporary file, and a failed shutdown snapshot makes `serve` exit 1;
//! - a flipped byte or another `--block-size` is refused; a valid restart still works.

mod common;
use common::{hashes, Server};
use kvroute::snapshot::{self, HashParams, SavedWorker, Snapshot};
use kvroute::types::{Tier, WorkerSpec};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// A fresh state dir path (not created).
fn state_dir(name: &str) -> (PathBuf, String) {
    let dir = std::env::temp_dir().join(format!("kvroute-sh-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let d = dir.to_str().unwrap().to_string();
    (dir, d)
}

fn free_addr() -> String {
    format!("127.0.0.1:{}", common::free_port())
}

/// Runs `kvroute serve` expected to refuse to start: its exit status and stderr. Killed
/// (and the test failed) if it is still running after 20 s.
fn refused_start(extra: &[&str]) -> (ExitStatus, String) {
    let (e, a, h) = (free_addr(), free_addr(), free_addr());
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvroute"))
        .args([
            "serve",
            "--proxy-addr",
            "off",
            "--cores",
            "2",
            "--events-addr",
            &e,
            "--api-addr",
            &a,
        ])
        .args(["--http-addr", &h])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn kvroute");
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("kvroute started although it should have refused: {extra:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        !stdout.contains("listening"),
        "it listened before refusing: {stdout}"
    );
    (
        out.status,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// SIGTERM and the exit status.
fn stop(s: Server) -> ExitStatus {
    let mut child = s.into_child();
    kvroute::process::sigterm(&child);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("kvroute did not stop on SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn worker(id: &str, capacity: u64) -> SavedWorker {
    let mut spec = WorkerSpec::new(id);
    spec.capacity_blocks = capacity;
    SavedWorker {
        spec,
        heartbeat: false,
        next_seq: 0,
        approximate: false,
    }
}

/// Writes a snapshot of `workers` (two device entries each) into a new `dir`.
fn write_snapshot(dir: &Path, workers: Vec<SavedWorker>) {
    std::fs::create_dir_all(dir).unwrap();
    let entries = (0..workers.len() as u64)
        .map(|i| vec![(Tier::Device, i * 2 + 1), (Tier::Device, i * 2 + 2)])
        .collect();
    let snap = Snapshot {
        params: Some(HashParams::current(128)),
        workers,
        entries,
        requests: Vec::new(),
    };
    snapshot::write(dir, &snap).unwrap();
}

/// A server with three workers holding blocks, stopped with a shutdown snapshot; the
/// snapshot's bytes.
fn three_workers_saved(d: &str, h: &[u64]) -> Vec<u8> {
    let s = Server::start(2, &["--state-dir", d]);
    for id in ["a", "b", "c"] {
        s.register(json!({"id": id, "capacity_blocks": 1000}));
    }
    s.store("a", "device", &h[..8]);
    s.store("b", "host", &h[..3]);
    s.store("c", "device", &h[8..]);
    s.wait_until("indexed", |s| {
        s.cached("a") == 8 && s.cached("b") == 3 && s.cached("c") == 4
    });
    assert!(stop(s).success());
    std::fs::read(Path::new(d).join(snapshot::FILE_NAME)).unwrap()
}

/// The restored router has all three workers and all their entries.
fn check_three_restored(d: &str) {
    let s = Server::start(2, &["--state-dir", d]);
    assert_eq!(s.workers().len(), 3);
    assert_eq!((s.cached("a"), s.cached("b"), s.cached("c")), (8, 3, 4));
    assert!(stop(s).success());
}

#[test]
fn a_lower_max_workers_refuses_the_restart_and_keeps_the_snapshot() {
    let (dir, d) = state_dir("maxw");
    let h = hashes(31, 12);
    let saved = three_workers_saved(&d, &h);
    let (st, err) = refused_start(&["--state-dir", &d, "--max-workers", "2"]);
    assert_eq!(st.code(), Some(2), "{err}");
    assert!(
        err.contains("3 workers") && err.contains("--max-workers"),
        "{err}"
    );
    // The refused start did not overwrite the snapshot it could not restore.
    let now = std::fs::read(dir.join(snapshot::FILE_NAME)).unwrap();
    assert_eq!(now, saved);
    check_three_restored(&d);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_invalid_or_repeated_worker_refuses_the_restart_naming_it() {
    let (dir, d) = state_dir("invalid");
    write_snapshot(&dir, vec![worker("ok", 100), worker("zero", 0)]);
    let (st, err) = refused_start(&["--state-dir", &d]);
    assert_eq!(st.code(), Some(2), "{err}");
    assert!(
        err.contains("\"zero\"") && err.contains("capacity_blocks must be > 0"),
        "{err}"
    );
    write_snapshot(&dir, vec![worker("ok", 100), worker("", 100)]);
    let (st, err) = refused_start(&["--state-dir", &d]);
    assert_eq!(st.code(), Some(2), "{err}");
    assert!(
        err.contains("worker #1") && err.contains("worker id"),
        "{err}"
    );
    write_snapshot(&dir, vec![worker("w", 100), worker("w", 100)]);
    let (st, err) = refused_start(&["--state-dir", &d]);
    assert_eq!(st.code(), Some(2), "{err}");
    assert!(err.contains("\"w\" is saved twice"), "{err}");
    // The same file with valid, distinct workers restores both, entries and all.
    write_snapshot(&dir, vec![worker("w", 100), worker("v", 100)]);
    let s = Server::start(2, &["--state-dir", &d]);
    assert_eq!((s.cached("w"), s.cached("v")), (2, 2));
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_flipped_byte_or_another_block_size_is_refused_and_a_valid_restart_works() {
    let (dir, d) = state_dir("corrupt");
    let h = hashes(32, 12);
    let saved = three_workers_saved(&d, &h);
    let file = dir.join(snapshot::FILE_NAME);
    // One bit of one saved hash.
    let pos = saved
        .windows(8)
        .position(|w| w == h[5].to_le_bytes())
        .expect("hash in the file");
    let mut bad = saved.clone();
    bad[pos] ^= 0x01;
    std::fs::write(&file, &bad).unwrap();
    let (st, err) = refused_start(&["--state-dir", &d]);
    assert_eq!(st.code(), Some(2), "{err}");
    assert!(err.contains("checksum mismatch"), "{err}");
    std::fs::write(&file, &saved).unwrap();
    // Hashes of another block size mean other prefixes: refused, naming the setting.
    let (st, err) = refused_start(&["--state-dir", &d, "--block-size", "64"]);
    assert_eq!(st.code(), Some(2), "{err}");
    assert!(
        err.contains("block_size 128") && err.contains("--block-size"),
        "{err}"
    );
    check_three_restored(&d);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_state_dir_that_cannot_hold_files_refuses_the_start() {
    let (dir, _) = state_dir("unusable");
    std::fs::create_dir_all(&dir).unwrap();
    // Root ignores permission bits, so: a path through a regular file, a directory in
    // /proc (reading finds no snapshot there, but nothing can be created), and a state
    // dir whose temporary file's name is taken by a directory (readable, not writable).
    let plain = dir.join("plain");
    std::fs::write(&plain, b"").unwrap();
    let writable_not = dir.join("taken");
    std::fs::create_dir_all(writable_not.join(snapshot::TMP_NAME).join("x")).unwrap();
    let proc_dir = PathBuf::from(format!("/proc/kvroute-state-{}", std::process::id()));
    for bad in [plain.join("state"), plain.clone(), proc_dir, writable_not] {
        let b = bad.to_str().unwrap();
        let (st, err) = refused_start(&["--state-dir", b]);
        assert_eq!(st.code(), Some(2), "{err}");
        assert!(
            err.contains("cannot hold snapshots") && err.contains(b),
            "{err}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn metric(s: &Server, name: &str) -> f64 {
    s.metric(&format!("{name} "))
}

fn health(s: &Server) -> serde_json::Value {
    let (code, body) = s.get("/healthz");
    assert_eq!(code, 200, "liveness stays 200: {body}");
    serde_json::from_str(&body).unwrap()
}

fn no_tmp(dir: &Path) -> bool {
    !dir.join(snapshot::TMP_NAME).exists()
}

#[test]
fn a_state_dir_removed_mid_run_is_counted_degraded_and_exits_nonzero() {
    let (dir, d) = state_dir("removed");
    let s = Server::start(2, &["--state-dir", &d, "--snapshot-interval-ms", "100"]);
    s.register(json!({"id": "w", "capacity_blocks": 100}));
    s.wait_until("a snapshot", |s| {
        metric(s, "kvroute_snapshots_total") >= 1.0
    });
    assert_eq!(health(&s)["status"], "ok");
    assert!(metric(&s, "kvroute_snapshot_last_success_timestamp_seconds") > 0.0);
    std::fs::remove_dir_all(&dir).unwrap();
    s.wait_until("failures counted", |s| {
        metric(s, "kvroute_snapshot_failures_total") >= 2.0
    });
    assert!(metric(&s, "kvroute_snapshot_consecutive_failures") >= 2.0);
    let h = health(&s);
    assert_eq!(h["status"], "degraded", "{h}");
    assert_eq!(h["snapshot"]["state"], "failing", "{h}");
    // The shutdown snapshot fails too: not a clean exit, and nothing was recreated.
    let st = stop(s);
    assert_eq!(st.code(), Some(1), "{st:?}");
    assert!(!dir.exists());
}

#[test]
fn a_failed_rename_leaves_no_temporary_file_and_the_router_recovers() {
    let (dir, d) = state_dir("rename");
    let s = Server::start(2, &["--state-dir", &d, "--snapshot-interval-ms", "100"]);
    s.register(json!({"id": "w", "capacity_blocks": 100}));
    s.wait_until("a snapshot", |s| {
        metric(s, "kvroute_snapshots_total") >= 1.0
    });
    // A non-empty directory where the snapshot goes: the temporary file is written,
    // then the rename over it fails.
    let file = dir.join(snapshot::FILE_NAME);
    std::fs::remove_file(&file).unwrap();
    std::fs::create_dir(&file).unwrap();
    std::fs::write(file.join("keep"), b"x").unwrap();
    let before = metric(&s, "kvroute_snapshot_failures_total");
    s.wait_until("failures counted", |s| {
        metric(s, "kvroute_snapshot_failures_total") >= before + 2.0
    });
    assert!(no_tmp(&dir), "a failed snapshot left its temporary file");
    assert_eq!(health(&s)["status"], "degraded");
    // Fixed: the next snapshot succeeds and health is back.
    std::fs::remove_dir_all(&file).unwrap();
    s.wait_until("recovered", |s| {
        metric(s, "kvroute_snapshot_consecutive_failures") == 0.0
    });
    assert_eq!(health(&s)["status"], "ok");
    assert!(file.is_file());
    let st = stop(s);
    assert!(st.success(), "{st:?}");
    assert!(no_tmp(&dir));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_second_router_on_the_same_state_dir_is_refused() {
    let (dir, d) = state_dir("shared");
    let s = Server::start(2, &["--state-dir", &d]);
    s.register(json!({"id": "w", "capacity_blocks": 100}));
    let (st, err) = refused_start(&["--state-dir", &d]);
    assert_eq!(st.code(), Some(2), "{err}");
    assert!(err.contains("in use by another kvroute"), "{err}");
    // The first one's state is intact and it still saves it.
    assert!(stop(s).success());
    let s = Server::start(2, &["--state-dir", &d]);
    assert_eq!(s.workers().len(), 1);
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A small tmpfs mounted for one test (root with CAP_SYS_ADMIN only); unmounted on drop.
struct SmallFs(PathBuf);

impl SmallFs {
    fn mount(name: &str, size: &str) -> Option<SmallFs> {
        let (dir, d) = state_dir(name);
        std::fs::create_dir_all(&dir).ok()?;
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs", &d])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            let _ = std::fs::remove_dir(&dir);
            return None;
        }
        Some(SmallFs(dir))
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn a_full_filesystem_is_counted_and_keeps_the_previous_snapshot() {
    let Some(fs) = SmallFs::mount("full", "64k") else {
        eprintln!("skipped: cannot mount a tmpfs here (needs root with CAP_SYS_ADMIN)");
        return;
    };
    let dir = fs.0.join("state");
    let d = dir.to_str().unwrap().to_string();
    let s = Server::start(2, &["--state-dir", &d, "--snapshot-interval-ms", "100"]);
    s.register(json!({"id": "w", "capacity_blocks": 20000}));
    s.wait_until("a small snapshot", |s| {
        metric(s, "kvroute_snapshots_total") >= 1.0
    });
    let small = std::fs::read(dir.join(snapshot::FILE_NAME)).unwrap();
    // 10,000 entries need ~90 KB: more than the filesystem holds.
    s.store("w", "device", &hashes(33, 10_000));
    s.wait_until("indexed", |s| s.cached("w") == 10_000);
    let before = metric(&s, "kvroute_snapshot_failures_total");
    s.wait_until("failures counted", |s| {
        metric(s, "kvroute_snapshot_failures_total") >= before + 2.0
    });
    assert!(no_tmp(&dir), "a failed snapshot left its temporary file");
    assert_eq!(health(&s)["status"], "degraded");
    let st = stop(s);
    assert_eq!(st.code(), Some(1), "{st:?}");
    assert!(no_tmp(&dir));
    // The last good snapshot is intact and restores.
    assert_eq!(std::fs::read(dir.join(snapshot::FILE_NAME)).unwrap(), small);
    let s = Server::start(2, &["--state-dir", &d]);
    assert_eq!((s.workers().len(), s.cached("w")), (1, 0));
    drop(s);
}

#[test]
fn a_worker_full_to_its_cap_restores_whole_or_refuses_never_in_part() {
    let (dir, d) = state_dir("cap");
    let s = Server::start(2, &["--state-dir", &d]);
    s.register(json!({"id": "w", "capacity_blocks": 100}));
    s.store("w", "device", &hashes(34, 200));
    // Settled: the count the snapshot will hold, once every event is applied.
    let mut last = u64::MAX;
    s.wait_until("the stores applied", |s| {
        let now = s.cached("w");
        let settled = now >= 100 && now == last;
        last = now;
        if !settled {
            std::thread::sleep(Duration::from_millis(100));
        }
        settled
    });
    let cached = s.cached("w");
    assert!(stop(s).success());
    // Same settings: everything the router held comes back.
    let s = Server::start(2, &["--state-dir", &d]);
    assert_eq!(s.cached("w"), cached);
    assert!(stop(s).success());
    // Fewer cores change each shard's share of the cap: all of it, or a refusal that
    // names the worker, never a silent part.
    let (e, a, h) = (free_addr(), free_addr(), free_addr());
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvroute"))
        .args([
            "serve",
            "--proxy-addr",
            "off",
            "--cores",
            "1",
            "--state-dir",
            &d,
            "--events-addr",
            &e,
        ])
        .args(["--api-addr", &a, "--http-addr", &h])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let url = format!("http://{h}/v1/workers");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            let out = child.wait_with_output().unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(st.code(), Some(2), "{err}");
            assert!(
                err.contains("saved worker \"w\"") && err.contains("cap"),
                "{err}"
            );
            eprintln!("refused, as it may be: {err}");
            break;
        }
        if let Ok(r) = ureq::get(&url).call() {
            let w: serde_json::Value = r.into_json().unwrap();
            assert_eq!(w[0]["cached_blocks"].as_u64(), Some(cached), "{w}");
            kvroute::process::terminate(&mut child, Duration::from_secs(10));
            break;
        }
        assert!(Instant::now() < deadline, "neither started nor refused");
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = std::fs::remove_dir_all(&dir);
}
