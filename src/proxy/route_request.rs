//! What a front end asks the router for one parsed completion: the `RouteRequest`
//! built from the client's request, its prompt's tokens and its body's size. The proxy
//! and the endpoint picker both build it here, so both route a body the same way.
//! Pure: no I/O, no service state.

use super::request::ClientRequest;
use crate::engine::RouteRequest;

/// The routing request of a parsed completion (`creq`, its prompt's `tokens` if it
/// tokenized, its body's size), as request `rid`, among the workers of `allow`.
pub fn route_request(
    tok: Option<&crate::tokenize::Tokenizers>,
    creq: &ClientRequest,
    tokens: Option<Vec<u32>>,
    body_len: usize,
    rid: &str,
    allow: Vec<String>,
) -> RouteRequest {
    let given = tokens.is_some();
    let (tok_ids, block_hashes, input_tokens) = match tokens {
        Some(t) => (Some(t), None, None),
        // Routed by load only; the prompt's size is estimated from its bytes.
        None => (None, Some(Vec::new()), Some((body_len / 4) as u32)),
    };
    // A LoRA adapter named as the model: its base model's workers, in the
    // adapter's hash space (`tokenize::Tokenizers::route_request`).
    let model = tok.map_or(creq.model.as_str(), |t| t.base_model(&creq.model));
    let lora_name = match (given, tok) {
        (true, Some(t)) => t.lora_for(&creq.model).map(str::to_string),
        _ => None,
    };
    // Forwarded unchanged in the body; routed in the salt's hash space.
    let cache_salt = given
        .then(|| super::prompt::cache_salt(&creq.body))
        .flatten();
    RouteRequest {
        request_id: rid.to_string(),
        model: (!model.is_empty()).then(|| model.to_string()),
        lora_name,
        cache_salt,
        tokens: tok_ids,
        block_hashes,
        input_tokens,
        expected_output_tokens: creq.max_tokens,
        allow: Some(allow),
        ..Default::default()
    }
}
