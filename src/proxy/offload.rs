//! Where a proxied request's prompt is tokenized (`tokenize_inline_max_bytes`): on
//! the core that accepted it, or, for a long body, on that core's blocking thread
//! (`service::runtime::blocking`, below the executors' priority), so that a multi-millisecond tokenization does not
//! hold the core's other streams. A completions prompt of token ids is only read, so
//! it stays on the core up to [`IDS_INLINE_FACTOR`] times that size. The tokenization
//! itself is `prompt`'s.
//!
//! A short body's chat template may still be costly: on the core it is rendered within
//! `tokenize::chat::QUICK_FUEL` steps only, and a render that needs more is done again
//! on the blocking thread (`kvroute_proxy_renders_off_core_total`), bounded there by
//! `chat_template_fuel`.
//!
//! Guarantees: the same token ids either way (one function computes them); the
//! request body moves to the blocking thread and back, it is not copied. A prompt
//! tokenized on the core is announced to the other cores first
//! (`service::routing::router::announce`), so that with `--cores` > 1 their wake-up for the
//! route's shard query overlaps the tokenizing; one tokenized off the core is not
//! (it takes long enough that they would spin for nothing).

use super::front::Front;
use super::request::{ClientRequest, Endpoint, Member};
use crate::tokenize::id_list::skip_ws;

/// How many times `tokenize_inline_max_bytes` a completions body whose prompt is a
/// list of token ids may be and still be read on the core: reading ids costs about
/// 1.4 ns a byte (`tokenize::id_list`), tokenizing text 20 ns or more, and the trip to
/// the blocking thread and back costs two wake-ups and the wait at nice 10.
pub const IDS_INLINE_FACTOR: usize = 16;

/// Whether the request's prompt is a list of token ids (a completions prompt that
/// opens with a number): nothing to tokenize, only ids to read.
fn ids_prompt(endpoint: Endpoint, creq: &ClientRequest) -> bool {
    if endpoint != Endpoint::Completions {
        return false;
    }
    let Some(p) = creq.body.get(Member::Prompt).map(str::as_bytes) else {
        return false;
    };
    p.first() == Some(&b'[') && p.get(skip_ws(p, 1)).is_some_and(u8::is_ascii_digit)
}

/// The prompt's token ids (`prompt::prompt_tokens`): on this core for a body of up to
/// `tokenize_inline_max_bytes`, else on the core's blocking thread while the core
/// keeps serving its other streams (the body travels there and back, not copied).
pub async fn tokenize(
    core: &Front,
    endpoint: Endpoint,
    mut creq: ClientRequest,
    body_bytes: usize,
) -> (
    ClientRequest,
    Result<Option<Vec<u32>>, super::prompt::PromptError>,
) {
    let sh = &core;
    let tok = sh.handle.tokenizers();
    let max = sh.handle.settings().proxy.tokenize_inline_max_bytes;
    let inline = tok.is_none()
        || body_bytes <= max
        || (body_bytes <= max.saturating_mul(IDS_INLINE_FACTOR) && ids_prompt(endpoint, &creq));
    if inline {
        if tok.is_some() {
            // The route after tokenizing queries the other cores' shards: wake them
            // now, so their wake-up overlaps the tokenizing (`answer_spin`).
            core.handle.announce();
        }
        let t = tok.map(|t| &**t);
        match super::prompt::prompt_tokens_quick(t, endpoint, &creq.model, &creq.body) {
            Some(r) => return (creq, r),
            None => sh.state.metrics.renders_off_core.inc(),
        };
    }
    let tok = tok.cloned();
    let body = std::mem::take(&mut creq.body);
    let model = creq.model.clone();
    let (body, r) = core
        .handle
        .off_core(move || {
            let r = super::prompt::prompt_tokens(tok.as_deref(), endpoint, &model, &body);
            (body, r)
        })
        .await;
    creq.body = body;
    sh.state.metrics.tokenized_off_core.inc();
    (creq, r)
}
