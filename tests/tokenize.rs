//! Tokenization as the engine does it (`kvroute::tokenize`), through the real
//! binaries: `kvroute-sim tokenizer` writes the tokenizer, `kvroute serve --tokenizer`
//! loads it (or refuses to start on a broken one), and `/v1/route` with the module's
//! tokens lands where the engine's events for the same prompt were indexed. A
//! tokenizer.json written by the Python `tokenizers` package (HF's own writer) loads
//! and encodes exactly as python encodes, and chat templates render as transformers
//! renders them (jinja2), when those packages are importable.

mod common;

use common::{python_has, Server};
use kvroute::tokenize::{Endpoint, Tokenizers};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const BLOCK: usize = 4;

/// `kvroute-sim tokenizer --out DIR --vocab N`.
fn build_tokenizer(dir: &Path, vocab: u32) {
    let out = Command::new(env!("CARGO_BIN_EXE_kvroute-sim"))
        .args(["tokenizer", "--out"])
        .arg(dir)
        .args(["--vocab", &vocab.to_string()])
        .output()
        .expect("run kvroute-sim");
    assert!(out.status.success(), "kvroute-sim tokenizer: {out:?}");
    assert!(dir.join("tokenizer.json").is_file());
    assert!(dir.join("tokenizer_config.json").is_file());
}

/// Runs `kvroute serve` expecting it to refuse to start; returns its stderr.
fn start_fails(extra: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_kvroute"))
        .args([
            "serve",
            "--cores",
            "1",
            "--events-addr",
            "127.0.0.1:0",
            "--api-addr",
            "127.0.0.1:0",
            "--http-addr",
            "127.0.0.1:0",
        ])
        .args(extra)
        .stdin(Stdio::null())
        .output()
        .expect("spawn kvroute");
    assert_eq!(
        out.status.code(),
        Some(2),
        "expected a start error: {out:?}"
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn chat_body(model: &str, turns: &[&str]) -> Value {
    let messages: Vec<Value> = turns
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let role = if i % 2 == 0 { "user" } else { "assistant" };
            json!({"role": role, "content": t})
        })
        .collect();
    json!({"model": model, "messages": messages, "stream": true})
}

fn route(s: &Server, req: &kvroute::engine::RouteRequest) -> Value {
    let body = serde_json::to_value(req).unwrap();
    let (code, d) = s.post("/v1/route", body);
    assert_eq!(code, 200, "route: {d}");
    d
}

#[test]
fn routes_module_tokens_like_the_engine_events_of_the_same_prompt() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("tok");
    build_tokenizer(&dir, 1000);
    let d = dir.display().to_string();
    let s = Server::start(
        2,
        &[
            "--block-size",
            &BLOCK.to_string(),
            "--tokenizer",
            &format!("m={d}"),
            "--lora-adapter",
            "sql=m",
        ],
    );
    for w in ["w1", "w2", "w3"] {
        s.register(json!({"id": w, "model": "m", "capacity_blocks": 10000}));
    }
    // What the proxy does: the module's tokens for the request.
    let toks = Tokenizers::load(&[("m".into(), dir.clone())])
        .unwrap()
        .with_adapters(&[("sql".into(), "m".into())])
        .unwrap();
    let long: Vec<u32> = (0..40).collect();
    let text = kvroute::tokenize::testing::text_of(&long);
    let body = chat_body("m", &[&text, "t7 t8 t9", "t1 t2 t3 t4 t5"]);
    let tokens = toks
        .prompt_tokens(Endpoint::Chat, "m", &body)
        .unwrap()
        .expect("m has a tokenizer");
    assert!(tokens.len() > 50, "{tokens:?}");
    // What the engine's events carry after it ran the same prompt: its token ids,
    // hashed by the router like any event (plain hash space on w2, LoRA `sql` on w3).
    let blocks = tokens.len() / BLOCK;
    let plain = kvroute::engines::salted_sequence_hashes(&tokens, BLOCK, None);
    let sql = kvroute::engines::salted_sequence_hashes(&tokens, BLOCK, Some("sql"));
    s.store("w2", "device", &plain);
    s.store("w3", "device", &sql);
    s.wait_until("both indexed", |s| {
        s.cached("w2") == blocks as u64 && s.cached("w3") == blocks as u64
    });

    let d = route(&s, &toks.route_request("r1".into(), "m", tokens.clone()));
    assert_eq!(d["decode_worker"], "w2", "{d}");
    assert_eq!(d["overlap"]["device"], blocks as u64, "{d}");
    let (code, _) = s.post("/v1/requests/r1/finish", json!({}));
    assert_eq!(code, 200);

    // The adapter's request: the base tokenizer, the adapter's hash space.
    let sql_tokens = toks
        .prompt_tokens(
            Endpoint::Chat,
            "sql",
            &chat_body("sql", &[&text, "t7 t8 t9", "t1 t2 t3 t4 t5"]),
        )
        .unwrap()
        .unwrap();
    assert_eq!(sql_tokens, tokens);
    let req = toks.route_request("r2".into(), "sql", sql_tokens);
    assert_eq!(req.lora_name.as_deref(), Some("sql"));
    let d = route(&s, &req);
    assert_eq!(d["decode_worker"], "w3", "{d}");
    assert_eq!(d["overlap"]["device"], blocks as u64, "{d}");
    let (code, _) = s.post("/v1/requests/r2/finish", json!({}));
    assert_eq!(code, 200);

    // A follow-up turn of the conversation shares the cached prefix: every block of the
    // earlier prompt except the last (the generation prompt differs from the reply).
    let next = chat_body("m", &[&text, "t7 t8 t9", "t1 t2 t3 t4 t5", "t6", "t11 t12"]);
    let more = toks
        .prompt_tokens(Endpoint::Chat, "m", &next)
        .unwrap()
        .unwrap();
    let d = route(&s, &toks.route_request("r3".into(), "m", more));
    assert_eq!(d["decode_worker"], "w2", "{d}");
    assert!(
        d["overlap"]["device"].as_u64().unwrap() >= (blocks as u64) - 2,
        "{d}"
    );

    // A completions prompt given as the same ids routes the same way.
    let c = json!({"model": "m", "prompt": tokens});
    let ids = toks
        .prompt_tokens(Endpoint::Completions, "m", &c)
        .unwrap()
        .unwrap();
    let d = route(&s, &toks.route_request("r4".into(), "m", ids));
    assert_eq!(d["decode_worker"], "w2", "{d}");
    assert_eq!(d["overlap"]["device"], blocks as u64, "{d}");

    // A model without a tokenizer: nothing to route on but load.
    assert_eq!(
        toks.prompt_tokens(Endpoint::Chat, "other", &chat_body("other", &["t1"]))
            .unwrap(),
        None
    );
}

#[test]
fn a_missing_or_broken_tokenizer_dir_fails_the_start_clearly() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("nope");
    let err = start_fails(&["--tokenizer", &format!("m={}", missing.display())]);
    assert!(
        err.contains("tokenizer for model \"m\"") && err.contains("not a directory"),
        "{err}"
    );

    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let err = start_fails(&["--tokenizer", &format!("m={}", empty.display())]);
    assert!(err.contains("tokenizer.json is missing"), "{err}");

    let broken = tmp.path().join("broken");
    std::fs::create_dir(&broken).unwrap();
    std::fs::write(broken.join("tokenizer.json"), "{\"model\": 42").unwrap();
    let err = start_fails(&["--tokenizer", &format!("m={}", broken.display())]);
    assert!(err.contains("not a usable tokenizer.json"), "{err}");

    // A good tokenizer.json with a template that does not compile.
    let bad_tmpl = tmp.path().join("badtmpl");
    build_tokenizer(&bad_tmpl, 10);
    std::fs::write(
        bad_tmpl.join("tokenizer_config.json"),
        json!({"chat_template": "{% for m in messages %}{{ m.content }"}).to_string(),
    )
    .unwrap();
    let err = start_fails(&["--tokenizer", &format!("m={}", bad_tmpl.display())]);
    assert!(err.contains("chat template"), "{err}");

    let good = tmp.path().join("good");
    build_tokenizer(&good, 10);
    let err = start_fails(&[
        "--tokenizer",
        &format!("m={}", good.display()),
        "--lora-adapter",
        "sql=other",
    ]);
    assert!(err.contains("has no tokenizer"), "{err}");
    let err = start_fails(&["--tokenizer", "no-equals-sign"]);
    assert!(err.contains("KEY=VALUE"), "{err}");
}

#[test]
fn tokenizer_settings_layer_toml_env_and_flags() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = tmp.path().join("k.toml");
    std::fs::write(
        &cfg,
        "tokenize_lean = false\n[limits]\nmax_prompt_tokens = 5000\n[tokenizers]\n\"org/model-a\" = \"/models/a\"\n\
         [lora_adapters]\nsql = \"org/model-a\"\n",
    )
    .unwrap();
    let print = |env: &[(&str, &str)], flags: &[&str]| -> Value {
        let out = Command::new(env!("CARGO_BIN_EXE_kvroute"))
            .arg("print-config")
            .arg("--config")
            .arg(&cfg)
            .args(flags)
            .envs(env.iter().copied())
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let t: toml::Value = toml::from_str(&String::from_utf8_lossy(&out.stdout)).unwrap();
        serde_json::to_value(t).unwrap()
    };
    let v = print(&[], &[]);
    assert_eq!(v["tokenizers"], json!({"org/model-a": "/models/a"}));
    assert_eq!(v["lora_adapters"], json!({"sql": "org/model-a"}));
    assert_eq!(v["limits"]["max_prompt_tokens"], 5000);
    assert_eq!(v["tokenize_lean"], false);
    let v = print(
        &[
            ("KVROUTE_TOKENIZERS", "b=/models/b,c=/models/c"),
            ("KVROUTE_LORA_ADAPTERS", "x=b"),
            ("KVROUTE_TOKENIZE_LEAN", "true"),
        ],
        &["--max-prompt-tokens", "77"],
    );
    assert_eq!(v["tokenizers"], json!({"b": "/models/b", "c": "/models/c"}));
    assert_eq!(v["lora_adapters"], json!({"x": "b"}));
    assert_eq!(v["limits"]["max_prompt_tokens"], 77);
    assert_eq!(v["tokenize_lean"], true);
    let v = print(
        &[("KVROUTE_TOKENIZERS", "b=/models/b")],
        &[
            "--tokenizer",
            "d=/models/d",
            "--lora-adapter",
            "y=d",
            "--tokenize-lean",
            "false",
        ],
    );
    assert_eq!(v["tokenizers"], json!({"d": "/models/d"}));
    assert_eq!(v["tokenize_lean"], false);
    // Defaults: none, and a generous prompt limit.
    let out = Command::new(env!("CARGO_BIN_EXE_kvroute"))
        .arg("print-config")
        .output()
        .unwrap();
    let t: toml::Value = toml::from_str(&String::from_utf8_lossy(&out.stdout)).unwrap();
    let v = serde_json::to_value(t).unwrap();
    assert!(v.get("tokenizers").is_none());
    assert_eq!(v["limits"]["max_prompt_tokens"], 262_144);
    assert_eq!(v["tokenize_lean"], true);
}

/// The running service says how each model's prompts are tokenized, and
/// `--tokenize-lean false` takes the lean walk away.
#[test]
fn the_service_names_the_tokenizing_path_of_each_model() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("tok");
    build_tokenizer(&dir, 100);
    let m = format!("m={}", dir.display());
    for (flags, want) in [
        (vec!["--tokenizer", m.as_str()], "lean walk"),
        (
            vec!["--tokenizer", m.as_str(), "--tokenize-lean", "false"],
            "HF pipeline (tokenize_lean = false)",
        ),
    ] {
        let s = Server::start_logged(1, &flags);
        let line = format!("kvroute: tokenizer for model \"m\": {want}");
        let log = s.log();
        assert!(
            log.iter().any(|l| l.starts_with(&line)),
            "{line:?} not in {log:?}"
        );
    }
}

/// A real HF tokenizer.json (byte-level BPE, Llama-3 regex with look-ahead, NFC) written
/// by the Python `tokenizers` package: kvroute loads it, serves with it, and encodes
/// exactly as python does; the chat template renders as transformers renders it.
#[test]
fn python_tokenizers_files_load_and_encode_like_python() {
    if !python_has("tokenizers", "tokenizers") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir: PathBuf = tmp.path().to_path_buf();
    let expect = python_tokenizer("hf_tokenizer.py", &dir);
    let toks = Tokenizers::load(&[("llama".into(), dir.clone())]).unwrap();
    // The comparison below is of the lean walk (tokenize::lean), which this
    // Llama-3-style pipeline (NFC, Split + ByteLevel, BPE) must take.
    assert!(toks.is_lean("llama"));
    same_as_python(&toks, "llama", &expect);
    let chats = expect["chats"].as_array().unwrap();
    if chats.is_empty() {
        eprintln!("SKIPPED chat comparison: python3 has no jinja2");
    }
    for c in chats {
        let ids: Vec<u32> = serde_json::from_value(c["ids"].clone()).unwrap();
        let got = toks
            .prompt_tokens(Endpoint::Chat, "llama", &c["body"])
            .unwrap()
            .unwrap();
        assert_eq!(
            got, ids,
            "chat {} rendered by python as {:?}",
            c["body"], c["text"]
        );
    }
    // The service starts with it too.
    let s = Server::start(1, &["--tokenizer", &format!("llama={}", dir.display())]);
    let (code, _) = s.get("/healthz");
    assert_eq!(code, 200);
}

/// Every `texts` entry of a tests/py script's output: kvroute's completions ids,
/// with and without special tokens, are python's.
fn same_as_python(toks: &Tokenizers, model: &str, expect: &Value) {
    for t in expect["texts"].as_array().unwrap() {
        let text = t["text"].as_str().unwrap();
        let with: Vec<u32> = serde_json::from_value(t["with_special"].clone()).unwrap();
        let without: Vec<u32> = serde_json::from_value(t["without_special"].clone()).unwrap();
        let got = toks
            .prompt_tokens(Endpoint::Completions, model, &json!({"prompt": text}))
            .unwrap()
            .unwrap();
        assert_eq!(got, with, "{text:?}");
        let got = toks
            .prompt_tokens(
                Endpoint::Completions,
                model,
                &json!({"prompt": text, "add_special_tokens": false}),
            )
            .unwrap()
            .unwrap();
        assert_eq!(got, without, "{text:?}");
    }
}

/// Runs `tests/py/SCRIPT DIR` and returns its JSON output.
fn python_tokenizer(script: &str, dir: &Path) -> Value {
    let script = format!("{}/tests/py/{script}", env!("CARGO_MANIFEST_DIR"));
    let out = Command::new("python3")
        .arg(script)
        .arg(dir)
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A SentencePiece-style tokenizer.json written by python (Metaspace with prepend
/// scheme "first", byte-fallback BPE, as Mistral's exports): loaded, tokenized by
/// the lean walk, and the ids are python's.
#[test]
fn python_sentencepiece_style_files_encode_like_python() {
    if !python_has("tokenizers", "tokenizers") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let expect = python_tokenizer("hf_tokenizer_sp.py", tmp.path());
    let toks = Tokenizers::load(&[("mistral".into(), tmp.path().to_path_buf())]).unwrap();
    assert!(toks.is_lean("mistral"));
    same_as_python(&toks, "mistral", &expect);
}
