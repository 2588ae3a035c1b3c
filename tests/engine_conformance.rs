//! Conformance with the engines as they run today: the real `kv_events.py` of vLLM
//! 0.33.0 and SGLang 0.5.23 (from their PyPI wheels, `.ci/engine_sources`), their own
//! event classes, media constants and `ZmqEventPublisher`, publishing to a real
//! `kvroute serve --engine ...`; `/v1/route` by tokens is the judge. Media and tiers,
//! reference-counted copies, KV cache groups of hybrid models, LoRA extra keys, cache
//! salts and lookahead tokens (docs/ENGINES.md). Streams (dp ranks, restarts) and the
//! proxy's salt are in tests/engine_streams.rs.
//!
//! Skipped (with a message) without the engine sources or pyzmq/msgspec/pydantic,
//! except under `CI=true`, where `.ci/run` provides them.

mod common;
#[path = "common/engines.rs"]
mod engines;

use common::Server;
use engines::{flag, prompt, removed, send, stored, stream, sync, tiers, Engines, BS};
use serde_json::json;

/// One engine `name` of kind `engine` bound to worker `w`, kvroute started with `extra`
/// flags, the subscription established.
fn one(engine: &str, extra: &[&str]) -> (Engines, Server) {
    let mut e = Engines::new();
    let p = e.start("e", engine, 0, false, None);
    let f = flag("w", p, "");
    let mut args = vec!["--block-size", "4", "--engine", &f];
    args.extend_from_slice(extra);
    let s = Server::start_logged(1, &args);
    sync(&mut e, &s, "e", "w");
    (e, s)
}

#[test]
fn vllm_media_map_to_tiers_and_an_unknown_medium_is_disk() {
    if !engines::available() {
        return;
    }
    let (mut e, s) = one("vllm", &[]);
    let p: Vec<Vec<u32>> = (1..=5).map(|i| prompt(i, 2)).collect();
    send(
        &mut e,
        &s,
        "e",
        "w",
        vec![
            stored(&[11, 12], None, &p[0], json!({"medium": "$MEDIUM_GPU"})),
            stored(&[21, 22], None, &p[1], json!({"medium": "$MEDIUM_CPU"})),
            stored(&[31, 32], None, &p[2], json!({"medium": "$MEDIUM_STORAGE"})),
            stored(&[41, 42], None, &p[3], json!({"medium": "NVME_OF"})),
            stored(
                &[51, 52],
                None,
                &p[4],
                json!({"medium": "$MEDIUM_CPU", "locality": "REMOTE"}),
            ),
        ],
    );
    assert_eq!(tiers(&s, "r0", "w", &p[0], json!({})), (2, 0, 0), "GPU");
    assert_eq!(tiers(&s, "r1", "w", &p[1], json!({})), (0, 2, 0), "CPU");
    assert_eq!(tiers(&s, "r2", "w", &p[2], json!({})), (0, 0, 2), "STORAGE");
    assert_eq!(tiers(&s, "r3", "w", &p[3], json!({})), (0, 0, 2), "unknown");
    assert_eq!(tiers(&s, "r4", "w", &p[4], json!({})), (0, 0, 2), "REMOTE");
    send(
        &mut e,
        &s,
        "e",
        "w",
        vec![stored(
            &[61],
            None,
            &prompt(6, 1),
            json!({"medium": "HBM9"}),
        )],
    );
    assert_eq!(stream(&s, "w", "unknown_medium"), 2.0);
    let warned = s
        .log()
        .iter()
        .filter(|l| l.contains("neither vLLM's nor SGLang's"))
        .count();
    assert_eq!(warned, 1, "warned once per worker: {:?}", s.log());
}

#[test]
fn unknown_medium_tier_is_configurable() {
    if !engines::available() {
        return;
    }
    let (mut e, s) = one("vllm", &["--engine-unknown-medium-tier", "host"]);
    let a = prompt(1, 2);
    send(
        &mut e,
        &s,
        "e",
        "w",
        vec![stored(&[1, 2], None, &a, json!({"medium": "X"}))],
    );
    assert_eq!(tiers(&s, "r", "w", &a, json!({})), (0, 2, 0));
}

#[test]
fn sglang_media_and_the_hicache_backup_keep_the_host_copy() {
    if !engines::available() {
        return;
    }
    let (mut e, s) = one("sglang", &[]);
    let p: Vec<Vec<u32>> = (1..=4).map(|i| prompt(i, 2)).collect();
    // HiCache: stored on GPU, backed up to host (CPU_PINNED), the GPU copy evicted.
    send(
        &mut e,
        &s,
        "e",
        "w",
        vec![
            stored(
                &[1, 2],
                None,
                &p[0],
                json!({"medium": "$StorageMedium.GPU"}),
            ),
            stored(
                &[1, 2],
                None,
                &p[0],
                json!({"medium": "$StorageMedium.CPU"}),
            ),
            removed(&[1, 2], json!({"medium": "$StorageMedium.GPU"})),
            stored(
                &[3, 4],
                None,
                &p[1],
                json!({"medium": "$StorageMedium.EXTERNAL"}),
            ),
            stored(
                &[5, 6],
                None,
                &p[2],
                json!({"medium": "$StorageMedium.DISK"}),
            ),
            stored(&[7, 8], None, &p[3], json!({})),
        ],
    );
    assert_eq!(
        tiers(&s, "r0", "w", &p[0], json!({})),
        (0, 2, 0),
        "host copy"
    );
    assert_eq!(
        tiers(&s, "r1", "w", &p[1], json!({})),
        (0, 0, 2),
        "EXTERNAL"
    );
    assert_eq!(tiers(&s, "r2", "w", &p[2], json!({})), (0, 0, 2), "DISK");
    assert_eq!(
        tiers(&s, "r3", "w", &p[3], json!({})),
        (2, 0, 0),
        "default GPU"
    );
    assert_eq!(stream(&s, "w", "unknown_medium"), 0.0);
}

#[test]
fn repeated_announcements_of_a_block_are_reference_counted() {
    if !engines::available() {
        return;
    }
    let (mut e, s) = one("vllm", &[]);
    let a = prompt(1, 2);
    let cpu = json!({"medium": "$MEDIUM_CPU"});
    // The offloading connector re-announces shared hashes once per chunk.
    send(
        &mut e,
        &s,
        "e",
        "w",
        vec![
            stored(&[1, 2], None, &a, cpu.clone()),
            stored(&[1, 2], None, &a, cpu.clone()),
            removed(&[1, 2], cpu.clone()),
        ],
    );
    assert_eq!(
        tiers(&s, "r0", "w", &a, json!({})),
        (0, 2, 0),
        "one copy left"
    );
    send(&mut e, &s, "e", "w", vec![removed(&[1, 2], cpu)]);
    assert_eq!(tiers(&s, "r1", "w", &a, json!({})), (0, 0, 0));
}

#[test]
fn hybrid_model_groups_need_full_attention_whole_and_the_window_at_the_end() {
    if !engines::available() {
        return;
    }
    let (mut e, s) = one("vllm", &[]);
    let a = prompt(1, 8);
    let h: Vec<i64> = (1..=8).collect();
    let full = json!({"medium": "$MEDIUM_GPU", "group_idx": 0,
                      "kv_cache_spec_kind": "full_attention"});
    let swa = json!({"medium": "$MEDIUM_GPU", "group_idx": 1,
                     "kv_cache_spec_kind": "sliding_window",
                     "kv_cache_spec_sliding_window": 2 * BS});
    let swa_rm = json!({"medium": "$MEDIUM_GPU", "group_idx": 1});
    send(
        &mut e,
        &s,
        "e",
        "w",
        vec![stored(&h, None, &a, full), stored(&h, None, &a, swa)],
    );
    assert_eq!(tiers(&s, "r0", "w", &a, json!({})), (8, 0, 0));
    // The sliding-window group evicts blocks 0-5; full attention still holds them.
    send(&mut e, &s, "e", "w", vec![removed(&h[..6], swa_rm.clone())]);
    assert_eq!(tiers(&s, "r1", "w", &a, json!({})), (8, 0, 0));
    // It loses its last window too: the engine cannot reuse the prefix.
    send(&mut e, &s, "e", "w", vec![removed(&h[6..], swa_rm)]);
    assert_eq!(tiers(&s, "r2", "w", &a, json!({})), (0, 0, 0));
}

#[test]
fn a_lora_store_with_its_extra_keys_is_found_by_the_lora_request() {
    if !engines::available() {
        return;
    }
    let (mut e, s) = one("vllm", &[]);
    let a = prompt(1, 2);
    // vLLM 0.33: the adapter name is the first extra key of every block.
    send(
        &mut e,
        &s,
        "e",
        "w",
        vec![stored(
            &[1, 2],
            None,
            &a,
            json!({"medium": "$MEDIUM_GPU", "lora_id": 1, "lora_name": "sql",
                   "extra_keys": [["sql"], ["sql"]]}),
        )],
    );
    assert_eq!(
        tiers(&s, "r0", "w", &a, json!({"lora_name": "sql"})),
        (2, 0, 0)
    );
    assert_eq!(tiers(&s, "r1", "w", &a, json!({})), (0, 0, 0));
}

#[test]
fn vllm_salted_blocks_are_only_credited_to_the_same_salt() {
    if !engines::available() {
        return;
    }
    let (mut e, s) = one("vllm", &[]);
    let (a, b) = (prompt(1, 2), prompt(2, 2));
    let gpu = |x: serde_json::Value| {
        let mut v = json!({"medium": "$MEDIUM_GPU"});
        v.as_object_mut()
            .unwrap()
            .extend(x.as_object().unwrap().clone());
        v
    };
    send(
        &mut e,
        &s,
        "e",
        "w",
        vec![
            // The cache salt is an extra key of the first block only.
            stored(
                &[1, 2],
                None,
                &a,
                gpu(json!({"extra_keys": [["tenant-a"], null]})),
            ),
            stored(
                &[3, 4],
                None,
                &b,
                gpu(json!({"lora_id": 1, "lora_name": "sql",
                           "extra_keys": [["sql", "tenant-a"], ["sql"]]})),
            ),
        ],
    );
    let salt = |x: &str| json!({"cache_salt": x});
    assert_eq!(tiers(&s, "r0", "w", &a, salt("tenant-a")), (2, 0, 0));
    assert_eq!(tiers(&s, "r1", "w", &a, json!({})), (0, 0, 0));
    assert_eq!(tiers(&s, "r2", "w", &a, salt("tenant-b")), (0, 0, 0));
    assert_eq!(
        tiers(
            &s,
            "r3",
            "w",
            &b,
            json!({"cache_salt": "tenant-a", "lora_name": "sql"})
        ),
        (2, 0, 0)
    );
    assert_eq!(
        tiers(&s, "r4", "w", &b, json!({"lora_name": "sql"})),
        (0, 0, 0)
    );
}

#[test]
fn sglang_salted_stores_are_not_credited_to_unsalted_requests() {
    if !engines::available() {
        return;
    }
    let (mut e, s) = one("sglang", &[]);
    let a = prompt(1, 2);
    // SGLang namespaces the hashes by the salt (its own functions) and names it.
    send(
        &mut e,
        &s,
        "e",
        "w",
        vec![stored(
            &[1, 2],
            None,
            &a,
            json!({"medium": "$StorageMedium.GPU", "cache_salt": "t1", "namespace_salt": "t1"}),
        )],
    );
    assert_eq!(tiers(&s, "r0", "w", &a, json!({})), (0, 0, 0), "unsalted");
    assert_eq!(
        tiers(&s, "r1", "w", &a, json!({"cache_salt": "t2"})),
        (0, 0, 0)
    );
    assert_eq!(
        tiers(&s, "r2", "w", &a, json!({"cache_salt": "t1"})),
        (2, 0, 0)
    );
}

#[test]
fn lookahead_blocks_count_only_when_the_request_continues_the_same_way() {
    if !engines::available() {
        return;
    }
    let (mut e, s) = one("vllm", &["--lookahead-tokens", "2"]);
    let full = prompt(1, 4);
    let (cached, next) = (&full[..12], &full[12..14]);
    let la: Vec<Vec<u32>> = vec![full[4..6].to_vec(), full[8..10].to_vec(), next.to_vec()];
    send(
        &mut e,
        &s,
        "e",
        "w",
        vec![stored(
            &[1, 2, 3],
            None,
            cached,
            json!({"medium": "$MEDIUM_GPU", "lookahead_token_ids": la}),
        )],
    );
    assert_eq!(tiers(&s, "r0", "w", &full[..14], json!({})), (3, 0, 0));
    let mut other = cached.to_vec();
    other.extend([7, 7]);
    assert_eq!(
        tiers(&s, "r1", "w", &other, json!({})),
        (2, 0, 0),
        "the last block's lookahead differs"
    );
    // An engine with another lookahead is refused, and said so.
    send(
        &mut e,
        &s,
        "e",
        "w",
        vec![stored(
            &[9],
            None,
            &prompt(2, 1),
            json!({"lookahead_token_ids": [[1]]}),
        )],
    );
    assert_eq!(stream(&s, "w", "lookahead_mismatch"), 1.0);
    assert!(s.log().iter().any(|l| l.contains("lookahead_tokens")));
}
