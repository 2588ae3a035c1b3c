//! Unit tests of the engine-event adapters: decoding both encodings, hash recomputation
//! and the engine-hash map, and the stream state machine.

use super::adapter::{Adapter, Change};
use super::vllm::{decode_batch, DecodeError};
use super::*;
use crate::hash::sequence_hashes;
use rmpv::Value;

pub(super) fn enc(v: &Value) -> Vec<u8> {
    let mut b = Vec::new();
    rmpv::encode::write_value(&mut b, v).unwrap();
    b
}

pub(super) fn s(x: &str) -> Value {
    Value::from(x)
}

pub(super) fn ints(xs: &[u64]) -> Value {
    Value::Array(xs.iter().map(|&x| Value::from(x)).collect())
}

pub(super) fn toks(n: u32, base: u32) -> Vec<u32> {
    (base..base + n).collect()
}

/// Positional `BlockStored` with trailing defaults omitted.
pub(super) fn stored_pos(
    hashes: Value,
    parent: Value,
    tokens: &[u32],
    bs: u64,
    medium: Option<&str>,
) -> Value {
    let mut v = vec![
        s("BlockStored"),
        hashes,
        parent,
        Value::Array(tokens.iter().map(|&t| Value::from(t)).collect()),
        Value::from(bs),
        Value::Nil,
    ];
    if let Some(m) = medium {
        v.push(s(m));
    }
    Value::Array(v)
}

pub(super) fn batch_pos(events: Vec<Value>) -> Vec<u8> {
    enc(&Value::Array(vec![Value::from(1.5), Value::Array(events)]))
}

fn batch_map(events: Vec<Value>) -> Vec<u8> {
    enc(&Value::Map(vec![
        (s("ts"), Value::from(2.0)),
        (s("events"), Value::Array(events)),
        (s("data_parallel_rank"), Value::from(1)),
        (s("future_field"), s("ignored")),
    ]))
}

fn map_event(fields: Vec<(&str, Value)>) -> Value {
    Value::Map(fields.into_iter().map(|(k, v)| (s(k), v)).collect())
}

#[test]
fn positional_batch_decodes_with_big_int_hashes() {
    let big = u64::MAX - 3; // beyond i64
    let t = toks(8, 0);
    let p = batch_pos(vec![
        stored_pos(ints(&[big, 7]), Value::Nil, &t, 4, Some("GPU")),
        Value::Array(vec![s("BlockRemoved"), ints(&[7]), s("cpu")]),
        Value::Array(vec![s("AllBlocksCleared")]),
        Value::Array(vec![s("SomethingNew"), Value::from(1)]),
    ]);
    let b = decode_batch(&p).unwrap();
    assert_eq!(b.ts, 1.5);
    assert_eq!(b.events.len(), 3);
    assert_eq!(b.skipped, 1, "unknown type skipped");
    let EngineEvent::Stored(st) = &b.events[0] else {
        panic!("{:?}", b.events[0])
    };
    assert_eq!(
        st.block_hashes,
        vec![EngineHash::Int(big), EngineHash::Int(7)]
    );
    assert_eq!(st.parent, None);
    assert_eq!(st.token_ids, t);
    assert_eq!(st.block_size, Some(4));
    assert_eq!(st.medium.as_deref(), Some("GPU"));
    assert_eq!(
        b.events[1],
        EngineEvent::Removed {
            block_hashes: vec![EngineHash::Int(7)],
            medium: Some("cpu".into()),
            group: None,
            locality: None,
        }
    );
    assert_eq!(b.events[2], EngineEvent::AllCleared { medium: None });
}

#[test]
fn map_batch_decodes_bytes_hashes_and_ignores_unknown_fields() {
    let d1 = vec![1u8; 32];
    let d0 = vec![9u8; 32];
    let p = batch_map(vec![map_event(vec![
        ("type", s("BlockStored")),
        (
            "block_hashes",
            Value::Array(vec![Value::Binary(d1.clone())]),
        ),
        ("parent_block_hash", Value::Binary(d0.clone())),
        ("token_ids", ints(&[1, 2, 3, 4])),
        ("block_size", Value::from(4)),
        ("lora_name", s("sql")),
        ("locality", s("rack-3")),
    ])]);
    let b = decode_batch(&p).unwrap();
    assert_eq!(b.dp_rank, Some(1));
    let EngineEvent::Stored(st) = &b.events[0] else {
        panic!()
    };
    assert_eq!(st.block_hashes, vec![EngineHash::Bytes(d1.into())]);
    assert_eq!(st.parent, Some(EngineHash::Bytes(d0.into())));
    assert_eq!(st.lora_name.as_deref(), Some("sql"));
    assert_eq!(st.medium, None);
}

#[test]
fn negative_int_hashes_are_twos_complement_and_bad_events_are_skipped() {
    let p = batch_pos(vec![
        Value::Array(vec![
            s("BlockRemoved"),
            Value::Array(vec![Value::from(-2i64)]),
        ]),
        Value::Array(vec![s("BlockRemoved"), s("not a list")]),
        Value::Array(vec![
            s("BlockStored"),
            ints(&[1]),
            Value::Nil,
            ints(&[1 << 40]),
        ]),
        Value::from(3),
    ]);
    let b = decode_batch(&p).unwrap();
    assert_eq!(b.skipped, 3);
    assert_eq!(
        b.events,
        vec![EngineEvent::Removed {
            block_hashes: vec![EngineHash::Int(u64::MAX - 1)],
            medium: None,
            group: None,
            locality: None,
        }]
    );
}

#[test]
fn bad_payloads_are_errors_not_panics() {
    assert!(matches!(decode_batch(&[]), Err(DecodeError::Msgpack(_))));
    assert!(matches!(
        decode_batch(&enc(&Value::from(1))),
        Err(DecodeError::Envelope(_))
    ));
    let mut two = batch_pos(vec![]);
    two.extend(batch_pos(vec![]));
    assert_eq!(decode_batch(&two), Err(DecodeError::Trailing));
    // Truncations and byte flips of a valid payload never panic.
    let p = batch_pos(vec![stored_pos(
        ints(&[1, 2]),
        Value::Nil,
        &toks(8, 0),
        4,
        Some("GPU"),
    )]);
    for cut in 0..p.len() {
        let _ = decode_batch(&p[..cut]);
    }
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..2000 {
        let mut q = p.clone();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let i = (x as usize) % q.len();
        q[i] = (x >> 32) as u8;
        let _ = decode_batch(&q);
    }
    // Deep nesting is refused, not recursed into.
    let mut deep = vec![0x91u8; 100_000];
    deep.push(0xc0);
    assert!(decode_batch(&deep).is_err());
}

fn stored_ev(hashes: &[u64], parent: Option<u64>, tokens: Vec<u32>, bs: u32) -> EngineEvent {
    EngineEvent::Stored(Stored {
        block_hashes: hashes.iter().map(|&h| EngineHash::Int(h)).collect(),
        parent: parent.map(EngineHash::Int),
        token_ids: tokens,
        block_size: Some(bs),
        ..Default::default()
    })
}

fn removed_ev(hashes: &[u64], medium: Option<&str>) -> EngineEvent {
    EngineEvent::Removed {
        block_hashes: hashes.iter().map(|&h| EngineHash::Int(h)).collect(),
        medium: medium.map(str::to_owned),
        group: None,
        locality: None,
    }
}

#[test]
fn adapter_recomputes_design_hashes_across_chained_events() {
    let t = toks(16, 100);
    let want = sequence_hashes(&t, 4);
    let mut a = Adapter::new(128, 100, None).with_router_block_size(4);
    let mut out = Vec::new();
    a.apply(&stored_ev(&[10, 11], None, t[..8].to_vec(), 4), &mut out);
    a.apply(
        &stored_ev(&[12, 13], Some(11), t[8..].to_vec(), 4),
        &mut out,
    );
    assert_eq!(
        out,
        vec![
            Change::Stored {
                tier: Tier::Device,
                hashes: want[..2].to_vec()
            },
            Change::Stored {
                tier: Tier::Device,
                hashes: want[2..].to_vec()
            },
        ]
    );
    out.clear();
    a.apply(&removed_ev(&[13, 99], Some("GPU")), &mut out);
    assert_eq!(
        out,
        vec![Change::Removed {
            tier: Tier::Device,
            hashes: vec![want[3]]
        }]
    );
    assert_eq!(a.stats.unknown_removed, 1);
    assert_eq!(a.len(), 3);
    a.check_invariants().unwrap();
}

#[test]
fn adapter_tiers_unknown_parent_and_short_tokens() {
    let t = toks(8, 0);
    let want = sequence_hashes(&t, 4);
    let mut a = Adapter::new(4, 100, None);
    let mut out = Vec::new();
    // Fallback block size (none in the event), CPU medium → host.
    let mut ev = stored_ev(&[1, 2], None, t.clone(), 4);
    if let EngineEvent::Stored(s) = &mut ev {
        s.block_size = None;
        s.medium = Some("Cpu".into());
    }
    a.apply(&ev, &mut out);
    assert_eq!(
        out,
        vec![Change::Stored {
            tier: Tier::Host,
            hashes: want.clone()
        }]
    );
    out.clear();
    // The same block on device too; removing it from host keeps the device copy mapped.
    a.apply(&stored_ev(&[1], None, t[..4].to_vec(), 4), &mut out);
    a.apply(&removed_ev(&[1], Some("CPU")), &mut out);
    a.apply(&removed_ev(&[1], Some("GPU")), &mut out);
    assert_eq!(
        out[1..],
        [
            Change::Removed {
                tier: Tier::Host,
                hashes: vec![want[0]]
            },
            Change::Removed {
                tier: Tier::Device,
                hashes: vec![want[0]]
            }
        ]
    );
    assert_eq!(a.lookup(&EngineHash::Int(1)), None);
    a.check_invariants().unwrap();
    out.clear();
    a.apply(&stored_ev(&[5], Some(424242), t[..4].to_vec(), 4), &mut out);
    assert!(out.is_empty());
    assert_eq!(a.stats.unknown_parent, 1);
    a.apply(&stored_ev(&[6, 7, 8], None, t.clone(), 4), &mut out);
    assert_eq!(a.stats.missing_tokens, 1, "third block has no tokens");
    assert_eq!(medium_tier(Some("DISK"), None), Some(Tier::Disk));
    assert_eq!(medium_tier(Some("npu-hbm"), None), None);
    a.check_invariants().unwrap();
}

#[test]
fn adapter_map_is_bounded_and_evictions_reach_the_index_first() {
    let mut a = Adapter::new(2, 3, None);
    let mut out = Vec::new();
    let t = toks(10, 0);
    let want = sequence_hashes(&t, 2);
    a.apply(&stored_ev(&[1, 2, 3, 4, 5], None, t.clone(), 2), &mut out);
    assert_eq!(a.len(), 3);
    assert_eq!(a.stats.evicted, 2);
    // Index view: replay the changes and check it equals the map's content.
    let mut index = std::collections::HashSet::new();
    for c in &out {
        match c {
            Change::Stored { hashes, .. } => index.extend(hashes.iter().copied()),
            Change::Removed { hashes, .. } => {
                for h in hashes {
                    assert!(index.remove(h), "removal of a block not stored yet");
                }
            }
            Change::Cleared { .. } => index.clear(),
        }
    }
    assert_eq!(index, want[2..].iter().copied().collect());
    a.check_invariants().unwrap();
    // Re-storing refreshes recency: with room for 2, re-stored 10 survives, 11 goes.
    let mut a = Adapter::new(2, 2, None);
    a.apply(&stored_ev(&[10], None, vec![1, 1], 2), &mut out);
    a.apply(&stored_ev(&[11], None, vec![2, 2], 2), &mut out);
    a.apply(&stored_ev(&[10], None, vec![1, 1], 2), &mut out);
    a.apply(&stored_ev(&[12], None, vec![3, 3], 2), &mut out);
    assert!(a.lookup(&EngineHash::Int(10)).is_some());
    assert_eq!(a.lookup(&EngineHash::Int(11)), None);
    a.check_invariants().unwrap();
    for _ in 0..5000 {
        a.apply(&stored_ev(&[3], None, t[..2].to_vec(), 2), &mut out);
    }
    a.check_invariants().unwrap();
}

#[test]
fn lora_and_extra_keys_salt_hashes() {
    let t = toks(8, 0);
    let plain = sequence_hashes(&t, 4);
    let mut a = Adapter::new(4, 100, Some("default-adapter".into()));
    let mut out = Vec::new();
    let mut ev = stored_ev(&[1, 2], None, t.clone(), 4);
    if let EngineEvent::Stored(s) = &mut ev {
        s.lora_name = Some("sql".into());
    }
    a.apply(&ev, &mut out);
    let sql = salted_sequence_hashes(&t, 4, Some("sql"));
    assert_ne!(sql, plain);
    assert_eq!(sql[0], crate::hash::chain(lora_salt("sql"), plain[0]));
    assert_eq!(
        out[0],
        Change::Stored {
            tier: Tier::Device,
            hashes: sql
        }
    );
    // lora_id without a name → the endpoint's configured LoRA.
    out.clear();
    if let EngineEvent::Stored(s) = &mut ev {
        s.lora_name = None;
        s.lora_id = Some(3);
        s.block_hashes = vec![EngineHash::Int(3), EngineHash::Int(4)];
    }
    a.apply(&ev, &mut out);
    let want = salted_sequence_hashes(&t, 4, Some("default-adapter"));
    assert_eq!(
        out[0],
        Change::Stored {
            tier: Tier::Device,
            hashes: want
        }
    );
    // Per-block extra keys: block 1 salted, block 0 not.
    out.clear();
    if let EngineEvent::Stored(s) = &mut ev {
        s.lora_id = None;
        s.block_hashes = vec![EngineHash::Int(5), EngineHash::Int(6)];
        s.extra_keys = Some(
            enc(&Value::Array(vec![
                Value::Nil,
                Value::Array(vec![s_("img")]),
            ]))
            .into_boxed_slice(),
        );
    }
    a.apply(&ev, &mut out);
    let Change::Stored { hashes, .. } = &out[0] else {
        panic!()
    };
    assert_eq!(hashes[0], plain[0]);
    assert_ne!(hashes[1], plain[1]);
}

fn s_(x: &str) -> Value {
    Value::from(x)
}
