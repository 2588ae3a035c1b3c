//! Configuration of one subscribed engine endpoint (`[[engines]]` in TOML, or the
//! repeatable `--engine key=value,...` flag) and its validation.

use crate::types::{default_capacity_blocks, DeviceClass, DpRanks, Role, WorkerSpec};
use serde::{Deserialize, Serialize};

/// One engine (one vLLM / SGLang data-parallel rank) publishing KV events over ZMQ,
/// bound to one kvroute worker.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineEndpoint {
    /// kvroute worker id the engine's blocks belong to.
    pub worker_id: String,
    /// The engine's ZMQ PUB endpoint, e.g. `tcp://10.0.0.5:5557` (rank r: port + r).
    pub endpoint: String,
    /// The engine's ZMQ ROUTER replay endpoint; without it a gap clears the worker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay_endpoint: Option<String>,
    /// Topic prefix to subscribe to (vLLM default: empty = everything).
    #[serde(default)]
    pub topic: String,
    #[serde(default)]
    pub role: Role,
    #[serde(default)]
    pub device: DeviceClass,
    #[serde(default)]
    pub model: String,
    #[serde(default = "default_capacity_blocks")]
    pub capacity_blocks: u64,
    /// Data-parallel rank served by this endpoint (the worker's dp range is [r, r]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dp_rank: Option<u32>,
    /// Tokens per block when an event carries none (default: the router's block_size).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_size: Option<u32>,
    /// LoRA name for events that carry a `lora_id` but no `lora_name`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lora: Option<String>,
    #[serde(default)]
    pub topology: String,
    #[serde(default)]
    pub taints: Vec<String>,
    /// The engine's OpenAI-compatible HTTP base URL (`http://host:port`), for the
    /// proxy (`crate::proxy`); none = route-only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
}

impl EngineEndpoint {
    /// The worker this endpoint registers.
    pub fn spec(&self) -> WorkerSpec {
        let mut w = WorkerSpec::new(self.worker_id.clone());
        w.role = self.role;
        w.device = self.device;
        w.model = self.model.clone();
        w.capacity_blocks = self.capacity_blocks;
        w.topology = self.topology.clone();
        w.taints = self.taints.clone();
        w.url = self.url.clone();
        if let Some(r) = self.dp_rank {
            w.dp_ranks = DpRanks { lo: r, hi: r };
        }
        w
    }

    pub fn validate(&self) -> Result<(), String> {
        let who = format!("engine {:?}", self.worker_id);
        self.spec().validate().map_err(|e| format!("{who}: {e}"))?;
        for ep in std::iter::once(&self.endpoint).chain(self.replay_endpoint.as_ref()) {
            check_endpoint(ep).map_err(|e| format!("{who}: {e}"))?;
        }
        if self.topic.len() > 256 {
            return Err(format!("{who}: topic longer than 256 bytes"));
        }
        if let Some(b) = self.block_size {
            if b == 0 || b as usize > crate::hash::MAX_BLOCK_SIZE {
                return Err(format!("{who}: block_size must be 1..=4096"));
            }
        }
        Ok(())
    }

    /// Parses the compact flag form:
    /// `worker_id=w1,endpoint=tcp://127.0.0.1:5557,replay_endpoint=tcp://127.0.0.1:5558,
    /// role=prefill,device=gpu,model=m,capacity_blocks=4096,dp_rank=0,block_size=16,
    /// lora=name,topic=t,topology=rack1,taints=a+b,url=http://10.0.0.5:8000` (values
    /// cannot contain commas).
    pub fn parse_compact(s: &str) -> Result<EngineEndpoint, String> {
        let mut t = toml::Table::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| format!("--engine: {part:?} is not key=value"))?;
            let v = v.trim();
            let val = match k.trim() {
                "capacity_blocks" | "dp_rank" | "block_size" => toml::Value::Integer(
                    v.parse::<i64>()
                        .map_err(|e| format!("--engine: {k}={v:?}: {e}"))?,
                ),
                "taints" => toml::Value::Array(
                    v.split('+')
                        .filter(|x| !x.is_empty())
                        .map(|x| toml::Value::String(x.into()))
                        .collect(),
                ),
                _ => toml::Value::String(v.into()),
            };
            if t.insert(k.trim().to_owned(), val).is_some() {
                return Err(format!("--engine: {k} given twice"));
            }
        }
        t.try_into::<EngineEndpoint>()
            .map_err(|e| format!("--engine {s:?}: {e}"))
    }
}

/// `tcp://host:port` with a non-empty host and a numeric port.
fn check_endpoint(ep: &str) -> Result<(), String> {
    let rest = ep
        .strip_prefix("tcp://")
        .ok_or_else(|| format!("endpoint {ep:?} must be tcp://host:port"))?;
    let (host, port) = rest
        .rsplit_once(':')
        .ok_or_else(|| format!("endpoint {ep:?} has no port"))?;
    if host.is_empty() || host == "*" || port.parse::<u16>().is_err() {
        return Err(format!(
            "endpoint {ep:?} must be tcp://host:port (connect, not bind)"
        ));
    }
    Ok(())
}

/// Rejects duplicate worker ids and invalid entries.
pub fn validate_all(engines: &[EngineEndpoint]) -> Result<(), String> {
    let mut seen = std::collections::HashSet::new();
    for e in engines {
        e.validate()?;
        if !seen.insert(e.worker_id.as_str()) {
            return Err(format!("engine worker_id {:?} listed twice", e.worker_id));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_compact_form_takes_the_proxy_url() {
        let e =
            EngineEndpoint::parse_compact("worker_id=w1,endpoint=tcp://h:5557,url=http://h:8000")
                .unwrap();
        assert_eq!(e.spec().url.as_deref(), Some("http://h:8000"));
        let bad =
            EngineEndpoint::parse_compact("worker_id=w1,endpoint=tcp://h:5557,url=https://h:1")
                .unwrap();
        assert!(bad.validate().is_err());
    }

    use super::*;

    #[test]
    fn compact_form_parses_and_validates() {
        let e = EngineEndpoint::parse_compact(
            "worker_id=w1,endpoint=tcp://127.0.0.1:5557,replay_endpoint=tcp://127.0.0.1:5558,role=prefill,device=cpu,model=m,capacity_blocks=64,dp_rank=2,block_size=16,taints=a+b",
        )
        .unwrap();
        assert_eq!(e.worker_id, "w1");
        assert_eq!(e.replay_endpoint.as_deref(), Some("tcp://127.0.0.1:5558"));
        assert_eq!(e.role, Role::Prefill);
        assert_eq!(e.device, DeviceClass::Cpu);
        assert_eq!(e.capacity_blocks, 64);
        assert_eq!(e.spec().dp_ranks, DpRanks { lo: 2, hi: 2 });
        assert_eq!(e.block_size, Some(16));
        assert_eq!(e.taints, vec!["a".to_string(), "b".into()]);
        validate_all(std::slice::from_ref(&e)).unwrap();
        assert!(
            validate_all(&[e.clone(), e.clone()]).is_err(),
            "duplicate id"
        );
        for bad in [
            "endpoint=tcp://127.0.0.1:5557",
            "worker_id=w1",
            "worker_id=w1,endpoint=tcp://127.0.0.1:5557,colour=red",
            "worker_id=w1,endpoint=tcp://127.0.0.1:5557,capacity_blocks=x",
            "worker_id=w1,worker_id=w2,endpoint=tcp://127.0.0.1:5557",
            "nonsense",
        ] {
            assert!(EngineEndpoint::parse_compact(bad).is_err(), "{bad}");
        }
        for bad in ["tcp://*:5557", "ipc:///tmp/x", "tcp://h", "tcp://h:99999"] {
            let mut x = e.clone();
            x.endpoint = bad.into();
            assert!(x.validate().is_err(), "{bad}");
        }
        let mut x = e;
        x.block_size = Some(0);
        assert!(x.validate().is_err());
    }
}
