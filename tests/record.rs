//! `kvroute serve --record FILE` end to end: the real binary records
//! the requests it routed as a Mooncake trace that `kvroute-sim`'s reader
//! (`kvroute::sim::read_mooncake`) reads back, with the lengths reported, hash ids
//! renumbered to small integers that keep prefix sharing, and a size limit that
//! stops the recording.

mod common;
use common::{hashes, Server};
use kvroute::sim::{read_mooncake, TraceOptions};
use serde_json::json;
use std::path::{Path, PathBuf};

fn temp_file(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kvroute-record-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("trace.jsonl")
}

fn lines(p: &Path) -> usize {
    std::fs::read_to_string(p)
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

fn worker(id: &str) -> serde_json::Value {
    json!({"id": id, "role": "aggregated", "device": "gpu", "model": "m", "capacity_blocks": 100000})
}

fn post_ok(s: &Server, path: &str, body: serde_json::Value) {
    let (code, b) = s.post(path, body);
    assert_eq!(code, 200, "{path}: {b}");
}

/// Routes, reports and finishes request `id` with prompt `h` and `out` output tokens.
fn serve_one(s: &Server, id: &str, h: &[u64], out: Option<u32>) {
    post_ok(
        s,
        "/v1/route",
        json!({"request_id": id, "model": "m", "block_hashes": h}),
    );
    post_ok(s, &format!("/v1/requests/{id}/first_token"), json!({}));
    if let Some(n) = out {
        post_ok(
            s,
            &format!("/v1/requests/{id}/progress"),
            json!({"output_tokens": n}),
        );
    }
    post_ok(s, &format!("/v1/requests/{id}/finish"), json!({}));
}

#[test]
fn recorded_trace_reads_back_in_the_simulator() {
    let path = temp_file("readback");
    let p = path.to_string_lossy().to_string();
    let s = Server::start(2, &["--record", &p]);
    for w in ["w1", "w2"] {
        s.register(worker(w));
    }
    let shared = hashes(3, 8); // two 512-token chunks
    let mut a = shared.clone();
    a.extend(hashes(4, 4)); // + one chunk of its own
    let mut b = shared.clone();
    b.extend(hashes(5, 2)); // + half a chunk
    serve_one(&s, "a", &a, Some(37));
    serve_one(&s, "b", &b, None);
    // No progress but an OSL hint: the hint is written.
    post_ok(
        &s,
        "/v1/route",
        json!({"request_id": "c", "model": "m", "block_hashes": &b, "expected_output_tokens": 77}),
    );
    post_ok(&s, "/v1/requests/c/finish", json!({}));
    // Routed but never ended: not recorded.
    post_ok(
        &s,
        "/v1/route",
        json!({"request_id": "open", "model": "m", "block_hashes": &a}),
    );
    s.wait_until("three lines", |_| lines(&path) == 3);
    assert_eq!(s.metric("kvroute_record_lines_total"), 3.0);
    let text = std::fs::read_to_string(&path).unwrap();
    let first: serde_json::Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    assert_eq!(first["hash_ids"], json!([0, 1, 2]), "{text}");
    assert!(
        !text.contains(&shared[0].to_string()),
        "no real hash is written"
    );
    let reqs = read_mooncake(&path, &TraceOptions::default()).unwrap();
    assert_eq!(reqs.len(), 3);
    let (ra, rb) = (&reqs[0], &reqs[1]);
    assert_eq!(
        (reqs[2].input_tokens, reqs[2].output_tokens),
        (10 * 128, 77)
    );
    assert_eq!(reqs[2].hashes, rb.hashes);
    assert_eq!((ra.input_tokens, ra.output_tokens), (12 * 128, 37));
    // No progress reported: the first token counts as one output token.
    assert_eq!((rb.input_tokens, rb.output_tokens), (10 * 128, 1));
    assert_eq!(ra.hashes.len(), 12);
    assert_eq!(rb.hashes.len(), 10);
    // The shared 8 blocks replay as a shared prefix, and nothing after them.
    assert_eq!(ra.hashes[..8], rb.hashes[..8]);
    assert_ne!(ra.hashes[8], rb.hashes[8]);
    assert!(ra.arrival_us <= rb.arrival_us);
    drop(s);
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}

#[test]
fn recording_stops_at_its_size_limit() {
    let path = temp_file("limit");
    let p = path.to_string_lossy().to_string();
    let s = Server::start(1, &["--record", &p, "--record-max-bytes", "300"]);
    s.register(worker("w1"));
    for i in 0..10u64 {
        serve_one(&s, &format!("r{i}"), &hashes(10 + i, 8), Some(5));
    }
    s.wait_until("stopped", |s| s.metric("kvroute_record_stopped") == 1.0);
    drop(s);
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.len() <= 300, "{} bytes", text.len());
    let n = text.lines().count();
    assert!((1..10).contains(&n), "{n} lines");
    // Whole lines only: the simulator reads every one of them.
    let reqs = read_mooncake(&path, &TraceOptions::default()).unwrap();
    assert_eq!(reqs.len(), n);
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}
