//! Tests of the simulated worker: exact event times and order, batching, stages.

use super::*;

/// Round numbers: prefill = 100 + 1·uncached, decode step = 10.
fn simple_timing(max_batch: u32) -> TimingModel {
    TimingModel {
        prefill_base_us: 100.0,
        prefill_us_per_token: 1.0,
        prefill_attention_us: 0.0,
        decode_step_base_us: 10.0,
        decode_us_per_seq: 0.0,
        max_batch,
        cpu_slowdown: 2.0,
        jitter: 0.0,
    }
}

fn req(id: &str, input: u32, output: u32, hashes: &[u64]) -> SimRequest {
    SimRequest {
        id: id.into(),
        arrival_us: 0,
        input_tokens: input,
        output_tokens: output,
        hashes: hashes.to_vec(),
        session: None,
    }
}

/// Runs the worker to completion the way the driver does.
fn drain(w: &mut SimWorker) -> Vec<Outcome> {
    let mut out = Vec::new();
    while let Some(t) = w.next_event_at() {
        w.advance(t, &mut out);
    }
    out
}

fn first(id: &str, at: u64, cached: u32) -> Outcome {
    Outcome::FirstToken {
        id: id.into(),
        at,
        cached_tokens: cached,
    }
}

fn fin(id: &str, at: u64) -> Outcome {
    Outcome::Finished { id: id.into(), at }
}

fn stored(at: u64, parent: Option<u64>, hashes: &[u64]) -> Outcome {
    Outcome::Cache {
        at,
        event: CacheEvent::Stored {
            parent,
            hashes: hashes.to_vec(),
        },
    }
}

#[test]
fn prefill_first_then_batched_decode_with_exact_times() {
    let mut w = SimWorker::new("w", DeviceClass::Gpu, 100, simple_timing(8), 4, 1);
    assert_eq!(w.next_event_at(), None);
    w.submit(&req("a", 8, 4, &[1, 2]), 0);
    w.submit(&req("b", 8, 2, &[1, 3]), 0);
    assert_eq!(w.next_event_at(), Some(0));
    let out = drain(&mut w);
    let want = vec![
        // a: prefill 0..108, nothing cached.
        stored(108, None, &[1, 2]),
        first("a", 108, 0),
        // b: prefill 108..212, block 1 cached (4 tokens).
        stored(212, Some(1), &[3]),
        first("b", 212, 4),
        // decode steps of 10 µs over both: b done at its 2nd token.
        fin("b", 222),
        Outcome::Progress {
            id: "a".into(),
            at: 242,
            output_tokens: 4,
        },
        fin("a", 242),
    ];
    assert_eq!(out, want);
    assert!(out.windows(2).all(|p| p[0].at() <= p[1].at()));
    let s = w.stats();
    assert_eq!(
        (s.prefills, s.prefill_input_tokens, s.hit_tokens),
        (2, 16, 4)
    );
    assert_eq!(s.decode_steps, 3);
    assert_eq!(s.busy_us, 108 + 104 + 30);
    assert_eq!(w.in_flight(), 0);
    assert_eq!(
        w.cache().pinned(),
        0,
        "finished requests release their blocks"
    );
}

#[test]
fn advance_stops_at_the_horizon() {
    let mut w = SimWorker::new("w", DeviceClass::Gpu, 100, simple_timing(8), 4, 1);
    w.submit(&req("a", 8, 3, &[1, 2]), 50);
    let mut out = Vec::new();
    w.advance(40, &mut out);
    assert!(out.is_empty());
    assert_eq!(w.next_event_at(), Some(50));
    w.advance(157, &mut out);
    assert!(out.is_empty(), "prefill ends at 158");
    assert_eq!(w.next_event_at(), Some(158));
    w.advance(158, &mut out);
    assert_eq!(out.last(), Some(&first("a", 158, 0)));
    assert_eq!(w.next_event_at(), Some(168));
    assert_eq!(w.in_flight(), 1);
}

#[test]
fn full_batch_holds_back_prefill() {
    let mut w = SimWorker::new("w", DeviceClass::Gpu, 100, simple_timing(1), 4, 1);
    w.submit(&req("a", 4, 3, &[1]), 0);
    w.submit(&req("b", 4, 1, &[2]), 0);
    let out = drain(&mut w);
    let firsts: Vec<(String, u64)> = out
        .iter()
        .filter_map(|o| match o {
            Outcome::FirstToken { id, at, .. } => Some((id.clone(), *at)),
            _ => None,
        })
        .collect();
    // a: prefill 0..104, decode 104..124; b waits for the slot: prefill 124..228.
    assert_eq!(firsts, vec![("a".into(), 104), ("b".into(), 228)]);
    assert_eq!(
        out.last(),
        Some(&fin("b", 228)),
        "single-token request ends at its first token"
    );
}

#[test]
fn cpu_worker_is_slower() {
    let mut w = SimWorker::new("c", DeviceClass::Cpu, 100, simple_timing(8), 4, 1);
    w.submit(&req("a", 8, 1, &[1, 2]), 0);
    let out = drain(&mut w);
    assert_eq!(out.last(), Some(&fin("a", 216)));
}

#[test]
fn disaggregated_stages() {
    let mut p = SimWorker::new("p", DeviceClass::Gpu, 100, simple_timing(8), 4, 1);
    let r = req("a", 8, 3, &[1, 2]);
    p.submit_stage(&r, Stage::PrefillOnly, 0);
    let out = drain(&mut p);
    assert_eq!(
        out,
        vec![
            stored(108, None, &[1, 2]),
            first("a", 108, 0),
            Outcome::PrefillDone {
                id: "a".into(),
                at: 108
            }
        ]
    );
    assert_eq!(p.cache().pinned(), 0);
    let mut d = SimWorker::new("d", DeviceClass::Gpu, 100, simple_timing(8), 4, 1);
    d.submit_stage(&r, Stage::DecodeOnly, 108);
    let out = drain(&mut d);
    // KV arrives with the request; two more tokens at 118 and 128.
    assert_eq!(out, vec![stored(108, None, &[1, 2]), fin("a", 128)]);
    assert_eq!(d.stats().prefills, 0);
}

#[test]
fn jitter_is_reproducible_for_a_seed() {
    let run = |seed| {
        let t = TimingModel {
            jitter: 0.2,
            ..simple_timing(8)
        };
        let mut w = SimWorker::new("w", DeviceClass::Gpu, 100, t, 4, seed);
        w.submit(&req("a", 400, 20, &[1, 2]), 0);
        drain(&mut w)
    };
    assert_eq!(run(7), run(7));
    assert_ne!(run(7), run(8));
}

#[test]
fn small_cache_pins_running_requests() {
    // Capacity 3: a's two blocks stay pinned while it decodes, so b stores one block.
    let mut w = SimWorker::new("w", DeviceClass::Gpu, 3, simple_timing(8), 4, 1);
    w.submit(&req("a", 8, 50, &[1, 2]), 0);
    w.submit(&req("b", 12, 2, &[5, 6, 7]), 0);
    let out = drain(&mut w);
    assert!(out.contains(&stored(220, None, &[5])), "{out:?}");
    assert!(w.cache().contains(1) && w.cache().contains(2));
}
