//! The HTTP doors' request rules, for both HTTP listeners (the JSON API on `http_addr`
//! and the proxy on `proxy_addr`): which `Host`, which `Origin` and which content type
//! a request may carry, and the CORS answers for listed origins. Pure (headers in,
//! verdict out), so the rules are unit-tested here; `http` and `proxy::server` answer
//! a refusal in their own error shapes.
//!
//! Guarantees:
//! - DNS rebinding: a request whose `Host` is neither an IP address, `localhost`, a
//!   `*.localhost` name nor a name of `http_allowed_hosts` is refused. A rebinding
//!   page reaches the router under the attacker's name, which is none of these (an
//!   address cannot be rebound; `localhost` never leaves the machine).
//! - Cross-site requests: a request carrying an `Origin` that is neither the router's
//!   own (an origin whose host and port are the request's `Host`) nor one of
//!   `http_allowed_origins` is refused. Browsers send `Origin` on every request that
//!   can change state from another origin (every POST, every CORS request).
//! - Simple requests: a state-changing call (POST, PUT, PATCH, DELETE) that carries a
//!   body or a content type must be `application/json`. A page can send `text/plain`,
//!   form and blob bodies to any origin without asking (no CORS preflight), never
//!   `application/json`. Bodyless calls (the lifecycle calls, DELETE) need none.
//! - The JSON API applies the three rules to every request. The proxy applies them to
//!   requests a browser sent (with `Origin` or a `Sec-Fetch-*` header, which every
//!   current browser sends), so API clients (the OpenAI SDKs, curl, gateways) that
//!   reach it under any name keep working.
//! - Listed origins get CORS: their preflights are answered and their answers carry
//!   `access-control-allow-origin`. The router's own origin needs none.

use crate::settings::Settings;
use hyper::header::{self, HeaderMap, HeaderValue};
use hyper::{Method, StatusCode};

/// Which listener a request came through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Door {
    /// The JSON API, admin, metrics and status page (`http_addr`): every request.
    Api,
    /// The OpenAI proxy (`proxy_addr`): requests a browser sent.
    Proxy,
}

/// Why a request was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    Host,
    Origin,
    ContentType,
}

impl Refusal {
    /// Error code (JSON `code`, metric kind).
    pub fn code(self) -> &'static str {
        match self {
            Refusal::Host => "host_not_allowed",
            Refusal::Origin => "origin_not_allowed",
            Refusal::ContentType => "unsupported_media_type",
        }
    }

    pub fn status(self) -> StatusCode {
        match self {
            Refusal::Host | Refusal::Origin => StatusCode::FORBIDDEN,
            Refusal::ContentType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
        }
    }

    pub fn message(self) -> &'static str {
        match self {
            Refusal::Host => {
                "Host is not an address, localhost or a name of http_allowed_hosts (DNS rebinding)"
            }
            Refusal::Origin => {
                "Origin is not this router's nor one of http_allowed_origins (cross-site request)"
            }
            Refusal::ContentType => "a request with a body must be content-type: application/json",
        }
    }
}

/// What a request that passed may go on with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Pass {
    /// Nothing to add to the answer.
    Plain,
    /// From a listed origin: the answer carries [`allow_origin`] with this origin.
    Cors(HeaderValue),
    /// A CORS preflight from a listed origin: answer it with [`fill_preflight`] alone.
    Preflight(HeaderValue),
}

/// Checks a request's head against the door's rules.
pub fn check(s: &Settings, door: Door, method: &Method, h: &HeaderMap) -> Result<Pass, Refusal> {
    if door == Door::Proxy && !from_browser(h) {
        return Ok(Pass::Plain);
    }
    let host = match h.get(header::HOST) {
        None => None,
        Some(v) => Some(v.to_str().map_err(|_| Refusal::Host)?),
    };
    if let Some(host) = host {
        if !host_allowed(host, &s.http_allowed_hosts) {
            return Err(Refusal::Host);
        }
    }
    let pass = match h.get(header::ORIGIN) {
        None => Pass::Plain,
        Some(v) => {
            let origin = v.to_str().map_err(|_| Refusal::Origin)?.trim();
            if host.is_some_and(|host| own_origin(origin, host)) {
                Pass::Plain
            } else if listed_origin(origin, &s.http_allowed_origins) {
                if method == Method::OPTIONS
                    && h.contains_key(header::ACCESS_CONTROL_REQUEST_METHOD)
                {
                    return Ok(Pass::Preflight(v.clone()));
                }
                Pass::Cors(v.clone())
            } else {
                return Err(Refusal::Origin);
            }
        }
    };
    if changes_state(method) && !json_or_bodyless(h) {
        return Err(Refusal::ContentType);
    }
    Ok(pass)
}

/// A browser sent it: it carries `Origin` or a Fetch Metadata header.
pub fn from_browser(h: &HeaderMap) -> bool {
    h.contains_key(header::ORIGIN)
        || h.contains_key("sec-fetch-site")
        || h.contains_key("sec-fetch-mode")
        || h.contains_key("sec-fetch-dest")
}

fn changes_state(m: &Method) -> bool {
    matches!(
        *m,
        Method::POST | Method::PUT | Method::PATCH | Method::DELETE
    )
}

/// No body and no content type, or `application/json` (any parameters).
fn json_or_bodyless(h: &HeaderMap) -> bool {
    match h.get(header::CONTENT_TYPE) {
        Some(v) => v
            .to_str()
            .ok()
            .and_then(|t| t.split(';').next())
            .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json")),
        None => {
            let length = h
                .get(header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok());
            !h.contains_key(header::TRANSFER_ENCODING) && length.unwrap_or(0) == 0
        }
    }
}

/// The host of a `Host` value, without its port, lowercase, without a final dot.
fn host_name(host: &str) -> String {
    let host = host.trim();
    let name = if let Some(rest) = host.strip_prefix('[') {
        rest.split(']').next().unwrap_or("")
    } else {
        match host.rsplit_once(':') {
            Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
            _ => host,
        }
    };
    name.trim_end_matches('.').to_ascii_lowercase()
}

/// `Host` names an IP address, `localhost`, a `*.localhost` name or a listed name.
pub fn host_allowed(host: &str, allowed: &[String]) -> bool {
    let name = host_name(host);
    if name.parse::<std::net::IpAddr>().is_ok()
        || name == "localhost"
        || name.ends_with(".localhost")
    {
        return true;
    }
    allowed.iter().any(|a| {
        let a = a.trim_end_matches('.').to_ascii_lowercase();
        match a.strip_prefix("*.") {
            _ if a == "*" => true,
            Some(domain) => name.strip_suffix(domain).is_some_and(|s| s.ends_with('.')),
            None => a == name,
        }
    })
}

/// `origin` is `http[s]://` followed by exactly the request's `Host` (the page was
/// served by this router under the name it is now asked under).
fn own_origin(origin: &str, host: &str) -> bool {
    origin.split_once("://").is_some_and(|(scheme, authority)| {
        matches!(scheme, "http" | "https") && authority.eq_ignore_ascii_case(host.trim())
    })
}

fn listed_origin(origin: &str, allowed: &[String]) -> bool {
    allowed
        .iter()
        .any(|a| a == "*" || a.trim_end_matches('/').eq_ignore_ascii_case(origin))
}

/// Lets `origin` read the answer (a listed origin, [`Pass::Cors`]).
pub fn allow_origin(h: &mut HeaderMap, origin: HeaderValue) {
    h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
    h.insert(
        header::ACCESS_CONTROL_EXPOSE_HEADERS,
        HeaderValue::from_static("*"),
    );
    h.append(header::VARY, HeaderValue::from_static("origin"));
}

/// The headers of a preflight's answer (204) for a listed origin: the methods the
/// doors have and the headers the page asked for, cached for ten minutes.
pub fn fill_preflight(h: &mut HeaderMap, origin: HeaderValue, request: &HeaderMap) {
    h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
    h.insert(
        header::ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static("GET, POST, DELETE"),
    );
    let asked = request
        .get(header::ACCESS_CONTROL_REQUEST_HEADERS)
        .cloned()
        .unwrap_or_else(|| HeaderValue::from_static("authorization, content-type"));
    h.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, asked);
    h.insert(
        header::ACCESS_CONTROL_MAX_AGE,
        HeaderValue::from_static("600"),
    );
    h.append(header::VARY, HeaderValue::from_static("origin"));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(hosts: &[&str], origins: &[&str]) -> Settings {
        Settings {
            http_allowed_hosts: hosts.iter().map(|s| s.to_string()).collect(),
            http_allowed_origins: origins.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    fn head(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                hyper::header::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn hosts_addresses_localhost_and_listed_names_only() {
        let list = ["router.internal".to_string(), "*.svc.example".to_string()];
        for ok in [
            "127.0.0.1:7480",
            "10.1.2.3",
            "[::1]:7480",
            "localhost:7480",
            "LocalHost.",
            "ui.localhost",
            "router.internal:7480",
            "kvroute.ns.svc.example",
        ] {
            assert!(host_allowed(ok, &list), "{ok}");
        }
        for bad in [
            "evil.example:7480",
            "localhost.evil.example",
            "svc.example",
            "xsvc.example",
            "router.internal.evil",
            "2130706433",
        ] {
            assert!(!host_allowed(bad, &list), "{bad}");
        }
        assert!(host_allowed("anything.at.all", &["*".to_string()]));
    }

    #[test]
    fn origins_own_listed_or_refused() {
        let s = settings(&[], &["https://dash.example"]);
        let own = head(&[
            ("host", "127.0.0.1:7480"),
            ("origin", "http://127.0.0.1:7480"),
        ]);
        assert_eq!(check(&s, Door::Api, &Method::GET, &own), Ok(Pass::Plain));
        let other_port = head(&[("host", "127.0.0.1:7480"), ("origin", "http://127.0.0.1:9")]);
        assert_eq!(
            check(&s, Door::Api, &Method::GET, &other_port),
            Err(Refusal::Origin)
        );
        let null = head(&[("host", "127.0.0.1:7480"), ("origin", "null")]);
        assert_eq!(
            check(&s, Door::Api, &Method::GET, &null),
            Err(Refusal::Origin)
        );
        let listed = head(&[
            ("host", "127.0.0.1:7480"),
            ("origin", "https://dash.example"),
        ]);
        assert!(matches!(
            check(&s, Door::Api, &Method::GET, &listed),
            Ok(Pass::Cors(_))
        ));
        let mut pre = listed.clone();
        pre.insert(
            "access-control-request-method",
            HeaderValue::from_static("POST"),
        );
        assert!(matches!(
            check(&s, Door::Api, &Method::OPTIONS, &pre),
            Ok(Pass::Preflight(_))
        ));
    }

    #[test]
    fn state_changing_bodies_must_be_json() {
        let s = Settings::default();
        let post = |pairs: &[(&str, &str)]| {
            let mut p = vec![("host", "127.0.0.1:7480")];
            p.extend_from_slice(pairs);
            check(&s, Door::Api, &Method::POST, &head(&p))
        };
        assert_eq!(post(&[]), Ok(Pass::Plain), "bodyless lifecycle call");
        assert_eq!(post(&[("content-length", "0")]), Ok(Pass::Plain));
        assert_eq!(
            post(&[
                ("content-type", "Application/JSON; charset=utf-8"),
                ("content-length", "2")
            ]),
            Ok(Pass::Plain)
        );
        for bad in [
            vec![
                ("content-type", "text/plain;charset=UTF-8"),
                ("content-length", "2"),
            ],
            vec![("content-type", "application/x-www-form-urlencoded")],
            vec![("content-length", "2")],
            vec![("transfer-encoding", "chunked")],
        ] {
            assert_eq!(post(&bad), Err(Refusal::ContentType), "{bad:?}");
        }
        let get = head(&[("host", "127.0.0.1"), ("content-type", "text/plain")]);
        assert_eq!(check(&s, Door::Api, &Method::GET, &get), Ok(Pass::Plain));
    }

    #[test]
    fn the_proxy_checks_browsers_only() {
        let s = Settings::default();
        let sdk = head(&[
            ("host", "kvroute.prod:8000"),
            ("content-type", "text/plain"),
        ]);
        assert_eq!(check(&s, Door::Proxy, &Method::POST, &sdk), Ok(Pass::Plain));
        let rebound = head(&[
            ("host", "evil.example:8000"),
            ("sec-fetch-site", "same-origin"),
        ]);
        assert_eq!(
            check(&s, Door::Proxy, &Method::GET, &rebound),
            Err(Refusal::Host)
        );
        let cross = head(&[
            ("host", "127.0.0.1:8000"),
            ("origin", "http://evil.example"),
            ("content-type", "text/plain"),
        ]);
        assert_eq!(
            check(&s, Door::Proxy, &Method::POST, &cross),
            Err(Refusal::Origin)
        );
        assert_eq!(
            check(
                &s,
                Door::Api,
                &Method::GET,
                &head(&[("host", "evil.example")])
            ),
            Err(Refusal::Host)
        );
    }
}
