//! The HTTP doors against hostile web pages, through the real binary: a page on another
//! origin in real Chromium cannot register a worker or prompt the proxy of a router
//! running with defaults (loopback, no token); a DNS-rebound page is refused by its
//! `Host`; a listed origin gets CORS; API clients (no browser headers) keep working on
//! the proxy under any name, and the JSON API answers only JSON bodies.

mod common;
use common::proxy::{self, FakeWorker};
use common::ui::Browser;
use common::Server;
use serde_json::Value;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A web server answering every request with one HTML page (the attacker's, or a
/// dashboard's), on its own loopback port: another origin than the router's ports.
struct Page {
    port: u16,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Page {
    fn serve(html: String) -> Page {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        l.set_nonblocking(true).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let st = stop.clone();
        let thread = std::thread::spawn(move || {
            while !st.load(Ordering::Relaxed) {
                match l.accept() {
                    Ok((mut c, _)) => {
                        let _ = c.set_nonblocking(false);
                        let _ = c.set_read_timeout(Some(Duration::from_secs(2)));
                        let mut buf = [0u8; 4096];
                        let _ = c.read(&mut buf);
                        let _ = write!(
                            c,
                            "HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{html}",
                            html.len()
                        );
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        });
        Page {
            port,
            stop,
            thread: Some(thread),
        }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/", self.port)
    }
}

impl Drop for Page {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A router with defaults and one worker with a URL (the proxy forwards to it).
fn router_and_worker(extra: &[&str]) -> (Server, FakeWorker) {
    let s = Server::start(1, extra);
    let w = FakeWorker::start("w1", &[]);
    proxy::register(&s, "w1", "m", "aggregated", &w.url());
    (s, w)
}

fn prompts_received(w: &FakeWorker, marker: &str) -> usize {
    w.received()
        .iter()
        .filter(|r| r.to_string().contains(marker))
        .count()
}

/// The issue's attack: a page on another origin POSTs `mode: "no-cors"` JSON as
/// `text/plain` (and as an untyped blob, and a bodyless lifecycle call) to the JSON
/// API, and a prompt to the proxy. None of it lands.
#[test]
fn a_cross_site_page_cannot_register_a_worker_or_prompt_the_proxy() {
    let Some(browser) = Browser::start_or_skip() else {
        return;
    };
    let (s, w) = router_and_worker(&[]);
    let page = Page::serve(format!(
        r#"<!doctype html><title>cute cats</title><script>
const spec = JSON.stringify({{id: "evil", model: "m", url: "http://127.0.0.1:9"}});
const blob = JSON.stringify({{id: "evil-blob", model: "m", url: "http://127.0.0.1:9"}});
Promise.allSettled([
  fetch("http://{api}/v1/workers", {{method: "POST", mode: "no-cors", body: spec}}),
  fetch("http://{api}/v1/workers", {{method: "POST", mode: "no-cors", body: new Blob([blob])}}),
  fetch("http://{api}/v1/requests/r1/finish", {{method: "POST", mode: "no-cors"}}),
  fetch("http://{proxy}/v1/completions", {{method: "POST", mode: "no-cors",
    body: JSON.stringify({{model: "m", prompt: "stolen-gpu-time", max_tokens: 2}})}}),
]).then(() => {{ window.done = true; }});
</script>"#,
        api = s.http,
        proxy = s.proxy
    ));
    browser.goto(&page.url());
    browser.wait_js(
        "the page's requests",
        "return window.done === true",
        Duration::from_secs(20),
    );
    let ids: Vec<Value> = s.workers().iter().map(|w| w["id"].clone()).collect();
    assert_eq!(ids, vec![Value::from("w1")], "a page registered a worker");
    assert_eq!(
        prompts_received(&w, "stolen-gpu-time"),
        0,
        "a page prompted the proxy"
    );
    let refused = s.metric("kvroute_protocol_errors_total{kind=\"origin_not_allowed\"}");
    assert!(refused >= 3.0, "{refused} refused on the JSON API");
    assert!(s.metric("kvroute_proxy_refused_total{kind=\"origin_not_allowed\"}") >= 1.0);
    // The router's own page still works in the same browser.
    browser.goto(&s.url("/ui"));
    browser.wait_js(
        "the status page's first fetch",
        "return !!(window.kvroute && window.kvroute.fetches > 0)",
        Duration::from_secs(15),
    );
}

/// DNS rebinding: the attacker's name now resolves to the router, so the page's
/// requests are same-origin for the browser (it sends the JSON content type, and a
/// readable answer comes back) but carry the attacker's name as `Host`.
#[test]
fn a_dns_rebound_page_is_refused_by_its_host() {
    let Some(browser) =
        Browser::start_or_skip_with(&["--host-resolver-rules=MAP rebound.test 127.0.0.1"])
    else {
        return;
    };
    let (s, w) = router_and_worker(&[]);
    let port = |a: &str| a.rsplit(':').next().unwrap().to_string();
    let attack = |origin: String, path: &str, body: &str| {
        browser.goto(&format!("{origin}/"));
        browser.js(&format!(
            r#"window.got = null;
fetch("{path}", {{method: "POST", headers: {{"content-type": "application/json"}}, body: {body:?}}})
  .then(r => r.text().then(t => {{ window.got = [r.status, t]; }}),
        e => {{ window.got = [0, String(e)]; }});
return 1;"#
        ));
        browser.wait_js(
            "the rebound request",
            "return window.got !== null",
            Duration::from_secs(15),
        );
        browser.js("return window.got")
    };
    let api = format!("http://rebound.test:{}", port(&s.http));
    let spec = r#"{"id":"evil","model":"m","url":"http://127.0.0.1:9"}"#;
    let got = attack(api.clone(), "/v1/workers", spec);
    assert_eq!(got[0], 403, "{got}");
    assert!(
        got[1].as_str().unwrap_or("").contains("host_not_allowed"),
        "{got}"
    );
    browser.goto(&format!("{api}/v1/workers"));
    let shown = browser.js("return document.body.innerText");
    assert!(
        shown.as_str().unwrap_or("").contains("host_not_allowed"),
        "{shown}"
    );
    let px = format!("http://rebound.test:{}", port(&s.proxy));
    let prompt = r#"{"model":"m","prompt":"rebound-gpu-time","max_tokens":2}"#;
    let got = attack(px, "/v1/completions", prompt);
    assert_eq!(got[0], 403, "{got}");
    assert_eq!(s.workers().len(), 1, "a rebound page registered a worker");
    assert_eq!(prompts_received(&w, "rebound-gpu-time"), 0);
    assert!(s.metric("kvroute_protocol_errors_total{kind=\"host_not_allowed\"}") >= 2.0);
}

/// `http_allowed_origins`: a listed page makes CORS calls (preflighted JSON, readable
/// answers) to both ports; an unlisted one still cannot.
#[test]
fn a_listed_origin_gets_cors_on_both_ports() {
    let Some(browser) = Browser::start_or_skip() else {
        return;
    };
    let page = Page::serve("<!doctype html><title>dashboard</title>".into());
    let origin = format!("http://127.0.0.1:{}", page.port);
    let (s, w) = router_and_worker(&["--http-allowed-origins", &origin]);
    browser.goto(&page.url());
    browser.js(&format!(
        r#"window.got = null;
const json = {{"content-type": "application/json"}};
(async () => {{
  const reg = await fetch("http://{api}/v1/workers", {{method: "POST", headers: json,
    body: JSON.stringify({{id: "dash-w", model: "m"}})}});
  const list = await (await fetch("http://{api}/v1/workers")).json();
  const done = await (await fetch("http://{proxy}/v1/completions", {{method: "POST",
    headers: json, body: JSON.stringify({{model: "m", prompt: "from-the-dashboard", max_tokens: 2}})}})).json();
  return [reg.status, list.length, done.choices.length];
}})().then(v => {{ window.got = v; }}, e => {{ window.got = String(e); }});
return 1;"#,
        api = s.http,
        proxy = s.proxy
    ));
    browser.wait_js(
        "the dashboard's calls",
        "return window.got !== null",
        Duration::from_secs(20),
    );
    assert_eq!(
        browser.js("return window.got"),
        serde_json::json!([201, 2, 1])
    );
    assert_eq!(prompts_received(&w, "from-the-dashboard"), 1);
}

/// Sends a raw request and returns its status and body.
fn raw(addr: &str, head: &str, body: &str) -> (u16, String) {
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        c,
        "{head}content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut got = String::new();
    let _ = c.read_to_string(&mut got);
    let status = got.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = got.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    (status, body)
}

/// The rules without a browser: `Host` names on the JSON API (addresses, localhost,
/// the listed names), JSON content type for state-changing calls with a body (bodyless
/// lifecycle calls need none), `Origin` checks; on the proxy an API client is checked
/// only when it carries browser headers.
#[test]
fn host_origin_and_content_type_rules_on_the_wire() {
    let (s, _w) = router_and_worker(&["--http-allowed-hosts", "router.internal,*.svc.test"]);
    let get = |host: &str, extra: &str| {
        raw(
            &s.http,
            &format!("GET /healthz HTTP/1.1\r\nhost: {host}\r\n{extra}"),
            "",
        )
        .0
    };
    for ok in [
        "127.0.0.1",
        "localhost:1",
        "[::1]",
        "router.internal",
        "a.svc.test:80",
    ] {
        assert_eq!(get(ok, ""), 200, "{ok}");
    }
    for bad in ["evil.test", "router.internal.evil.test", "svc.test"] {
        assert_eq!(get(bad, ""), 403, "{bad}");
    }
    let own = format!("origin: http://{}\r\n", s.http);
    assert_eq!(get(&s.http, &own), 200);
    assert_eq!(get(&s.http, "origin: http://127.0.0.1:1\r\n"), 403);
    assert_eq!(get(&s.http, "origin: null\r\n"), 403);

    let spec = r#"{"id":"typed","model":"m"}"#;
    let post = |path: &str, ctype: Option<&str>, body: &str| {
        let ct = ctype
            .map(|t| format!("content-type: {t}\r\n"))
            .unwrap_or_default();
        raw(
            &s.http,
            &format!("POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\n{ct}"),
            body,
        )
    };
    let (code, body) = post("/v1/workers", Some("text/plain;charset=UTF-8"), spec);
    assert_eq!(code, 415, "{body}");
    assert!(body.contains("unsupported_media_type"), "{body}");
    assert_eq!(
        post(
            "/v1/workers",
            Some("application/x-www-form-urlencoded"),
            spec
        )
        .0,
        415
    );
    assert_eq!(post("/v1/workers", None, spec).0, 415);
    assert_eq!(
        post("/v1/workers", Some("application/json; charset=utf-8"), spec).0,
        201
    );
    // A bodyless lifecycle call needs no content type (an unknown id: 404, not 415).
    assert_eq!(post("/v1/requests/nope/finish", None, "").0, 404);
    assert!(s.metric("kvroute_protocol_errors_total{kind=\"unsupported_media_type\"}") >= 3.0);

    // The proxy: an SDK or curl under any name, with any content type, is served.
    let completion = r#"{"model":"m","prompt":"hi","max_tokens":2}"#;
    let px = |host: &str, extra: &str| {
        raw(
            &s.proxy,
            &format!("POST /v1/completions HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n{extra}"),
            completion,
        )
        .0
    };
    assert_eq!(px("kvroute.prod.example:8000", ""), 200);
    assert_eq!(px("127.0.0.1", "sec-fetch-site: same-origin\r\n"), 200);
    assert_eq!(
        px("kvroute.prod.example", "sec-fetch-site: same-origin\r\n"),
        403
    );
    assert_eq!(px("127.0.0.1", "origin: http://evil.test\r\n"), 403);
}
