//! A request's priority, deadline, expected output length and session key, read from
//! its headers and its (already parsed) JSON body (docs/POLICIES.md "Priorities and
//! deadlines", "Sessions").
//!
//! Priority, lower served first (vLLM's convention), from the first source present:
//! 1. the priority the operator pinned for the request's tenant / API key;
//! 2. the `x-kvroute-priority` header (configurable name);
//! 3. Dynamo's `x-dynamo-request-priority` header, negated (Dynamo: higher first);
//! 4. the body's `priority` field (vLLM's);
//! 5. the body's `nvext.agent_hints.priority`, negated (Dynamo's);
//!
//! else 0. So a vLLM client and a Dynamo client are served in the order they ask for
//! without changing anything. The value is clamped to `[-max_priority, max_priority]`.
//!
//! Deadline: the `x-kvroute-deadline-ms` header (configurable name): milliseconds from
//! arrival by which the request should be running (a time-to-first-token budget, so no
//! clock is shared with the client). Expected output length: `nvext.agent_hints.osl`.
//! Session key: a header (`x-session-id`, configurable) or, when enabled, the OpenAI
//! `user` field; hashed with the tenant, so two tenants' sessions never meet.
//!
//! A hint that is present but malformed (a priority that is not an integer, a negative
//! deadline) is refused with a message naming it ([`BadHint`], a 400), rather than
//! silently ignored. Pure: no I/O, no clock (`now_us` is passed in); reads at most the
//! named fields, allocates only for an error message.

use serde_json::Value;

/// The header Dynamo clients send their priority in (Dynamo's polarity).
pub const DYNAMO_PRIORITY_HEADER: &str = "x-dynamo-request-priority";

/// Largest deadline budget accepted (one day), in ms.
pub const MAX_DEADLINE_MS: u64 = 86_400_000;

/// Where the hints are read from (`[admission]` and `[router]` session settings).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HintConfig {
    /// Lower-case header name of the priority (empty: not read).
    pub priority_header: String,
    /// Lower-case header name of the deadline budget in ms (empty: not read).
    pub deadline_header: String,
    /// Lower-case header name of the session key (empty: not read).
    pub session_header: String,
    /// Use the body's `user` field as the session key when no header names one.
    pub session_from_user: bool,
    pub max_priority: i32,
}

impl Default for HintConfig {
    fn default() -> Self {
        HintConfig {
            priority_header: "x-kvroute-priority".into(),
            deadline_header: "x-kvroute-deadline-ms".into(),
            session_header: "x-session-id".into(),
            session_from_user: false,
            max_priority: 10,
        }
    }
}

/// Which source gave the priority (for explain records and metrics).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PrioritySource {
    Default,
    Pinned,
    Header,
    DynamoHeader,
    Body,
    AgentHints,
}

/// What a request asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hints {
    /// Clamped priority, lower first.
    pub priority: i32,
    pub source: PrioritySource,
    /// Absolute deadline on the caller's clock, µs.
    pub deadline_us: Option<u64>,
    /// Expected output tokens (`nvext.agent_hints.osl`).
    pub osl: Option<u32>,
    /// Hash of (tenant, session key), if the request names a session.
    pub session: Option<u64>,
}

/// A malformed hint: the message names it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadHint(pub String);

/// The hints of one request. `headers` are (name, value) pairs (names compared
/// without regard to case), `body` the parsed JSON body, `pinned` the operator's
/// priority for its tenant, `tenant` its tenant hash (0 if none), `now_us` its arrival.
pub fn read<'a>(
    cfg: &HintConfig,
    headers: impl IntoIterator<Item = (&'a str, &'a [u8])>,
    body: &Value,
    pinned: Option<i32>,
    tenant: u64,
    now_us: u64,
) -> Result<Hints, BadHint> {
    let mut header_prio = None;
    let mut dynamo_prio = None;
    let mut deadline = None;
    let mut session = None;
    for (name, value) in headers {
        let is = |n: &str| !n.is_empty() && name.eq_ignore_ascii_case(n);
        if is(&cfg.priority_header) {
            header_prio = Some(header_int(name, value)?);
        } else if is(DYNAMO_PRIORITY_HEADER) {
            dynamo_prio = Some(header_int(name, value)?);
        } else if is(&cfg.deadline_header) {
            deadline = Some(deadline_ms(name, value)?);
        } else if is(&cfg.session_header) && !value.is_empty() {
            session = Some(session_hash(tenant, value));
        }
    }
    let hints = body
        .get("nvext")
        .and_then(|n| n.get("agent_hints"))
        .filter(|h| !h.is_null());
    if let Some(h) = hints {
        if !h.is_object() {
            return Err(BadHint("nvext.agent_hints must be an object".into()));
        }
    }
    let body_prio = json_int(body.get("priority"), "priority")?;
    let agent_prio = json_int(
        hints.and_then(|h| h.get("priority")),
        "nvext.agent_hints.priority",
    )?;
    let osl = json_int(hints.and_then(|h| h.get("osl")), "nvext.agent_hints.osl")?
        .map(|v| {
            u32::try_from(v)
                .map_err(|_| BadHint("nvext.agent_hints.osl must be 0..=4294967295".into()))
        })
        .transpose()?;
    if session.is_none() && cfg.session_from_user {
        match body.get("user") {
            None | Some(Value::Null) => {}
            Some(Value::String(u)) if u.is_empty() => {}
            Some(Value::String(u)) => session = Some(session_hash(tenant, u.as_bytes())),
            Some(_) => return Err(BadHint("user must be a string".into())),
        }
    }
    let neg = |v: i64| v.saturating_neg();
    let (raw, source) = if let Some(p) = pinned {
        (i64::from(p), PrioritySource::Pinned)
    } else if let Some(p) = header_prio {
        (p, PrioritySource::Header)
    } else if let Some(p) = dynamo_prio {
        (neg(p), PrioritySource::DynamoHeader)
    } else if let Some(p) = body_prio {
        (p, PrioritySource::Body)
    } else if let Some(p) = agent_prio {
        (neg(p), PrioritySource::AgentHints)
    } else {
        (0, PrioritySource::Default)
    };
    let m = i64::from(cfg.max_priority.max(0));
    Ok(Hints {
        priority: raw.clamp(-m, m) as i32,
        source,
        deadline_us: deadline.map(|ms| now_us.saturating_add(ms.saturating_mul(1000))),
        osl,
        session,
    })
}

/// Hash of a session key within a tenant (XXH3, the router's hash).
pub fn session_hash(tenant: u64, key: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64_with_seed(key, tenant ^ 0x5E55_1011_u64)
}

fn header_int(name: &str, value: &[u8]) -> Result<i64, BadHint> {
    std::str::from_utf8(value)
        .ok()
        .map(str::trim)
        .and_then(|s| s.parse::<i64>().ok())
        .ok_or_else(|| BadHint(format!("header {name} must be an integer")))
}

fn deadline_ms(name: &str, value: &[u8]) -> Result<u64, BadHint> {
    std::str::from_utf8(value)
        .ok()
        .map(str::trim)
        .and_then(|s| s.parse::<u64>().ok())
        .filter(|&ms| ms <= MAX_DEADLINE_MS)
        .ok_or_else(|| {
            BadHint(format!(
                "header {name} must be milliseconds from now, 0..={MAX_DEADLINE_MS}"
            ))
        })
}

/// An optional JSON integer (`null` counts as absent; floats with no fraction, as
/// Python clients may send, are accepted).
fn json_int(v: Option<&Value>, what: &str) -> Result<Option<i64>, BadHint> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => n
            .as_i64()
            .or_else(|| {
                n.as_f64()
                    .filter(|f| f.fract() == 0.0 && f.abs() < 9.0e18)
                    .map(|f| f as i64)
            })
            .or_else(|| n.as_u64().map(|_| i64::MAX))
            .map(Some)
            .ok_or_else(|| BadHint(format!("{what} must be an integer"))),
        Some(_) => Err(BadHint(format!("{what} must be an integer"))),
    }
}

#[cfg(test)]
mod tests;
