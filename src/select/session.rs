//! Session affinity: which worker a session's last turn was routed to
//! (`session_max_entries`, `session_ttl_ms`; docs/POLICIES.md "Sessions").
//!
//! A session key (an `x-session-id` header or the OpenAI `user` field, hashed with the
//! tenant by `admission::hints`) names a conversation or an agent run. The prefix
//! affinity (`super::Affinity`) finds a conversation's worker from its prompt's
//! blocks, which fails when the client rewrote or summarised the history; a session
//! key does not. [`Hits::set_session`](super::Hits::set_session) makes the session's
//! worker the request's affinity worker with the same slack rule: it gets the request
//! unless its cost exceeds `1 + affinity_slack` times the lowest. Unlike a prefix
//! affinity, a worker holding more of the (rewritten) prompt does not cancel it: the
//! session's worker holds context the index cannot match to this prompt.
//!
//! The table is set-associative: `max_entries` (rounded up to a power of two, at
//! least [`WAYS`]) entries of two atomic words, in sets of [`WAYS`]; a key lives in
//! one set. A note refreshes the key's entry, else takes an empty or expired entry of
//! the set, else the least recently used one. An entry unused for `ttl` is expired:
//! never answered, and reused first. Like the prefix affinity, one table serves every
//! core without a lock: entries are hints, so relaxed atomics are enough. A lookup
//! reads the key word again after the data word and answers only if it did not
//! change, so a racing note of another session into the same entry is not mistaken
//! for this one (a torn read can only lose an answer).
//!
//! Guarantees: memory fixed at start (16 bytes per entry, at most
//! [`crate::config::MAX_SESSION_ENTRIES`]); a lookup or a note reads at most
//! 2 × [`WAYS`] words; pure apart from the atomics (time passed in as ms); no panics.

use crate::types::WorkerSlot;
use std::sync::atomic::{AtomicU64, Ordering};

/// Entries per set.
pub const WAYS: usize = 4;

/// Largest time a data word holds (48 bits of ms: 8,900 years).
const TIME_MASK: u64 = (1 << 48) - 1;

#[derive(Debug, Default)]
struct Entry {
    /// The session key (0: empty; a key of 0 is stored as 1).
    key: AtomicU64,
    /// Worker slot (top 16 bits) and the last use, ms (low 48 bits).
    data: AtomicU64,
}

/// The session table (see the module docs). `Default` is disabled.
#[derive(Debug, Default)]
pub struct Sessions {
    entries: Box<[Entry]>,
    sets_mask: usize,
    ttl_ms: u64,
}

fn stored(key: u64) -> u64 {
    key.max(1)
}

fn pack(worker: WorkerSlot, now_ms: u64) -> u64 {
    (u64::from(worker) << 48) | (now_ms & TIME_MASK)
}

impl Sessions {
    /// A table of `max_entries` entries (rounded up to a power of two, at least
    /// [`WAYS`], at most [`crate::config::MAX_SESSION_ENTRIES`]) forgetting a session
    /// after `ttl_ms`; 0 entries disables it.
    pub fn new(max_entries: usize, ttl_ms: u64) -> Sessions {
        if max_entries == 0 {
            return Sessions::default();
        }
        let n = max_entries
            .min(crate::config::MAX_SESSION_ENTRIES)
            .next_power_of_two()
            .max(WAYS);
        Sessions {
            entries: (0..n).map(|_| Entry::default()).collect(),
            sets_mask: n / WAYS - 1,
            ttl_ms,
        }
    }

    pub fn enabled(&self) -> bool {
        !self.entries.is_empty()
    }

    /// Entries the table can hold.
    pub fn capacity(&self) -> usize {
        self.entries.len()
    }

    fn set(&self, key: u64) -> &[Entry] {
        let s = (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 24) as usize & self.sets_mask;
        self.entries
            .get(s * WAYS..(s + 1) * WAYS)
            .unwrap_or_default()
    }

    fn fresh(&self, data: u64, now_ms: u64) -> bool {
        (now_ms & TIME_MASK).saturating_sub(data & TIME_MASK) < self.ttl_ms
    }

    /// The worker of `session`'s last turn, if seen within the TTL.
    pub fn lookup(&self, session: u64, now_ms: u64) -> Option<WorkerSlot> {
        let key = stored(session);
        self.set(session).iter().find_map(|e| {
            if e.key.load(Ordering::Relaxed) != key {
                return None;
            }
            let d = e.data.load(Ordering::Relaxed);
            (e.key.load(Ordering::Relaxed) == key && self.fresh(d, now_ms))
                .then_some((d >> 48) as WorkerSlot)
        })
    }

    /// `session`'s turn was routed to `worker` at `now_ms`.
    pub fn note(&self, session: u64, worker: WorkerSlot, now_ms: u64) {
        let key = stored(session);
        let set = self.set(session);
        let data = pack(worker, now_ms);
        if let Some(e) = set.iter().find(|e| e.key.load(Ordering::Relaxed) == key) {
            e.data.store(data, Ordering::Relaxed);
            return;
        }
        // An empty or expired entry, else the least recently used.
        let victim = set.iter().min_by_key(|e| {
            let k = e.key.load(Ordering::Relaxed);
            let d = e.data.load(Ordering::Relaxed);
            match (k, self.fresh(d, now_ms)) {
                (0, _) | (_, false) => (0, 0),
                _ => (1, d & TIME_MASK),
            }
        });
        if let Some(e) = victim {
            // Empty the entry while its data changes, so no reader pairs the old key
            // with the new data.
            e.key.store(0, Ordering::Relaxed);
            e.data.store(data, Ordering::Relaxed);
            e.key.store(key, Ordering::Relaxed);
        }
    }

    /// Sessions seen within the TTL (a scan of the table: for status pages).
    pub fn live(&self, now_ms: u64) -> usize {
        self.entries
            .iter()
            .filter(|e| {
                e.key.load(Ordering::Relaxed) != 0
                    && self.fresh(e.data.load(Ordering::Relaxed), now_ms)
            })
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_session_finds_its_worker_until_the_ttl() {
        let s = Sessions::new(64, 1000);
        assert!(s.enabled());
        assert_eq!(s.lookup(7, 0), None);
        s.note(7, 3, 100);
        assert_eq!(s.lookup(7, 100), Some(3));
        assert_eq!(s.lookup(7, 1099), Some(3));
        assert_eq!(s.lookup(7, 1100), None, "expired");
        s.note(7, 5, 1200);
        assert_eq!(s.lookup(7, 1300), Some(5), "a later turn moves it");
        s.note(0, 0, 1300);
        assert_eq!(s.lookup(0, 1300), Some(0), "key 0 and slot 0 are ordinary");
        assert_eq!(s.live(1300), 2);
        assert_eq!(s.live(5000), 0);
    }

    #[test]
    fn disabled_remembers_nothing() {
        let s = Sessions::new(0, 1000);
        s.note(1, 1, 0);
        assert!(!s.enabled());
        assert_eq!(s.lookup(1, 0), None);
        assert_eq!(s.live(0), 0);
    }

    #[test]
    fn the_table_is_bounded_and_evicts_expired_then_least_recent() {
        let s = Sessions::new(3, 1000);
        assert_eq!(s.capacity(), WAYS, "one set");
        for k in 0..4u64 {
            s.note(k + 10, k as WorkerSlot, k);
        }
        // A fifth session takes the least recently used entry (key 10).
        s.note(20, 9, 10);
        assert_eq!(s.lookup(10, 10), None);
        assert_eq!(s.lookup(11, 10), Some(1));
        assert_eq!(s.lookup(20, 10), Some(9));
        // Refreshing 11 protects it; at t = 1005 keys 12 and 13 (noted at 2, 3) have
        // expired, so the next newcomers take their entries first.
        s.note(11, 1, 1000);
        s.note(30, 4, 1005);
        s.note(31, 5, 1005);
        assert_eq!(s.lookup(11, 1005), Some(1));
        assert_eq!(s.lookup(20, 1005), Some(9));
        assert_eq!(s.capacity(), 4);
        assert_eq!(
            Sessions::new(usize::MAX, 1).capacity(),
            crate::config::MAX_SESSION_ENTRIES
        );
    }

    proptest! {
        /// Against a model of the last note per session: an answer is always the last
        /// worker noted for that session within the TTL (entries may be lost to
        /// eviction, never confused).
        #[test]
        fn answers_are_never_wrong(ops in prop::collection::vec((0u64..40, 0u16..8, 0u64..300, any::<bool>()), 1..300)) {
            let s = Sessions::new(16, 500);
            let mut last: std::collections::HashMap<u64, (u16, u64)> = Default::default();
            let mut now = 0;
            for &(key, w, dt, note) in &ops {
                now += dt;
                if note {
                    s.note(key, w, now);
                    last.insert(key, (w, now));
                } else if let Some(got) = s.lookup(key, now) {
                    let (w0, t0) = last[&key];
                    prop_assert_eq!(got, w0);
                    prop_assert!(now - t0 < 500);
                }
                prop_assert!(s.live(now) <= 16);
            }
        }
    }
}
