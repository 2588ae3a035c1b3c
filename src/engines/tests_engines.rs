//! Unit tests of what the engines of today publish: media, KV cache groups,
//! reference-counted copies, salts and lookahead hashed as requests are, dp ranks and
//! restarts on a fresh connection.

use super::adapter::{Adapter, Change};
use super::stream::{Session, Step};
use super::tests::{enc, s};
use super::*;
use crate::hash::sequence_hashes;
use proptest::prelude::*;
use rmpv::Value;

fn stored(hashes: &[u64], parent: Option<u64>, tokens: Vec<u32>) -> Stored {
    Stored {
        block_hashes: hashes.iter().map(|&h| EngineHash::Int(h)).collect(),
        parent: parent.map(EngineHash::Int),
        token_ids: tokens,
        block_size: Some(4),
        ..Default::default()
    }
}

fn removed(hashes: &[u64], medium: &str, group: Option<u32>) -> EngineEvent {
    EngineEvent::Removed {
        block_hashes: hashes.iter().map(|&h| EngineHash::Int(h)).collect(),
        medium: Some(medium.into()),
        group,
        locality: None,
    }
}

/// The index as the changes build it.
fn index(out: &[Change]) -> Vec<(u64, Tier)> {
    let mut set = std::collections::BTreeSet::new();
    for c in out {
        match c {
            Change::Stored { tier, hashes } => set.extend(hashes.iter().map(|&h| (h, *tier))),
            Change::Removed { tier, hashes } => {
                for h in hashes {
                    assert!(set.remove(&(*h, *tier)), "removal of a block not stored");
                }
            }
            Change::Cleared { tier: None } => set.clear(),
            Change::Cleared { tier: Some(t) } => set.retain(|(_, x)| x != t),
        }
    }
    set.into_iter().collect()
}

#[test]
fn every_medium_of_both_engines_has_its_tier() {
    for (m, t) in [
        ("GPU", Tier::Device),
        ("CPU", Tier::Host),
        ("STORAGE", Tier::Disk),
        ("CPU_PINNED", Tier::Host),
        ("DISK", Tier::Disk),
        ("EXTERNAL", Tier::Disk),
    ] {
        assert_eq!(medium_tier(Some(m), None), Some(t), "{m}");
        assert_eq!(
            medium_tier(Some(m), Some("REMOTE")),
            Some(Tier::Disk),
            "{m}"
        );
        assert_eq!(medium_tier(Some(m), Some("LOCAL")), Some(t), "{m}");
    }
    assert_eq!(medium_tier(None, None), Some(Tier::Device));
    assert_eq!(medium_tier(Some("HBM"), None), None);
    let mut a = Adapter::new(4, 100, None);
    let mut out = Vec::new();
    let mut st = stored(&[1], None, vec![1, 2, 3, 4]);
    st.medium = Some("HBM".into());
    a.apply(&EngineEvent::Stored(st), &mut out);
    assert_eq!(
        index(&out),
        [(sequence_hashes(&[1, 2, 3, 4], 4)[0], Tier::Disk)]
    );
    assert_eq!(a.stats.unknown_medium, 1);
}

#[test]
fn groups_keep_a_prefix_the_engine_can_reuse() {
    let t: Vec<u32> = (0..32).collect();
    let h: Vec<u64> = (1..=8).collect();
    let plain = sequence_hashes(&t, 4);
    let mut a = Adapter::new(4, 100, None);
    let mut out = Vec::new();
    for (g, kind) in [(0, "full_attention"), (1, "sliding_window")] {
        let mut st = stored(&h, None, t.clone());
        st.group = Some(g);
        st.spec_kind = Some(kind.into());
        a.apply(&EngineEvent::Stored(st), &mut out);
    }
    let all: Vec<(u64, Tier)> = {
        let mut v: Vec<_> = plain.iter().map(|&x| (x, Tier::Device)).collect();
        v.sort_unstable();
        v
    };
    assert_eq!(index(&out), all);
    a.apply(&removed(&h[..6], "GPU", Some(1)), &mut out);
    assert_eq!(index(&out), all, "the window's tail keeps the prefix");
    a.check_invariants().unwrap();
    a.apply(&removed(&h[7..], "GPU", Some(1)), &mut out);
    let mut seven: Vec<_> = plain[..7].iter().map(|&x| (x, Tier::Device)).collect();
    seven.sort_unstable();
    assert_eq!(index(&out), seven, "block 6 is the window's last block now");
    a.apply(&removed(&h[6..7], "GPU", Some(1)), &mut out);
    assert!(index(&out).is_empty(), "no window left: nothing reusable");
    assert_eq!(a.present(), index(&out));
    a.check_invariants().unwrap();
}

#[test]
fn copies_are_counted_per_group_and_tier() {
    let t: Vec<u32> = (0..4).collect();
    let mut a = Adapter::new(4, 100, None);
    let mut out = Vec::new();
    let mut st = stored(&[1], None, t.clone());
    st.medium = Some("CPU".into());
    a.apply(&EngineEvent::Stored(st.clone()), &mut out);
    a.apply(&EngineEvent::Stored(st), &mut out);
    a.apply(&removed(&[1], "CPU", None), &mut out);
    assert_eq!(index(&out).len(), 1);
    a.apply(&removed(&[1], "CPU", None), &mut out);
    assert!(index(&out).is_empty());
    a.apply(&removed(&[1], "CPU", None), &mut out);
    assert_eq!(a.stats.unknown_removed, 1);
    a.check_invariants().unwrap();
}

#[test]
fn salts_and_lookahead_hash_as_requests_do() {
    let t: Vec<u32> = (0..10).collect();
    let keys = |v: Vec<Value>| Some(enc(&Value::Array(v)).into_boxed_slice());
    // LoRA and salt in vLLM's extra keys, and SGLang's field: the request's hashes.
    let mut a = Adapter::new(4, 100, None);
    let mut out = Vec::new();
    let mut st = stored(&[1, 2], None, t[..8].to_vec());
    st.lora_name = Some("sql".into());
    st.extra_keys = keys(vec![
        Value::Array(vec![s("sql"), s("tenant")]),
        Value::Array(vec![s("sql")]),
    ]);
    a.apply(&EngineEvent::Stored(st), &mut out);
    let mut want = Vec::new();
    prompt_hashes(
        &t[..8],
        4,
        chain_start(Some("sql"), Some("tenant")),
        0,
        &mut want,
    );
    assert_eq!(
        out,
        [Change::Stored {
            tier: Tier::Device,
            hashes: want.clone()
        }]
    );
    let mut sg = stored(&[3, 4], None, t[..8].to_vec());
    sg.lora_name = Some("sql".into());
    sg.cache_salt = Some("tenant".into());
    out.clear();
    a.apply(&EngineEvent::Stored(sg), &mut out);
    assert_eq!(
        out,
        [Change::Stored {
            tier: Tier::Device,
            hashes: want
        }]
    );
    // A multimodal key still salts its block.
    let mut mm = stored(&[5], None, t[..4].to_vec());
    mm.extra_keys = keys(vec![Value::Array(vec![Value::Array(vec![
        s("img"),
        Value::from(0),
    ])])]);
    out.clear();
    a.apply(&EngineEvent::Stored(mm), &mut out);
    assert_ne!(
        out,
        [Change::Stored {
            tier: Tier::Device,
            hashes: sequence_hashes(&t[..4], 4)
        }]
    );
    // Lookahead: the request hashes each block with its own next tokens.
    let mut l = Adapter::new(4, 100, None).with_lookahead(2);
    let mut la = stored(&[1, 2], None, t[..8].to_vec());
    la.lookahead = Some(vec![t[4..6].to_vec(), t[8..10].to_vec()]);
    out.clear();
    l.apply(&EngineEvent::Stored(la.clone()), &mut out);
    let mut want = Vec::new();
    prompt_hashes(&t, 4, None, 2, &mut want);
    assert_eq!(
        out,
        [Change::Stored {
            tier: Tier::Device,
            hashes: want
        }]
    );
    let mut want = Vec::new();
    prompt_hashes(&t[..9], 4, None, 2, &mut want);
    assert_eq!(
        want.len(),
        1,
        "a block without its lookahead tokens is not hashed"
    );
    out.clear();
    a.apply(&EngineEvent::Stored(la), &mut out);
    assert!(out.is_empty());
    assert_eq!(a.stats.lookahead_mismatch, 1);
}

fn batch_of_rank(rank: u64, hash: u64) -> Vec<u8> {
    let ev = Value::Map(vec![
        (s("type"), s("BlockStored")),
        (s("block_hashes"), Value::Array(vec![Value::from(hash)])),
        (s("parent_block_hash"), Value::Nil),
        (
            s("token_ids"),
            Value::Array((0..4).map(Value::from).collect()),
        ),
        (s("block_size"), Value::from(4)),
    ]);
    enc(&Value::Array(vec![
        Value::from(1.0),
        Value::Array(vec![ev]),
        Value::from(rank),
    ]))
}

#[test]
fn other_ranks_are_refused_and_noted_once() {
    let mut st = Session::new(Adapter::new(4, 100, None), false, Some(0));
    let mut out = Vec::new();
    st.live(0, &batch_of_rank(1, 7), &mut out);
    st.live(1, &batch_of_rank(1, 8), &mut out);
    assert!(out.is_empty());
    assert_eq!(st.counters.dp_rank_mismatch, 2);
    assert_eq!(st.dp_mismatch, Some(1));
    assert_eq!(st.notes.len(), 1);
    st.live(2, &batch_of_rank(0, 9), &mut out);
    assert_eq!(out.len(), 1);
    assert_eq!(st.dp_mismatch, None);
}

#[test]
fn a_lower_sequence_on_a_fresh_connection_is_a_restart() {
    // With replay: cleared, then synced from seq 0.
    let mut st = Session::new(Adapter::new(4, 100, None), true, None);
    let mut out = Vec::new();
    st.live(0, &batch_of_rank(0, 1), &mut out);
    st.live(1, &batch_of_rank(0, 2), &mut out);
    st.live(2, &batch_of_rank(0, 3), &mut out);
    st.reconnected();
    assert_eq!(
        st.live(1, &batch_of_rank(0, 5), &mut out),
        Step::Replay { from: 0 }
    );
    assert_eq!(st.counters.restarts, 1);
    assert!(st.adapter.is_empty());
    assert!(st.replayed(0, &batch_of_rank(0, 4), &mut out));
    st.replay_done(true, 1, &batch_of_rank(0, 5), &mut out);
    assert_eq!(st.next_seq(), Some(2));
    assert_eq!(st.adapter.len(), 2);
    // Not after the first message of that connection: a duplicate as before.
    st.live(1, &batch_of_rank(0, 6), &mut out);
    assert_eq!(st.counters.duplicates, 1);
    // Without replay: cleared, continuing from the message.
    let mut st = Session::new(Adapter::new(4, 100, None), false, None);
    st.live(0, &batch_of_rank(0, 1), &mut out);
    st.live(1, &batch_of_rank(0, 2), &mut out);
    st.reconnected();
    st.live(1, &batch_of_rank(0, 3), &mut out);
    assert_eq!((st.counters.restarts, st.adapter.len()), (1, 1));
    assert_eq!(st.next_seq(), Some(2));
}

#[test]
fn eviction_order_survives_the_rebuilds_of_the_store_order() {
    // Six blocks stay while 3,000 others come and go: their stale pairs make the store
    // order rebuild itself several times, and it must still evict the oldest first.
    let mut a = Adapter::new(4, 8, None);
    let mut out = Vec::new();
    let store = |a: &mut Adapter, out: &mut Vec<Change>, h: u64| {
        let ev = EngineEvent::Stored(stored(&[h], None, vec![h as u32, 1, 2, 3]));
        a.apply(&ev, out);
    };
    let kept: Vec<u64> = (100_000..100_006).collect();
    for &h in &kept {
        store(&mut a, &mut out, h);
    }
    for h in 0..3000 {
        store(&mut a, &mut out, h);
        a.apply(&removed(&[h], "GPU", None), &mut out);
    }
    let known = |a: &Adapter, h: u64| a.lookup(&EngineHash::Int(h)).is_some();
    for (i, h) in (10_000..10_008).enumerate() {
        store(&mut a, &mut out, h);
        // Full from the third new block on: each evicts the oldest kept one.
        let gone = i.saturating_sub(1);
        assert!(
            kept[..gone].iter().all(|&k| !known(&a, k)),
            "evicted out of order"
        );
        assert!(
            kept[gone..].iter().all(|&k| known(&a, k)),
            "evicted out of order"
        );
    }
    a.check_invariants().unwrap();
    assert_eq!(index(&out), a.present());
}

proptest! {
    /// Any sequence of stores and removes over two groups and two tiers: the changes
    /// build exactly the index the adapter says, and its invariants hold.
    #[test]
    fn the_index_follows_the_adapter(
        ops in prop::collection::vec((0u8..4, 0u64..6, 0u64..3, 0u8..2, any::<bool>()), 1..60),
        cap in 3usize..12,
    ) {
        let t: Vec<u32> = (0..40).collect();
        let mut a = Adapter::new(4, cap, None);
        let mut out = Vec::new();
        for (kind, start, len, group, host) in ops {
            let medium = if host { "CPU" } else { "GPU" };
            let hs: Vec<u64> = (start..start + len + 1).collect();
            let ev = if kind < 3 {
                let mut st = stored(&hs, start.checked_sub(1).filter(|_| kind == 1), t[(start as usize) * 4..(start as usize + hs.len()) * 4].to_vec());
                st.group = Some(u32::from(group));
                st.spec_kind = Some(if group == 0 { "full_attention" } else { "sliding_window" }.into());
                st.medium = Some(medium.into());
                EngineEvent::Stored(st)
            } else {
                removed(&hs, medium, Some(u32::from(group)))
            };
            a.apply(&ev, &mut out);
            prop_assert_eq!(a.check_invariants(), Ok(()));
            prop_assert_eq!(index(&out), a.present());
        }
    }
}
