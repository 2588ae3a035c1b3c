//! The publisher task of the cluster bridge: drains the publish buffer in order. Event
//! records go to `kvroute.NAME.events.WORKER` with a `Nats-Msg-Id` of
//! `origin.worker.seq`, registrations and removals (sealed tombstones, not KV deletes)
//! to the KV bucket; every one sealed with the tier secret (`cluster::auth`).
//!
//! Guarantees: each record's sequence is assigned once, so a retried publish carries
//! the same id and JetStream deduplicates it; a failure retries from the first
//! unacknowledged item, keeping per-worker order; at most 512 items are queued here
//! (the rest wait in the bounded publish buffer), and the replica reports itself
//! degraded while publishing fails.

use crate::cluster::auth::Kind;
use crate::cluster::names::Names;
use crate::cluster::wire::EventRecord;
use crate::service::cluster::log;
use crate::service::runtime::cluster_link::{Cluster, Out};
use crate::service::runtime::shared::Shared;
use async_nats::jetstream::{self, kv};
use bytes::Bytes;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::time::Duration;

/// One item of the publish queue, its sequence assigned once (retries reuse it).
enum Job {
    Publish {
        subject: String,
        id: String,
        payload: Bytes,
    },
    Put {
        key: String,
        value: Bytes,
    },
}

pub(super) async fn publisher(
    sh: &Shared,
    cl: &Cluster,
    js: &jetstream::Context,
    kv: &kv::Store,
    names: &Names,
    rx: crossbeam::channel::Receiver<Out>,
) {
    let mut seqs: HashMap<String, u64> = HashMap::new();
    let mut queue: VecDeque<Job> = VecDeque::new();
    let mut pause = Duration::from_millis(50);
    let m = sh.cluster_metrics();
    loop {
        while queue.len() < 512 {
            let Ok(out) = rx.try_recv() else { break };
            if let Some((key, value)) = crate::service::cluster::auth::registry_value(sh, cl, &out)
            {
                queue.push_back(Job::Put { key, value });
                continue;
            }
            queue.push_back(match out {
                Out::Events { worker, ops } => {
                    let seq = seqs.entry(worker.clone()).or_insert(0);
                    *seq += 1;
                    let rec = EventRecord {
                        origin: cl.origin.clone(),
                        worker,
                        seq: *seq,
                        ops,
                    };
                    Job::Publish {
                        subject: names.event_subject(&rec.worker),
                        id: format!("{}.{}.{}", rec.origin, rec.worker, rec.seq),
                        payload: cl.sealer.seal(Kind::Record, b"", rec.encode()).into(),
                    }
                }
                // Registry changes were queued above.
                Out::Worker(_) | Out::Removed(_) => continue,
            });
        }
        m.publish_backlog.set((queue.len() + rx.len()) as i64);
        cl.unacked.store(queue.len() as u64, Ordering::Release);
        if queue.is_empty() {
            let _ = tokio::time::timeout(Duration::from_millis(200), cl.wake.notified()).await;
            continue;
        }
        let ok = match queue.front() {
            Some(Job::Put { key, value }) => kv
                .put(key, value.clone())
                .await
                .map(|_| 1)
                .map_err(|e| (0, e.to_string())),
            Some(Job::Publish { .. }) => publish_run(js, &queue).await,
            None => Ok(0),
        };
        match ok {
            Ok(n) => {
                let mut events = 0u64;
                for j in queue.drain(..n) {
                    events += u64::from(matches!(j, Job::Publish { .. }));
                }
                m.record("published", events);
                pause = Duration::from_millis(50);
                let backlog = (queue.len() + rx.len()) as u64;
                cl.with_health(|h| {
                    h.publish_failing = false;
                    h.backlog = backlog;
                });
            }
            Err((n, e)) => {
                for _ in queue.drain(..n) {
                    m.record("published", 1);
                }
                let backlog = (queue.len() + rx.len()) as u64;
                let dropped = m
                    .records
                    .get_or_create(&crate::service::runtime::cluster_metrics::OutcomeLabel {
                        outcome: "dropped",
                    })
                    .get();
                let first = cl.with_health(|h| {
                    let first = !h.publish_failing;
                    h.publish_failing = true;
                    h.backlog = backlog;
                    h.dropped = dropped;
                    first
                });
                if first {
                    log(&format!(
                        "publish failed ({e}); buffering {backlog} records"
                    ));
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(2));
            }
        }
    }
}

/// Publishes the run of event records at the front of `queue` (at most 256) and
/// waits for their acknowledgements: `Ok(n)` all `n` stored, `Err((k, e))` the first
/// `k` stored and the next one failed.
async fn publish_run(
    js: &jetstream::Context,
    queue: &VecDeque<Job>,
) -> Result<usize, (usize, String)> {
    let mut acks = Vec::new();
    for j in queue.iter().take(256) {
        let Job::Publish {
            subject,
            id,
            payload,
        } = j
        else {
            break;
        };
        let p = jetstream::context::Publish::build()
            .payload(payload.clone())
            .message_id(id);
        match js.send_publish(subject.clone(), p).await {
            Ok(ack) => acks.push(ack),
            Err(e) => {
                if acks.is_empty() {
                    return Err((0, e.to_string()));
                }
                break;
            }
        }
    }
    let n = acks.len();
    for (i, ack) in acks.into_iter().enumerate() {
        if let Err(e) = ack.await {
            return Err((i, e.to_string()));
        }
    }
    Ok(n)
}
