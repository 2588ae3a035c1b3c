//! Reading a shard's live entries back out, for warm-restart snapshots.
//!
//! The map is keyed by `mix(hash)`; `mix` is a bijection, so `unmix` recovers the
//! sequence hash and a restored index is identical to the one that was saved.

use super::{is_live, slot_of, tier_of, IndexShard};
use crate::index::unmix;
use crate::types::{Tier, WorkerSlot};

impl IndexShard {
    /// Calls `f(hash, worker, tier)` for every live entry (unspecified order).
    pub fn for_each_live(&self, mut f: impl FnMut(u64, WorkerSlot, Tier)) {
        for (key, hs) in self.map.iter() {
            for &e in hs.entries(&self.slab) {
                if is_live(&self.gens, e) {
                    f(unmix(key), slot_of(e), tier_of(e));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::index::{mix, unmix, IndexShard};
    use crate::types::Tier;

    #[test]
    fn unmix_inverts_mix() {
        for h in [
            0u64,
            1,
            2,
            0xdead_beef,
            u64::MAX,
            1 << 63,
            0x9E37_79B9_7F4A_7C15,
        ] {
            assert_eq!(unmix(mix(h)), h);
        }
        let mut x = 12345u64;
        for _ in 0..10_000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            assert_eq!(unmix(mix(x)), x);
        }
    }

    #[test]
    fn for_each_live_skips_cleared_entries() {
        let mut s = IndexShard::new();
        s.stored(1, Tier::Device, &[10, 11]);
        s.stored(2, Tier::Host, &[11, 12]);
        s.stored(3, Tier::Device, &[13]);
        s.clear_worker(3);
        let mut got = Vec::new();
        s.for_each_live(|h, w, t| got.push((h, w, t)));
        got.sort_by_key(|&(h, w, _)| (h, w));
        assert_eq!(
            got,
            vec![
                (10, 1, Tier::Device),
                (11, 1, Tier::Device),
                (11, 2, Tier::Host),
                (12, 2, Tier::Host)
            ]
        );
    }
}
