//! Who may do what: the shared token and per-worker tokens.
//!
//! Pure decisions (no I/O apart from [`load_worker_tokens`] reading the file), used by
//! every door of the service (event `Hello`, binary request API, HTTP). Two kinds of
//! credential:
//! - the **shared token** (`auth_token` / `auth_token_file`): frontends and admins.
//!   Routing, lifecycle, reads (`GET /v1/workers`, `/metrics`), and registering,
//!   feeding, clearing and removing every worker *without* a token of its own;
//! - a **worker token** (`worker_tokens_file`, lines `worker_id token`): exactly one
//!   worker. It may register that worker (event `Hello`, `POST /v1/workers`, binary
//!   `Register`), send and clear its events, and remove it — and nothing else. A worker
//!   listed in the file can be registered, fed, cleared or removed **only** with its own
//!   token: the shared token no longer can, so a frontend holding it cannot clear the
//!   worker's blocks or kick it with a new epoch.
//!
//! Guarantees: every comparison is constant-time in the token bytes; a token found by
//! scanning the worker tokens ([`Credentials::principal`]) compares against all of
//! them (no early exit); with authentication off (no shared token, no worker tokens)
//! everything is allowed, as before.

use std::collections::HashMap;
use subtle::ConstantTimeEq;

/// The token of an `Authorization: Bearer <token>` header, if there is one: how every
/// HTTP door reads a credential (the JSON API, the proxy port, the simulated workers).
#[cfg(feature = "service")]
pub fn bearer(headers: &hyper::HeaderMap) -> Option<&str> {
    headers
        .get(hyper::header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
}

/// An authenticated caller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Principal {
    /// Holder of the shared token (or anyone, when authentication is off).
    Admin,
    /// Holder of this worker's own token.
    Worker(String),
}

/// The configured credentials.
#[derive(Clone, Debug, Default)]
pub struct Credentials {
    admin: Option<String>,
    /// worker id → its token.
    workers: HashMap<String, String>,
}

fn eq(a: &str, b: &str) -> bool {
    bool::from(a.as_bytes().ct_eq(b.as_bytes()))
}

impl Credentials {
    pub fn new(admin: Option<String>, workers: HashMap<String, String>) -> Credentials {
        Credentials { admin, workers }
    }

    /// Any token required anywhere.
    pub fn enabled(&self) -> bool {
        self.admin.is_some() || !self.workers.is_empty()
    }

    /// Workers with a token of their own.
    pub fn worker_count(&self) -> usize {
        self.workers.len()
    }

    /// `presented` is the shared token (always true with authentication off).
    pub fn is_admin(&self, presented: &str) -> bool {
        match &self.admin {
            Some(t) => eq(t, presented),
            None => self.workers.is_empty(),
        }
    }

    /// Who `presented` authenticates, if anyone.
    pub fn principal(&self, presented: &str) -> Option<Principal> {
        if self.is_admin(presented) {
            return Some(Principal::Admin);
        }
        let mut found = None;
        for (id, t) in &self.workers {
            if eq(t, presented) && found.is_none() {
                found = Some(Principal::Worker(id.clone()));
            }
        }
        found
    }

    /// May `presented` register, feed, clear or remove worker `worker_id`? Its own
    /// token if it has one, else the shared token.
    pub fn may_act_on(&self, presented: &str, worker_id: &str) -> bool {
        match self.workers.get(worker_id) {
            Some(t) => eq(t, presented),
            None => self.is_admin(presented),
        }
    }

    /// [`Credentials::may_act_on`] for an already authenticated principal (binary API
    /// connections authenticate once, at `Hello`).
    pub fn principal_may_act_on(&self, who: &Principal, worker_id: &str) -> bool {
        match who {
            Principal::Worker(id) => id == worker_id,
            Principal::Admin => !self.workers.contains_key(worker_id),
        }
    }
}

/// Parses a worker-tokens file: one `worker_id token` per line (separated by spaces or
/// tabs), blank lines and lines starting with `#` ignored. Refused: a malformed line,
/// a worker id listed twice, a token shared by two workers, or a token equal to the
/// shared one (each token must name exactly one principal).
pub fn parse_worker_tokens(
    text: &str,
    admin: Option<&str>,
) -> Result<HashMap<String, String>, String> {
    let mut out = HashMap::new();
    let mut tokens = std::collections::HashSet::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut parts = line.split_whitespace();
        let (Some(id), Some(token), None) = (parts.next(), parts.next(), parts.next()) else {
            return Err(format!(
                "line {}: expected `worker_id token`, got {} fields",
                n + 1,
                line.split_whitespace().count()
            ));
        };
        if id.len() > 128 {
            return Err(format!("line {}: worker id longer than 128 bytes", n + 1));
        }
        if admin == Some(token) {
            return Err(format!(
                "line {}: worker {id:?} has the shared auth token",
                n + 1
            ));
        }
        if !tokens.insert(token.to_string()) {
            return Err(format!(
                "line {}: worker {id:?} reuses another worker's token",
                n + 1
            ));
        }
        if out.insert(id.to_string(), token.to_string()).is_some() {
            return Err(format!("line {}: worker {id:?} listed twice", n + 1));
        }
    }
    Ok(out)
}

/// Reads and parses `path` ([`parse_worker_tokens`]); errors name the file.
pub fn load_worker_tokens(
    path: &str,
    admin: Option<&str>,
) -> Result<HashMap<String, String>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("reading worker_tokens_file {path}: {e}"))?;
    parse_worker_tokens(&text, admin).map_err(|e| format!("worker_tokens_file {path}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn creds() -> Credentials {
        let w = parse_worker_tokens("# fleet\nw1 tok1\n\n w2\ttok2 \n", Some("admin")).unwrap();
        Credentials::new(Some("admin".into()), w)
    }

    #[test]
    fn each_credential_may_do_only_its_part() {
        let c = creds();
        assert!(c.enabled() && c.is_admin("admin") && !c.is_admin("tok1"));
        assert_eq!(c.principal("admin"), Some(Principal::Admin));
        assert_eq!(c.principal("tok2"), Some(Principal::Worker("w2".into())));
        assert_eq!(c.principal("nope"), None);
        assert!(c.may_act_on("tok1", "w1"));
        assert!(!c.may_act_on("tok2", "w1"));
        assert!(
            !c.may_act_on("admin", "w1"),
            "shared token on a worker with its own"
        );
        assert!(c.may_act_on("admin", "unlisted"));
        assert!(!c.may_act_on("tok1", "unlisted"));
        assert!(c.principal_may_act_on(&Principal::Worker("w1".into()), "w1"));
        assert!(!c.principal_may_act_on(&Principal::Worker("w1".into()), "w2"));
        assert!(!c.principal_may_act_on(&Principal::Admin, "w1"));
        assert!(c.principal_may_act_on(&Principal::Admin, "other"));
    }

    #[test]
    fn no_credentials_allow_everything() {
        let c = Credentials::default();
        assert!(!c.enabled() && c.is_admin("") && c.may_act_on("", "w"));
        assert_eq!(c.principal("x"), Some(Principal::Admin));
    }

    #[test]
    fn bad_files_are_refused() {
        for bad in ["w1", "w1 a b", "w1 a\nw1 b", "w1 a\nw2 a", "w1 admin"] {
            assert!(parse_worker_tokens(bad, Some("admin")).is_err(), "{bad:?}");
        }
    }
}
