//! Where the proxy's cores run (`pin_cores`, docs/PERFORMANCE.md "Proxy overhead"):
//! pinned by default, one CPU per executor; with `pin_cores = false` every core thread
//! may run on any CPU the process may use, and the proxy still answers on new
//! connections. Checked on the real binary through `/proc` (the kernel's record of
//! each thread's allowed CPUs), and the setting through flag, env, TOML and default.
//! Likewise the cores' scheduler slice (`core_slice_us`), read back from the kernel.

mod common;

use common::Server;
use std::io::{Read, Write};
use std::process::Command;
use std::time::Duration;

/// `(thread name, /proc/PID/task/TID)` of every thread of `pid`, in thread-id order
/// (creation order).
fn tasks(pid: u32) -> Vec<(String, std::path::PathBuf)> {
    let mut tasks: Vec<(u64, std::path::PathBuf)> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|t| {
            let dir = t.ok()?.path();
            Some((dir.file_name()?.to_str()?.parse().ok()?, dir))
        })
        .collect();
    tasks.sort();
    tasks
        .into_iter()
        .filter_map(|(_, dir)| {
            // A thread that ended meanwhile has no name to read.
            let comm = std::fs::read_to_string(dir.join("comm")).ok()?;
            Some((comm.trim().to_string(), dir))
        })
        .collect()
}

/// A thread's `Cpus_allowed_list` (its `/proc/PID/task/TID/status`).
fn cpus_of(dir: &std::path::Path) -> Option<String> {
    let status = std::fs::read_to_string(dir.join("status")).ok()?;
    let list = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))?;
    Some(list.trim().to_string())
}

/// `(thread name, Cpus_allowed_list)` of every thread of `pid`, in creation order.
fn threads(pid: u32) -> Vec<(String, String)> {
    tasks(pid)
        .into_iter()
        .filter_map(|(name, dir)| Some((name, cpus_of(&dir)?)))
        .collect()
}

/// The executor threads' directories (glommio names them after the executor). An
/// executor's blocking thread, which it starts later, inherits its name and is
/// deliberately unbound: the first thread of each name is the executor.
fn core_tasks(pid: u32) -> Vec<std::path::PathBuf> {
    let mut seen = std::collections::HashSet::new();
    tasks(pid)
        .into_iter()
        .filter(|(name, _)| name.starts_with("kvroute-core-") && seen.insert(name.clone()))
        .map(|(_, dir)| dir)
        .collect()
}

/// The allowed CPUs of each executor thread.
fn core_threads(pid: u32) -> Vec<String> {
    core_tasks(pid).iter().filter_map(|d| cpus_of(d)).collect()
}

/// This process's allowed CPUs (the router inherits them).
fn own_cpus() -> String {
    threads(std::process::id())
        .into_iter()
        .next()
        .map(|(_, c)| c)
        .unwrap()
}

fn is_single_cpu(list: &str) -> bool {
    !list.is_empty() && !list.contains(',') && !list.contains('-')
}

/// One `GET /health` on a new connection that the client closes after the answer.
fn health_on_new_connection(proxy: &str) -> String {
    let mut c = std::net::TcpStream::connect(proxy).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    c.write_all(b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .unwrap();
    let mut got = String::new();
    c.read_to_string(&mut got).unwrap();
    got
}

#[test]
fn cores_are_pinned_by_default_one_cpu_each() {
    let s = Server::start(2, &[]);
    let cores = core_threads(s.pid());
    assert!(cores.len() >= 2, "{:?}", threads(s.pid()));
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cpus > 1 {
        assert!(cores.iter().all(|c| is_single_cpu(c)), "{cores:?}");
    }
    assert!(health_on_new_connection(&s.proxy).starts_with("HTTP/1.1 200"));
}

#[test]
fn unpinned_cores_may_run_on_any_cpu_and_keep_serving_new_connections() {
    let s = Server::start(2, &["--pin-cores", "false"]);
    let cores = core_threads(s.pid());
    assert!(cores.len() >= 2, "{:?}", threads(s.pid()));
    let mine = own_cpus();
    assert!(cores.iter().all(|c| *c == mine), "{cores:?} vs {mine}");
    for _ in 0..20 {
        let a = health_on_new_connection(&s.proxy);
        assert!(a.starts_with("HTTP/1.1 200"), "{a}");
        assert!(a.contains("\"ok\""), "{a}");
    }
}

#[test]
fn pin_cores_comes_from_flag_env_toml_and_default() {
    let dir = std::env::temp_dir().join(format!("kvroute-proxy-conn-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("k.toml");
    std::fs::write(&cfg, "pin_cores = false\n").unwrap();
    let print = |env: &[(&str, &str)], flags: &[&str]| -> toml::Value {
        let out = Command::new(env!("CARGO_BIN_EXE_kvroute"))
            .arg("print-config")
            .args(flags)
            .env_remove("KVROUTE_PIN_CORES")
            .envs(env.iter().copied())
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        toml::from_str(&String::from_utf8_lossy(&out.stdout)).unwrap()
    };
    let pin = |v: toml::Value| v["pin_cores"].as_bool().unwrap();
    let cfg_s = cfg.to_str().unwrap();
    assert!(pin(print(&[], &[])));
    assert!(!pin(print(&[], &["--config", cfg_s])));
    assert!(!pin(print(&[("KVROUTE_PIN_CORES", "false")], &[])));
    // Flags over env over the file.
    assert!(pin(print(
        &[("KVROUTE_PIN_CORES", "true")],
        &["--config", cfg_s]
    )));
    assert!(!pin(print(
        &[("KVROUTE_PIN_CORES", "true")],
        &["--pin-cores", "false"]
    )));
    let bad = Command::new(env!("CARGO_BIN_EXE_kvroute"))
        .args(["print-config", "--pin-cores", "sometimes"])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    let _ = std::fs::remove_dir_all(&dir);
}

/// `se.slice` (ns) of each executor thread of `pid`, from the kernel's
/// `/proc/PID/task/TID/sched`.
fn core_slices(pid: u32) -> Vec<u64> {
    let slice_of = |dir: &std::path::PathBuf| {
        let sched = std::fs::read_to_string(dir.join("sched")).ok()?;
        let v = sched.lines().find_map(|l| l.strip_prefix("se.slice"))?;
        v.trim_start_matches([' ', ':']).trim().parse().ok()
    };
    core_tasks(pid).iter().filter_map(slice_of).collect()
}

#[test]
fn cores_run_with_the_configured_scheduler_slice() {
    // Whether this kernel takes a normal thread's slice (Linux 6.12 and later).
    let takes = std::thread::spawn(|| {
        use kvroute::service::runtime::sched_slice;
        sched_slice::set_current(2_500).is_ok() && sched_slice::get(0) == Some(2_500)
    })
    .join()
    .unwrap();
    let s = Server::start(2, &["--core-slice-us", "2500"]);
    let slices = core_slices(s.pid());
    assert!(health_on_new_connection(&s.proxy).starts_with("HTTP/1.1 200"));
    if !takes {
        eprintln!("this kernel keeps its own slice for normal threads: {slices:?}");
        return;
    }
    assert_eq!(slices, vec![2_500_000; 2]);
    drop(s);
    let s = Server::start(2, &["--core-slice-us", "0"]);
    assert!(
        core_slices(s.pid()).iter().all(|&n| n != 2_500_000),
        "0 leaves the kernel's slice"
    );
    for bad in ["50", "100001"] {
        let out = Command::new(env!("CARGO_BIN_EXE_kvroute"))
            .args(["print-config", "--core-slice-us", bad])
            .output()
            .unwrap();
        assert!(!out.status.success(), "{bad}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("core_slice_us"));
    }
}
