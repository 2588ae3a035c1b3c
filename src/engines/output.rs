//! What an engine adapter ([`super::adapter`]) hands out: its changes to one worker's
//! part of the index, merged within an event per kind and tier, and its counters.

use crate::types::Tier;

/// A change to this worker's part of the index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    Stored { tier: Tier, hashes: Vec<u64> },
    Removed { tier: Tier, hashes: Vec<u64> },
    Cleared { tier: Option<Tier> },
}

/// What the adapter dropped or could not resolve (monotonic counters).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AdapterStats {
    pub stored_blocks: u64,
    pub removed_blocks: u64,
    /// Stored events whose parent hash was not in the map.
    pub unknown_parent: u64,
    /// Removed hashes not held in that group and tier (never seen, or evicted).
    pub unknown_removed: u64,
    /// Blocks of stored events without complete tokens.
    pub missing_tokens: u64,
    /// Entries evicted because the map was full.
    pub evicted: u64,
    /// Stored events with a block size kvroute cannot hash (0 or too large).
    pub bad_block_size: u64,
    /// Stored events refused: their block size differs from the router's.
    pub block_size_mismatch: u64,
    /// Events whose medium neither engine defines (credited to the configured tier).
    pub unknown_medium: u64,
    /// Stored events refused: their lookahead differs from the router's.
    pub lookahead_mismatch: u64,
    /// Events of a KV cache group index kvroute does not track (>= `MAX_GROUPS`).
    pub bad_group: u64,
}

impl AdapterStats {
    /// One block more stored (`true`) or removed.
    pub(super) fn count(&mut self, stored: bool) {
        if stored {
            self.stored_blocks += 1;
        } else {
            self.removed_blocks += 1;
        }
    }
}

/// Appends `seq` to the last change if it is of this event (at or after `mark`) and of
/// the same kind and tier, else a new one.
pub(super) fn push(out: &mut Vec<Change>, mark: usize, stored: bool, tier: Tier, seq: u64) {
    let last = if out.len() > mark {
        out.last_mut()
    } else {
        None
    };
    match last {
        Some(Change::Stored { tier: t, hashes }) if stored && *t == tier => hashes.push(seq),
        Some(Change::Removed { tier: t, hashes }) if !stored && *t == tier => hashes.push(seq),
        _ => out.push(if stored {
            Change::Stored {
                tier,
                hashes: vec![seq],
            }
        } else {
            Change::Removed {
                tier,
                hashes: vec![seq],
            }
        }),
    }
}
