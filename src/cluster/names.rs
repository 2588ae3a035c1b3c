//! NATS names derived from the cluster name and worker ids. Worker ids may hold `.`
//! (a subject token separator) and `:@+=` (not allowed in KV keys), so subjects
//! replace `.` by `%` (not an id byte: injective) and KV keys are hex. Pure.

/// Whether `name` may be a cluster name (one subject token, part of stream and bucket
/// names): 1..=64 bytes of `A-Z a-z 0-9 _ -`.
pub fn check_cluster_name(name: &str) -> Result<(), String> {
    if !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        Ok(())
    } else {
        Err(format!(
            "cluster_name must be 1..=64 bytes of [A-Za-z0-9_-], got {name:?}"
        ))
    }
}

/// Whether `origin` names a replica incarnation as replicas make them
/// (`replica_id/boot`: a valid id, `/`, 1..=16 lowercase hex digits).
pub fn is_origin(origin: &str) -> bool {
    let Some((id, boot)) = origin.rsplit_once('/') else {
        return false;
    };
    crate::ids::check("replica id", id).is_ok()
        && (1..=16).contains(&boot.len())
        && boot.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

pub struct Names {
    pub stream: String,
    pub events_prefix: String,
    pub workers_bucket: String,
}

impl Names {
    pub fn new(cluster: &str) -> Names {
        Names {
            stream: format!("KVROUTE_{cluster}_EVENTS"),
            events_prefix: format!("kvroute.{cluster}.events"),
            workers_bucket: format!("kvroute_{cluster}_workers"),
        }
    }

    pub fn event_subject(&self, worker: &str) -> String {
        format!("{}.{}", self.events_prefix, worker.replace('.', "%"))
    }

    /// Core NATS subject of the shared-load batches.
    pub fn load_subject(&self) -> String {
        format!("{}.load", self.events_prefix.trim_end_matches(".events"))
    }

    pub fn events_filter(&self) -> String {
        format!("{}.>", self.events_prefix)
    }
}

/// The KV key of a worker.
pub fn worker_key(id: &str) -> String {
    let mut s = String::with_capacity(2 + id.len() * 2);
    s.push_str("w.");
    for b in id.bytes() {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// The worker id of a KV key made by [`worker_key`]; `None` for any other key.
pub fn worker_id_of_key(key: &str) -> Option<String> {
    let hex = key.strip_prefix("w.")?;
    if hex.len() % 2 != 0 {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect();
    String::from_utf8(bytes?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        let n = Names::new("prod");
        assert_eq!(n.event_subject("w.1:a"), "kvroute.prod.events.w%1:a");
        assert_eq!(worker_key("a:b"), "w.613a62");
        assert_eq!(n.load_subject(), "kvroute.prod.load");
        assert_eq!(n.events_filter(), "kvroute.prod.events.>");
        assert!(check_cluster_name("prod-1_x").is_ok());
        assert!(check_cluster_name("a.b").is_err());
        assert!(check_cluster_name("").is_err());
    }

    #[test]
    fn origins() {
        assert!(is_origin("host-1/1a2b3c"));
        assert!(is_origin("r:1@x/0"));
        for bad in [
            "",
            "r",
            "r/",
            "/1a",
            "r/1A",
            "r/xyz",
            "r/12345678901234567",
            "a b/1",
        ] {
            assert!(!is_origin(bad), "{bad:?}");
        }
    }

    #[test]
    fn keys_round_trip() {
        for id in ["w-1", "a.b:c@d+e=f_g"] {
            let k = worker_key(id);
            assert_eq!(worker_id_of_key(&k).as_deref(), Some(id));
        }
        assert_eq!(worker_id_of_key("w.6"), None);
        assert_eq!(worker_id_of_key("x.61"), None);
    }
}
