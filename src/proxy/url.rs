//! A worker's upstream URL: `http://host:port` with an optional base path, e.g.
//! `http://10.0.0.5:8000` or `http://vllm-0.svc:8000/v1-prefix`. Only plain HTTP/1.1
//! (workers sit on the cluster network behind the router); `https` is refused at
//! registration rather than failing on every request. Guarantees: a parsed URL has a
//! non-empty host, a port (default 80), and a base path without a trailing `/`, so
//! `base + "/v1/completions"` is the request path.

/// Longest accepted URL, in bytes.
pub const MAX_URL_LEN: usize = 512;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UpstreamUrl {
    /// `host:port` as given (the `Host` header and the pool key).
    pub authority: String,
    pub host: String,
    pub port: u16,
    /// Path prefix without a trailing `/` (empty for none).
    pub base: String,
}

impl UpstreamUrl {
    pub fn parse(s: &str) -> Result<UpstreamUrl, String> {
        if s.len() > MAX_URL_LEN {
            return Err(format!("url longer than {MAX_URL_LEN} bytes"));
        }
        let rest = s
            .strip_prefix("http://")
            .ok_or_else(|| format!("url {s:?} must start with http:// (https is not supported)"))?;
        if rest.bytes().any(|b| !(0x21..0x7f).contains(&b)) {
            return Err(format!("url {s:?} has spaces or non-ASCII bytes"));
        }
        let (authority, base) = match rest.find('/') {
            Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
            None => (rest, ""),
        };
        if base.contains(['?', '#']) || authority.contains('@') {
            return Err(format!("url {s:?}: no query, fragment or user info"));
        }
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let (h, p) = v6
                .split_once(']')
                .ok_or_else(|| format!("url {s:?}: bad IPv6 host"))?;
            (h.to_string(), p.strip_prefix(':'))
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (h.to_string(), Some(p)),
                None => (authority.to_string(), None),
            }
        };
        let port = match port {
            None => 80,
            Some(p) => p
                .parse::<u16>()
                .map_err(|_| format!("url {s:?}: bad port {p:?}"))?,
        };
        if host.is_empty() || port == 0 {
            return Err(format!("url {s:?} needs a host and a port"));
        }
        Ok(UpstreamUrl {
            authority: authority.to_string(),
            host,
            port,
            base: base.to_string(),
        })
    }

    /// The request path for `path` (which starts with `/`).
    pub fn path(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_usual_forms() {
        let u = UpstreamUrl::parse("http://127.0.0.1:8001").unwrap();
        assert_eq!(
            (u.host.as_str(), u.port, u.base.as_str()),
            ("127.0.0.1", 8001, "")
        );
        assert_eq!(u.path("/v1/completions"), "/v1/completions");
        let u = UpstreamUrl::parse("http://w.svc/pre/").unwrap();
        assert_eq!(
            (u.host.as_str(), u.port, u.base.as_str()),
            ("w.svc", 80, "/pre")
        );
        let u = UpstreamUrl::parse("http://[::1]:9000").unwrap();
        assert_eq!((u.host.as_str(), u.port), ("::1", 9000));
    }

    #[test]
    fn refuses_what_it_cannot_serve() {
        for bad in [
            "https://a:1",
            "a:1",
            "http://",
            "http://:80",
            "http://a:0",
            "http://a:",
            "http://a:99999",
            "http://a b:1",
            "http://u@a:1",
            "http://a:1/x?y",
        ] {
            assert!(UpstreamUrl::parse(bad).is_err(), "{bad}");
        }
        assert!(UpstreamUrl::parse(&format!("http://a:1/{}", "x".repeat(600))).is_err());
    }
}
