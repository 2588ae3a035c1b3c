//! Settings of the endpoint picker (`[epp]` in TOML; flags `--epp-*`, env
//! `KVROUTE_EPP_*`; `args` holds the flags). `validate` is the one place that rejects
//! unusable values.

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EppSettings {
    /// `HOST:PORT` of the ext_proc gRPC server (`envoy.service.ext_proc.v3`), e.g.
    /// `0.0.0.0:9002` (the InferencePool's `endpointPickerRef` port). Empty or `off`:
    /// no endpoint picker. Default off.
    pub addr: String,
    /// Largest request body read to route a completion; beyond it 413 (refused from
    /// `content-length` before reading, else as soon as the body passes it).
    /// Default 8 MiB, as the proxy's.
    pub max_body_bytes: usize,
    /// Most request headers per request; beyond it 431. Default 128.
    pub max_header_count: usize,
    /// Most bytes of request header keys and values together; beyond it 431.
    /// Default 65,536.
    pub max_header_bytes: usize,
    /// ext_proc streams (requests through the gateway) open at once; beyond it a new
    /// stream is refused with gRPC RESOURCE_EXHAUSTED. Default 4096.
    pub max_streams: usize,
}

impl Default for EppSettings {
    fn default() -> Self {
        EppSettings {
            addr: "off".into(),
            max_body_bytes: 8 << 20,
            max_header_count: 128,
            max_header_bytes: 64 << 10,
            max_streams: 4096,
        }
    }
}

impl EppSettings {
    /// Whether the endpoint picker is on.
    pub fn enabled(&self) -> bool {
        !crate::proxy::config::is_off(&self.addr)
    }

    pub fn validate(&self) -> Result<(), String> {
        if self.enabled() && self.addr.parse::<std::net::SocketAddr>().is_err() {
            return Err(format!(
                "epp addr {:?} must be IP:PORT (or empty / off)",
                self.addr
            ));
        }
        if self.max_body_bytes < 64 || self.max_body_bytes > 1 << 30 {
            return Err("epp max_body_bytes must be between 64 and 1 GiB".into());
        }
        if self.max_header_count == 0 || self.max_header_count > 10_000 {
            return Err("epp max_header_count must be between 1 and 10000".into());
        }
        if self.max_header_bytes < 256 || self.max_header_bytes > 16 << 20 {
            return Err("epp max_header_bytes must be between 256 and 16 MiB".into());
        }
        if self.max_streams == 0 || self.max_streams > 1 << 20 {
            return Err("epp max_streams must be between 1 and 1048576".into());
        }
        Ok(())
    }

    /// The stream limits these settings give.
    #[cfg(all(target_os = "linux", feature = "service"))]
    pub fn limits(&self) -> super::stream::Limits {
        super::stream::Limits {
            max_body_bytes: self.max_body_bytes,
            max_header_count: self.max_header_count,
            max_header_bytes: self.max_header_bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_off() {
        let s = EppSettings::default();
        assert!(s.validate().is_ok() && !s.enabled());
        let on = EppSettings {
            addr: "127.0.0.1:9002".into(),
            ..s.clone()
        };
        assert!(on.validate().is_ok() && on.enabled());
        for bad in [
            EppSettings {
                addr: "nowhere".into(),
                ..s.clone()
            },
            EppSettings {
                max_body_bytes: 1,
                ..s.clone()
            },
            EppSettings {
                max_header_count: 0,
                ..s.clone()
            },
            EppSettings {
                max_header_bytes: 10,
                ..s.clone()
            },
            EppSettings {
                max_streams: 0,
                ..s.clone()
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
        let t: EppSettings = toml::from_str("addr = \"off\"\nmax_streams = 8").unwrap();
        assert!(!t.enabled() && t.max_streams == 8);
        assert!(toml::from_str::<EppSettings>("nope = 1").is_err());
    }
}
