//! Chat requests → prompt text, rendered with the model's HF chat template as vLLM
//! renders it (`apply_chat_template`), then tokenized without adding special tokens.
//!
//! HF conventions kept here:
//! - Jinja with `trim_blocks` and `lstrip_blocks`, `{% break %}`/`{% continue %}`,
//!   python string/dict methods (`.strip()`, `.items()`: minijinja-contrib pycompat),
//!   `raise_exception(msg)`, `strftime_now(fmt)` (UTC), and HF's `tojson` (python
//!   `json.dumps` output, not HTML-escaped: [`super::tojson`]). `{% generation %}` tags
//!   (HF's assistant-mask extension) are dropped: they do not change the text.
//! - Context: `messages`, `add_generation_prompt` (the request's, default true), `tools`
//!   and `documents` (none when absent), the special tokens of tokenizer_config.json
//!   (`bos_token`, `eos_token`, `unk_token`, `pad_token`, `sep_token`, `cls_token`,
//!   `mask_token`, `additional_special_tokens`; string or `{content: ..}` form), and the
//!   request's `chat_template_kwargs`.
//! - A named template list (`[{name, template}]`) picks `tool_use` when tools are given
//!   and it exists, else `default`. `chat_template.jinja` in the directory overrides the
//!   config's template (as transformers does).
//! - Messages as vLLM prepares them: `role`, `content`, `name`, `tool_calls` (assistant;
//!   string `arguments` parsed as JSON) and `tool_call_id` (tool). Content given as a
//!   list of parts becomes one string (text parts joined by "\n"), unless the template
//!   iterates over `content` (vLLM's "openai" content format), in which case it stays
//!   a list of `{"type": "text", "text": ..}` parts. Non-text parts (images, audio) are
//!   kept as typed placeholders in the list form and dropped from the string form: the
//!   text before them hashes as the engine's, the engine's placeholder expansion is
//!   not reproduced.
//! - `continue_final_message` (HF/vLLM): the text ends with the final message's
//!   content, without the template's closing tokens.
//!
//! Templates are compiled once at load (a broken template is a start error).
//!
//! A render is bounded in steps (minijinja fuel): `chat_template_fuel` at most
//! ([`ChatTemplates::set_fuel`]; past it the request is refused), and [`QUICK_FUEL`]
//! for a quick render ([`ChatTemplates::render_quick`]), which the proxy tries on the
//! core and, when it runs out, repeats on the core's blocking thread, so a template
//! that turns out costly never holds the core for more than those few steps.

use super::bounds::PromptError;
use minijinja::{Environment, Error, ErrorKind, Value};
use serde_json::{Map, Value as Json};
use std::collections::BTreeMap;

/// Special-token keys of tokenizer_config.json passed to the template.
const SPECIAL_KEYS: [&str; 7] = [
    "bos_token",
    "eos_token",
    "unk_token",
    "pad_token",
    "sep_token",
    "cls_token",
    "mask_token",
];

/// Default of `chat_template_fuel`: template steps one render may take (about 20 ns
/// each: some 40 ms; a chat template takes tens of steps per message).
pub const DEFAULT_FUEL: u64 = 2_000_000;

/// Steps of a quick render (about 0.4 ms), before it is handed to a thread that may
/// wait.
pub const QUICK_FUEL: u64 = 20_000;

/// Why a render did not give a prompt.
#[derive(Debug)]
pub(crate) enum Fail {
    Prompt(PromptError),
    /// It took more steps than its budget.
    OutOfFuel,
}

impl From<PromptError> for Fail {
    fn from(e: PromptError) -> Fail {
        Fail::Prompt(e)
    }
}

/// A model's compiled chat templates and their context constants.
pub struct ChatTemplates {
    /// Renders with `fuel` steps.
    env: Environment<'static>,
    /// The same templates with [`QUICK_FUEL`] steps (at most `fuel`).
    quick: Environment<'static>,
    fuel: u64,
    /// (template name, whether it iterates over message content).
    names: Vec<(String, bool)>,
    specials: BTreeMap<String, Value>,
    /// Some template refuses a system message after the first turn (vLLM's probe for
    /// `/v1/messages`: such models get inline system messages merged into the first).
    system_first: bool,
}

impl ChatTemplates {
    /// The templates of a tokenizer_config.json (and an optional `chat_template.jinja`
    /// that overrides it). Ok(None): the model has no chat template (chat requests for
    /// it are refused, as vLLM refuses them).
    pub fn from_config(
        config: &Json,
        jinja: Option<String>,
    ) -> Result<Option<ChatTemplates>, String> {
        let mut sources: Vec<(String, String)> = Vec::new();
        if let Some(src) = jinja {
            sources.push(("default".into(), src));
        } else {
            match config.get("chat_template") {
                None | Some(Json::Null) => {}
                Some(Json::String(s)) => sources.push(("default".into(), s.clone())),
                Some(Json::Array(list)) => {
                    for t in list {
                        let name = t.get("name").and_then(Json::as_str);
                        let tmpl = t.get("template").and_then(Json::as_str);
                        match (name, tmpl) {
                            (Some(n), Some(s)) => sources.push((n.to_string(), s.to_string())),
                            _ => {
                                return Err(
                                    "chat_template list entries need a name and a template".into()
                                )
                            }
                        }
                    }
                }
                Some(_) => return Err("chat_template must be a string or a list".into()),
            }
        }
        if sources.is_empty() {
            return Ok(None);
        }
        let mut specials = BTreeMap::new();
        for key in SPECIAL_KEYS {
            if let Some(s) = config.get(key).and_then(token_text) {
                specials.insert(key.to_string(), Value::from(s));
            }
        }
        if let Some(Json::Array(list)) = config.get("additional_special_tokens") {
            let v: Vec<String> = list.iter().filter_map(token_text).collect();
            specials.insert("additional_special_tokens".into(), Value::from(v));
        }
        let mut env = new_env();
        let mut names = Vec::new();
        for (name, src) in sources {
            let openai = iterates_content(&src);
            env.add_template_owned(name.clone(), strip_generation_tags(&src))
                .map_err(|e| format!("chat template {name:?}: {e:#}"))?;
            names.push((name, openai));
        }
        let mut t = ChatTemplates {
            quick: env.clone(),
            env,
            fuel: DEFAULT_FUEL,
            names,
            specials,
            system_first: false,
        };
        t.set_fuel(DEFAULT_FUEL);
        t.system_first = t.names.iter().any(|(n, _)| !t.renders_inline_system(n));
        Ok(Some(t))
    }

    /// Whether template `name` renders `[system, user, system, user]` (vLLM's
    /// `_detect_merge_inline_system` probe).
    fn renders_inline_system(&self, name: &str) -> bool {
        let msg = |role: &str| serde_json::json!({"role": role, "content": "t"});
        let msgs = [msg("system"), msg("user"), msg("system"), msg("user")];
        let mut ctx = self.specials.clone();
        ctx.insert("messages".into(), Value::from_serialize(msgs));
        ctx.insert("add_generation_prompt".into(), Value::from(false));
        self.env
            .get_template(name)
            .and_then(|t| t.render(&ctx))
            .is_ok()
    }

    /// Whether a template needs system messages first: an Anthropic request's inline
    /// system messages are then merged into the leading one, as vLLM merges them.
    pub fn system_first(&self) -> bool {
        self.system_first
    }

    /// Bounds a render to `fuel` template steps (at least 1).
    pub fn set_fuel(&mut self, fuel: u64) {
        self.fuel = fuel.max(1);
        self.env.set_fuel(Some(self.fuel));
        self.quick.set_fuel(Some(self.fuel.min(QUICK_FUEL)));
    }

    /// Renders `body` (a chat completions request) to the prompt text, within the
    /// whole fuel (past it, refused).
    pub fn render(&self, body: &Json, max_tokens: usize) -> Result<String, PromptError> {
        self.render_in(&self.env, body, max_tokens)
            .map_err(|f| self.refusal(f))
    }

    /// [`Self::render`] within [`QUICK_FUEL`] steps; `None`: it needs more (render it
    /// again with [`Self::render`] where a wait does no harm).
    pub fn render_quick(
        &self,
        body: &Json,
        max_tokens: usize,
    ) -> Option<Result<String, PromptError>> {
        match self.render_in(&self.quick, body, max_tokens) {
            Ok(t) => Some(Ok(t)),
            Err(Fail::OutOfFuel) if self.fuel > QUICK_FUEL => None,
            Err(f) => Some(Err(self.refusal(f))),
        }
    }

    fn refusal(&self, f: Fail) -> PromptError {
        match f {
            Fail::Prompt(e) => e,
            Fail::OutOfFuel => PromptError(format!(
                "chat template: rendering takes more than {} steps (chat_template_fuel)",
                self.fuel
            )),
        }
    }

    fn render_in(
        &self,
        env: &Environment<'static>,
        body: &Json,
        max_tokens: usize,
    ) -> Result<String, Fail> {
        let messages = match body.get("messages") {
            Some(Json::Array(m)) if !m.is_empty() => m,
            Some(Json::Array(_)) => {
                return Err(PromptError("messages must not be empty".into()).into())
            }
            _ => return Err(PromptError("messages must be a list".into()).into()),
        };
        // Nothing is rendered for a request whose strings alone exceed the limit.
        let mut budget = max_tokens.saturating_mul(super::bounds::BYTES_PER_TOKEN_BOUND);
        for key in ["messages", "tools", "documents", "chat_template_kwargs"] {
            if let Some(v) = body.get(key) {
                if !spend_strings(v, &mut budget) {
                    return Err(PromptError(format!(
                        "prompt too long: the request's text exceeds the limit of {max_tokens} tokens"
                    ))
                    .into());
                }
            }
        }
        let tools = body.get("tools").filter(|t| !t.is_null());
        let (name, openai) = self.pick(tools.is_some())?;
        let msgs = messages
            .iter()
            .map(|m| prepare_message(m, openai))
            .collect::<Result<Vec<Json>, PromptError>>()?;
        let flag = |k: &str, default: bool| match body.get(k) {
            None | Some(Json::Null) => Ok(default),
            Some(Json::Bool(b)) => Ok(*b),
            Some(_) => Err(PromptError(format!("{k} must be a boolean"))),
        };
        let cont = flag("continue_final_message", false)?;
        let agp = flag("add_generation_prompt", !cont)?;
        if cont && agp {
            return Err(PromptError(
                "continue_final_message and add_generation_prompt cannot both be true".into(),
            )
            .into());
        }
        let mut ctx: BTreeMap<String, Value> = self.specials.clone();
        match body.get("chat_template_kwargs") {
            None | Some(Json::Null) => {}
            Some(Json::Object(kw)) => {
                for (k, v) in kw {
                    ctx.insert(k.clone(), Value::from_serialize(v));
                }
            }
            Some(_) => {
                return Err(PromptError("chat_template_kwargs must be an object".into()).into())
            }
        }
        ctx.insert("messages".into(), Value::from_serialize(&msgs));
        ctx.insert("add_generation_prompt".into(), Value::from(agp));
        for key in ["tools", "documents"] {
            let v = body.get(key).filter(|v| !v.is_null());
            ctx.insert(
                key.into(),
                v.map(Value::from_serialize).unwrap_or(Value::from(())),
            );
        }
        let tmpl = env
            .get_template(name)
            .map_err(|e| PromptError(format!("chat template: {e}")))?;
        let mut text = tmpl.render(&ctx).map_err(|e| match e.kind() {
            ErrorKind::OutOfFuel => Fail::OutOfFuel,
            _ => Fail::Prompt(PromptError(format!("chat template: {}", describe(&e)))),
        })?;
        if cont {
            text = cut_after_final_message(text, msgs.last())?;
        }
        Ok(text)
    }

    fn pick(&self, with_tools: bool) -> Result<(&str, bool), PromptError> {
        if self.names.len() == 1 {
            let (n, o) = &self.names[0];
            return Ok((n, *o));
        }
        let find = |want: &str| self.names.iter().find(|(n, _)| n == want);
        let hit = if with_tools { find("tool_use") } else { None }.or_else(|| find("default"));
        hit.map(|(n, o)| (n.as_str(), *o)).ok_or_else(|| {
            PromptError("the model's chat templates have no \"default\" template".into())
        })
    }
}

fn new_env() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", |msg: String| -> Result<Value, Error> {
        Err(Error::new(ErrorKind::InvalidOperation, msg))
    });
    env.add_function("strftime_now", |fmt: String| -> Result<String, Error> {
        jiff::fmt::strtime::format(fmt.as_str(), jiff::Timestamp::now())
            .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("strftime_now: {e}")))
    });
    env.add_filter("tojson", super::tojson::tojson);
    env
}

/// The message of a template error (raise_exception's text as given).
fn describe(e: &Error) -> String {
    match (e.kind(), e.detail()) {
        (ErrorKind::InvalidOperation, Some(d)) => d.to_string(),
        _ => format!("{e:#}"),
    }
}

/// A special token's text: a string, or the `content` of the AddedToken form.
fn token_text(v: &Json) -> Option<String> {
    match v {
        Json::String(s) => Some(s.clone()),
        Json::Object(o) => o.get("content").and_then(Json::as_str).map(str::to_string),
        _ => None,
    }
}

/// Subtracts the bytes of every string in `v` from `budget`; false once exceeded.
fn spend_strings(v: &Json, budget: &mut usize) -> bool {
    match v {
        Json::String(s) => match budget.checked_sub(s.len()) {
            Some(b) => {
                *budget = b;
                true
            }
            None => false,
        },
        Json::Array(a) => a.iter().all(|x| spend_strings(x, budget)),
        Json::Object(o) => o.iter().all(|(k, x)| {
            *budget = budget.saturating_sub(k.len());
            spend_strings(x, budget)
        }),
        _ => true,
    }
}

/// One message as vLLM hands it to the template.
fn prepare_message(m: &Json, openai: bool) -> Result<Json, PromptError> {
    let o = m
        .as_object()
        .ok_or_else(|| PromptError("each message must be an object".into()))?;
    let role = o
        .get("role")
        .and_then(Json::as_str)
        .ok_or_else(|| PromptError("each message needs a string role".into()))?;
    let mut out = Map::new();
    out.insert("role".into(), Json::String(role.into()));
    out.insert("content".into(), content(o.get("content"), openai)?);
    if role == "assistant" {
        if let Some(Json::Array(calls)) = o.get("tool_calls") {
            let calls = calls.iter().map(parse_tool_call).collect();
            out.insert("tool_calls".into(), Json::Array(calls));
        }
    }
    if role == "tool" {
        if let Some(id) = o.get("tool_call_id") {
            out.insert("tool_call_id".into(), id.clone());
        }
    }
    if let Some(Json::String(n)) = o.get("name") {
        out.insert("name".into(), Json::String(n.clone()));
    }
    Ok(Json::Object(out))
}

/// A tool call with its string `function.arguments` parsed as JSON (templates expect a
/// mapping, as vLLM passes it); arguments that are not JSON stay a string.
fn parse_tool_call(c: &Json) -> Json {
    let mut c = c.clone();
    if let Some(Json::Object(f)) = c.get_mut("function") {
        if let Some(Json::String(a)) = f.get("arguments") {
            if let Ok(parsed) = serde_json::from_str::<Json>(a) {
                f.insert("arguments".into(), parsed);
            }
        }
    }
    c
}

/// A message's content in the template's format (module docs).
fn content(c: Option<&Json>, openai: bool) -> Result<Json, PromptError> {
    let parts: Vec<Part> = match c {
        None | Some(Json::Null) => Vec::new(),
        Some(Json::String(s)) => vec![Part::Text(s.clone())],
        Some(Json::Array(list)) => list.iter().map(part).collect::<Result<_, _>>()?,
        Some(_) => {
            return Err(PromptError(
                "message content must be a string or a list of parts".into(),
            ))
        }
    };
    if openai {
        let list = parts
            .into_iter()
            .map(|p| match p {
                Part::Text(t) => serde_json::json!({"type": "text", "text": t}),
                Part::Other(kind) => serde_json::json!({ "type": kind }),
            })
            .collect();
        return Ok(Json::Array(list));
    }
    let texts: Vec<String> = parts
        .into_iter()
        .filter_map(|p| match p {
            Part::Text(t) => Some(t),
            Part::Other(_) => None,
        })
        .collect();
    Ok(Json::String(texts.join("\n")))
}

enum Part {
    Text(String),
    /// A non-text part, by its placeholder type (`image`, `audio`, `video`).
    Other(&'static str),
}

fn part(p: &Json) -> Result<Part, PromptError> {
    if let Json::String(s) = p {
        return Ok(Part::Text(s.clone()));
    }
    let kind = p
        .get("type")
        .and_then(Json::as_str)
        .ok_or_else(|| PromptError("each content part needs a type".into()))?;
    let field = |k: &str| {
        p.get(k)
            .and_then(Json::as_str)
            .map(|s| Part::Text(s.to_string()))
            .ok_or_else(|| PromptError(format!("a {kind} content part needs a string {k}")))
    };
    match kind {
        "text" | "input_text" => field("text"),
        "refusal" => field("refusal"),
        "image_url" | "input_image" | "image" | "image_pil" | "image_embeds" => {
            Ok(Part::Other("image"))
        }
        "input_audio" | "audio_url" | "audio" => Ok(Part::Other("audio")),
        "video_url" | "video" => Ok(Part::Other("video")),
        other => Err(PromptError(format!("unknown content part type {other:?}"))),
    }
}

/// HF's `continue_final_message`: the text up to the end of the final message's
/// content.
fn cut_after_final_message(text: String, last: Option<&Json>) -> Result<String, PromptError> {
    let content = last.and_then(|m| m.get("content"));
    let fin: &str = match content {
        Some(Json::String(s)) => s,
        Some(Json::Array(parts)) => parts
            .iter()
            .rev()
            .find_map(|p| p.get("text").and_then(Json::as_str))
            .ok_or_else(|| {
                PromptError("continue_final_message: the final message has no text".into())
            })?,
        _ => {
            return Err(PromptError(
                "continue_final_message: no final message".into(),
            ))
        }
    };
    let stripped = fin.trim();
    let loc = text.rfind(stripped).ok_or_else(|| {
        PromptError("continue_final_message: the template does not echo the final message".into())
    })?;
    let lead = fin.trim_start();
    let end = if text[loc..].starts_with(lead) {
        loc + lead.len()
    } else {
        loc + stripped.len()
    };
    let mut text = text;
    text.truncate(end);
    Ok(text)
}

/// Whether the template loops over a message's `content` (`{% for p in
/// message['content'] %}`): vLLM then passes content as a list of parts.
pub fn iterates_content(src: &str) -> bool {
    tags(src).any(|inner| {
        let t = inner.trim();
        t.strip_prefix("for ")
            .and_then(|rest| rest.split_once(" in "))
            .is_some_and(|(_, iter)| iter.contains("content"))
    })
}

/// The inner text of every `{% .. %}` tag, without the `-`/`+` trim markers.
fn tags(src: &str) -> impl Iterator<Item = &str> {
    let mut rest = src;
    std::iter::from_fn(move || {
        let start = rest.find("{%")?;
        let after = &rest[start + 2..];
        let end = after.find("%}")?;
        let inner = &after[..end];
        rest = &after[end + 2..];
        let inner = inner.strip_prefix(['-', '+']).unwrap_or(inner);
        let inner = inner.strip_suffix(['-', '+']).unwrap_or(inner);
        Some(inner)
    })
}

/// Drops `{% generation %}` / `{% endgeneration %}` tags (HF's AssistantTracker).
pub fn strip_generation_tags(src: &str) -> String {
    let mut out = String::with_capacity(src.len());
    let mut rest = src;
    while let Some(start) = rest.find("{%") {
        let after = &rest[start + 2..];
        let Some(end) = after.find("%}") else { break };
        let inner = &after[..end];
        let word = inner.trim_matches(|c: char| c == '-' || c == '+' || c.is_whitespace());
        out.push_str(&rest[..start]);
        if word != "generation" && word != "endgeneration" {
            out.push_str(&rest[start..start + 2 + end + 2]);
        }
        rest = &after[end + 2..];
    }
    out.push_str(rest);
    out
}
