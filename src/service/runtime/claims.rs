//! The service-wide register of request ids, for `index_layout = "replicated"` with
//! more than one core: which core holds (or is routing) each request a client named.
//!
//! Why it exists: a request id lives on at most one core. Sharded, a route asks every
//! other core anyway (their shards hold part of its prefix), so they check the id on
//! the way. Replicated, the routing core's own copy of the index answers alone, and
//! asking the other cores only "do you know this id?" would cost a cross-core round
//! trip (two doorbells, two wake-ups: tens of µs) on every route. This register
//! answers the same question with one short, striped critical section instead.
//!
//! Guarantees: an id is in the register exactly while one core has claimed it for a
//! routing in progress or holds its request (`service::runtime::core` claims before routing,
//! restoring or admitting a replica's request, and releases when the routing fails
//! or the request ends: finish, prefill failure, its worker's removal); a second claim
//! of a registered id fails, so of two cores routing one id at once exactly one wins.
//! The proxy's own ids (`ids::PROXY_ID_PREFIX`) are unique by construction and never
//! registered. Memory is bounded by the cores' request limits (`max_active_requests`
//! each).

use std::sync::Mutex;

/// Stripes: enough that two cores rarely meet on one lock, few enough to stay small.
const STRIPES: usize = 64;

type Stripe = hashbrown::HashMap<Box<str>, u16, ahash::RandomState>;

/// Request id → the core that claimed it.
pub struct Claims {
    pick: ahash::RandomState,
    stripes: Box<[Mutex<Stripe>]>,
}

impl Default for Claims {
    fn default() -> Self {
        Claims::new()
    }
}

impl Claims {
    pub fn new() -> Claims {
        Claims {
            pick: ahash::RandomState::new(),
            stripes: (0..STRIPES)
                .map(|_| Mutex::new(Stripe::with_hasher(ahash::RandomState::new())))
                .collect(),
        }
    }

    fn stripe(&self, id: &str) -> std::sync::MutexGuard<'_, Stripe> {
        let i = self.pick.hash_one(id) as usize % STRIPES;
        // A panic while holding a stripe leaves a map that is still consistent (every
        // operation is one insert, lookup or remove): keep using it.
        match self.stripes[i].lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Registers `id` as held by `core`; `false` (nothing changed) when it is already
    /// registered, by any core.
    pub fn claim(&self, id: &str, core: usize) -> bool {
        let mut s = self.stripe(id);
        if s.contains_key(id) {
            return false;
        }
        s.insert(id.into(), core as u16);
        true
    }

    /// Removes `id` if `core` holds it (a release by a core that does not hold the id
    /// changes nothing).
    pub fn release(&self, id: &str, core: usize) {
        let mut s = self.stripe(id);
        if s.get(id) == Some(&(core as u16)) {
            s.remove(id);
        }
    }

    /// The core that holds `id`, if any.
    pub fn owner(&self, id: &str) -> Option<usize> {
        self.stripe(id).get(id).map(|&c| usize::from(c))
    }

    /// Registered ids (for tests and the status of a drained service).
    pub fn len(&self) -> usize {
        self.stripes
            .iter()
            .map(|s| match s.lock() {
                Ok(g) => g.len(),
                Err(p) => p.into_inner().len(),
            })
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_claim_per_id() {
        let c = Claims::new();
        assert!(c.claim("a", 0));
        assert!(!c.claim("a", 1));
        assert!(!c.claim("a", 0));
        assert_eq!(c.owner("a"), Some(0));
        assert!(c.claim("b", 1));
        assert_eq!(c.len(), 2);
    }

    #[test]
    fn only_the_holder_releases() {
        let c = Claims::new();
        assert!(c.claim("a", 0));
        c.release("a", 1);
        assert_eq!(c.owner("a"), Some(0));
        c.release("a", 0);
        assert_eq!(c.owner("a"), None);
        assert!(c.is_empty());
        assert!(c.claim("a", 1));
    }

    #[test]
    fn concurrent_claims_have_one_winner() {
        let c = std::sync::Arc::new(Claims::new());
        for round in 0..50 {
            let id = format!("r{round}");
            let won: usize = std::thread::scope(|s| {
                let hs: Vec<_> = (0..4)
                    .map(|core| {
                        let (c, id) = (c.clone(), id.clone());
                        s.spawn(move || usize::from(c.claim(&id, core)))
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap_or(0)).sum()
            });
            assert_eq!(won, 1, "round {round}");
        }
        assert_eq!(c.len(), 50);
    }
}
