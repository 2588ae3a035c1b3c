//! The receiving tasks of the cluster bridge: the event-stream consumer and the
//! registry (KV bucket) reader and watcher, all handing what they read to the apply
//! thread.
//!
//! Guarantees: records reach the apply thread in stream order, each sequence at most
//! once, from the sequence after the restored snapshot's (or the start); after any
//! error (NATS restart) the consumer is re-created from the next sequence. A record
//! of a worker this replica does not know yet is preceded by its KV registration
//! ([`learn_worker`], which the load subscriber uses too).
//! Nothing is applied unless its tag verifies (`service::cluster::auth`); an
//! undecodable, unsealed or foreign record is counted and skipped.

use crate::cluster::auth::Kind;
use crate::cluster::names::{worker_key, Names};
use crate::cluster::wire::EventRecord;
use crate::service::cluster::apply::Apply;
use crate::service::cluster::auth::{self as auth, registry_delete, registry_item};
use crate::service::cluster::log;
use crate::service::runtime::cluster_link::Cluster;
use crate::service::runtime::shared::Shared;
use async_nats::jetstream::{consumer, kv, stream};
use futures_lite::StreamExt;
use std::time::Duration;
use tokio::sync::mpsc::Sender;

/// Hands the apply thread worker `id`'s KV registration first when this replica does
/// not know it yet: a peer's record or load op may overtake the registry watch, and
/// would otherwise be dropped as naming an unknown worker.
pub(in crate::service::cluster) async fn learn_worker(
    sh: &Shared,
    cl: &Cluster,
    kv: &kv::Store,
    id: &str,
    apply: &Sender<Apply>,
) {
    if sh.registry.load().slot(id).is_some() {
        return;
    }
    let key = worker_key(id);
    if let Ok(Some(v)) = kv.get(&key).await {
        if let Some(item) = registry_item(sh, cl, &key, &v) {
            let _ = apply.send(item).await;
        }
    }
}

pub(super) async fn registry_sync(
    sh: &Shared,
    cl: &Cluster,
    kv: &kv::Store,
    apply: &Sender<Apply>,
) -> Result<(), String> {
    let mut keys = kv.keys().await.map_err(|e| e.to_string())?;
    let mut all = Vec::new();
    while let Some(k) = keys.next().await {
        all.push(k.map_err(|e| e.to_string())?);
    }
    for k in all {
        if let Some(v) = kv.get(&k).await.map_err(|e| e.to_string())? {
            if let Some(item) = registry_item(sh, cl, &k, &v) {
                let _ = apply.send(item).await;
            }
        }
    }
    Ok(())
}

pub(super) async fn watch_registry(
    sh: &Shared,
    cl: &Cluster,
    kv: &kv::Store,
    apply: &Sender<Apply>,
) {
    loop {
        match kv.watch_all().await {
            Ok(mut w) => {
                while let Some(e) = w.next().await {
                    let Ok(e) = e else { break };
                    let item = match e.operation {
                        kv::Operation::Put => registry_item(sh, cl, &e.key, &e.value),
                        kv::Operation::Delete | kv::Operation::Purge => {
                            registry_delete(sh, cl, &e.key)
                        }
                    };
                    if let Some(item) = item {
                        if apply.send(item).await.is_err() {
                            return;
                        }
                    }
                }
            }
            Err(e) => log(&format!("registry watch: {e}; retrying")),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

pub(super) async fn consume(
    sh: &Shared,
    cl: &Cluster,
    stream: &stream::Stream,
    kv: &kv::Store,
    names: &Names,
    start: u64,
    apply: &Sender<Apply>,
) {
    let mut next = start + 1;
    loop {
        let cfg = consumer::pull::Config {
            deliver_policy: if next <= 1 {
                consumer::DeliverPolicy::All
            } else {
                consumer::DeliverPolicy::ByStartSequence {
                    start_sequence: next,
                }
            },
            ack_policy: consumer::AckPolicy::None,
            filter_subject: names.events_filter(),
            inactive_threshold: Duration::from_secs(60),
            ..Default::default()
        };
        let c = match stream.create_consumer(cfg).await {
            Ok(c) => c,
            Err(e) => {
                log(&format!("consumer from sequence {next}: {e}; retrying"));
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        // A continuous pull (batches of 200, heartbeats): records arrive as they are
        // stored. An error (NATS restarted, heartbeats missed) re-creates the consumer
        // from the next sequence.
        let mut msgs = match c.messages().await {
            Ok(m) => m,
            Err(e) => {
                log(&format!("consume: {e}; re-creating the consumer"));
                tokio::time::sleep(Duration::from_millis(300)).await;
                continue;
            }
        };
        while let Some(m) = msgs.next().await {
            let m = match m {
                Ok(m) => m,
                Err(e) => {
                    log(&format!("consume: {e}; re-creating the consumer"));
                    break;
                }
            };
            let Ok((seq, pending)) = m.info().map(|i| (i.stream_sequence, i.pending)) else {
                continue;
            };
            if seq < next {
                continue;
            }
            next = seq + 1;
            let opened = auth::open(sh, cl, Kind::Record, b"", &m.payload);
            let item = match opened.map(EventRecord::decode) {
                None => Apply::Skip { seq },
                Some(Ok(rec)) if !auth::origin_ok(sh, Kind::Record, &rec.origin) => {
                    Apply::Skip { seq }
                }
                Some(Ok(rec)) => {
                    learn_worker(sh, cl, kv, &rec.worker, apply).await;
                    Apply::Record { seq, rec }
                }
                Some(Err(e)) => {
                    sh.cluster_metrics().record("undecodable", 1);
                    log(&format!("record {seq}: {e}; skipped"));
                    Apply::Skip { seq }
                }
            };
            if apply.send(item).await.is_err() {
                return;
            }
            // Nothing left behind this one: caught up even if older records aged out
            // below the catch-up target.
            if pending == 0 && apply.send(Apply::Tail).await.is_err() {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}
