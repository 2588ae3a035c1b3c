//! Endpoints as the gateway names them, and the subset hint.
//!
//! A worker's endpoint is the `host:port` of its registered `url` (port 80 when the URL
//! has none; IPv6 as `[addr]:port`). The gateway may restrict a request to a subset
//! (filter metadata `envoy.lb.subset_hint` / `x-gateway-destination-endpoint-subset`):
//! a list of strings or one comma-separated string (both occur in practice), each
//! `ip:port` or a bare `ip` (any port of that host). [`Subset::resolve`] maps it onto
//! the known workers; entries naming no known worker are ignored and counted.
//!
//! Guarantees: at most [`MAX_ENTRIES`] entries of at most [`MAX_ENTRY_LEN`] bytes are
//! read (a longer hint is refused, not truncated: a truncated subset could route
//! outside what the gateway allows); a hint that is present but empty, or names no
//! known worker, allows nothing (the protocol's 503), never everything.

use super::pick::EndpointInfo;
use envoy_types::pb::envoy::config::core::v3::Metadata;
use envoy_types::pb::google::protobuf::value::Kind;

/// Metadata namespace of the subset hint.
pub const SUBSET_NAMESPACE: &str = "envoy.lb.subset_hint";
/// Key of the subset hint.
pub const SUBSET_KEY: &str = "x-gateway-destination-endpoint-subset";
/// Most subset entries read.
pub const MAX_ENTRIES: usize = 4096;
/// Longest subset entry.
pub const MAX_ENTRY_LEN: usize = 300;

/// One subset entry: a host, and a port unless any port of it is allowed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub host: String,
    pub port: Option<u16>,
}

/// The gateway's subset hint.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Subset {
    pub entries: Vec<Entry>,
    /// Entries that are not `host[:port]` (counted like unknown ones).
    pub malformed: usize,
}

/// What a subset allows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolved {
    /// Worker ids, in the order the endpoints list them.
    pub allow: Vec<String>,
    /// Entries naming no known worker (or malformed).
    pub unknown: usize,
}

/// `host:port` of a worker URL (`http://host[:port][/base]`), `None` if unusable.
pub fn endpoint_of(url: &str) -> Option<String> {
    let u = crate::proxy::url::UpstreamUrl::parse(url).ok()?;
    Some(join(&u.host, u.port))
}

fn join(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Splits `host[:port]` (`[v6]:port`, `[v6]`, bare `v6`). `None`: malformed.
pub fn parse_entry(s: &str) -> Option<Entry> {
    let s = s.trim();
    if s.is_empty() || s.len() > MAX_ENTRY_LEN || s.bytes().any(|b| !(0x21..0x7f).contains(&b)) {
        return None;
    }
    let (host, port) = if let Some(v6) = s.strip_prefix('[') {
        let (h, rest) = v6.split_once(']')?;
        match rest {
            "" => (h, None),
            _ => (h, Some(rest.strip_prefix(':')?)),
        }
    } else if s.matches(':').count() > 1 {
        (s, None)
    } else {
        match s.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (s, None),
        }
    };
    let port = match port {
        None => None,
        Some(p) => Some(p.parse::<u16>().ok().filter(|&p| p != 0)?),
    };
    if host.is_empty() || host.contains(['[', ']', '/', '@']) {
        return None;
    }
    Some(Entry {
        host: host.to_ascii_lowercase(),
        port,
    })
}

/// Why a subset hint was refused.
#[derive(Debug, PartialEq, Eq)]
pub struct BadSubset(pub String);

/// The subset hint of a request's metadata: `Ok(None)` when the gateway sent none.
pub fn from_metadata(md: Option<&Metadata>) -> Result<Option<Subset>, BadSubset> {
    let Some(ns) = md.and_then(|m| m.filter_metadata.get(SUBSET_NAMESPACE)) else {
        return Ok(None);
    };
    let Some(v) = ns.fields.get(SUBSET_KEY) else {
        return Ok(None);
    };
    let mut raw: Vec<&str> = Vec::new();
    fn push<'a>(s: &'a str, raw: &mut Vec<&'a str>) -> Result<(), BadSubset> {
        for part in s.split(',') {
            if part.trim().is_empty() {
                continue;
            }
            if raw.len() == MAX_ENTRIES {
                return Err(BadSubset(format!(
                    "the subset hint has more than {MAX_ENTRIES} endpoints"
                )));
            }
            raw.push(part);
        }
        Ok(())
    }
    match &v.kind {
        Some(Kind::StringValue(s)) => push(s, &mut raw)?,
        Some(Kind::ListValue(l)) => {
            for item in &l.values {
                match &item.kind {
                    Some(Kind::StringValue(s)) => push(s, &mut raw)?,
                    _ => return Err(BadSubset("subset hint entries must be strings".into())),
                }
            }
        }
        Some(Kind::NullValue(_)) | None => {}
        Some(_) => {
            return Err(BadSubset(
                "the subset hint must be a list of strings or a string".into(),
            ))
        }
    }
    let mut out = Subset::default();
    for s in raw {
        match parse_entry(s) {
            Some(e) => out.entries.push(e),
            None => out.malformed += 1,
        }
    }
    Ok(Some(out))
}

impl Subset {
    /// The known workers this subset allows.
    pub fn resolve(&self, endpoints: &[EndpointInfo]) -> Resolved {
        let mut allow = Vec::new();
        let mut used = vec![false; self.entries.len()];
        for ep in endpoints {
            let Some(have) = parse_entry(&ep.endpoint) else {
                continue;
            };
            let mut hit = false;
            for (i, e) in self.entries.iter().enumerate() {
                if e.host == have.host && (e.port.is_none() || e.port == have.port) {
                    used[i] = true;
                    hit = true;
                }
            }
            if hit {
                allow.push(ep.worker.clone());
            }
        }
        let unknown = used.iter().filter(|u| !**u).count() + self.malformed;
        Resolved { allow, unknown }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::google::protobuf::{ListValue, Struct, Value};

    fn md(v: Kind) -> Metadata {
        let mut inner = Struct::default();
        inner
            .fields
            .insert(SUBSET_KEY.into(), Value { kind: Some(v) });
        let mut m = Metadata::default();
        m.filter_metadata.insert(SUBSET_NAMESPACE.into(), inner);
        m
    }

    fn s(x: &str) -> Value {
        Value {
            kind: Some(Kind::StringValue(x.into())),
        }
    }

    fn eps() -> Vec<EndpointInfo> {
        [
            ("w1", "10.0.0.1:8000"),
            ("w2", "10.0.0.1:8001"),
            ("w3", "10.0.0.2:8000"),
            ("w6", "[fd00::6]:8000"),
        ]
        .iter()
        .map(|(w, e)| EndpointInfo {
            worker: w.to_string(),
            endpoint: e.to_string(),
        })
        .collect()
    }

    #[test]
    fn entries_parse_hosts_ports_and_ipv6() {
        let e = |h: &str, p: Option<u16>| {
            Some(Entry {
                host: h.into(),
                port: p,
            })
        };
        assert_eq!(parse_entry("10.0.0.1:8000"), e("10.0.0.1", Some(8000)));
        assert_eq!(parse_entry(" 10.0.0.1 "), e("10.0.0.1", None));
        assert_eq!(parse_entry("[fd00::6]:80"), e("fd00::6", Some(80)));
        assert_eq!(parse_entry("[fd00::6]"), e("fd00::6", None));
        assert_eq!(parse_entry("fd00::6"), e("fd00::6", None));
        assert_eq!(parse_entry("Pod-A:1"), e("pod-a", Some(1)));
        for bad in [
            "", ":80", "h:0", "h:99999", "h:x", "[fd00::6", "[a]b", "a b", "é:1",
        ] {
            assert_eq!(parse_entry(bad), None, "{bad:?}");
        }
        assert_eq!(parse_entry(&"a".repeat(MAX_ENTRY_LEN + 1)), None);
    }

    #[test]
    fn worker_urls_become_endpoints() {
        assert_eq!(
            endpoint_of("http://10.0.0.1:8000").as_deref(),
            Some("10.0.0.1:8000")
        );
        assert_eq!(endpoint_of("http://h/base").as_deref(), Some("h:80"));
        assert_eq!(
            endpoint_of("http://[fd00::6]:9").as_deref(),
            Some("[fd00::6]:9")
        );
        assert_eq!(endpoint_of("https://h:1"), None);
    }

    #[test]
    fn the_hint_reads_lists_and_comma_strings() {
        assert_eq!(from_metadata(None), Ok(None));
        assert_eq!(from_metadata(Some(&Metadata::default())), Ok(None));
        let list = md(Kind::ListValue(ListValue {
            values: vec![s("10.0.0.1:8000"), s("10.0.0.2:8000, 9.9.9.9:1")],
        }));
        let sub = from_metadata(Some(&list)).unwrap().unwrap();
        assert_eq!(sub.entries.len(), 3);
        let r = sub.resolve(&eps());
        assert_eq!(r.allow, vec!["w1", "w3"]);
        assert_eq!(r.unknown, 1);
        let comma = md(Kind::StringValue("10.0.0.1,,bad:port".into()));
        let r = from_metadata(Some(&comma))
            .unwrap()
            .unwrap()
            .resolve(&eps());
        assert_eq!((r.allow, r.unknown), (vec!["w1".into(), "w2".into()], 1));
        let v6 = md(Kind::StringValue("[FD00::6]:8000".into()));
        let r = from_metadata(Some(&v6)).unwrap().unwrap().resolve(&eps());
        assert_eq!(r.allow, vec!["w6"]);
    }

    #[test]
    fn an_empty_or_unknown_subset_allows_nothing() {
        let empty = md(Kind::ListValue(ListValue { values: vec![] }));
        let sub = from_metadata(Some(&empty)).unwrap().unwrap();
        assert!(sub.resolve(&eps()).allow.is_empty());
        let unknown = md(Kind::StringValue("1.2.3.4:5".into()));
        let r = from_metadata(Some(&unknown))
            .unwrap()
            .unwrap()
            .resolve(&eps());
        assert!(r.allow.is_empty() && r.unknown == 1);
    }

    #[test]
    fn malformed_and_oversized_hints_are_refused() {
        let num = md(Kind::NumberValue(1.0));
        assert!(from_metadata(Some(&num)).is_err());
        let mixed = md(Kind::ListValue(ListValue {
            values: vec![
                s("10.0.0.1"),
                Value {
                    kind: Some(Kind::BoolValue(true)),
                },
            ],
        }));
        assert!(from_metadata(Some(&mixed)).is_err());
        let many = vec!["1.1.1.1"; MAX_ENTRIES + 1].join(",");
        assert!(from_metadata(Some(&md(Kind::StringValue(many)))).is_err());
        let ok = vec!["1.1.1.1"; MAX_ENTRIES].join(",");
        assert!(from_metadata(Some(&md(Kind::StringValue(ok)))).is_ok());
    }
}
