//! Where a proxied request's prompt is tokenized (`tokenize_inline_max_bytes`): on
//! the core that accepted it, or, for a long body, on that core's blocking thread
//! (`service::runtime::blocking`, below the executors' priority), so that a multi-millisecond tokenization does not
//! hold the core's other streams. The tokenization itself is `prompt`'s.
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

/// The prompt's token ids (`prompt::prompt_tokens`): on this core for a body of up to
/// `tokenize_inline_max_bytes`, else on the core's blocking thread while the core
/// keeps serving its other streams (the body travels there and back, not copied).
pub async fn tokenize(
    core: &Front,
    endpoint: super::request::Endpoint,
    mut creq: super::request::ClientRequest,
    body_bytes: usize,
) -> (
    super::request::ClientRequest,
    Result<Option<Vec<u32>>, super::prompt::PromptError>,
) {
    let sh = &core;
    let tok = sh.handle.tokenizers();
    if tok.is_none() || body_bytes <= sh.handle.settings().proxy.tokenize_inline_max_bytes {
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
