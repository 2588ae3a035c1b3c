//! Prompt token ids of OpenAI requests, computed as the inference engine computes them,
//! so the router hashes the same blocks the engine will cache.
//!
//! Per model, a HuggingFace tokenizer directory (`tokenizer.json`, optionally
//! `tokenizer_config.json` and `chat_template.jinja`) is loaded once at start
//! ([`Tokenizers::load`]); every core shares the result through an `Arc` (it is
//! `Send + Sync`, and encoding takes `&self`).
//!
//! - **Chat** (`/v1/chat/completions`): `messages` are rendered with the model's chat
//!   template (HF conventions, see [`chat`]) and the text is tokenized *without* adding
//!   special tokens again, as vLLM does for chat (the template writes `bos_token`
//!   itself). A request's `add_special_tokens` (bool) overrides that, as in vLLM.
//! - **Completions** (`/v1/completions`): `prompt` is a string (tokenized *with*
//!   special tokens, as vLLM does, unless the request says `add_special_tokens: false`),
//!   a list of strings (a batch: kvroute routes the whole request on the **first**
//!   prompt, since one request goes to one worker), a list of token ids, or a list of
//!   token-id lists (again the first). See [`prompt`].
//! - **Bounds**: prompts above `max_prompt_tokens` are refused ([`PromptError`]); text
//!   longer than [`BYTES_PER_TOKEN_BOUND`] bytes per allowed token is refused before it
//!   is rendered or tokenized, so no request makes the tokenizer walk gigabytes; a chat
//!   render takes at most `chat_template_fuel` template steps ([`chat`]), and
//!   [`Tokenizers::prompt_tokens_quick`] gives up after [`chat::QUICK_FUEL`] for a caller
//!   that must not wait (it finishes the work elsewhere).
//!
//! Model names are matched exactly; a name registered with
//! [`Tokenizers::with_adapters`] as a LoRA adapter of a base model uses the base
//! model's tokenizer and is hashed in the adapter's hash space.
//!
//! ## From token ids to a routing request
//! The router hashes `RouteRequest.tokens` itself, salted by `lora_name` exactly as the
//! engine adapter salts the engine's events for that adapter (`engines::lora_salt`), so a
//! proxy only fills the request: [`Tokenizers::route_request`] does it (model, tokens,
//! `input_tokens`, and `lora_name` for an adapter). Tokenization time: the caller times
//! [`Tokenizers::prompt_tokens`] (it is synchronous and does no I/O).

mod bounds;
pub mod chat;
pub mod fixture;
pub mod given;
pub mod id_list;
mod ids;
mod lean;
#[cfg(test)]
mod lean_tests;
mod model;
pub mod pipelines;
pub mod prompt;
pub mod testing;
pub mod tojson;
mod words;

#[cfg(test)]
mod tests;

pub use bounds::{PromptError, BYTES_PER_TOKEN_BOUND, DEFAULT_MAX_PROMPT_TOKENS};
pub(crate) use model::Model;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Largest `tokenizer.json` / `tokenizer_config.json` / template file read (bytes).
pub const MAX_TOKENIZER_FILE_BYTES: u64 = 512 << 20;

/// Which OpenAI endpoint a body belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// `POST /v1/completions`: `prompt`.
    Completions,
    /// `POST /v1/chat/completions`: `messages`.
    Chat,
}

/// The tokenizers of every configured model.
pub struct Tokenizers {
    models: HashMap<String, Arc<Model>>,
    /// adapter name → base model name.
    adapters: HashMap<String, String>,
    max_prompt_tokens: usize,
}

impl std::fmt::Debug for Tokenizers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut names: Vec<&String> = self.models.keys().collect();
        names.sort();
        f.debug_struct("Tokenizers")
            .field("models", &names)
            .field("adapters", &self.adapters)
            .field("max_prompt_tokens", &self.max_prompt_tokens)
            .finish()
    }
}

impl Tokenizers {
    /// Loads `(model, directory)` pairs. Any unreadable or broken file (tokenizer.json,
    /// tokenizer_config.json, chat template) is an error naming the model and file.
    pub fn load(models: &[(String, PathBuf)]) -> Result<Tokenizers, String> {
        let mut out = Tokenizers::empty();
        for (name, dir) in models {
            if name.is_empty() {
                return Err("tokenizer: empty model name".into());
            }
            if out.models.contains_key(name) {
                return Err(format!("tokenizer: model {name:?} given twice"));
            }
            let m = load_dir(dir).map_err(|e| format!("tokenizer for model {name:?}: {e}"))?;
            out.models.insert(name.clone(), Arc::new(m));
        }
        Ok(out)
    }

    /// No tokenizers: every request is routed by load only.
    pub fn empty() -> Tokenizers {
        Tokenizers {
            models: HashMap::new(),
            adapters: HashMap::new(),
            max_prompt_tokens: DEFAULT_MAX_PROMPT_TOKENS,
        }
    }

    /// `false`: every prompt through HF's pipeline, never the lean walk
    /// (`tokenize::lean`; on by default wherever it is exact).
    pub fn with_lean(mut self, on: bool) -> Tokenizers {
        if !on {
            // Builders run before the set is shared, so each model is still unique.
            for m in self.models.values_mut() {
                if let Some(m) = Arc::get_mut(m) {
                    m.lean = None;
                }
            }
        }
        self
    }

    /// Bounds every chat render to `fuel` template steps (`chat_template_fuel`;
    /// default [`chat::DEFAULT_FUEL`]).
    pub fn with_template_fuel(mut self, fuel: u64) -> Tokenizers {
        // Builders run before the set is shared, so each model is still unique.
        for m in self.models.values_mut() {
            if let Some(c) = Arc::get_mut(m).and_then(|m| m.chat.as_mut()) {
                c.set_fuel(fuel);
            }
        }
        self
    }

    /// Sets the prompt size limit (tokens; at least 1).
    pub fn with_max_prompt_tokens(mut self, n: usize) -> Tokenizers {
        self.max_prompt_tokens = n.max(1);
        self
    }

    /// Registers LoRA adapters `(adapter, base model)`: a request naming the adapter uses
    /// the base model's tokenizer, and its blocks are hashed under the adapter's salt
    /// (vLLM names an adapter's cached blocks with the adapter's served name, the one
    /// requests give as `model`). The base model must have a tokenizer.
    pub fn with_adapters(mut self, adapters: &[(String, String)]) -> Result<Tokenizers, String> {
        for (a, base) in adapters {
            if a.is_empty() || a.len() > crate::engine::request::MAX_LORA_NAME {
                return Err(format!("lora adapter name {a:?} must be 1..=65535 bytes"));
            }
            if self.models.contains_key(a) {
                return Err(format!(
                    "lora adapter {a:?} is also a model with a tokenizer"
                ));
            }
            if !self.models.contains_key(base) {
                return Err(format!(
                    "lora adapter {a:?}: base model {base:?} has no tokenizer"
                ));
            }
            self.adapters.insert(a.clone(), base.clone());
        }
        Ok(self)
    }

    /// Whether `model`'s prompts take the lean walk of its pipeline (`tokenize::lean`:
    /// exact for this tokenizer, checked at load and on sampled prompts).
    pub fn is_lean(&self, model: &str) -> bool {
        self.resolve(model).is_some_and(Model::is_lean)
    }

    /// The configured models, sorted.
    pub fn models(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.models.keys().map(String::as_str).collect();
        names.sort_unstable();
        names
    }

    /// Sampled prompts whose lean ids differed from HF's, over all models (each turns
    /// its model's lean path off).
    pub fn lean_mismatches(&self) -> u64 {
        self.models
            .values()
            .filter_map(|m| m.lean.as_ref())
            .map(lean::Lean::mismatches)
            .sum()
    }

    /// A tokenizer exists for `model` (its own, or its base model's for an adapter).
    pub fn has(&self, model: &str) -> bool {
        self.resolve(model).is_some()
    }

    /// The prompt size limit in tokens.
    pub fn max_prompt_tokens(&self) -> usize {
        self.max_prompt_tokens
    }

    /// The LoRA adapter `model` names (its blocks live in that adapter's hash space), or
    /// None for a base model or an unknown name.
    pub fn lora_for<'a>(&self, model: &'a str) -> Option<&'a str> {
        self.adapters.contains_key(model).then_some(model)
    }

    /// The base model of an adapter; any other name as given.
    pub fn base_model<'a>(&'a self, model: &'a str) -> &'a str {
        self.adapters
            .get(model)
            .map(String::as_str)
            .unwrap_or(model)
    }

    fn resolve(&self, model: &str) -> Option<&Model> {
        match self.models.get(model) {
            Some(m) => Some(m),
            None => self
                .adapters
                .get(model)
                .and_then(|b| self.models.get(b))
                .map(|m| &**m),
        }
    }

    /// Whether `model`'s chat template needs system messages first (see
    /// [`chat::ChatTemplates::system_first`]); true without a template, as vLLM assumes.
    pub fn system_first(&self, model: &str) -> bool {
        self.resolve(model)
            .and_then(|m| m.chat.as_ref())
            .is_none_or(chat::ChatTemplates::system_first)
    }

    /// The text of token ids `ids` of `model` (special tokens kept), as vLLM's
    /// `/detokenize` answers; None without a tokenizer for it.
    pub fn decode(&self, model: &str, ids: &[u32]) -> Option<Result<String, PromptError>> {
        let m = self.resolve(model)?;
        if let Some(bad) = ids.iter().find(|&&i| i >= m.vocab) {
            return Some(Err(PromptError(format!(
                "token id {bad} is out of vocabulary (size {})",
                m.vocab
            ))));
        }
        Some(
            m.tok
                .decode(ids, false)
                .map_err(|e| PromptError(format!("tokenizer: {e}"))),
        )
    }

    /// Prompt token ids of an OpenAI request body, as the engine would compute them.
    /// Ok(None): no tokenizer for `model` (the caller routes by load only) — except
    /// that a completions prompt given as token ids is returned whatever the model,
    /// since it needs no tokenizer (with one, the ids are checked against its
    /// vocabulary, as vLLM checks them).
    pub fn prompt_tokens(
        &self,
        endpoint: Endpoint,
        model: &str,
        body: &serde_json::Value,
    ) -> Result<Option<Vec<u32>>, PromptError> {
        self.tokens_in(endpoint, model, body, false)
            .unwrap_or_else(|| Err(PromptError("chat template: out of fuel".into())))
    }

    /// [`Self::prompt_tokens`] with a chat render of at most [`chat::QUICK_FUEL`]
    /// steps: `None` when it needs more, to be done again with `prompt_tokens` where
    /// a wait does no harm (the proxy: on the core's blocking thread).
    pub fn prompt_tokens_quick(
        &self,
        endpoint: Endpoint,
        model: &str,
        body: &serde_json::Value,
    ) -> Option<Result<Option<Vec<u32>>, PromptError>> {
        self.tokens_in(endpoint, model, body, true)
    }

    /// [`Self::prompt_tokens`] of a completions prompt read in place from a body's
    /// bytes ([`given::read`]): the same answer, without a JSON tree.
    pub fn completion_tokens(
        &self,
        model: &str,
        given: given::Given<'_>,
        add_special: bool,
    ) -> Result<Option<Vec<u32>>, PromptError> {
        given::tokens(
            self.resolve(model),
            given,
            add_special,
            self.max_prompt_tokens,
        )
    }

    fn tokens_in(
        &self,
        endpoint: Endpoint,
        model: &str,
        body: &serde_json::Value,
        quick: bool,
    ) -> Option<Result<Option<Vec<u32>>, PromptError>> {
        let m = self.resolve(model);
        Some(match endpoint {
            Endpoint::Completions => prompt::completion_tokens(m, body, self.max_prompt_tokens),
            Endpoint::Chat => match m {
                None => Ok(None),
                Some(m) => prompt::chat_tokens(m, body, self.max_prompt_tokens, quick)?.map(Some),
            },
        })
    }

    /// The routing request for `tokens` of a request for `model`: the router hashes
    /// them in the hash space the engine's events use for that model (the adapter's
    /// LoRA salt for an adapter, plain otherwise). For an adapter, the request's
    /// `model` (the worker filter) is its base model, which the workers register.
    pub fn route_request(
        &self,
        request_id: String,
        model: &str,
        tokens: Vec<u32>,
    ) -> crate::engine::request::RouteRequest {
        crate::engine::request::RouteRequest {
            request_id,
            model: Some(self.base_model(model).to_string()),
            input_tokens: u32::try_from(tokens.len()).ok(),
            tokens: Some(tokens),
            lora_name: self.lora_for(model).map(str::to_string),
            ..Default::default()
        }
    }
}

/// Reads a file of at most [`MAX_TOKENIZER_FILE_BYTES`].
fn read_bounded(path: &Path) -> Result<Option<Vec<u8>>, String> {
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    if meta.len() > MAX_TOKENIZER_FILE_BYTES {
        return Err(format!(
            "{}: {} bytes is larger than the {MAX_TOKENIZER_FILE_BYTES} accepted",
            path.display(),
            meta.len()
        ));
    }
    std::fs::read(path)
        .map(Some)
        .map_err(|e| format!("{}: {e}", path.display()))
}

fn load_dir(dir: &Path) -> Result<Model, String> {
    if !dir.is_dir() {
        return Err(format!("{} is not a directory", dir.display()));
    }
    let tj = dir.join("tokenizer.json");
    let bytes = read_bounded(&tj)?.ok_or_else(|| format!("{} is missing", tj.display()))?;
    let tok = tokenizers::Tokenizer::from_bytes(&bytes)
        .map_err(|e| format!("{}: not a usable tokenizer.json: {e}", tj.display()))?;
    let cfg_path = dir.join("tokenizer_config.json");
    let config = match read_bounded(&cfg_path)? {
        None => serde_json::Value::Object(Default::default()),
        Some(b) => serde_json::from_slice(&b)
            .map_err(|e| format!("{}: not JSON: {e}", cfg_path.display()))?,
    };
    if !config.is_object() {
        return Err(format!("{}: not a JSON object", cfg_path.display()));
    }
    let jinja_path = dir.join("chat_template.jinja");
    let jinja = match read_bounded(&jinja_path)? {
        None => None,
        Some(b) => {
            Some(String::from_utf8(b).map_err(|_| format!("{}: not UTF-8", jinja_path.display()))?)
        }
    };
    let chat = chat::ChatTemplates::from_config(&config, jinja)
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    Ok(Model::new(tok, chat))
}
