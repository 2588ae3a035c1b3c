//! The replicated registry entry: the value of key `w.HEX(id)` in the tier's KV bucket
//! (`kvroute_NAME_workers`, docs/PROTOCOL.md "Cluster registry"). A registration or a
//! removal (a tombstone, not a KV delete: a delete carries no value, so it could not
//! carry a tag), with the replica incarnation that accepted it (`origin`) and whom its
//! door authenticated (`by`), sealed by `cluster::auth`.
//!
//! `by` lets a receiver apply the ownership rule HTTP applies
//! (`Credentials::principal_may_act_on`): a worker with a token of its own is changed
//! only by that token, so an entry for it made with the shared token is refused, as
//! HTTP would refuse the call, even if the replica that accepted it was configured
//! without that worker's token.
//!
//! Guarantees: decoding is bounded ([`MAX_ENTRY_BYTES`], checked before parsing),
//! refuses unknown fields, an invalid worker id or origin, and an entry whose worker is
//! not the one its key names (a sealed entry cannot be moved to another worker's key:
//! its tag covers the key too). Pure.

use crate::types::WorkerSpec;
use serde::{Deserialize, Serialize};

/// Largest entry a receiver parses (the bucket's `max_message_size`).
pub const MAX_ENTRY_BYTES: usize = 1 << 20;

/// Whom the accepting replica's door authenticated for the change.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum By {
    /// The shared token (or anyone, authentication off).
    Admin,
    /// The worker's own token.
    Worker,
}

/// One registry change.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum RegEntry {
    Put {
        origin: String,
        by: By,
        spec: WorkerSpec,
    },
    Remove {
        origin: String,
        by: By,
        id: String,
    },
}

/// Why an entry was refused (the `reason` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryError {
    Undecodable,
    /// The entry's worker is not the key's.
    Key,
    /// The origin is not a replica incarnation (`replica_id/boot`).
    Origin,
}

impl EntryError {
    pub fn label(self) -> &'static str {
        match self {
            EntryError::Undecodable => "undecodable",
            EntryError::Key => "key",
            EntryError::Origin => "origin",
        }
    }
}

impl RegEntry {
    pub fn id(&self) -> &str {
        match self {
            RegEntry::Put { spec, .. } => &spec.id,
            RegEntry::Remove { id, .. } => id,
        }
    }

    pub fn origin(&self) -> &str {
        match self {
            RegEntry::Put { origin, .. } | RegEntry::Remove { origin, .. } => origin,
        }
    }

    pub fn by(&self) -> By {
        match self {
            RegEntry::Put { by, .. } | RegEntry::Remove { by, .. } => *by,
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Decodes the (opened) value stored under `key`.
    pub fn decode(key: &str, b: &[u8]) -> Result<RegEntry, EntryError> {
        if b.len() > MAX_ENTRY_BYTES {
            return Err(EntryError::Undecodable);
        }
        let e: RegEntry = serde_json::from_slice(b).map_err(|_| EntryError::Undecodable)?;
        crate::ids::check("worker id", e.id()).map_err(|_| EntryError::Undecodable)?;
        if super::names::worker_key(e.id()) != key {
            return Err(EntryError::Key);
        }
        if !super::names::is_origin(e.origin()) {
            return Err(EntryError::Origin);
        }
        Ok(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::names::worker_key;

    fn spec(id: &str) -> WorkerSpec {
        serde_json::from_value(serde_json::json!({"id": id, "url": "http://127.0.0.1:9"})).unwrap()
    }

    #[test]
    fn entries_round_trip_under_their_key_only() {
        let put = RegEntry::Put {
            origin: "r1/1a2b".into(),
            by: By::Worker,
            spec: spec("w1"),
        };
        let rm = RegEntry::Remove {
            origin: "r1/1a2b".into(),
            by: By::Admin,
            id: "w2".into(),
        };
        for e in [&put, &rm] {
            let b = e.encode();
            assert_eq!(RegEntry::decode(&worker_key(e.id()), &b).as_ref(), Ok(e));
            assert_eq!(
                RegEntry::decode(&worker_key("other"), &b),
                Err(EntryError::Key)
            );
        }
        let text = String::from_utf8(rm.encode()).unwrap();
        assert_eq!(
            text,
            r#"{"op":"remove","origin":"r1/1a2b","by":"admin","id":"w2"}"#
        );
        // A bare spec (the value an older replica wrote) and garbage are refused.
        let bare = serde_json::to_vec(&spec("w1")).unwrap();
        assert_eq!(
            RegEntry::decode(&worker_key("w1"), &bare),
            Err(EntryError::Undecodable)
        );
        let bad_origin = text.replace("r1/1a2b", "nobody");
        assert_eq!(
            RegEntry::decode(&worker_key("w2"), bad_origin.as_bytes()),
            Err(EntryError::Origin)
        );
        let extra = text.replace(r#""id":"w2""#, r#""id":"w2","x":1"#);
        assert_eq!(
            RegEntry::decode(&worker_key("w2"), extra.as_bytes()),
            Err(EntryError::Undecodable)
        );
        assert_eq!(
            RegEntry::decode("w.00", &vec![b' '; MAX_ENTRY_BYTES + 1]),
            Err(EntryError::Undecodable)
        );
    }
}
