//! The replicated event record (`kvroute.NAME.events.WORKER`, docs/PROTOCOL.md
//! "Cluster event log"): one batch of one worker's index changes as a replica's ingest
//! accepted it, tagged with the publishing replica (`origin`) and that replica's
//! per-worker sequence number, so receivers can drop duplicates and redeliveries.
//!
//! Guarantees: `decode(encode(r)) == r`; decoding never allocates more than the input
//! justifies (every count is checked against the bytes left before anything is
//! reserved) and rejects trailing bytes, unknown versions, kinds and tiers. Pure.

use crate::types::Tier;

/// First byte of every record.
pub const VERSION: u8 = 1;
/// Largest record a receiver accepts (the default NATS max payload is 1 MiB).
pub const MAX_RECORD_BYTES: usize = 1 << 20;

const KIND_STORED: u8 = 0;
const KIND_REMOVED: u8 = 1;
const KIND_CLEARED: u8 = 2;
/// `Cleared` of every tier.
const TIER_ALL: u8 = 0xff;

/// One index change of a worker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecOp {
    Stored { tier: Tier, hashes: Vec<u64> },
    Removed { tier: Tier, hashes: Vec<u64> },
    Cleared { tier: Option<Tier> },
}

/// One published batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventRecord {
    /// The publishing replica's incarnation (`replica_id/boot`).
    pub origin: String,
    pub worker: String,
    /// Per (origin, worker), from 1, +1 per record.
    pub seq: u64,
    pub ops: Vec<RecOp>,
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("record truncated")]
    Truncated,
    #[error("record of {0} bytes is over the limit")]
    TooLarge(usize),
    #[error("unknown record version {0}")]
    Version(u8),
    #[error("bad field: {0}")]
    Bad(&'static str),
}

impl EventRecord {
    pub fn encode(&self) -> Vec<u8> {
        let hashes: usize = self
            .ops
            .iter()
            .map(|o| match o {
                RecOp::Stored { hashes, .. } | RecOp::Removed { hashes, .. } => hashes.len(),
                RecOp::Cleared { .. } => 0,
            })
            .sum();
        let mut out = Vec::with_capacity(
            16 + self.origin.len() + self.worker.len() + self.ops.len() * 6 + hashes * 8,
        );
        out.push(VERSION);
        put_str(&mut out, &self.origin);
        put_str(&mut out, &self.worker);
        out.extend_from_slice(&self.seq.to_le_bytes());
        out.extend_from_slice(&(self.ops.len() as u32).to_le_bytes());
        for op in &self.ops {
            match op {
                RecOp::Stored { tier, hashes } | RecOp::Removed { tier, hashes } => {
                    let kind = if matches!(op, RecOp::Stored { .. }) {
                        KIND_STORED
                    } else {
                        KIND_REMOVED
                    };
                    out.push(kind);
                    out.push(tier.as_u8());
                    out.extend_from_slice(&(hashes.len() as u32).to_le_bytes());
                    for h in hashes {
                        out.extend_from_slice(&h.to_le_bytes());
                    }
                }
                RecOp::Cleared { tier } => {
                    out.push(KIND_CLEARED);
                    out.push(tier.map_or(TIER_ALL, Tier::as_u8));
                }
            }
        }
        out
    }

    pub fn decode(b: &[u8]) -> Result<EventRecord, WireError> {
        if b.len() > MAX_RECORD_BYTES {
            return Err(WireError::TooLarge(b.len()));
        }
        let mut r = Reader(b);
        let v = r.u8()?;
        if v != VERSION {
            return Err(WireError::Version(v));
        }
        let origin = r.str()?;
        let worker = r.str()?;
        crate::ids::check("worker id", &worker).map_err(|_| WireError::Bad("worker id"))?;
        let seq = r.u64()?;
        let n = r.u32()? as usize;
        // Each op takes at least 2 bytes.
        if n > r.0.len() / 2 {
            return Err(WireError::Truncated);
        }
        let mut ops = Vec::with_capacity(n);
        for _ in 0..n {
            let kind = r.u8()?;
            let t = r.u8()?;
            match kind {
                KIND_STORED | KIND_REMOVED => {
                    let tier = Tier::from_u8(t).ok_or(WireError::Bad("tier"))?;
                    let count = r.u32()? as usize;
                    if count > r.0.len() / 8 {
                        return Err(WireError::Truncated);
                    }
                    let mut hashes = Vec::with_capacity(count);
                    for _ in 0..count {
                        hashes.push(r.u64()?);
                    }
                    ops.push(if kind == KIND_STORED {
                        RecOp::Stored { tier, hashes }
                    } else {
                        RecOp::Removed { tier, hashes }
                    });
                }
                KIND_CLEARED => {
                    let tier = if t == TIER_ALL {
                        None
                    } else {
                        Some(Tier::from_u8(t).ok_or(WireError::Bad("tier"))?)
                    };
                    ops.push(RecOp::Cleared { tier });
                }
                _ => return Err(WireError::Bad("op kind")),
            }
        }
        if !r.0.is_empty() {
            return Err(WireError::Bad("trailing bytes"));
        }
        Ok(EventRecord {
            origin,
            worker,
            seq,
            ops,
        })
    }
}

/// Strings are at most 255 bytes (ids are at most 128); longer ones are cut at a
/// character boundary.
fn put_str(out: &mut Vec<u8>, s: &str) {
    let mut end = s.len().min(255);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    out.push(end as u8);
    out.extend_from_slice(&s.as_bytes()[..end]);
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], WireError> {
        if self.0.len() < n {
            return Err(WireError::Truncated);
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, WireError> {
        let mut a = [0u8; 4];
        a.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(a))
    }
    fn u64(&mut self) -> Result<u64, WireError> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(a))
    }
    fn str(&mut self) -> Result<String, WireError> {
        let n = self.u8()? as usize;
        let b = self.take(n)?;
        String::from_utf8(b.to_vec()).map_err(|_| WireError::Bad("utf-8"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> EventRecord {
        EventRecord {
            origin: "r1/abc".into(),
            worker: "w.0:1".into(),
            seq: 42,
            ops: vec![
                RecOp::Stored {
                    tier: Tier::Device,
                    hashes: vec![1, u64::MAX, 3],
                },
                RecOp::Removed {
                    tier: Tier::Host,
                    hashes: vec![],
                },
                RecOp::Cleared { tier: None },
                RecOp::Cleared {
                    tier: Some(Tier::Disk),
                },
            ],
        }
    }

    #[test]
    fn round_trips() {
        let r = sample();
        assert_eq!(EventRecord::decode(&r.encode()), Ok(r));
    }

    #[test]
    fn matches_the_protocol_example() {
        // docs/PROTOCOL.md §8.1.
        let r = EventRecord {
            origin: "r/1".into(),
            worker: "w".into(),
            seq: 1,
            ops: vec![RecOp::Stored {
                tier: Tier::Device,
                hashes: vec![5],
            }],
        };
        let mut want = vec![1, 3, b'r', b'/', b'1', 1, b'w', 1, 0, 0, 0, 0, 0, 0, 0];
        want.extend_from_slice(&[1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(r.encode(), want);
    }

    #[test]
    fn rejects_every_truncation_and_garbage() {
        let b = sample().encode();
        for n in 0..b.len() {
            assert!(EventRecord::decode(&b[..n]).is_err(), "prefix {n}");
        }
        let mut long = b.clone();
        long.push(0);
        assert!(EventRecord::decode(&long).is_err());
        let mut v = b.clone();
        v[0] = 9;
        assert_eq!(EventRecord::decode(&v), Err(WireError::Version(9)));
        // A huge hash count with no bytes behind it allocates nothing.
        let mut huge = b[..1 + 7 + 6 + 8].to_vec();
        huge.extend_from_slice(&1u32.to_le_bytes());
        huge.extend_from_slice(&[KIND_STORED, 0]);
        huge.extend_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(EventRecord::decode(&huge), Err(WireError::Truncated));
    }
}
