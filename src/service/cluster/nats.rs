//! The NATS side of the cluster bridge (thread "kvroute-cluster", one tokio
//! current-thread runtime): connect (token, user/password or creds file; reconnects
//! forever), make sure the event stream and the registry bucket exist, then run three
//! tasks until shutdown:
//! - publisher: drains the publish buffer in order; event records go to
//!   `kvroute.NAME.events.WORKER` with a `Nats-Msg-Id` of `origin.worker.seq` (so a
//!   retried publish is deduplicated by JetStream), registrations to the KV bucket. A
//!   failure retries from the first unacknowledged item, keeping per-worker order;
//!   meanwhile the replica is degraded and the buffer absorbs new records.
//! - consumer: an ephemeral pull consumer from the sequence after the restored
//!   snapshot's (or the start), re-created from the next sequence after any error
//!   (NATS restart), handing records in stream order to the apply thread. Records of a
//!   worker this replica does not know yet are preceded by its KV registration.
//! - registry watcher: every put/delete of the bucket, to the apply thread.
//!
//! On every (re)connection the replica republishes its own registrations (those that
//! came through its doors), the reconcile path for registry writes made while NATS
//! was down.
//!
//! Submodules: `publish` (the publisher task) and `consume` (the stream consumer and
//! the registry reader / watcher); this file connects, sets up and starts them.

pub(in crate::service::cluster) mod consume;
mod publish;

use crate::cluster::load::LoadOp;
use crate::cluster::names::Names;
use crate::service::cluster::apply::Apply;
use crate::service::cluster::log;
use crate::service::cluster::peers;
use crate::service::runtime::cluster_link::{Cluster, Out};
use crate::service::runtime::shared::Shared;
use async_nats::jetstream::{self, kv, stream};
use consume::{consume, registry_sync, watch_registry};
use publish::publisher;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc::Sender;

/// The thread's body; returns at shutdown.
pub fn run(
    sh: Arc<Shared>,
    cl: Arc<Cluster>,
    rx: crossbeam::channel::Receiver<Out>,
    load_rx: crossbeam::channel::Receiver<LoadOp>,
    apply: Sender<Apply>,
) {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return log(&format!("cannot start the runtime: {e}; cluster off")),
    };
    rt.block_on(async move {
        let stop = {
            let (sh, cl) = (sh.clone(), cl.clone());
            async move {
                while !sh.stopping.load(Ordering::Relaxed) {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                // A graceful stop: what was accepted goes into the log first, for at
                // most 3 s (NATS may be down).
                let until = tokio::time::Instant::now() + Duration::from_secs(3);
                while cl.unpublished() > 0 && tokio::time::Instant::now() < until {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        };
        tokio::select! {
            _ = main(sh, cl, rx, load_rx, apply) => {}
            _ = stop => {}
        }
    });
}

async fn connect(sh: &Arc<Shared>, cl: &Arc<Cluster>) -> async_nats::Client {
    let cfg = &sh.settings.cluster;
    let url = cfg.url.clone().unwrap_or_default();
    let mut pause = Duration::from_millis(100);
    loop {
        let (s, c) = (sh.clone(), cl.clone());
        let mut opts = async_nats::ConnectOptions::new()
            .name(format!("kvroute {}", cl.origin))
            .connection_timeout(Duration::from_secs(2))
            .max_reconnects(None)
            .reconnect_delay_callback(|n| Duration::from_millis((100 * n as u64).min(1000)))
            .event_callback(move |e| {
                let (s, c) = (s.clone(), c.clone());
                async move { on_event(&s, &c, e) }
            });
        if let Some(t) = &cfg.token {
            opts = opts.token(t.clone());
        }
        if let (Some(u), Some(p)) = (&cfg.user, &cfg.password) {
            opts = opts.user_and_password(u.clone(), p.clone());
        }
        if let Some(f) = &cfg.creds_file {
            opts = match opts.credentials_file(f).await {
                Ok(o) => o,
                Err(e) => {
                    log(&format!("creds file {f}: {e}; retrying"));
                    tokio::time::sleep(Duration::from_secs(2)).await;
                    continue;
                }
            };
        }
        let addrs: Vec<&str> = url.split(',').map(str::trim).collect();
        let addrs: Vec<async_nats::ServerAddr> =
            addrs.iter().filter_map(|a| a.parse().ok()).collect();
        match opts.connect(addrs.as_slice()).await {
            Ok(c) => return c,
            Err(e) => {
                log(&format!("cannot reach NATS at {url}: {e}; retrying"));
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(2));
            }
        }
    }
}

fn on_event(sh: &Arc<Shared>, cl: &Arc<Cluster>, e: async_nats::Event) {
    match e {
        async_nats::Event::Connected => {
            log("connected to NATS");
            cl.with_health(|h| h.connected = true);
            republish_own(sh);
        }
        async_nats::Event::Disconnected => {
            log("lost NATS");
            cl.with_health(|h| h.on_disconnected());
        }
        _ => {}
    }
}

/// Queues this replica's own registrations for publication again.
fn republish_own(sh: &Shared) {
    let reg = sh.registry.load();
    for e in reg.iter() {
        if e.origin != crate::registry::Origin::Restored {
            crate::service::runtime::cluster_hooks::publish_worker(sh, &e.spec);
        }
    }
}

async fn setup(
    sh: &Shared,
    js: &jetstream::Context,
    names: &Names,
) -> Result<(stream::Stream, kv::Store), String> {
    let cfg = &sh.settings.cluster;
    let stream = js
        .get_or_create_stream(stream::Config {
            name: names.stream.clone(),
            subjects: vec![names.events_filter()],
            max_age: Duration::from_millis(cfg.max_age_ms),
            max_bytes: cfg.max_bytes.min(i64::MAX as u64) as i64,
            storage: stream::StorageType::File,
            discard: stream::DiscardPolicy::Old,
            ..Default::default()
        })
        .await
        .map_err(|e| format!("stream {}: {e}", names.stream))?;
    // The bucket's stream as `create_key_value` would make it: that call first asks
    // for the account info, whose reply from a 2.9 server this client cannot parse.
    js.get_or_create_stream(stream::Config {
        name: format!("KV_{}", names.workers_bucket),
        subjects: vec![format!("$KV.{}.>", names.workers_bucket)],
        max_messages_per_subject: 1,
        max_bytes: -1,
        max_message_size: 1 << 20,
        storage: stream::StorageType::File,
        allow_rollup: true,
        deny_delete: true,
        deny_purge: false,
        allow_direct: true,
        num_replicas: 1,
        discard: stream::DiscardPolicy::New,
        ..Default::default()
    })
    .await
    .map_err(|e| format!("bucket {}: {e}", names.workers_bucket))?;
    let kv = js
        .get_key_value(&names.workers_bucket)
        .await
        .map_err(|e| format!("bucket {}: {e}", names.workers_bucket))?;
    Ok((stream, kv))
}

async fn main(
    sh: Arc<Shared>,
    cl: Arc<Cluster>,
    rx: crossbeam::channel::Receiver<Out>,
    load_rx: crossbeam::channel::Receiver<LoadOp>,
    apply: Sender<Apply>,
) {
    let names = Names::new(&sh.settings.cluster.name);
    let client = connect(&sh, &cl).await;
    cl.with_health(|h| h.connected = true);
    let js = jetstream::new(client.clone());
    let (stream, kv) = loop {
        match setup(&sh, &js, &names).await {
            Ok(x) => break x,
            Err(e) => {
                log(&format!("{e}; retrying"));
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    };
    let (last, start) = loop {
        match stream.get_info().await {
            Ok(i) => {
                // No records left (all aged out): nothing to wait for.
                let last = if i.state.messages == 0 {
                    0
                } else {
                    i.state.last_sequence
                };
                // A snapshot sequence past the stream's end: the stream was recreated
                // (a new NATS store); replay all of it.
                let start = if cl.start_after > last {
                    log(&format!(
                        "snapshot covers sequence {} but the stream ends at {last}: replaying it all",
                        cl.start_after
                    ));
                    0
                } else {
                    cl.start_after
                };
                break (last, start);
            }
            Err(e) => {
                log(&format!("stream info: {e}; retrying"));
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    };
    cl.applied_seq.store(start, Ordering::Release);
    // The fleet first, then the catch-up target: the apply thread handles both in
    // order, so the replica is ready only once it knows every registered worker.
    loop {
        match registry_sync(&sh, &cl, &kv, &apply).await {
            Ok(()) => break,
            Err(e) => {
                log(&format!("registry sync: {e}; retrying"));
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
    if apply
        .send(Apply::Connected {
            stream_last: last,
            start,
        })
        .await
        .is_err()
    {
        return;
    }
    log(&format!(
        "stream {} holds up to sequence {last}; applying from {}",
        names.stream,
        start + 1
    ));
    let load_subject = names.load_subject();
    // Subscribed before the replica says it is caught up, so no peer's load change
    // made after that point is missed.
    let sub = loop {
        match client.subscribe(load_subject.clone()).await {
            Ok(s) => break s,
            Err(e) => {
                log(&format!("subscribe {load_subject}: {e}; retrying"));
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    };
    let sync_subject = format!("{load_subject}.sync");
    let sync_sub = loop {
        match client.subscribe(sync_subject.clone()).await {
            Ok(s) => break s,
            Err(e) => {
                log(&format!("subscribe {sync_subject}: {e}; retrying"));
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    };
    let sync = async {
        let (ops, peers) = peers::sync_request(&sh, &cl, &client, &sync_subject).await;
        let _ = apply.send(Apply::LoadSync { ops, peers }).await;
    };
    tokio::join!(
        peers::engine_leases(&sh, &cl, &client, &js, &names),
        sync,
        peers::sync_responder(&sh, &cl, &client, sync_sub),
        peers::load_publisher(&sh, &cl, &client, &load_subject, load_rx),
        peers::load_subscriber(&sh, &cl, &kv, sub, &apply),
        publisher(&sh, &cl, &js, &kv, &names, rx),
        consume(&sh, &cl, &stream, &kv, &names, start, &apply),
        watch_registry(&sh, &cl, &kv, &apply),
    );
}
