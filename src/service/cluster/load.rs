//! Shared active load between replicas, the receiving side (`--cluster`): the routes
//! and lifecycle calls this replica answers go out through `runtime::cluster_link`
//! (`publish_route`, `publish_life`); a peer's arrive through [`apply_load`] as [`ReplicaOp`] messages to the cores, which
//! admit a routed request like a restored one and run lifecycle calls wherever the
//! record lives; a peer's route also enters this replica's prefix affinity
//! (`select::affinity`) unless the peer's caller pinned its worker. [`load_sync`]
//! takes the peers' in-flight requests over at start.
//! The wire format is `cluster::load`; the NATS side is `cluster::peers`.

use crate::service::routing::control;
use crate::service::runtime::msg::Msg;
use crate::service::runtime::shared::Shared;
use crate::types::WorkerSlot;

pub use crate::service::runtime::msg::ReplicaOp;

/// A peer's load change as a core message (`None`: a worker unknown here).
fn to_replica(sh: &Shared, op: crate::cluster::load::LoadOp) -> Option<(ReplicaOp, Option<usize>)> {
    use crate::cluster::load::LoadOp;
    use crate::service::runtime::msg::LifeOp as L;
    Some(match op {
        LoadOp::Route(r) => {
            crate::ids::check("request id", &r.id).ok()?;
            let reg = sh.registry.load();
            let owner = sh.owner_of(&r.id);
            let c = r.map_workers(|w| reg.slot(w))?;
            // The peer's decision teaches this replica's prefix affinity too, so the
            // next turn of a conversation follows it whichever replica it reaches;
            // a pinned one teaches nothing, as on the peer (`note_decision`).
            sh.affinity
                .note_route(&c.hashes, c.pinned, c.decode_worker, c.prefill_worker);
            (ReplicaOp::Route(c), Some(owner))
        }
        LoadOp::FirstToken { id } => (ReplicaOp::Life(L::FirstToken, id), None),
        LoadOp::Progress { id, output_tokens } => {
            (ReplicaOp::Life(L::Progress(output_tokens), id), None)
        }
        LoadOp::Finish { id } => (ReplicaOp::Life(L::Finish, id), None),
        LoadOp::PrefillFailed { id } => (ReplicaOp::Life(L::PrefillFailed, id), None),
    })
}

pub(in crate::service) fn apply_load(sh: &Shared, ops: Vec<crate::cluster::load::LoadOp>) {
    for op in ops {
        let Some((rop, to)) = to_replica(sh, op) else {
            sh.cluster_metrics().load("unknown_worker", 1);
            continue;
        };
        let ok = match (rop, to) {
            (rop, Some(to)) => control::send_blocking(sh, to, Msg::Replica(Box::new(rop))),
            (ReplicaOp::Life(op, id), None) => (0..sh.cores).all(|to| {
                control::send_blocking(
                    sh,
                    to,
                    Msg::Replica(Box::new(ReplicaOp::Life(op, id.clone()))),
                )
            }),
            (ReplicaOp::Route(_) | ReplicaOp::Carry(_), None) => true,
        };
        if !ok {
            return;
        }
        sh.cluster_metrics().load("applied", 1);
    }
}

/// Every core's in-flight requests (from a plain thread; waits up to 10 s).
pub fn carry_all(sh: &Shared) -> Option<Vec<crate::load::CarriedRequest>> {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    for to in 0..sh.cores {
        let m = Msg::Replica(Box::new(ReplicaOp::Carry(tx.clone())));
        if !control::send_blocking(sh, to, m) {
            return None;
        }
    }
    drop(tx);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut all = Vec::new();
    let mut got = 0;
    while got < sh.cores && std::time::Instant::now() < deadline {
        match rx.try_recv() {
            Ok(v) => {
                all.extend(v);
                got += 1;
            }
            Err(tokio::sync::mpsc::error::TryRecvError::Empty) => {
                std::thread::sleep(std::time::Duration::from_millis(1))
            }
            Err(_) => return None,
        }
    }
    (got == sh.cores).then_some(all)
}

/// In-flight requests as load ops with worker ids (a load-sync answer).
pub fn carried_ops(
    sh: &Shared,
    all: Vec<crate::load::CarriedRequest>,
) -> Vec<crate::cluster::load::LoadOp> {
    let reg = sh.registry.load();
    let name = |&s: &WorkerSlot| reg.get(s).map(|e| e.spec.id.clone());
    all.into_iter()
        .filter_map(|c| c.map_workers(name).map(crate::cluster::load::LoadOp::Route))
        .collect()
}

/// Takes the peers' in-flight requests over: the ones missing here are admitted
/// (except this replica's own orphans, `Cluster::orphans`: the peers may answer
/// before they applied their finish), and the ones held here (restored from a
/// snapshot) that no peer holds any more ended while this replica was away, so they
/// are released.
pub(in crate::service) fn load_sync(sh: &Shared, ops: Vec<crate::cluster::load::LoadOp>) {
    use crate::cluster::load::LoadOp;
    let Some(mine) = carry_all(sh) else {
        return;
    };
    let theirs: std::collections::HashSet<String> = ops
        .iter()
        .filter_map(|o| match o {
            LoadOp::Route(r) => Some(r.id.clone()),
            _ => None,
        })
        .collect();
    let mine: std::collections::HashSet<String> = mine.into_iter().map(|c| c.id).collect();
    for id in mine.iter().filter(|id| !theirs.contains(*id)) {
        apply_load(sh, vec![LoadOp::Finish { id: id.clone() }]);
    }
    let orphan = |id: &str| sh.cluster.get().is_some_and(|c| c.orphans.contains(id));
    let missing: Vec<LoadOp> = ops
        .into_iter()
        .filter(|o| matches!(o, LoadOp::Route(r) if !mine.contains(&r.id) && !orphan(&r.id)))
        .collect();
    apply_load(sh, missing);
}
