//! The driver side of the per-worker circuit breakers (`breaker` is the state machine):
//! one breaker per worker per core (no cross-core locking on the request path; each
//! core learns of a failing worker from its own requests), the
//! `kvroute_proxy_breaker_open{worker}` gauge (cores with it open or half-open), and
//! the half-open probe `GET {url}/health`.

use super::breaker::{Allow, Breaker};
use super::front::Front;
use super::pool;
use super::state::WorkerLabel;
use super::url::UpstreamUrl;
use bytes::Bytes;
use futures_lite::FutureExt;
use http_body_util::Full;
use hyper::Request;
use std::cell::RefCell;
use std::collections::HashMap;
use std::time::Duration;

thread_local! {
    static BREAKERS: RefCell<HashMap<String, Breaker>> = RefCell::new(HashMap::new());
}

/// What routing may do with `worker` on this core now.
pub fn allow(worker: &str, now_ms: u64) -> Allow {
    BREAKERS.with(|b| {
        b.borrow_mut()
            .get_mut(worker)
            .map_or(Allow::Yes, |b| b.allow(now_ms))
    })
}

pub fn breaker_success(core: &Front, worker: &str) {
    BREAKERS.with(|b| {
        if let Some(br) = b.borrow_mut().get_mut(worker) {
            if !br.is_closed() {
                open_gauge(core, worker, -1);
            }
            br.on_success();
        }
    });
}

pub fn breaker_failure(core: &Front, worker: &str) {
    let ps = &core.handle.settings().proxy;
    let now = core.handle.now_ms();
    BREAKERS.with(|b| {
        let mut b = b.borrow_mut();
        let br = b.entry(worker.to_string()).or_default();
        let was_closed = br.is_closed();
        br.on_failure(now, ps.breaker_threshold, ps.breaker_open_ms);
        if was_closed && !br.is_closed() {
            open_gauge(core, worker, 1);
        }
    });
}

fn open_gauge(core: &Front, worker: &str, by: i64) {
    let g = core.state.metrics.breaker_open.get_or_create(&WorkerLabel {
        worker: worker.to_string(),
    });
    if by > 0 {
        g.inc();
    } else {
        g.dec();
    }
}

/// The half-open probe: `GET {url}/health` decides the breaker.
pub fn spawn_probe(core: &Front, worker: &str, url: &str, connect_ms: u64) {
    let (core, worker) = (core.clone(), worker.to_string());
    let Ok(url) = UpstreamUrl::parse(url) else {
        return;
    };
    glommio::spawn_local(async move {
        let ok = probe(&core, &url, Duration::from_millis(connect_ms)).await;
        if ok {
            breaker_success(&core, &worker);
        } else {
            breaker_failure(&core, &worker);
        }
    })
    .detach();
}

async fn probe(core: &Front, url: &UpstreamUrl, connect: Duration) -> bool {
    let Ok(mut conn) = pool::connect(url, connect).await else {
        return false;
    };
    let head =
        Request::get(url.path("/health")).header(hyper::header::HOST, url.authority.as_str());
    let Ok(req) = (core.state).authorize(head).body(Full::new(Bytes::new())) else {
        return false;
    };
    async { conn.sender.send_request(req).await.ok() }
        .or(async {
            glommio::timer::sleep(connect.max(Duration::from_secs(2))).await;
            None
        })
        .await
        .is_some_and(|r| r.status().is_success())
}
