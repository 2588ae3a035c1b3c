//! Which worker answered (and so stores) each OpenAI Responses response: a
//! `previous_response_id` follow-up must go back to it, since the history lives in
//! that engine's response store.
//!
//! Guarantees: at most `capacity` entries (the oldest goes first when full), each
//! forgotten `ttl_ms` after it was recorded; ids longer than
//! [`super::responses::MAX_RESPONSE_ID`] are not recorded. Pure: the caller passes
//! the time; every operation is O(1) amortised (expired entries are dropped from
//! the front of the insertion queue as time passes).

use std::collections::{HashMap, VecDeque};

#[derive(Debug)]
pub struct ResponseMap<W> {
    map: HashMap<String, (W, u64, u64)>,
    /// (id, insertion sequence, recorded at) in insertion order.
    order: VecDeque<(String, u64, u64)>,
    capacity: usize,
    ttl_ms: u64,
    seq: u64,
}

impl<W: Clone> ResponseMap<W> {
    pub fn new(capacity: usize, ttl_ms: u64) -> ResponseMap<W> {
        ResponseMap {
            map: HashMap::new(),
            order: VecDeque::new(),
            capacity: capacity.max(1),
            ttl_ms,
            seq: 0,
        }
    }

    /// Records that `worker` answered response `id` at `now_ms` (a repeated id moves).
    pub fn insert(&mut self, id: &str, worker: W, now_ms: u64) {
        if id.is_empty() || id.len() > super::responses::MAX_RESPONSE_ID {
            return;
        }
        self.expire(now_ms);
        while self.map.len() >= self.capacity && !self.map.contains_key(id) {
            if !self.pop_front() {
                break;
            }
        }
        self.seq += 1;
        self.map.insert(id.to_string(), (worker, self.seq, now_ms));
        self.order.push_back((id.to_string(), self.seq, now_ms));
        // Stale queue entries (ids re-inserted since) never outnumber live ones.
        if self.order.len() > 2 * self.capacity {
            let live = &self.map;
            self.order
                .retain(|(k, s, _)| live.get(k).is_some_and(|(_, ls, _)| ls == s));
        }
    }

    /// The worker that answered `id`, if recorded within the TTL.
    pub fn get(&self, id: &str, now_ms: u64) -> Option<&W> {
        self.map
            .get(id)
            .filter(|(_, _, at)| now_ms.saturating_sub(*at) < self.ttl_ms)
            .map(|(w, _, _)| w)
    }

    /// Forgets `id` (its worker is gone, or the engine said it does not hold it).
    pub fn remove(&mut self, id: &str) {
        self.map.remove(id);
    }

    /// Drops every entry older than the TTL at `now_ms`.
    pub fn expire(&mut self, now_ms: u64) {
        while let Some((_, _, at)) = self.order.front() {
            if now_ms.saturating_sub(*at) < self.ttl_ms {
                break;
            }
            self.pop_front();
        }
    }

    /// Forgets every response of the workers `gone` says are gone.
    pub fn retain_workers(&mut self, mut keep: impl FnMut(&W) -> bool) {
        self.map.retain(|_, (w, _, _)| keep(w));
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Removes the oldest queued entry (and its map entry if still current).
    fn pop_front(&mut self) -> bool {
        let Some((k, s, _)) = self.order.pop_front() else {
            return false;
        };
        if self.map.get(&k).is_some_and(|(_, ls, _)| *ls == s) {
            self.map.remove(&k);
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_and_expiring() {
        let mut m = ResponseMap::new(2, 1000);
        m.insert("a", 1u32, 0);
        m.insert("b", 2, 10);
        assert_eq!(m.get("a", 20), Some(&1));
        m.insert("c", 3, 20);
        assert_eq!((m.get("a", 20), m.len()), (None, 2));
        assert_eq!(m.get("b", 1009), Some(&2));
        assert_eq!(m.get("b", 1010), None);
        m.expire(1015);
        assert_eq!(m.len(), 1);
        m.insert(&"x".repeat(300), 9, 1015);
        assert_eq!(m.len(), 1);
        m.retain_workers(|w| *w != 3);
        assert!(m.is_empty());
    }

    #[test]
    fn reinserting_moves_and_the_queue_stays_bounded() {
        let mut m = ResponseMap::new(2, u64::MAX);
        for i in 0..1000u64 {
            m.insert("same", i, i);
        }
        assert_eq!(m.get("same", 1000), Some(&999));
        assert!(m.order.len() <= 4);
        m.insert("other", 1, 1000);
        m.insert("third", 2, 1001);
        assert_eq!(m.get("same", 1002), None);
        assert_eq!(m.len(), 2);
    }
}
