//! `GET /metrics`: the Prometheus text, with the scrape-time gauges (per-worker load,
//! cached blocks, liveness, hit rate as routed) filled in from the lock-free load board
//! and the status counters at the moment of the scrape. Reads only; costs nothing on
//! the hot path.

use crate::service::metrics;
use crate::service::runtime::core::Core;

/// `/metrics` text, with scrape-time gauges filled from the board.
pub fn scrape(core: &Core) -> String {
    let sh = &core.shared;
    sh.metrics.render(|m| {
        let reg = sh.registry.load();
        let cfg = &sh.settings.router;
        let now = sh.now_us();
        let (mut blocks, mut active) = (0u64, 0u64);
        let (mut prompt, mut cached) = (0u64, 0u64);
        m.worker_active_requests.clear();
        m.worker_prefill_tokens.clear();
        m.worker_decode_blocks.clear();
        m.worker_cached_blocks.clear();
        m.worker_live.clear();
        m.worker_routed_prompt_blocks.clear();
        m.worker_routed_cached_blocks.clear();
        m.worker_hit_rate.clear();
        m.worker_approximate.clear();
        m.worker_approximate_blocks.clear();
        for e in reg.iter() {
            let p = sh.board.read(e.slot);
            let load = p.agg.load(cfg.prefill_load_model, now);
            let l = metrics::WorkerLabel {
                worker: e.spec.id.clone(),
            };
            blocks += p.cached_blocks;
            active += load.active_requests as u64;
            m.worker_active_requests
                .get_or_create(&l)
                .set(load.active_requests as i64);
            m.worker_prefill_tokens
                .get_or_create(&l)
                .set(load.prefill_tokens as i64);
            let decode = if cfg.assume_kv_reuse {
                p.blocks_unique as f64
            } else {
                load.blocks_total
            };
            m.worker_decode_blocks.get_or_create(&l).set(decode as i64);
            m.worker_cached_blocks
                .get_or_create(&l)
                .set(p.cached_blocks as i64);
            m.worker_live
                .get_or_create(&l)
                .set(sh.is_live(e.slot, now / 1000) as i64);
            let approx = sh
                .cells(e.slot)
                .is_some_and(|c| c.approximate.load(std::sync::atomic::Ordering::Relaxed));
            m.worker_approximate.get_or_create(&l).set(approx as i64);
            if approx {
                // An approximate worker's entries in the index budget are its model's.
                let n = sh.budget_of(0).held(e.slot);
                m.worker_approximate_blocks
                    .get_or_create(&l)
                    .set(i64::try_from(n).unwrap_or(i64::MAX));
            }
            let routed = sh.status.counters.slot_count(e.slot, 0);
            prompt += routed.prompt_blocks;
            cached += routed.cached_blocks;
            m.worker_routed_prompt_blocks
                .get_or_create(&l)
                .set(routed.prompt_blocks as i64);
            m.worker_routed_cached_blocks
                .get_or_create(&l)
                .set(routed.cached_blocks as i64);
            m.worker_hit_rate
                .get_or_create(&l)
                .set(ratio(routed.cached_blocks, routed.prompt_blocks));
        }
        m.routed_prompt_blocks.set(prompt as i64);
        m.routed_cached_blocks.set(cached as i64);
        m.hit_rate.set(ratio(cached, prompt));
        m.index_blocks.set(blocks as i64);
        m.index_budget_used.set(sh.budget_of(0).total() as i64);
        m.active_requests.set(active as i64);
        m.workers.set(reg.len() as i64);
        if let Some(t) = sh.tokenizers.get() {
            let n = i64::try_from(t.lean_mismatches()).unwrap_or(i64::MAX);
            m.tokenize_lean_mismatches.set(n);
        }
    })
}

/// `num / den`, 0 when nothing was routed.
fn ratio(num: u64, den: u64) -> f64 {
    if den == 0 {
        0.0
    } else {
        num as f64 / den as f64
    }
}
