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
        vec![(8.0, 20.0, 28.0), (5.0, 15.0, 20.0), (2.0, 19.0, 21.0)]
    );
    for w in &ws {
        assert_eq!(terms(&cfg, req10(), w).prefill_blocks, 10.0);
    }
}

#[test]
fn cached_prefix_is_credited_once_not_twice() {
    // A worker holding 6 of the 10 blocks on device, nothing active: the prefill term
    // credits the 6 blocks; the decode term still counts all 10 (the request pins
    // them). Blocks of an *active* request are not counted twice.
    let w = W::new("a").dev(6);
    let t = terms(&RouterConfig::default(), req10(), &w);
    assert_eq!(
        (t.adjusted_prefill, t.decode_blocks, t.cost),
        (4.0, 10.0, 14.0)
    );
    let w = W::new("a").dev(6).unique(6.0).reuse(6);
    let t = terms(&RouterConfig::default(), req10(), &w);
    assert_eq!(
        (t.adjusted_prefill, t.decode_blocks, t.cost),
        (4.0, 10.0, 14.0)
    );
}

#[test]
fn knob_assume_device_reuse_keeps_the_earlier_form() {
    let cfg = RouterConfig {
        assume_device_reuse: true,
        ..Default::default()
    };
    let w = W::new("a").dev(6);
    let t = terms(&cfg, req10(), &w);
    assert_eq!(
        (t.adjusted_prefill, t.decode_blocks, t.cost),
        (4.0, 4.0, 8.0)
    );
    let got: Vec<f64> = worked_example_device_reuse()
        .iter()
        .map(|w| terms(&cfg, req10(), w).cost)
        .collect();
    assert_eq!(got, vec![18.0, 10.0, 11.0]);
    let d = Case::new()
        .cfg(|c| c.assume_device_reuse = true)
        .decide(&worked_example_device_reuse())
        .unwrap();
    assert_eq!((d.decode_worker, d.cost), (1, 10.0));
    // Without assume_kv_reuse the knob changes nothing.
    let off = RouterConfig {
        assume_kv_reuse: false,
        ..cfg
    };
    assert_eq!(
        terms(&off, req10(), &W::new("a").dev(6)).decode_blocks,
        10.0
    );
}

#[test]
fn cost_weighs_by_device_throughput() {
    let cfg = RouterConfig::default();
    // A CPU worker: the same work costs cuda_to_cpu_ratio (8) times more.
    let gpu = terms(&cfg, req10(), &W::new("g").unique(4.0));
    let cpu = terms(&cfg, req10(), &W::new("c").cpu().unique(4.0));
    assert_eq!(gpu.cost, 24.0);
    assert_eq!(cpu.cost, 8.0 * 24.0);
    assert_eq!(cpu.decode_blocks, gpu.decode_blocks, "terms stay in blocks");
    let ratio = RouterConfig {
        cuda_to_cpu_ratio: 2.0,
        ..cfg.clone()
    };
    assert_eq!(terms(&ratio, req10(), &W::new("c").cpu()).cost, 40.0);
    // A declared throughput wins over the device class.
    let mut w = W::new("half").cpu();
    w.spec.throughput_weight = Some(0.5);
    assert_eq!(terms(&cfg, req10(), &w).cost, 40.0);
    let mut w = W::new("fast");
    w.spec.throughput_weight = Some(2.0);
    assert_eq!(terms(&cfg, req10(), &w).cost, 10.0);
    // Off: blocks only, as before.
    let off = RouterConfig {
        weigh_by_throughput: false,
        ..cfg
    };
    assert_eq!(terms(&off, req10(), &W::new("c").cpu()).cost, 20.0);
}

#[test]
fn kv_prefers_a_busier_gpu_over_an_idle_cpu_worker_until_8x() {
    // GPU with 100 active blocks: 10 + 110 = 120; idle CPU: 8 * 20 = 160 → GPU.
    let ws = vec![W::new("g").unique(100.0), W::new("c").cpu()];
    let d = Case::new().explain().decide(&ws).unwrap();
    assert_eq!(d.decode_worker, 0);
    let costs: Vec<f64> = d.candidates.iter().map(|e| e.cost).collect();
    assert_eq!(costs, vec![120.0, 160.0]);
    // GPU with 200 active blocks: 220 > 160 → CPU.
    let ws = vec![W::new("g").unique(200.0), W::new("c").cpu()];
    assert_eq!(Case::new().decide(&ws).unwrap().decode_worker, 1);
    // Without the weighing the idle CPU worker wins at once.
    let ws = vec![W::new("g").unique(100.0), W::new("c").cpu()];
    let d = Case::new()
        .cfg(|c| c.weigh_by_throughput = false)
        .decide(&ws)
        .unwrap();
    assert_eq!(d.decode_worker, 1);
}

#[test]
fn worked_example_chooses_w2() {
    let d = Case::new().explain().decide(&worked_example()).unwrap();
    assert_eq!(d.decode_worker, 1);
    assert_eq!(d.cost, 20.0);
    assert_eq!(d.overlap.device, 5);
    assert_eq!(d.fallback, Fallback::None);
    assert_eq!(d.prefill_worker, None);
    let costs: Vec<f64> = d.candidates.iter().map(|e| e.cost).collect();
    assert_eq!(costs, vec![28.0, 20.0, 21.0]);
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
    // cached: 2 + (8 + 10) = 20 < light 10 + 10 + 1; with credit 0: 10 + 18 = 28 > 21.
    let ws = vec![
        W::new("cached").dev(8).unique(8.0),
        W::new("light").unique(1.0),
    ];
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
    // Decode blocks only: active 4 plus the 10 blocks the request pins.
    assert_eq!(t.cost, 14.0);
}

#[test]
fn knob_prefill_load_scale() {
    let w = W::new("a").dev(2).unique(3.0);
    let cfg = RouterConfig {
        prefill_load_scale: 2.0,
        ..Default::default()
    };
    // 2 * 8 + (3 + 10): cached blocks the request pins are decode load.
    assert_eq!(terms(&cfg, req10(), &w).cost, 29.0);
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
