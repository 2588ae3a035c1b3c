//! The cost formula: the DESIGN worked example and one test per knob.

use super::*;

fn req10() -> RequestShape {
    RequestShape::new(1280, 128)
}

#[test]
fn request_shape_rounds_blocks_up() {
    assert_eq!(RequestShape::new(1280, 128).prompt_blocks, 10);
    assert_eq!(RequestShape::new(1281, 128).prompt_blocks, 11);
    assert_eq!(RequestShape::new(0, 128).prompt_blocks, 0);
    assert_eq!(RequestShape::new(5, 0).prompt_blocks, 5);
}

#[test]
fn worked_example_costs_exactly() {
    let cfg = RouterConfig::default();
    let ws = worked_example();
    let got: Vec<(f64, f64, f64)> = ws
        .iter()
        .map(|w| {
            let t = terms(&cfg, req10(), w);
            (t.adjusted_prefill, t.decode_blocks, t.cost)
        })
        .collect();
    assert_eq!(
        got,
        vec![(8.0, 10.0, 18.0), (5.0, 5.0, 10.0), (2.0, 9.0, 11.0)]
    );
    for w in &ws {
        assert_eq!(terms(&cfg, req10(), w).prefill_blocks, 10.0);
    }
}

#[test]
fn worked_example_chooses_w2() {
    let d = Case::new().explain().decide(&worked_example()).unwrap();
    assert_eq!(d.decode_worker, 1);
    assert_eq!(d.cost, 10.0);
    assert_eq!(d.overlap.device, 5);
    assert_eq!(d.fallback, Fallback::None);
    assert_eq!(d.prefill_worker, None);
    let costs: Vec<f64> = d.candidates.iter().map(|e| e.cost).collect();
    assert_eq!(costs, vec![18.0, 10.0, 11.0]);
    assert!(d.candidates.iter().all(|e| e.stage == Stage::Aggregated));
}

#[test]
fn knob_overlap_score_credit() {
    let w = W::new("a").dev(4);
    let full = RouterConfig::default();
    let half = RouterConfig {
        overlap_score_credit: 0.5,
        ..full.clone()
    };
    assert_eq!(terms(&full, req10(), &w).adjusted_prefill, 6.0);
    assert_eq!(terms(&half, req10(), &w).adjusted_prefill, 8.0);
    // Credit 0 turns the choice from the cached worker to the lighter one.
    // cached: 2 + (12 + 2) = 16 < light 10 + 10; with credit 0: 10 + 14 = 24 > 20.
    let ws = vec![W::new("cached").dev(8).unique(12.0), W::new("light")];
    assert_eq!(Case::new().decide(&ws).unwrap().decode_worker, 0);
    let d = Case::new()
        .cfg(|c| c.overlap_score_credit = 0.0)
        .decide(&ws)
        .unwrap();
    assert_eq!(d.decode_worker, 1);
}

#[test]
fn knob_host_disk_shared_weights() {
    let o = Overlap {
        device: 0,
        host: 4,
        disk: 4,
        shared: 4,
    };
    let w = W::new("a").ov(o);
    let cfg = RouterConfig::default();
    // 10 - 0.75*4 - 0.25*4 - 0.5*4 = 4
    assert_eq!(terms(&cfg, req10(), &w).adjusted_prefill, 4.0);
    let host = RouterConfig {
        host_cache_hit_weight: 0.25,
        ..cfg.clone()
    };
    assert_eq!(terms(&host, req10(), &w).adjusted_prefill, 6.0);
    let disk = RouterConfig {
        disk_cache_hit_weight: 0.5,
        ..cfg.clone()
    };
    assert_eq!(terms(&disk, req10(), &w).adjusted_prefill, 3.0);
    let shared = RouterConfig {
        shared_cache_multiplier: 0.0,
        ..cfg.clone()
    };
    assert_eq!(terms(&shared, req10(), &w).adjusted_prefill, 6.0);
    assert_eq!(terms(&cfg, req10(), &w).overlap, o);
}

#[test]
fn adjusted_prefill_floors_at_zero() {
    let w = W::new("a").dev(30).unique(4.0);
    let t = terms(&RouterConfig::default(), req10(), &w);
    assert_eq!(t.adjusted_prefill, 0.0);
    // Decode blocks only: the whole prompt is already on device, nothing is added.
    assert_eq!(t.cost, 4.0);
}

#[test]
fn knob_prefill_load_scale() {
    let w = W::new("a").dev(2).unique(3.0);
    let cfg = RouterConfig {
        prefill_load_scale: 2.0,
        ..Default::default()
    };
    // 2 * 8 + (3 + 10 - 2): the 2 cached blocks are not added again.
    assert_eq!(terms(&cfg, req10(), &w).cost, 27.0);
}

#[test]
fn knob_track_prefill_tokens() {
    let w = W::new("a").queued(256.0);
    let on = RouterConfig::default();
    let off = RouterConfig {
        track_prefill_tokens: false,
        ..on.clone()
    };
    assert_eq!(terms(&on, req10(), &w).prefill_blocks, 12.0);
    assert_eq!(terms(&off, req10(), &w).prefill_blocks, 10.0);
}

#[test]
fn knob_block_size() {
    let cfg = RouterConfig {
        block_size: 64,
        ..Default::default()
    };
    assert_eq!(terms(&cfg, req10(), &W::new("a")).prefill_blocks, 20.0);
}

#[test]
fn knob_track_active_blocks() {
    let w = W::new("a").unique(7.0).total(9.0).output(3.0);
    let off = RouterConfig {
        track_active_blocks: false,
        track_output_blocks: true,
        ..Default::default()
    };
    let t = terms(&off, req10(), &w);
    assert_eq!(t.decode_blocks, 0.0);
    assert_eq!(t.cost, 10.0);
}

#[test]
fn knob_assume_kv_reuse() {
    let w = W::new("a").unique(7.0).total(9.0).reuse(4);
    let on = RouterConfig::default();
    let off = RouterConfig {
        assume_kv_reuse: false,
        ..on.clone()
    };
    assert_eq!(terms(&on, req10(), &w).decode_blocks, 7.0 + 6.0);
    assert_eq!(terms(&off, req10(), &w).decode_blocks, 9.0 + 10.0);
    // Reuse beyond the prompt is clamped: the request adds nothing, never negative.
    let w = W::new("a").unique(7.0).reuse(50);
    assert_eq!(terms(&on, req10(), &w).decode_blocks, 7.0);
}

#[test]
fn knob_track_output_blocks() {
    let w = W::new("a").unique(2.0).output(3.5);
    let off = RouterConfig::default();
    let on = RouterConfig {
        track_output_blocks: true,
        ..off.clone()
    };
    assert_eq!(terms(&off, req10(), &w).decode_blocks, 12.0);
    assert_eq!(terms(&on, req10(), &w).decode_blocks, 15.5);
}

#[test]
fn suspect_worker_gets_no_cache_credit() {
    let w = W::new("a").dev(6).suspect();
    let t = terms(&RouterConfig::default(), req10(), &w);
    assert_eq!(t.overlap, Overlap::default());
    assert_eq!(t.adjusted_prefill, 10.0);
    // And the decision reports the zero overlap it used.
    let ws = vec![W::new("s").dev(9).suspect(), W::new("b").dev(3)];
    let d = Case::new().decide(&ws).unwrap();
    assert_eq!(d.decode_worker, 1);
    let only = vec![W::new("s").dev(9).suspect()];
    assert_eq!(
        Case::new().decide(&only).unwrap().overlap,
        Overlap::default()
    );
}

#[test]
fn stage_configs_shape_the_terms() {
    let cfg = RouterConfig::default();
    let w = W::new("a").dev(4).unique(2.0).total(6.0).queued(128.0);
    let p = terms(&cfg.prefill_stage(), req10(), &w);
    assert_eq!((p.adjusted_prefill, p.decode_blocks), (7.0, 0.0));
    let d = terms(&cfg.decode_stage(), req10(), &w);
    assert_eq!(d.prefill_blocks, 10.0); // in-flight prompt tokens not counted
    assert_eq!(d.adjusted_prefill, 10.0); // no cache credit
    assert_eq!(d.decode_blocks, 16.0); // no reuse: blocks_total + prompt blocks
}
