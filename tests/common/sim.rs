//! Running the `kvroute-sim` binary from tests: the committed trace slice, per-process
//! temporary paths, and a run whose `--json` report is read back.

use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;

/// The committed 1,000-request slice of the conversation trace.
pub const SLICE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/data/mooncake_slice.jsonl"
);

/// A temporary path unique to this test process (`prefix` names the test file).
pub fn tmp(prefix: &str, name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("kvroute-{prefix}-{}-{name}", std::process::id()))
}

/// Runs `kvroute-sim ARGS --json FILE`, asserting success; its stdout and the JSON
/// report.
pub fn run_json(prefix: &str, name: &str, args: &[&str]) -> (String, Value) {
    let (stdout, _, v) = run_json_logged(prefix, name, args);
    (stdout, v)
}

/// [`run_json`], also returning stderr (the tool's and its spawned routers' log), for
/// assertions that should show what the router said. Each call has its own report
/// file, so parallel tests of one process never share one.
pub fn run_json_logged(prefix: &str, name: &str, args: &[&str]) -> (String, String, Value) {
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let json = tmp(prefix, &format!("{name}-{n}.json"));
    let out = Command::new(env!("CARGO_BIN_EXE_kvroute-sim"))
        .args(args)
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        out.status.success(),
        "kvroute-sim {args:?} failed:\n{stdout}\n{stderr}"
    );
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let _ = std::fs::remove_file(&json);
    (stdout, stderr, v)
}
