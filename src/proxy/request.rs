//! The client's request body, reduced to what routing needs, and the ids.
//!
//! The body is forwarded as the client sent it (its bytes, not a re-serialisation;
//! `strip` cuts members out of those bytes when it must). It is read in place
//! ([`Body`]: one validating pass of `members` gives the spans of the members kvroute
//! reads; no JSON tree of the body is built): this module reads `model`, `stream`,
//! `max_tokens` / `max_completion_tokens` / `max_output_tokens` (Responses) (the OSL
//! hint) out of it. It must be a JSON object; `model` and `stream` must have their
//! OpenAI types when present. The proxy and the endpoint picker both read bodies here.
//! Request ids: the client's `x-request-id` is
//! propagated to the worker as given (generated when absent); kvroute's own id for the
//! routing request adds this process's nonce (drawn at start), the core and a per-core
//! counter to it, so clients reusing an id never collide in the router, nor do two
//! replicas given the same id (they share the routed requests through the cluster).

use super::members;
use bytes::Bytes;

/// Which endpoint a request came in on (forwarded to the same path on the worker).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Completions,
    Chat,
    /// Anthropic Messages (`proxy::agents`).
    Messages,
    /// OpenAI Responses (`proxy::agents`).
    Responses,
    /// Passed through, routed by load within the model (`proxy::agents`).
    Embeddings,
    Tokenize,
    Detokenize,
}

impl Endpoint {
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::Completions => "/v1/completions",
            Endpoint::Chat => "/v1/chat/completions",
            Endpoint::Messages => "/v1/messages",
            Endpoint::Responses => "/v1/responses",
            Endpoint::Embeddings => "/v1/embeddings",
            Endpoint::Tokenize => "/tokenize",
            Endpoint::Detokenize => "/detokenize",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct ClientRequest {
    pub body: Body,
    /// `model`, empty when absent.
    pub model: String,
    pub stream: bool,
    pub max_tokens: Option<u32>,
}

/// The members of a body that kvroute reads (routing, tokenizing, `strip`, `pd`, the
/// front door's hints, the agent endpoints).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Member {
    Model,
    Stream,
    MaxTokens,
    MaxCompletionTokens,
    MaxOutputTokens,
    Prompt,
    Messages,
    Tools,
    Documents,
    ChatTemplateKwargs,
    AddGenerationPrompt,
    ContinueFinalMessage,
    AddSpecialTokens,
    CacheSalt,
    VllmXargs,
    PreviousResponseId,
    Priority,
    Nvext,
    User,
}

/// How many [`Member`]s there are.
const MEMBERS: usize = 19;

impl Member {
    const ALL: [Member; MEMBERS] = [
        Member::Model,
        Member::Stream,
        Member::MaxTokens,
        Member::MaxCompletionTokens,
        Member::MaxOutputTokens,
        Member::Prompt,
        Member::Messages,
        Member::Tools,
        Member::Documents,
        Member::ChatTemplateKwargs,
        Member::AddGenerationPrompt,
        Member::ContinueFinalMessage,
        Member::AddSpecialTokens,
        Member::CacheSalt,
        Member::VllmXargs,
        Member::PreviousResponseId,
        Member::Priority,
        Member::Nvext,
        Member::User,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Member::Model => "model",
            Member::Stream => "stream",
            Member::MaxTokens => "max_tokens",
            Member::MaxCompletionTokens => "max_completion_tokens",
            Member::MaxOutputTokens => "max_output_tokens",
            Member::Prompt => "prompt",
            Member::Messages => "messages",
            Member::Tools => "tools",
            Member::Documents => "documents",
            Member::ChatTemplateKwargs => "chat_template_kwargs",
            Member::AddGenerationPrompt => "add_generation_prompt",
            Member::ContinueFinalMessage => "continue_final_message",
            Member::AddSpecialTokens => "add_special_tokens",
            Member::CacheSalt => "cache_salt",
            Member::VllmXargs => "vllm_xargs",
            Member::PreviousResponseId => "previous_response_id",
            Member::Priority => "priority",
            Member::Nvext => "nvext",
            Member::User => "user",
        }
    }

    fn of(key: &str) -> Option<Member> {
        Member::ALL.into_iter().find(|m| m.name() == key)
    }
}

/// The members the front door's hints read (`admission::hints`).
pub const HINTS: [Member; 3] = [Member::Priority, Member::Nvext, Member::User];

/// A client body: its bytes, forwarded as they are, and where the members kvroute
/// reads lie in them (no JSON tree: `members`). A repeated member is its last
/// occurrence, as in a parsed `Value` object.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Body {
    raw: Bytes,
    /// The value span (start, end) of each [`Member`] (by its index), `(0, 0)` when
    /// absent; boxed, so a request moves as a few words.
    spans: Box<[(u32, u32); MEMBERS]>,
    /// Some member `strip` removes may be present (a top-level one, or `vllm_xargs`).
    strippable: bool,
}

impl Body {
    /// Reads `raw`, a JSON object (`Err`: the 400's message).
    pub fn parse(raw: Bytes) -> Result<Body, BadBody> {
        if u32::try_from(raw.len()).is_err() {
            return Err(BadBody("the body is larger than 4 GiB".into()));
        }
        let mut spans: Box<[(u32, u32); MEMBERS]> = Box::default();
        let mut strippable = false;
        members::object(&raw, |k, r| match Member::of(&k) {
            Some(m) => {
                strippable |= m == Member::VllmXargs;
                // In range: the body's length fits in a u32.
                spans[m as usize] = (r.start as u32, r.end as u32);
            }
            None => strippable |= super::strip::TOP.iter().any(|(n, _)| *n == k),
        })
        .map_err(|e| match e {
            members::ObjectError::NotObject => BadBody("the body must be a JSON object".into()),
            members::ObjectError::Json(e) => BadBody(format!("invalid JSON body: {e}")),
        })?;
        Ok(Body {
            raw,
            spans,
            strippable,
        })
    }

    /// The body's bytes.
    pub fn bytes(&self) -> &Bytes {
        &self.raw
    }

    /// The JSON text of member `m`'s value, if present.
    pub fn get(&self, m: Member) -> Option<&str> {
        let (start, end) = self.spans[m as usize];
        let r = start as usize..end as usize;
        // Spans come from `members::object`, which checked the text is UTF-8.
        (!r.is_empty()).then(|| std::str::from_utf8(&self.raw[r]).unwrap_or("null"))
    }

    /// Member `m` as a string, if it is one.
    pub fn get_str(&self, m: Member) -> Option<String> {
        let t = self.get(m)?;
        if !t.starts_with('"') {
            return None;
        }
        serde_json::from_str(t).ok()
    }

    /// Removes the members engines trust from engine to engine (`strip`), cutting
    /// them out of the bytes, and returns their labels (`strip::FIELDS`). A body that
    /// has none of them is left as it is, without another pass over it.
    pub fn strip(&mut self) -> Vec<&'static str> {
        if !self.strippable {
            return Vec::new();
        }
        let Some((edited, labels)) = super::strip::strip(&self.raw) else {
            return Vec::new();
        };
        // The cut bytes are one JSON object with the other members as they were
        // (property-tested); were they not, the members go through a JSON tree.
        *self = Body::parse(Bytes::from(edited))
            .or_else(|_| Body::parse(Bytes::from(super::strip::tree_strip(&self.raw))))
            .unwrap_or_else(|_| Body {
                raw: Bytes::from_static(b"{}"),
                ..Body::default()
            });
        labels
    }

    /// The whole body as a JSON tree (the disaggregated legs and the agent endpoints
    /// rewrite or convert all of it).
    pub fn to_value(&self) -> serde_json::Value {
        serde_json::from_slice(&self.raw).unwrap_or_default()
    }

    /// A JSON object of the members `names` (those present), each parsed from its
    /// span: what a chat template or the front door's hints read, without the rest
    /// of the body. `Err`: a member serde_json cannot build (nesting too deep).
    pub fn subset(&self, names: &[Member]) -> Result<serde_json::Value, String> {
        let mut out = serde_json::Map::new();
        for &m in names {
            if let Some(t) = self.get(m) {
                let v = serde_json::from_str(t).map_err(|e| format!("{}: {e}", m.name()))?;
                out.insert(m.name().into(), v);
            }
        }
        Ok(serde_json::Value::Object(out))
    }
}

/// Why a body was refused (400).
#[derive(Debug, PartialEq, Eq)]
pub struct BadBody(pub String);

/// The bytes of a body to [`parse`]: a `Bytes` is shared, not copied.
pub trait BodyBytes {
    fn into_bytes(self) -> Bytes;
}

impl BodyBytes for Bytes {
    fn into_bytes(self) -> Bytes {
        self
    }
}

impl BodyBytes for &Bytes {
    fn into_bytes(self) -> Bytes {
        self.clone()
    }
}

impl BodyBytes for &[u8] {
    fn into_bytes(self) -> Bytes {
        Bytes::copy_from_slice(self)
    }
}

impl<const N: usize> BodyBytes for &[u8; N] {
    fn into_bytes(self) -> Bytes {
        Bytes::copy_from_slice(self)
    }
}

/// Reads a client body: the bytes are kept as they are; `model`, `stream` and the OSL
/// hint are read from their members (typed as OpenAI types them when present).
pub fn parse(bytes: impl BodyBytes) -> Result<ClientRequest, BadBody> {
    let body = Body::parse(bytes.into_bytes())?;
    let model = match body.get(Member::Model) {
        None | Some("null") => String::new(),
        Some(t) => match serde_json::from_str::<String>(t) {
            Ok(s) => s,
            Err(_) => return Err(BadBody("model must be a string".into())),
        },
    };
    if model.len() > 256 {
        return Err(BadBody("model longer than 256 bytes".into()));
    }
    let stream = match body.get(Member::Stream) {
        None | Some("null") | Some("false") => false,
        Some("true") => true,
        Some(_) => return Err(BadBody("stream must be a boolean".into())),
    };
    // A non-negative integer (as `Value::as_u64` reads one), else no hint.
    let max_tokens = [
        Member::MaxTokens,
        Member::MaxCompletionTokens,
        Member::MaxOutputTokens,
    ]
    .into_iter()
    .filter_map(|m| body.get(m))
    .find_map(|t| t.parse::<u64>().ok())
    .map(|n| n.min(u64::from(u32::MAX)) as u32);
    Ok(ClientRequest {
        body,
        model,
        stream,
        max_tokens,
    })
}

/// The `x-request-id` to send upstream: the client's when it is printable ASCII of at
/// most 128 bytes, else a generated one.
pub fn client_request_id(given: Option<&[u8]>, generate: impl FnOnce() -> String) -> String {
    match given {
        Some(b)
            if !b.is_empty() && b.len() <= 128 && b.iter().all(|c| (0x21..0x7f).contains(c)) =>
        {
            String::from_utf8_lossy(b).into_owned()
        }
        _ => generate(),
    }
}

/// Hex digits of the per-process nonce in [`router_id`] (48 random bits).
pub const NONCE_HEX: usize = 12;

/// A fresh per-process nonce for [`router_id`].
pub fn new_nonce() -> String {
    format!("{:0w$x}", rand::random::<u64>() >> 16, w = NONCE_HEX)
}

/// kvroute's id for one routing attempt: the client id's id-safe prefix, this
/// process's `nonce` ([`new_nonce`]), the core and a per-core counter, and the attempt
/// (`crate::ids` rule; at most 128 bytes).
pub fn router_id(client_id: &str, nonce: &str, core: usize, counter: u64, attempt: u32) -> String {
    let safe: String = client_id
        .bytes()
        .filter(|&b| crate::ids::is_id_byte(b))
        .take(72)
        .map(char::from)
        .collect();
    let p = crate::ids::PROXY_ID_PREFIX;
    let mut id = if safe.is_empty() {
        format!("{p}{nonce}.{core}.{counter}")
    } else {
        format!("{p}{safe}.{nonce}.{core}.{counter}")
    };
    if attempt > 0 {
        id.push_str(&format!(".r{attempt}"));
    }
    id
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_routing_fields_and_refuses_bad_types() {
        let r = parse(br#"{"model":"m","stream":true,"max_tokens":7,"x":1}"#).unwrap();
        assert_eq!(
            (r.model.as_str(), r.stream, r.max_tokens),
            ("m", true, Some(7))
        );
        let r = parse(br#"{"messages":[],"max_completion_tokens":3}"#).unwrap();
        assert_eq!(
            (r.model.as_str(), r.stream, r.max_tokens),
            ("", false, Some(3))
        );
        assert!(parse(b"{nope").is_err());
        assert!(parse(b"[1]").is_err());
        assert!(parse(br#"{"model":1}"#).is_err());
        assert!(parse(br#"{"stream":"yes"}"#).is_err());
    }

    #[test]
    fn ids_are_unique_per_attempt_and_process_and_id_safe() {
        let a = router_id("abc/def", "n1", 1, 7, 0);
        assert_eq!(a, "px=abcdef.n1.1.7");
        assert_eq!(router_id("", "n1", 0, 1, 2), "px=n1.0.1.r2");
        assert_ne!(a, router_id("abc/def", "n2", 1, 7, 0));
        assert!(crate::ids::is_proxy_id(&a));
        let nonce = new_nonce();
        assert_eq!(nonce.len(), NONCE_HEX);
        assert_ne!(nonce, new_nonce());
        let long = router_id(&"x".repeat(500), &nonce, 9999, u64::MAX, 16);
        assert!(crate::ids::check("id", &long).is_ok(), "{long}");
        assert_eq!(client_request_id(Some(b"r-1"), || "gen".into()), "r-1");
        assert_eq!(client_request_id(Some(b"a b"), || "gen".into()), "gen");
        assert_eq!(client_request_id(None, || "gen".into()), "gen");
    }
}
