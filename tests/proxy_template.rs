//! Chat template rendering through the real binary with `--cores 1`: a render is
//! bounded in template steps (`chat_template_fuel`; past it 400), and one that turns
//! out costly leaves the core after a few thousand steps for the core's blocking
//! thread, so `/healthz` and other requests on that core stay served meanwhile.

mod common;

use common::proxy::{post, register, wait_until, FakeWorker};
use common::tokenizer::TestTokenizer;
use common::Server;
use serde_json::json;
use std::sync::Mutex;

/// 10^8 loop steps and no output, for a 40-byte chat body.
const COSTLY: &str =
    "{% for a in range(10000) %}{% for b in range(10000) %}{% endfor %}{% endfor %}t1";

fn costly_tokenizer() -> TestTokenizer {
    let t = TestTokenizer::new(100);
    std::fs::write(t.path().join("chat_template.jinja"), COSTLY).expect("template");
    t
}

const CHAT: &str = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;

/// Routers start one at a time: one test sets an environment variable for its own.
static START: Mutex<()> = Mutex::new(());

fn start(tok: &TestTokenizer, fuel_env: Option<&str>) -> Server {
    let _one = START.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(f) = fuel_env {
        std::env::set_var("KVROUTE_CHAT_TEMPLATE_FUEL", f);
    }
    let s = Server::start(1, &["--tokenizer", &tok.flag()]);
    std::env::remove_var("KVROUTE_CHAT_TEMPLATE_FUEL");
    s
}

#[test]
fn a_costly_template_is_refused_past_its_fuel_off_the_core() {
    if !common::python_has("json", "python3") {
        return;
    }
    let tok = costly_tokenizer();
    let s = start(&tok, None);
    let w = FakeWorker::start("w1", &[]);
    register(&s, "w1", "m", "aggregated", &w.url());
    let a = post(&s, "/v1/chat/completions", CHAT, &[]);
    assert_eq!(a.status, 400, "{a:?}");
    assert!(a.body.contains("chat_template_fuel"), "{}", a.body);
    assert_eq!(s.metric("kvroute_proxy_renders_off_core_total"), 1.0);
    assert!(w.received().is_empty());
    // A completion on the same core is unaffected.
    let c = post(
        &s,
        "/v1/completions",
        &json!({"model": "m", "prompt": "t1 t2", "max_tokens": 1}).to_string(),
        &[],
    );
    assert_eq!(c.status, 200, "{c:?}");
}

#[test]
fn healthz_stays_served_while_a_long_render_runs() {
    if !common::python_has("json", "python3") {
        return;
    }
    let tok = costly_tokenizer();
    // Fuel for the whole 10^8 steps (seconds of work): the render must not hold the
    // core. The env var: a router without the setting ignores it and renders inline.
    let s = start(&tok, Some("1000000000"));
    let w = FakeWorker::start("w1", &[]);
    register(&s, "w1", "m", "aggregated", &w.url());
    let proxy = s.proxy.clone();
    let chat = std::thread::spawn(move || {
        common::proxy::agent()
            .post(&format!("http://{proxy}/v1/chat/completions"))
            .set("content-type", "application/json")
            .send_string(CHAT)
            .map_or_else(|e| e.to_string(), |r| r.status().to_string())
    });
    wait_until("the render left the core", || {
        s.metric("kvroute_proxy_renders_off_core_total") == 1.0
    });
    for _ in 0..5 {
        assert_eq!(s.get("/healthz").0, 200);
    }
    assert!(
        !chat.is_finished(),
        "the render ended before /healthz was asked"
    );
    drop(s);
    let _ = chat.join();
}

#[test]
fn chat_template_fuel_comes_from_default_toml_env_and_flag() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("k.toml");
    std::fs::write(&cfg, "[limits]\nchat_template_fuel = 5000\n").unwrap();
    let print = |args: &[&str], env: Option<&str>| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_kvroute"));
        cmd.arg("print-config").args(args);
        cmd.env_remove("KVROUTE_CHAT_TEMPLATE_FUEL");
        if let Some(v) = env {
            cmd.env("KVROUTE_CHAT_TEMPLATE_FUEL", v);
        }
        let out = cmd.output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let v: toml::Value = toml::from_str(&text).unwrap_or(toml::Value::Integer(-1));
        let fuel = v.get("limits").and_then(|l| l.get("chat_template_fuel"));
        (out.status.code(), fuel.cloned())
    };
    let cfg = cfg.to_str().unwrap();
    let fuel = |n: i64| (Some(0), Some(toml::Value::Integer(n)));
    assert_eq!(print(&[], None), fuel(2_000_000));
    assert_eq!(print(&["--config", cfg], None), fuel(5000));
    assert_eq!(print(&["--config", cfg], Some("6000")), fuel(6000));
    assert_eq!(
        print(
            &["--config", cfg, "--chat-template-fuel", "7000"],
            Some("6000")
        ),
        fuel(7000)
    );
    assert_eq!(print(&["--chat-template-fuel", "0"], None).0, Some(2));
}
