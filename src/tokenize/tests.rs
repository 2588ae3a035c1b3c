//! Unit tests of the tokenize module, on the test tokenizer of `testing` (word `tN` is
//! id N) with its own or a test-specific tokenizer_config.json.

use super::testing::{self, extra_id, text_of};
use super::*;
use serde_json::{json, Value};

const V: u32 = 100;

fn e(s: &str) -> u32 {
    extra_id(V, s).unwrap()
}

/// A tokenizer directory with the builder's tokenizer.json and `config` (None: the
/// builder's tokenizer_config.json).
fn dir_with(config: Option<Value>) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    testing::write_dir(d.path(), V).unwrap();
    if let Some(c) = config {
        std::fs::write(d.path().join("tokenizer_config.json"), c.to_string()).unwrap();
    }
    d
}

fn load(config: Option<Value>) -> (tempfile::TempDir, Tokenizers) {
    let d = dir_with(config);
    let t = Tokenizers::load(&[("m".into(), d.path().to_path_buf())]).unwrap();
    (d, t)
}

fn with_template(tmpl: &str) -> (tempfile::TempDir, Tokenizers) {
    load(Some(json!({
        "bos_token": "<s>",
        "eos_token": {"__type": "AddedToken", "content": "</s>", "lstrip": false},
        "chat_template": tmpl,
    })))
}

fn chat(t: &Tokenizers, body: Value) -> Result<Vec<u32>, PromptError> {
    t.prompt_tokens(Endpoint::Chat, "m", &body)
        .map(|o| o.unwrap())
}

fn comp(t: &Tokenizers, body: Value) -> Result<Option<Vec<u32>>, PromptError> {
    t.prompt_tokens(Endpoint::Completions, "m", &body)
}

/// The rendered text of a chat body (the template alone, no tokenizer).
fn render(t: &Tokenizers, body: Value) -> Result<String, PromptError> {
    let m = t.resolve("m").unwrap();
    m.chat
        .as_ref()
        .unwrap()
        .render(&body, t.max_prompt_tokens())
}

fn user(content: Value) -> Value {
    json!({"messages": [{"role": "user", "content": content}]})
}

#[test]
fn completions_string_adds_bos_and_maps_words_to_ids() {
    let (_d, t) = load(None);
    let ids = comp(&t, json!({"model": "m", "prompt": "t5 t17 t3"}))
        .unwrap()
        .unwrap();
    assert_eq!(ids, vec![e("<s>"), 5, 17, 3]);
    let ids = comp(&t, json!({"prompt": "t5 t17", "add_special_tokens": false})).unwrap();
    assert_eq!(ids.unwrap(), vec![5, 17]);
    // Special tokens inside the text are matched as such; unknown words are <unk>.
    let ids = comp(
        &t,
        json!({"prompt": "t1</s>word", "add_special_tokens": false}),
    )
    .unwrap();
    assert_eq!(ids.unwrap(), vec![1, e("</s>"), e("<unk>")]);
    assert_eq!(text_of(&[3, 4]), "t3 t4");
}

#[test]
fn completions_lists_route_on_the_first_prompt() {
    let (_d, t) = load(None);
    let ids = comp(&t, json!({"prompt": ["t1 t2", "t9"]}))
        .unwrap()
        .unwrap();
    assert_eq!(ids, vec![e("<s>"), 1, 2]);
    let ids = comp(&t, json!({"prompt": [7, 8, 9]})).unwrap().unwrap();
    assert_eq!(
        ids,
        vec![7, 8, 9],
        "token ids are used as given, no BOS added"
    );
    let ids = comp(&t, json!({"prompt": [[4, 5], [6]]})).unwrap().unwrap();
    assert_eq!(ids, vec![4, 5]);
    for bad in [
        json!({"prompt": []}),
        json!({"prompt": ["t1", 2]}),
        json!({"prompt": [[1], 2]}),
        json!({"prompt": [[]]}),
        json!({"prompt": [1, -2]}),
        json!({"prompt": [1, 2.5]}),
        json!({"prompt": [1, 4294967296u64]}),
        json!({"prompt": [{"a": 1}]}),
        json!({"prompt": 5}),
        json!({"prompt": null}),
        json!({"nothing": 1}),
        json!({"prompt": "t1", "add_special_tokens": "yes"}),
    ] {
        assert!(comp(&t, bad.clone()).is_err(), "{bad}");
    }
    // Ids are checked against the vocabulary (with added tokens: 100 + 9 here).
    let err = comp(&t, json!({"prompt": [1, 109]})).unwrap_err();
    assert!(err.0.contains("out of vocabulary"), "{err}");
    assert!(comp(&t, json!({"prompt": [108]})).is_ok());
}

#[test]
fn models_without_a_tokenizer_give_none_except_for_token_ids() {
    let (_d, t) = load(None);
    let body = json!({"prompt": "t1 t2"});
    assert_eq!(
        t.prompt_tokens(Endpoint::Completions, "x", &body).unwrap(),
        None
    );
    assert_eq!(
        t.prompt_tokens(Endpoint::Chat, "x", &user(json!("t1")))
            .unwrap(),
        None
    );
    let body = json!({"prompt": [1_000_000, 2]});
    let ids = t.prompt_tokens(Endpoint::Completions, "x", &body).unwrap();
    assert_eq!(ids, Some(vec![1_000_000, 2]));
    assert!(!t.has("x") && t.has("m"));
    let empty = Tokenizers::empty();
    assert!(!empty.has("m"));
    assert_eq!(
        empty
            .prompt_tokens(Endpoint::Chat, "m", &user(json!("t1")))
            .unwrap(),
        None
    );
}

#[test]
fn prompt_size_limits_hold_before_and_after_tokenizing() {
    let (_d, t) = load(None);
    let t = t.with_max_prompt_tokens(10);
    let ids: Vec<u32> = (0..11).collect();
    assert!(comp(&t, json!({"prompt": ids}))
        .unwrap_err()
        .0
        .contains("too long"));
    assert!(comp(&t, json!({"prompt": (0..10).collect::<Vec<u32>>()})).is_ok());
    // 11 words → 12 tokens with BOS: refused after tokenizing.
    let text = text_of(&(0..11).collect::<Vec<u32>>());
    assert!(text.len() <= 10 * BYTES_PER_TOKEN_BOUND);
    assert!(comp(&t, json!({"prompt": text}))
        .unwrap_err()
        .0
        .contains("tokens"));
    // Text beyond the byte bound is refused from its length alone.
    let huge = "t1 ".repeat(200);
    let err = comp(&t, json!({"prompt": huge})).unwrap_err();
    assert!(err.0.contains("bytes"), "{err}");
    let err = chat(&t, user(json!("t1 ".repeat(200)))).unwrap_err();
    assert!(err.0.contains("too long"), "{err}");
    let err = chat(&t, user(json!(text))).unwrap_err();
    assert!(err.0.contains("too long"), "{err}");
}

#[test]
fn chat_renders_the_template_without_adding_bos_twice() {
    let (_d, t) = load(None);
    let ids = chat(&t, user(json!("t1 t2"))).unwrap();
    let prompt = vec![
        e("<s>"),
        e("<|im_start|>"),
        e("user"),
        1,
        2,
        e("<|im_end|>"),
    ];
    let mut want = prompt.clone();
    want.extend([e("<|im_start|>"), e("assistant")]);
    assert_eq!(ids, want);
    // add_generation_prompt false; add_special_tokens true adds the post-processor's BOS.
    let mut body = user(json!("t1 t2"));
    body["add_generation_prompt"] = json!(false);
    assert_eq!(chat(&t, body.clone()).unwrap(), prompt);
    body["add_special_tokens"] = json!(true);
    assert_eq!(chat(&t, body).unwrap()[..2], [e("<s>"), e("<s>")]);
    // Unknown roles raise the template's exception.
    let err = chat(
        &t,
        json!({"messages": [{"role": "wizard", "content": "t1"}]}),
    )
    .unwrap_err();
    assert!(err.0.contains("unknown role wizard"), "{err}");
}

#[test]
fn content_parts_are_joined_for_string_templates() {
    let (_d, t) = load(None);
    let parts = json!([
        {"type": "text", "text": "t1 t2"},
        {"type": "image_url", "image_url": {"url": "data:"}},
        "t3",
        {"type": "text", "text": "t4"}
    ]);
    let text = render(&t, user(parts.clone())).unwrap();
    assert!(text.contains("user\nt1 t2\nt3\nt4<|im_end|>"), "{text:?}");
    let ids = chat(&t, user(parts)).unwrap();
    assert_eq!(ids[3..7], [1, 2, 3, 4]);
    // Null content (an assistant turn with only tool calls) renders as empty.
    let body = json!({"messages": [{"role": "assistant", "content": null}]});
    assert!(render(&t, body).unwrap().contains("assistant\n<|im_end|>"));
    for bad in [
        json!({"messages": []}),
        json!({"messages": "hi"}),
        json!({}),
        json!({"messages": [{"content": "t1"}]}),
        json!({"messages": ["t1"]}),
        user(json!(5)),
        user(json!([{"type": "text"}])),
        user(json!([{"type": "hologram"}])),
        user(json!([{"text": "no type"}])),
    ] {
        assert!(chat(&t, bad.clone()).is_err(), "{bad}");
    }
}

#[test]
fn templates_that_iterate_content_get_the_parts_list() {
    let tmpl = "{% for m in messages %}[{% for p in m['content'] %}{{ p['type'] }}:{{ p['text'] }};{% endfor %}]{% endfor %}";
    assert!(chat::iterates_content(tmpl));
    assert!(!chat::iterates_content(testing::CHAT_TEMPLATE));
    assert!(chat::iterates_content(
        "{%- for c in message.content -%}{% endfor %}"
    ));
    let (_d, t) = with_template(tmpl);
    let text = render(
        &t,
        user(json!([{"type": "text", "text": "a"}, {"type": "image_url"}])),
    )
    .unwrap();
    assert_eq!(text, "[text:a;image:;]");
    // A string content becomes one text part.
    assert_eq!(render(&t, user(json!("b"))).unwrap(), "[text:b;]");
}

/// Booleans print as python prints them (`True`), as in transformers.
#[test]
fn hf_conventions_special_tokens_tools_kwargs_and_python_methods() {
    let tmpl = concat!(
        "{{ bos_token }}|{{ eos_token }}|{{ unk_token is defined }}|",
        "{% if tools is not none %}{% for t in tools %}{{ t | tojson }}{% endfor %}{% endif %}|",
        "{{ documents is none }}|{{ enable_thinking }}|",
        "{% for m in messages %}{{ m['content'].strip().upper() }}",
        "{% if m.tool_calls %}{{ m.tool_calls[0].function.arguments.city }}{% endif %}",
        "{% if loop.index == 1 %}{% continue %}{% endif %}!{% endfor %}",
        "{% generation %}G{% endgeneration %}"
    );
    let (_d, t) = with_template(tmpl);
    let body = json!({
        "messages": [
            {"role": "user", "content": "  hi  "},
            {"role": "assistant", "content": "ok", "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "w", "arguments": "{\"city\": \"Zürich\"}"}}
            ]}
        ],
        "tools": [{"type": "function", "function": {"name": "w", "parameters": {"b": [1, 2.5, "é\n"], "a": null}}}],
        "chat_template_kwargs": {"enable_thinking": false},
    });
    let text = render(&t, body).unwrap();
    assert_eq!(
        text,
        "<s>|</s>|False|{\"type\": \"function\", \"function\": {\"name\": \"w\", \"parameters\": {\"b\": [1, 2.5, \"é\\n\"], \"a\": null}}}|True|False|HIOKZürich!G"
    );
}

#[test]
fn tojson_matches_python_json_dumps() {
    let (_d, t) = with_template(concat!(
        "{{ obj | tojson(indent=2) }}#",
        "{{ obj | tojson(ensure_ascii=true, separators=[',', ':']) }}#",
        "{{ 1.0 | tojson }} {{ 1e20 | tojson }} {{ 0.5 | tojson }} {{ [] | tojson(indent=2) }}"
    ));
    let mut body = user(json!("x"));
    body["chat_template_kwargs"] = json!({"obj": {"k": ["é", 1], "e": {}}});
    let text = render(&t, body).unwrap();
    assert_eq!(
        text,
        "{\n  \"k\": [\n    \"é\",\n    1\n  ],\n  \"e\": {}\n}#{\"k\":[\"\\u00e9\",1],\"e\":{}}#1.0 1e+20 0.5 []"
    );
}

#[test]
fn generation_prompt_flags_and_continue_final_message() {
    let (_d, t) = load(None);
    let mut body = json!({"messages": [
        {"role": "user", "content": "t1"},
        {"role": "assistant", "content": "t2 t3 "}
    ], "continue_final_message": true});
    let text = render(&t, body.clone()).unwrap();
    assert!(text.ends_with("<|im_start|>assistant\nt2 t3 "), "{text:?}");
    body["add_generation_prompt"] = json!(true);
    assert!(render(&t, body.clone()).is_err());
    body["add_generation_prompt"] = json!("yes");
    assert!(render(&t, body).is_err());
}

#[test]
fn raise_exception_strftime_and_missing_templates() {
    let (_d, t) = with_template("{{ raise_exception('Conversation roles must alternate') }}");
    let err = chat(&t, user(json!("t1"))).unwrap_err();
    assert_eq!(
        err.to_string(),
        "chat template: Conversation roles must alternate"
    );
    let (_d, t) = with_template("{{ strftime_now('%Y') }}");
    let y = render(&t, user(json!("x"))).unwrap();
    assert!(y.len() == 4 && y.starts_with('2'), "{y}");
    // No chat template: chat is refused, completions work.
    let (_d, t) = load(Some(json!({"bos_token": "<s>"})));
    let err = chat(&t, user(json!("t1"))).unwrap_err();
    assert!(err.0.contains("no chat template"), "{err}");
    assert!(comp(&t, json!({"prompt": "t1"})).is_ok());
    // Without tokenizer_config.json at all, too.
    let d = dir_with(None);
    std::fs::remove_file(d.path().join("tokenizer_config.json")).unwrap();
    let t = Tokenizers::load(&[("m".into(), d.path().to_path_buf())]).unwrap();
    assert!(chat(&t, user(json!("t1"))).is_err());
    // A template that fails at render time (undefined.attr) is a PromptError.
    let (_d, t) = with_template("{{ nothing.at.all }}");
    assert!(chat(&t, user(json!("t1")))
        .unwrap_err()
        .0
        .starts_with("chat template"));
}

#[test]
fn named_templates_and_the_jinja_file() {
    let (d, t) = load(Some(json!({"chat_template": [
        {"name": "default", "template": "D{{ messages | length }}"},
        {"name": "tool_use", "template": "T{{ tools | length }}"}
    ]})));
    assert_eq!(render(&t, user(json!("x"))).unwrap(), "D1");
    let mut body = user(json!("x"));
    body["tools"] = json!([{"type": "function"}]);
    assert_eq!(render(&t, body).unwrap(), "T1");
    // chat_template.jinja overrides the config's templates.
    std::fs::write(d.path().join("chat_template.jinja"), "J{{ bos_token }}").unwrap();
    let t = Tokenizers::load(&[("m".into(), d.path().to_path_buf())]).unwrap();
    assert_eq!(render(&t, user(json!("x"))).unwrap(), "J");
    let (_d, t) = load(Some(
        json!({"chat_template": [{"name": "other", "template": "O"}, {"name": "x", "template": "X"}]}),
    ));
    assert!(render(&t, user(json!("x"))).is_err());
}

#[test]
fn load_errors_name_the_model_and_the_problem() {
    let d = dir_with(None);
    let p = d.path().to_path_buf();
    let err = Tokenizers::load(&[("a".into(), p.clone()), ("a".into(), p.clone())]).unwrap_err();
    assert!(err.contains("twice"), "{err}");
    assert!(Tokenizers::load(&[("".into(), p.clone())]).is_err());
    for (cfg, what) in [
        ("not json", "not JSON"),
        ("[1]", "not a JSON object"),
        ("{\"chat_template\": 5}", "string or a list"),
        (
            "{\"chat_template\": [{\"name\": \"x\"}]}",
            "name and a template",
        ),
        ("{\"chat_template\": \"{% if %}\"}", "chat template"),
    ] {
        std::fs::write(p.join("tokenizer_config.json"), cfg).unwrap();
        let err = Tokenizers::load(&[("a".into(), p.clone())]).unwrap_err();
        assert!(
            err.contains("model \"a\"") && err.contains(what),
            "{cfg}: {err}"
        );
    }
}

#[test]
fn adapters_use_the_base_tokenizer_and_their_own_hash_space() {
    let (_d, t) = load(None);
    let t = t.with_adapters(&[("sql".into(), "m".into())]).unwrap();
    assert!(t.has("sql"));
    assert_eq!(t.lora_for("sql"), Some("sql"));
    assert_eq!(t.lora_for("m"), None);
    assert_eq!(t.base_model("sql"), "m");
    let body = json!({"prompt": "t1 t2 t3 t4"});
    let ids = t
        .prompt_tokens(Endpoint::Completions, "sql", &body)
        .unwrap()
        .unwrap();
    let r = t.route_request("r".into(), "sql", ids.clone());
    assert_eq!(r.model.as_deref(), Some("m"));
    assert_eq!(r.lora_name.as_deref(), Some("sql"));
    assert_eq!(r.input_tokens, Some(ids.len() as u32));
    // The router hashes them as the engine adapter hashes the adapter's events.
    let p = r.prepare(2, 100).unwrap();
    assert_eq!(
        p.hashes,
        crate::engines::salted_sequence_hashes(&ids, 2, Some("sql"))
    );
    let plain = t.route_request("r".into(), "m", ids.clone());
    assert_eq!(plain.lora_name, None);
    let p = plain.prepare(2, 100).unwrap();
    assert_eq!(
        p.hashes,
        crate::engines::salted_sequence_hashes(&ids, 2, None)
    );
    let (_d, t) = load(None);
    assert!(t.with_adapters(&[("sql".into(), "nope".into())]).is_err());
    let (_d, t) = load(None);
    assert!(t.with_adapters(&[("m".into(), "m".into())]).is_err());
}

#[test]
fn generation_tags_are_dropped_and_other_tags_kept() {
    assert_eq!(
        chat::strip_generation_tags(
            "a{% generation %}b{%- endgeneration -%}c{% if x %}d{% endif %}"
        ),
        "abc{% if x %}d{% endif %}"
    );
    assert_eq!(
        chat::strip_generation_tags("{% unterminated"),
        "{% unterminated"
    );
}

#[test]
fn tokenizers_are_shared_across_cores() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Tokenizers>();
    send_sync::<std::sync::Arc<Tokenizers>>();
    let t = testing::in_memory("m", 10).unwrap();
    let ids = comp(&t, json!({"prompt": "t1 t9"})).unwrap().unwrap();
    assert_eq!(ids, vec![extra_id(10, "<s>").unwrap(), 1, 9]);
}

#[test]
fn a_render_is_bounded_in_steps_and_a_quick_one_gives_up_early() {
    // 10^8 loop steps, no output: what a costly template looks like.
    let costly = "{% for a in range(10000) %}{% for b in range(10000) %}{% endfor %}{% endfor %}x";
    let (_d, t) = with_template(costly);
    let body = user(json!("t1"));
    let e = chat(&t, body.clone()).unwrap_err();
    assert!(e.0.contains("chat_template_fuel"), "{e}");
    let quick = t.prompt_tokens_quick(Endpoint::Chat, "m", &body);
    assert!(quick.is_none(), "{quick:?}");
    // A cheap one renders quickly, with the same ids as the full render.
    let (_d, t) = with_template("{% for m in messages %}{{ m['content'] }}{% endfor %}");
    let quick = t.prompt_tokens_quick(Endpoint::Chat, "m", &body).unwrap();
    assert_eq!(quick.unwrap().unwrap(), chat(&t, body.clone()).unwrap());
    // Within a larger fuel, a render of some 30,000 steps: not quick, but allowed.
    let mid = "{% for a in range(10000) %}{% endfor %}{{ messages[0]['content'] }}";
    let (_d, t) = with_template(mid);
    assert!(t.prompt_tokens_quick(Endpoint::Chat, "m", &body).is_none());
    assert_eq!(chat(&t, body.clone()).unwrap(), vec![1]);
    let t = t.with_template_fuel(100);
    assert!(chat(&t, body.clone()).unwrap_err().0.contains("100 steps"));
    // Under the quick budget, running out is a refusal right away.
    let e = t.prompt_tokens_quick(Endpoint::Chat, "m", &body).unwrap();
    assert!(e.unwrap_err().0.contains("chat_template_fuel"));
}
