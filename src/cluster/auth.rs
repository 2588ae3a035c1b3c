//! Authentication of everything router replicas accept from NATS (`cluster.secret`):
//! event records, registry entries, load batches, load-sync requests and answers, and
//! engine leases each carry an HMAC-SHA256 tag, so a NATS client without the tier's
//! secret can neither forge any of them nor alter one in transit.
//!
//! Sealed form: `payload || "KVT1" || tag` (32 bytes), where
//! `tag = HMAC-SHA256(key, DOMAIN || kind || u32 LE len(context) || context || payload)`
//! and `key = HMAC-SHA256(secret, "kvroute tier " || cluster name)`. The kind keeps a
//! tag of one message type from verifying as another; the context binds a message to
//! where it belongs (a registry entry to its KV key, a load-sync answer to the inbox
//! of the request it answers); the key binds everything to one tier, so two tiers
//! sharing a secret cannot replay into each other.
//!
//! Guarantees: [`Sealer::open`] returns the payload only when its tag verifies
//! (constant-time comparison); a message without the trailer is
//! [`Refusal::MissingTag`], one with a wrong tag [`Refusal::BadTag`]. With the
//! explicit opt-out ([`Sealer::unauthenticated`]) nothing is added or checked.
//! Integrity and origin only: the tags hide nothing (NATS permissions and TLS do
//! that), and a captured message can be replayed (docs/SECURITY.md says which replays
//! each kind absorbs). Pure.

use hmac::{Hmac, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// Marks a sealed message's trailer.
pub const MARKER: &[u8; 4] = b"KVT1";
/// Bytes of the tag.
pub const TAG_LEN: usize = 32;
/// Bytes a seal adds to a payload.
pub const TRAILER_LEN: usize = MARKER.len() + TAG_LEN;
/// Shortest secret accepted (bytes).
pub const MIN_SECRET_LEN: usize = 16;

const DOMAIN: &[u8] = b"kvroute-cluster-v1\0";

/// What a sealed message is (part of its tag).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Record = 1,
    Registry = 2,
    Load = 3,
    SyncRequest = 4,
    SyncAnswer = 5,
    Lease = 6,
}

impl Kind {
    /// The `kind` label of `kvroute_cluster_refused_total`.
    pub fn label(self) -> &'static str {
        match self {
            Kind::Record => "record",
            Kind::Registry => "registry",
            Kind::Load => "load",
            Kind::SyncRequest => "sync_request",
            Kind::SyncAnswer => "sync_answer",
            Kind::Lease => "lease",
        }
    }
}

/// Why a message was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// No trailer: not sealed (a plain NATS client, or a replica without a secret).
    MissingTag,
    /// A trailer whose tag does not verify: another secret, or altered.
    BadTag,
}

impl Refusal {
    /// The `reason` label of `kvroute_cluster_refused_total`.
    pub fn label(self) -> &'static str {
        match self {
            Refusal::MissingTag => "missing_tag",
            Refusal::BadTag => "bad_tag",
        }
    }
}

/// Seals and opens messages with one tier's key (or, opted out, passes them through).
#[derive(Clone)]
pub struct Sealer {
    /// HMAC keyed with the tier key, cloned per message (no key schedule per message).
    mac: Option<HmacSha256>,
}

impl Sealer {
    /// The sealer of tier `tier` with `secret`.
    pub fn new(secret: &[u8], tier: &str) -> Sealer {
        let mut k = keyed(secret);
        k.update(b"kvroute tier ");
        k.update(tier.as_bytes());
        let key = k.finalize().into_bytes();
        Sealer {
            mac: Some(keyed(&key)),
        }
    }

    /// No authentication (`cluster.unauthenticated`): seals nothing, accepts anything.
    pub fn unauthenticated() -> Sealer {
        Sealer { mac: None }
    }

    pub fn enabled(&self) -> bool {
        self.mac.is_some()
    }

    fn tag(mac: &HmacSha256, kind: Kind, context: &[u8], payload: &[u8]) -> HmacSha256 {
        let mut m = mac.clone();
        m.update(DOMAIN);
        m.update(&[kind as u8]);
        m.update(&(context.len() as u32).to_le_bytes());
        m.update(context);
        m.update(payload);
        m
    }

    /// `payload` with its trailer appended (unchanged when unauthenticated).
    pub fn seal(&self, kind: Kind, context: &[u8], mut payload: Vec<u8>) -> Vec<u8> {
        if let Some(mac) = &self.mac {
            let tag = Self::tag(mac, kind, context, &payload)
                .finalize()
                .into_bytes();
            payload.reserve_exact(TRAILER_LEN);
            payload.extend_from_slice(MARKER);
            payload.extend_from_slice(&tag);
        }
        payload
    }

    /// The payload of a sealed `msg` whose tag verifies (all of `msg` when
    /// unauthenticated).
    pub fn open<'a>(&self, kind: Kind, context: &[u8], msg: &'a [u8]) -> Result<&'a [u8], Refusal> {
        let Some(mac) = &self.mac else {
            return Ok(msg);
        };
        let Some(split) = msg.len().checked_sub(TRAILER_LEN) else {
            return Err(Refusal::MissingTag);
        };
        let (payload, trailer) = msg.split_at(split);
        let (marker, tag) = trailer.split_at(MARKER.len());
        if marker != MARKER {
            return Err(Refusal::MissingTag);
        }
        Self::tag(mac, kind, context, payload)
            .verify_slice(tag)
            .map(|()| payload)
            .map_err(|_| Refusal::BadTag)
    }
}

fn keyed(key: &[u8]) -> HmacSha256 {
    // HMAC takes keys of any length: `new_from_slice` cannot fail for it.
    match HmacSha256::new_from_slice(key) {
        Ok(m) => m,
        Err(_) => unreachable!("HMAC accepts keys of every length"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealed_messages_open_only_with_the_same_key_kind_and_context() {
        let s = Sealer::new(b"0123456789abcdef", "prod");
        let msg = s.seal(Kind::Load, b"kvroute.prod.load", b"{\"ops\":[]}".to_vec());
        assert_eq!(msg.len(), 10 + TRAILER_LEN);
        assert_eq!(
            s.open(Kind::Load, b"kvroute.prod.load", &msg),
            Ok(&b"{\"ops\":[]}"[..])
        );
        // Another kind, context, tier or secret: refused.
        assert_eq!(
            s.open(Kind::Record, b"kvroute.prod.load", &msg),
            Err(Refusal::BadTag)
        );
        assert_eq!(s.open(Kind::Load, b"other", &msg), Err(Refusal::BadTag));
        let tier = Sealer::new(b"0123456789abcdef", "test");
        assert_eq!(
            tier.open(Kind::Load, b"kvroute.prod.load", &msg),
            Err(Refusal::BadTag)
        );
        let other = Sealer::new(b"0123456789abcdeF", "prod");
        assert_eq!(
            other.open(Kind::Load, b"kvroute.prod.load", &msg),
            Err(Refusal::BadTag)
        );
        // Any flipped bit of payload or tag: refused.
        for i in 0..msg.len() {
            let mut m = msg.clone();
            m[i] ^= 1;
            assert!(s.open(Kind::Load, b"kvroute.prod.load", &m).is_err(), "{i}");
        }
        // Unsealed or cut messages: missing.
        assert_eq!(
            s.open(Kind::Load, b"", b"{\"ops\":[]}"),
            Err(Refusal::MissingTag)
        );
        assert_eq!(s.open(Kind::Load, b"", b""), Err(Refusal::MissingTag));
        assert_eq!(
            s.open(Kind::Load, b"kvroute.prod.load", &msg[..msg.len() - 1]),
            Err(Refusal::MissingTag)
        );
        // An empty payload seals too.
        let empty = s.seal(Kind::Lease, b"k", Vec::new());
        assert_eq!(s.open(Kind::Lease, b"k", &empty), Ok(&b""[..]));
    }

    #[test]
    fn unauthenticated_passes_everything_through() {
        let s = Sealer::unauthenticated();
        assert!(!s.enabled());
        assert_eq!(s.seal(Kind::Record, b"", b"abc".to_vec()), b"abc");
        assert_eq!(s.open(Kind::Record, b"", b"abc"), Ok(&b"abc"[..]));
    }

    #[test]
    fn context_length_is_part_of_the_tag() {
        // ("ab", "c") and ("a", "bc") must not share a tag.
        let s = Sealer::new(b"0123456789abcdef", "t");
        let m = s.seal(Kind::Registry, b"ab", b"c".to_vec());
        let mut moved = b"bc".to_vec();
        moved.extend_from_slice(&m[1..]);
        assert_eq!(s.open(Kind::Registry, b"a", &moved), Err(Refusal::BadTag));
    }
}
