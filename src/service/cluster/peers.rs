//! The NATS side of what replicas share besides the event log (thread
//! "kvroute-cluster", with `cluster::nats`): shared load on core NATS (batched
//! publisher, subscriber), the start's load sync (request and responder), and the ZMQ
//! engine leases in a KV bucket.
//!
//! Everything is sealed with the tier secret (`cluster::auth`): live load batches
//! with their subject and a per-origin sequence (a replayed batch is refused), a
//! load-sync request and its answers with the requester's inbox (so only a replica
//! can make peers dump their requests, and answers to one request never count for
//! another), a lease with its key (a lease held by a value that does not verify is
//! taken over).

use crate::cluster::auth::Kind;
use crate::cluster::load::{Batcher, LoadBatch, LoadOp, SeqGuard};
use crate::cluster::names::{worker_key, Names};
use crate::service::cluster::apply::Apply;
use crate::service::cluster::auth;
use crate::service::cluster::log;
use crate::service::cluster::nats::consume::learn_worker;
use crate::service::runtime::cluster_link::Cluster;
use crate::service::runtime::shared::Shared;
use async_nats::jetstream::{self, stream};
use bytes::Bytes;
use futures_lite::StreamExt;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc::Sender;

/// Batches this replica's load changes onto core NATS. While NATS is unreachable
/// they are dropped (counted): load is transient, and each request's own record stays
/// exact on the replica that holds it.
pub(in crate::service) async fn load_publisher(
    sh: &Shared,
    cl: &Cluster,
    client: &async_nats::Client,
    subject: &str,
    rx: crossbeam::channel::Receiver<LoadOp>,
) {
    let mut b = Batcher::default();
    // An op the pending batch does not take (a pinned route travels alone): it
    // starts the next batch.
    let mut held: Option<LoadOp> = None;
    let t0 = std::time::Instant::now();
    let m = sh.cluster_metrics();
    let mut seq = 0u64;
    loop {
        while b.len() < crate::cluster::load::MAX_OPS {
            let Some(op) = held.take().or_else(|| rx.try_recv().ok()) else {
                break;
            };
            if !b.takes(&op) {
                held = Some(op);
                break;
            }
            b.push(op, t0.elapsed().as_micros() as u64);
        }
        let now = t0.elapsed().as_micros() as u64;
        if b.due(now) || (!b.is_empty() && (held.is_some() || rx.is_empty())) {
            let ops = b.take();
            let n = ops.len() as u64;
            if client.connection_state() != async_nats::connection::State::Connected {
                m.load("dropped", n);
                continue;
            }
            seq += 1;
            let batch = LoadBatch {
                origin: cl.origin.clone(),
                seq,
                ops,
                more: false,
            };
            let sealed = cl
                .sealer
                .seal(Kind::Load, subject.as_bytes(), batch.encode());
            match client.publish(subject.to_string(), sealed.into()).await {
                Ok(()) => m.load("published", n),
                Err(_) => m.load("dropped", n),
            }
            continue;
        }
        if b.is_empty() {
            let _ = tokio::time::timeout(Duration::from_millis(100), cl.load_wake.notified()).await;
        } else {
            tokio::time::sleep(Duration::from_micros(crate::cluster::load::FLUSH_US)).await;
        }
    }
}

/// Asks the peers for their in-flight requests (a start's load sync): collects the
/// answers until every answering peer has sent its last part and no new peer spoke
/// for a moment (at most 10 s). Returns the ops and how many peers answered.
pub(in crate::service) async fn sync_request(
    sh: &Shared,
    cl: &Cluster,
    client: &async_nats::Client,
    subject: &str,
) -> (Vec<LoadOp>, usize) {
    let origin = cl.origin.as_str();
    let inbox = client.new_inbox();
    let Ok(mut sub) = client.subscribe(inbox.clone()).await else {
        return (Vec::new(), 0);
    };
    let request = cl.sealer.seal(
        Kind::SyncRequest,
        inbox.as_bytes(),
        origin.as_bytes().to_vec(),
    );
    if client
        .publish_with_reply(subject.to_string(), inbox.clone(), request.into())
        .await
        .is_err()
    {
        return (Vec::new(), 0);
    }
    let start = tokio::time::Instant::now();
    let hard = start + Duration::from_secs(10);
    let mut quiet = start + Duration::from_millis(1500);
    let mut open: HashMap<String, bool> = HashMap::new();
    let mut ops = Vec::new();
    loop {
        let until = if open.values().any(|more| *more) {
            hard
        } else {
            quiet.min(hard)
        };
        match tokio::time::timeout_at(until, sub.next()).await {
            Ok(Some(m)) => {
                let Some(p) = auth::open(sh, cl, Kind::SyncAnswer, inbox.as_bytes(), &m.payload)
                else {
                    continue;
                };
                let Ok(b) = LoadBatch::decode(p) else {
                    continue;
                };
                if b.origin == origin || !auth::origin_ok(sh, Kind::SyncAnswer, &b.origin) {
                    continue;
                }
                open.insert(b.origin, b.more);
                ops.extend(b.ops);
                quiet = tokio::time::Instant::now() + Duration::from_millis(300);
            }
            Ok(None) | Err(_) => break,
        }
    }
    (ops, open.len())
}

/// Answers peers' load-sync requests with this replica's in-flight requests, in
/// parts under the NATS payload limit.
pub(in crate::service) async fn sync_responder(
    sh: &Arc<Shared>,
    cl: &Cluster,
    client: &async_nats::Client,
    mut sub: async_nats::Subscriber,
) {
    while let Some(m) = sub.next().await {
        let Some(reply) = m.reply.clone() else {
            continue;
        };
        let Some(asker) = auth::open(sh, cl, Kind::SyncRequest, reply.as_bytes(), &m.payload)
        else {
            continue;
        };
        if asker == cl.origin.as_bytes() {
            continue;
        }
        let s = sh.clone();
        let ops = tokio::task::spawn_blocking(move || {
            crate::service::cluster::load::carry_all(&s)
                .map(|all| crate::service::cluster::load::carried_ops(&s, all))
        })
        .await
        .ok()
        .flatten();
        let Some(ops) = ops else { continue };
        let max = (client.server_info().max_payload / 2).clamp(1 << 12, 1 << 19);
        for part in crate::cluster::load::chunk(&cl.origin, ops, max) {
            let sealed = cl
                .sealer
                .seal(Kind::SyncAnswer, reply.as_bytes(), part.encode());
            let _ = client.publish(reply.clone(), sealed.into()).await;
        }
    }
}

/// Peers' load changes, in arrival order, to the apply thread: only sealed batches
/// of a replica incarnation, each at most once ([`SeqGuard`]). A route naming a
/// worker not known here yet (its registration still on the way through the KV
/// watch) is preceded by that registration, read from the bucket.
pub(in crate::service) async fn load_subscriber(
    sh: &Shared,
    cl: &Cluster,
    kv: &jetstream::kv::Store,
    mut sub: async_nats::Subscriber,
    apply: &Sender<Apply>,
) {
    let mut seqs = SeqGuard::new(4096);
    while let Some(msg) = sub.next().await {
        let Some(p) = auth::open(sh, cl, Kind::Load, msg.subject.as_bytes(), &msg.payload) else {
            continue;
        };
        let Ok(batch) = LoadBatch::decode(p) else {
            sh.cluster_metrics().load("undecodable", 1);
            continue;
        };
        if batch.origin == cl.origin || !auth::origin_ok(sh, Kind::Load, &batch.origin) {
            continue;
        }
        if !seqs.admit(&batch.origin, batch.seq) {
            auth::refuse(sh, "load", "stale", &batch.origin);
            continue;
        }
        let mut named: Vec<&str> = Vec::new();
        for op in &batch.ops {
            if let LoadOp::Route(r) = op {
                named.push(&r.decode_worker);
                named.extend(r.prefill_worker.as_deref());
            }
        }
        named.sort_unstable();
        named.dedup();
        for id in named {
            learn_worker(sh, cl, kv, id, apply).await;
        }
        if apply.send(Apply::Load(batch.ops)).await.is_err() {
            return;
        }
    }
}

/// How long an engine lease outlives its last refresh (the bucket's max age).
pub const LEASE_TTL: Duration = Duration::from_secs(6);
const LEASE_REFRESH: Duration = Duration::from_secs(2);

/// Holds or waits for the lease of every `[[engines]]` entry (key = the engine's
/// worker, in bucket `kvroute_NAME_leases` whose entries expire after
/// [`LEASE_TTL`]): a holder refreshes it (a revision-checked update, so a lease
/// taken over meanwhile is noticed), a standby tries to create it, which succeeds
/// only once the holder's entry expired (it died or lost NATS).
pub(in crate::service) async fn engine_leases(
    sh: &Shared,
    cl: &Cluster,
    client: &async_nats::Client,
    js: &jetstream::Context,
    names: &Names,
) {
    let engines: Vec<String> = sh
        .settings
        .engines
        .iter()
        .map(|e| e.worker_id.clone())
        .collect();
    if engines.is_empty() {
        return;
    }
    let bucket = format!(
        "{}_leases",
        names.workers_bucket.trim_end_matches("_workers")
    );
    let kv = loop {
        let made = js
            .get_or_create_stream(stream::Config {
                name: format!("KV_{bucket}"),
                subjects: vec![format!("$KV.{bucket}.>")],
                max_messages_per_subject: 1,
                max_age: LEASE_TTL,
                max_bytes: -1,
                storage: stream::StorageType::File,
                allow_rollup: true,
                deny_delete: true,
                allow_direct: true,
                num_replicas: 1,
                discard: stream::DiscardPolicy::New,
                ..Default::default()
            })
            .await;
        match made {
            Ok(_) => match js.get_key_value(&bucket).await {
                Ok(kv) => break kv,
                Err(e) => log(&format!("lease bucket: {e}; retrying")),
            },
            Err(e) => log(&format!("lease bucket: {e}; retrying")),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    let mut revs: Vec<Option<u64>> = vec![None; engines.len()];
    loop {
        for (i, w) in engines.iter().enumerate() {
            let key = worker_key(w);
            let me: Bytes = cl
                .sealer
                .seal(Kind::Lease, key.as_bytes(), cl.origin.clone().into_bytes())
                .into();
            // Refused (another writer got there first): a replica's lease stands, a
            // forged one is taken over at once.
            let r = match revs[i] {
                Some(rev) => kv.update(&key, me.clone(), rev).await.ok(),
                None => kv.create(&key, me.clone()).await.ok(),
            };
            let r = match r {
                Some(rev) => Some(rev),
                None => take_forged(sh, cl, &kv, &key, me).await,
            };
            // No answer from NATS decides nothing: while it is unreachable the holder
            // keeps ingesting locally (and buffering), a standby keeps waiting.
            if r.is_none() && client.connection_state() != async_nats::connection::State::Connected
            {
                continue;
            }
            let held = r.is_some();
            let was = cl.engine_leases[i].swap(held, Ordering::AcqRel);
            if held != was {
                log(&format!(
                    "engine {w:?}: {} its lease",
                    if held {
                        "this replica holds"
                    } else {
                        "this replica lost"
                    }
                ));
            }
            revs[i] = r;
        }
        let held = cl
            .engine_leases
            .iter()
            .filter(|f| f.load(Ordering::Acquire))
            .count();
        sh.cluster_metrics().engine_leases.set(held as i64);
        tokio::time::sleep(LEASE_REFRESH).await;
    }
}

/// A lease key that exists: if its value is not a sealed lease (a NATS client wrote
/// it, to keep every replica from ingesting the engine), it is refused, counted, and
/// taken over (a revision-checked update, so a replica's lease written meanwhile
/// wins); if it is this replica's own (a refresh whose answer was lost), it is kept.
/// `None` when another replica holds it, or on any NATS error.
async fn take_forged(
    sh: &Shared,
    cl: &Cluster,
    kv: &async_nats::jetstream::kv::Store,
    key: &str,
    me: Bytes,
) -> Option<u64> {
    let e = kv.entry(key).await.ok()??;
    if e.operation == async_nats::jetstream::kv::Operation::Put {
        match cl.sealer.open(Kind::Lease, key.as_bytes(), &e.value) {
            Ok(holder) => return (holder == cl.origin.as_bytes()).then_some(e.revision),
            Err(r) => auth::refuse(sh, "lease", r.label(), key),
        }
    } else {
        auth::refuse(sh, "lease", "missing_tag", key);
    }
    kv.update(key, me, e.revision).await.ok()
}
