//! The routing pipeline of the service, spread over cores:
//! prepare (hash) → claim the id on this core and scatter positions to shards (each
//! other core also checks it does not know the id) → gather per-shard matches → merge
//! → decide (pure `select::decide`) → commit the request's load on this core, its
//! *home*. Lifecycle calls run where they arrive when the request lives there (a
//! frontend sends them on the connection that routed it), else at whichever other
//! core holds it. A request id lives on at most one core: a core claims it before
//! asking the others, so of two cores routing one id at once neither can miss the
//! other's claim.
//!
//! With `index_layout = "replicated"` every core's shard is the whole index: the
//! positions all stay local, and the id is checked in the service-wide register
//! (`claims`) instead of by asking the other cores, so a route touches no other core
//! before it commits (the commit still tells every core its active blocks). The
//! proxy's own ids (`ids::PROXY_ID_PREFIX`: unique by construction, refused from the
//! route APIs) skip even the register.
//!
//! The steps are the engine's (`engine::Engine::route`), so the in-process engine and
//! the service give the same decisions for the same state.

use crate::config::Mode;
use crate::config::PrefillLoadModel;
use crate::engine::plan;
use crate::engine::{EngineError, Prepared, RouteDecision, RouteRequest};
use crate::index::{merge, MergeResult, ShardAnswer};
use crate::registry::Registry;
use crate::select::{
    decide_view, Decision, Fleet, Hits, Loads, RequestShape, RouteError, RrState, Scratch,
    ViewInput,
};
use crate::service::runtime::core::Core;
use crate::service::runtime::msg::{LifeOp, LifeOutcome, Msg, Reply, Retained};
use crate::types::{Role, WorkerSlot};
use std::cell::RefCell;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

pub use crate::service::routing::errors::ApiError;

/// One core's decision inputs: the [`Fleet`] of a registry snapshot and its [`Loads`],
/// kept current from the load board's change marks, plus reusable buffers.
struct CoreView {
    /// Holding the snapshot keeps its address from being reused, so pointer equality
    /// with the current snapshot is sound.
    reg: Arc<Registry>,
    fleet: Fleet,
    loads: Loads,
    hits: Hits,
    scratch: Scratch,
    changed: Vec<WorkerSlot>,
    /// Workers whose prefill load decays with time (`predicted` load model).
    decaying: Vec<WorkerSlot>,
}

thread_local! {
    static VIEW: RefCell<Option<CoreView>> = const { RefCell::new(None) };
    /// The (position, hash) list of a route's local query, reused.
    static ITEMS: std::cell::Cell<Vec<(u32, u64)>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Brings this core's view up to date with registry snapshot `reg` at `now_us`:
/// rebuilt when the snapshot changed, else only the workers the board reports changed
/// (and, under `predicted`, those whose prefill load decays) re-read. Liveness and
/// suspicion are re-read for every worker (heartbeats change them without a board
/// publication).
fn refresh(core: &Core, reg: &Arc<Registry>, v: &mut Option<CoreView>, now_us: u64) {
    let sh = &core.shared;
    let model = sh.settings.router.prefill_load_model;
    let v = match v {
        Some(v) if Arc::ptr_eq(&v.reg, reg) => {
            sh.board.take_changed(core.id, &mut v.changed);
            if model == PrefillLoadModel::Predicted {
                v.changed.append(&mut v.decaying);
            }
            v
        }
        _ => {
            let fleet = Fleet::with_slots(reg.iter().map(|e| (e.slot, &e.spec)));
            let loads = Loads::new(&fleet);
            let mut changed = Vec::new();
            sh.board.take_changed(core.id, &mut changed);
            changed.clear();
            changed.extend(reg.iter().map(|e| e.slot));
            v.insert(CoreView {
                reg: reg.clone(),
                fleet,
                loads,
                hits: Hits::default(),
                scratch: Scratch::default(),
                changed,
                decaying: Vec::new(),
            })
        }
    };
    v.changed.sort_unstable();
    v.changed.dedup();
    for &w in &v.changed {
        let p = sh.board.read(w);
        // Replicated: this core's copy is current for its own decisions (`catch_up`);
        // the board's is core 0's, which may not have woken for the latest updates.
        let unique = if sh.replicated {
            core.unique_blocks(w)
        } else {
            p.blocks_unique
        };
        v.loads
            .set_load(w, &p.agg.load(model, now_us), unique as f64);
        if model == PrefillLoadModel::Predicted && p.agg.oldest_prefill.is_some() {
            v.decaying.push(w);
        }
    }
    v.changed.clear();
    let now_ms = now_us / 1000;
    for e in reg.iter() {
        v.loads.set_live(e.slot, sh.is_live(e.slot, now_ms));
        let suspect = sh
            .cells(e.slot)
            .is_some_and(|c| c.suspect.load(Ordering::Relaxed));
        v.loads.set_suspect(e.slot, suspect);
    }
}

/// From shutdown on, routing and lifecycle calls are refused (`overloaded`: retry, the
/// restarted router will know the request), so the shutdown snapshot holds exactly the
/// requests that were answered.
fn refuse_when_stopping(core: &Core) -> Result<(), ApiError> {
    if core.shared.stopping.load(Ordering::Acquire) {
        return Err(ApiError::Overloaded("shutting down; retry".into()));
    }
    Ok(())
}

/// Tells the other cores that a route from this core will query their shards soon
/// (the caller is about to tokenize a prompt), so their doorbells ring now, while the
/// prompt is tokenized, and they stay awake for the query (`answer_spin`) instead of
/// paying a wake-up when it comes. A hint only: a full inbox drops it, and a query
/// that never comes ends the other core's spin at `answer_spin_us`.
pub fn announce(core: &Core) {
    let sh = &core.shared;
    // Replicated: a proxied route asks no other core.
    if sh.cores < 2 || sh.settings.answer_spin_us == 0 || sh.replicated {
        return;
    }
    for c in (0..sh.cores).filter(|&c| c != core.id) {
        let _ = sh.try_send(c, Msg::Expect);
    }
}

/// Routes one request from the binary API or HTTP. Ids in the proxy's reserved space
/// (`ids::PROXY_ID_PREFIX`) are refused: only the proxy makes them.
pub async fn route(core: &Core, req: &RouteRequest) -> Result<RouteDecision, ApiError> {
    if crate::ids::is_proxy_id(&req.request_id) {
        return Err(EngineError::BadRequest(format!(
            "request_id must not start with {:?} (reserved for the proxy's own ids)",
            crate::ids::PROXY_ID_PREFIX
        ))
        .into());
    }
    route_any(core, req).await
}

/// Routes one request the proxy made (its id is in the reserved space).
pub async fn route_proxied(core: &Core, req: &RouteRequest) -> Result<RouteDecision, ApiError> {
    debug_assert!(crate::ids::is_proxy_id(&req.request_id));
    route_any(core, req).await
}

async fn route_any(core: &Core, req: &RouteRequest) -> Result<RouteDecision, ApiError> {
    let started = Instant::now();
    // The decision's own CPU time, on a sample of decisions (`cpu_clock::sampled`).
    let cpu = crate::service::runtime::cpu_clock::sampled();
    let sh = &core.shared;
    refuse_when_stopping(core)?;
    let prepared = req
        .prepare_with(
            sh.settings.router.block_size,
            sh.settings.router.lookahead_tokens,
            sh.settings.limits.max_hashes_per_request,
        )
        .map_err(EngineError::from)?;
    if core.load_count() >= sh.settings.limits.max_active_requests {
        sh.metrics.route("kv", "overloaded");
        sh.status
            .counters
            .on_route(false, started.elapsed().as_nanos() as u64);
        return Err(ApiError::Overloaded("too many active requests".into()));
    }
    let mode = req.mode.unwrap_or(sh.settings.router.mode);
    let mut waited = cpu.map(|_| std::time::Duration::ZERO);
    let job = Retained {
        prepared,
        mode,
        expected_output_tokens: req.expected_output_tokens,
    };
    let out = route_prepared(core, &req.request_id, job, req.explain, false, &mut waited).await;
    if let (Some(cpu), Some(waited)) = (cpu, waited) {
        let own = crate::service::runtime::cpu_clock::now().saturating_sub(cpu + waited);
        sh.metrics.decision_cpu.observe(own.as_secs_f64());
    }
    let outcome = match &out {
        Ok(d) if d.fallback != "none" => "fallback",
        Ok(_) => "ok",
        Err(ApiError::Engine(EngineError::Route(RouteError::AllBusy { .. }))) => "busy",
        Err(_) => "error",
    };
    sh.metrics.route(mode.name(), outcome);
    let elapsed = started.elapsed();
    sh.metrics.decision_latency.observe(elapsed.as_secs_f64());
    sh.status
        .counters
        .on_route(out.is_ok(), elapsed.as_nanos() as u64);
    out
}

/// Routes a prepared request (`job`: what a disaggregated request also keeps for a
/// re-route). `waited`, when the caller measures the decision's CPU time, gains the
/// thread CPU time that passed while the route waited for other cores (other tasks of
/// this core ran meanwhile), so the caller can tell the decision's own.
async fn route_prepared(
    core: &Core,
    id: &str,
    job: Retained,
    explain: bool,
    prefill_failed: bool,
    waited: &mut Option<std::time::Duration>,
) -> Result<RouteDecision, ApiError> {
    let Retained {
        mut prepared,
        mode,
        expected_output_tokens: osl,
    } = job;
    let sh = &core.shared;
    let n = prepared.hashes.len();
    // This core becomes the request's home: claim the id here before asking the other
    // cores whether they know it, so two cores routing one id concurrently cannot both
    // succeed (each sees the other's claim; both refuse).
    if !core.claim(id) {
        return Err(EngineError::Duplicate(id.to_string()).into());
    }
    // Sharded, every other core is asked (its shard's positions and the duplicate
    // check); replicated, none: `claim` checked the id in the service-wide register.
    let ask_others = sh.cores > 1 && !sh.replicated;
    // Until the answers are in, this core's run loop stays awake for them
    // (`answer_spin_us`): parking now would add its own wake-up to the round trip.
    let awaiting = ask_others.then(crate::service::runtime::answer_spin::awaiting);
    let mut qids = Vec::new();
    let mut local_items = ITEMS.take();
    local_items.clear();
    if ask_others {
        let mut items: Vec<Vec<(u32, u64)>> = vec![Vec::new(); sh.cores];
        for (i, &h) in prepared.hashes.iter().enumerate() {
            items[sh.shard_of(h)].push((i as u32, h));
        }
        for (s, it) in items.into_iter().enumerate() {
            if s == core.id {
                local_items = it;
                continue;
            }
            let qid = core.new_wait();
            core.send(
                s,
                Msg::Query {
                    from: core.id,
                    qid,
                    items: it,
                    check_id: Some(id.to_string()),
                },
            )
            .await;
            qids.push(qid);
        }
    } else {
        // Replicated or one core: every position is in this core's copy, listed in
        // a buffer the core keeps (a long prompt's list is 16 bytes per block).
        local_items.extend(
            prepared
                .hashes
                .iter()
                .enumerate()
                .map(|(i, &h)| (i as u32, h)),
        );
    }
    core.catch_up();
    let local = core.local_query(&local_items, None);
    ITEMS.set(local_items);
    let (mut reuse, mut spec_matches) = (local.reuse, local.spec);
    let mut free = true;
    // Gather.
    let mut answers: Vec<ShardAnswer> = Vec::with_capacity(qids.len() + 1);
    answers.push(local.answer);
    let asked = !qids.is_empty();
    let gather_from = waited
        .filter(|_| asked)
        .map(|_| crate::service::runtime::cpu_clock::now());
    for qid in qids {
        if let Reply::Answer(a) = core.wait(qid).await {
            // Replicated: the other cores answered the duplicate check only.
            if !sh.replicated {
                answers.push(a.answer);
            }
            reuse.extend(a.reuse);
            spec_matches.extend(a.spec);
            free &= a.id_free.unwrap_or(true);
        }
    }
    drop(awaiting);
    // Other tasks of this core ran while the answers were awaited: not this route's.
    if let (Some(w), Some(from)) = (waited.as_mut(), gather_from) {
        *w += crate::service::runtime::cpu_clock::now().saturating_sub(from);
    }
    if !free {
        core.release(id);
        return Err(EngineError::Duplicate(id.to_string()).into());
    }
    // Merge + decide.
    let reg = sh.registry.load();
    let mut merged = MergeResult::default();
    merge(
        n,
        &answers,
        |s: WorkerSlot| reg.get(s).is_some_and(|e| e.spec.role == Role::Shared),
        &mut merged,
    );
    let mut spec = Vec::new();
    crate::index::speculate(&merged, &mut spec_matches, &mut spec);
    let cfg = &sh.settings.router;
    let now_us = sh.now_us();
    // The status page's recent decisions carry explain records: a sampled decision
    // computes one even when the client did not ask (at most a few per second).
    let sampled = sh.status.counters.sample(explain, now_us);
    // One round-robin cursor for the whole service (a per-core cursor would cycle
    // each core's share of the requests separately).
    let mut rr = RrState {
        counter: if mode == Mode::RoundRobin {
            sh.rr.fetch_add(1, Ordering::Relaxed)
        } else {
            0
        },
        // The `balance_slack` turn among tied workers, service-wide like the cursor.
        ties: if cfg.balance_slack > 0.0 && mode != Mode::RoundRobin {
            sh.rr.fetch_add(1, Ordering::Relaxed)
        } else {
            0
        },
    };
    let decided: Result<Decision, RouteError> = VIEW.with(|c| {
        let mut c = c.borrow_mut();
        refresh(core, &reg, &mut c, now_us);
        let Some(v) = c.as_mut() else {
            return Err(RouteError::NoWorkers {
                model: prepared.filters.model.clone(),
            });
        };
        plan::write_hits(&mut v.hits, &v.fleet, &merged, reuse.iter().copied());
        plan::write_speculative(&mut v.hits, &v.fleet, &spec);
        // The service-wide prefix affinity (turns of a conversation may arrive on
        // different cores; slots are stable across registry changes).
        v.hits
            .set_affinity(&v.fleet, sh.affinity.lookup(&prepared.hashes));
        // A session's next turn: back to its last worker, under the same slack.
        let session = prepared.session.filter(|_| sh.sessions.enabled());
        v.hits.set_session(
            &v.fleet,
            session.and_then(|s| sh.sessions.lookup(s, now_us / 1000)),
        );
        let input = ViewInput {
            cfg,
            mode,
            req: RequestShape {
                input_tokens: prepared.input_tokens,
                prompt_blocks: prepared.prompt_blocks,
            },
            filters: &prepared.filters,
            fleet: &v.fleet,
            loads: &v.loads,
            hits: &v.hits,
            prefill_failed,
            explain: explain || sampled,
        };
        let d = decide_view(
            &input,
            &mut core.st.borrow_mut().rng,
            &mut rr,
            &mut v.scratch,
        )?;
        sh.affinity
            .note_decision(&prepared.hashes, prepared.filters.pin.is_some(), &d);
        if let Some(s) = session {
            sh.sessions.note(s, d.decode_worker, now_us / 1000);
        }
        Ok(d)
    });
    let d = match decided {
        Ok(d) => d,
        Err(e) => {
            core.release(id);
            return Err(EngineError::Route(e).into());
        }
    };
    let mut out = plan::to_output(&reg, id, &d, explain || sampled, &spec);
    let (sw, from) = plan::speculative_target(&d, &merged);
    // Always sent (`from` may be past the end: nothing pending): an approximate
    // worker's model touches the whole prompt on every shard.
    let spec_add = Some(crate::service::runtime::msg::SpecAdd {
        slot: sw,
        from: from.min(n) as u32,
        now_us,
    });
    sh.metrics.request_blocks.inc_by(n as u64);
    sh.metrics.overlap_blocks.inc_by(d.overlap.own() as u64);
    let credited = plan::speculative_of(&spec, sw);
    if credited > 0 {
        if approximate(sh, sw) {
            sh.metrics
                .approximate_credited_blocks
                .inc_by(credited as u64);
        } else {
            sh.metrics.speculative_blocks.inc_by(credited as u64);
        }
    }
    record_for_status(core, &d, &mut out, &prepared, mode, sampled, explain);
    let retained = d.prefill_worker.is_some().then(|| Retained {
        prepared: prepared.clone(),
        mode,
        expected_output_tokens: osl,
    });
    let hashes = std::mem::take(&mut prepared.hashes);
    let req = plan::new_request(id, &d, &prepared, hashes, cfg.block_size, osl, now_us);
    core.commit_here(req, retained, spec_add);
    Ok(out)
}

/// Whether worker `slot`'s cache is modelled (approximate mode).
fn approximate(sh: &crate::service::runtime::shared::Shared, slot: WorkerSlot) -> bool {
    sh.cells(slot)
        .is_some_and(|c| c.approximate.load(Ordering::Relaxed))
}

/// Counts decision `d` for the status page (routes per worker; prompt and cached
/// blocks on the worker that prefills) and, if `sampled`, records it with its explain
/// record, leaving `out.candidates` only if the client asked for them (`explain`).
fn record_for_status(
    core: &Core,
    d: &Decision,
    out: &mut RouteDecision,
    prepared: &Prepared,
    mode: Mode,
    sampled: bool,
    explain: bool,
) {
    use crate::status::model::{keep_candidates, DecisionRecord, MAX_CANDIDATES};
    let c = &core.shared.status.counters;
    c.routed(d.decode_worker);
    let prefill = d.prefill_worker.filter(|&p| p != d.decode_worker);
    if let Some(p) = prefill {
        c.routed(p);
    }
    let now_ms = core.shared.now_ms();
    let workers = [(d.decode_worker, &out.decode_worker)]
        .into_iter()
        .chain(prefill.zip(out.prefill_worker.as_ref()));
    // Approximate workers send no events by design: nothing to warn about.
    for (slot, id) in workers.filter(|(s, _)| !approximate(&core.shared, *s)) {
        if let Some(warn) = c.routed_silent(slot, now_ms) {
            let label = crate::service::metrics::WorkerLabel { worker: id.clone() };
            core.shared
                .metrics
                .routed_without_events
                .get_or_create(&label)
                .inc();
            if warn {
                // A worker that never sent one is told apart from one that went quiet:
                // the first is often just new (its first blocks are still on the way).
                let when = match c.last_event_ms(slot) {
                    None => "since it registered".to_string(),
                    Some(_) => format!(
                        "in the last {} s",
                        crate::status::model::SILENT_AFTER_MS / 1000
                    ),
                };
                eprintln!(
                    "kvroute: warning: worker {id:?} is being routed to but sent no KV cache event {when}: its decisions are load-only (check its event connection or engine)"
                );
            }
        }
    }
    c.prefilled(
        d.prefill_worker.unwrap_or(d.decode_worker),
        prepared.hashes.len() as u64,
        d.overlap.own() as u64,
    );
    if !sampled {
        return;
    }
    let all = out.candidates.take().unwrap_or_default();
    let mut decision = out.clone();
    if explain {
        out.candidates = Some(all.clone());
    }
    let mut chosen = vec![decision.decode_worker.as_str()];
    chosen.extend(decision.prefill_worker.as_deref());
    let total = all.len();
    let kept = keep_candidates(all, &chosen, MAX_CANDIDATES);
    decision.candidates = Some(kept);
    c.record(DecisionRecord {
        seq: 0,
        t_ms: core.shared.now_ms(),
        mode: mode.name(),
        prompt_blocks: prepared.prompt_blocks,
        input_tokens: prepared.input_tokens,
        candidates_total: total,
        decision,
    });
}

/// A lifecycle call. `PrefillFailed` answers with the decode-only decision.
pub async fn lifecycle(
    core: &Core,
    op: LifeOp,
    id: &str,
) -> Result<Option<RouteDecision>, ApiError> {
    crate::engine::request::check_request_id(id).map_err(EngineError::from)?;
    refuse_when_stopping(core)?;
    // Most calls arrive on the connection (so the core) that routed the request; the
    // others ask the other cores, of which at most one knows the id.
    let local = core.lifecycle_local(op, id);
    core.after_local();
    let result = match local {
        Err(EngineError::UnknownRequest(_)) if core.shared.cores > 1 => {
            lifecycle_elsewhere(core, op, id).await
        }
        r => r,
    };
    if result.is_ok() {
        crate::service::runtime::cluster_hooks::publish_life(&core.shared, op, id);
    }
    match result? {
        LifeOutcome::Done => Ok(None),
        LifeOutcome::Reroute(r) => {
            let mode = r.mode;
            let d = route_prepared(core, id, *r, false, true, &mut None).await?;
            core.shared.metrics.route(mode.name(), "fallback");
            Ok(Some(d))
        }
    }
}

/// Runs a lifecycle call at whichever other core holds the request.
async fn lifecycle_elsewhere(
    core: &Core,
    op: LifeOp,
    id: &str,
) -> Result<LifeOutcome, EngineError> {
    // Replicated: the register names the one core that can hold a client's id.
    let only = match &core.shared.claims {
        Some(c) if !crate::ids::is_proxy_id(id) => match c.owner(id) {
            Some(o) if o != core.id => Some(o),
            _ => return Err(EngineError::UnknownRequest(id.to_string())),
        },
        _ => None,
    };
    let mut qids = Vec::with_capacity(core.shared.cores - 1);
    let _awaiting = crate::service::runtime::answer_spin::awaiting();
    let others = (0..core.shared.cores).filter(|&c| c != core.id);
    for to in others.filter(|&c| only.is_none_or(|o| o == c)) {
        let qid = core.new_wait();
        core.send(
            to,
            Msg::Lifecycle {
                from: core.id,
                qid,
                op,
                id: id.to_string(),
            },
        )
        .await;
        qids.push(qid);
    }
    let mut result = Err(EngineError::UnknownRequest(id.to_string()));
    for qid in qids {
        match core.wait(qid).await {
            Reply::Lifecycle(Err(EngineError::UnknownRequest(_))) => {}
            Reply::Lifecycle(r) => result = r,
            Reply::Answer(_) | Reply::Applied => {
                result = Err(EngineError::BadRequest("internal: mismatched reply".into()))
            }
        }
    }
    result
}
