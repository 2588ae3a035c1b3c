//! One simulated worker's KV cache: fixed capacity in blocks, LRU eviction, keyed by
//! sequence hash, with pinning of blocks used by running requests.
//!
//! Guarantees:
//! - Every operation is O(1) per block: blocks live in a slab (`Vec` + free list)
//!   threaded by an intrusive doubly-linked LRU list and found through a hash map.
//! - [`KvCache::insert`] emits exactly the changes it made, batched per call (one
//!   `Removed` for all evictions, then one `Stored` per contiguous run of new blocks with
//!   the run's parent). Applying the events of every call in order to a set reproduces
//!   the cache contents exactly, so a router fed these events mirrors the cache.
//! - Pinned blocks (reference count > 0) are never evicted: they are taken out of the
//!   LRU list while pinned. If no unpinned block is left, `insert` stores what fits, as
//!   a prefix (a block stored after a gap could never be matched).
//! - Blocks of one prefix are ordered so the *deepest* block is evicted first (like
//!   vLLM frees a request's blocks tail first): evicting a parent before its children
//!   would orphan them.

use hashbrown::HashMap;

/// A change to a worker's cache, as reported to the router.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CacheEvent {
    /// `hashes` were stored, in prefix order; `parent` is the sequence hash of the block
    /// just before the first of them (`None` at the start of a prompt).
    Stored {
        parent: Option<u64>,
        hashes: Vec<u64>,
    },
    /// `hashes` were evicted.
    Removed { hashes: Vec<u64> },
}

const NIL: u32 = u32::MAX;

#[derive(Clone, Debug)]
struct Node {
    hash: u64,
    prev: u32,
    next: u32,
    pins: u32,
    /// Number of the `insert` call that last touched the block: blocks of the current
    /// call must not be evicted to make room for the call's later blocks.
    stamp: u64,
}

/// An LRU cache of KV blocks (see the module docs for its guarantees).
#[derive(Clone, Debug)]
pub struct KvCache {
    capacity: usize,
    map: HashMap<u64, u32>,
    nodes: Vec<Node>,
    free: Vec<u32>,
    /// Most recently used unpinned block.
    head: u32,
    /// Least recently used unpinned block: the next victim.
    tail: u32,
    epoch: u64,
    pinned: usize,
}

impl KvCache {
    /// An empty cache holding at most `capacity` blocks (at most `u32::MAX - 1`).
    pub fn new(capacity: usize) -> KvCache {
        KvCache {
            capacity: capacity.min(NIL as usize - 1),
            map: HashMap::new(),
            nodes: Vec::new(),
            free: Vec::new(),
            head: NIL,
            tail: NIL,
            epoch: 0,
            pinned: 0,
        }
    }

    /// Capacity in blocks.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Blocks currently cached.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// True when nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Blocks currently pinned.
    pub fn pinned(&self) -> usize {
        self.pinned
    }

    /// Whether the block is cached.
    pub fn contains(&self, hash: u64) -> bool {
        self.map.contains_key(&hash)
    }

    /// Every cached block, in no particular order.
    pub fn blocks(&self) -> impl Iterator<Item = u64> + '_ {
        self.map.keys().copied()
    }

    /// Length of the longest cached prefix of `hashes`; those blocks become the most
    /// recently used.
    pub fn lookup(&mut self, hashes: &[u64]) -> usize {
        let k = self.prefix_len(hashes);
        self.touch_rev(&hashes[..k]);
        k
    }

    /// Length of the longest cached prefix of `hashes`, without touching anything.
    pub fn prefix_len(&self, hashes: &[u64]) -> usize {
        hashes
            .iter()
            .take_while(|h| self.map.contains_key(*h))
            .count()
    }

    /// Stores the missing blocks of `hashes` (a prompt's sequence hashes, in order),
    /// evicting unpinned least-recently-used blocks as needed, and appends exactly the
    /// resulting changes to `out`. Returns the length of the cached prefix afterwards.
    pub fn insert(&mut self, hashes: &[u64], out: &mut Vec<CacheEvent>) -> usize {
        self.epoch += 1;
        let ep = self.epoch;
        let mut removed = Vec::new();
        let mut stored: Vec<CacheEvent> = Vec::new();
        let mut run: Vec<u64> = Vec::new();
        let mut run_parent: Option<u64> = None;
        let mut processed = 0;
        for (i, &h) in hashes.iter().enumerate() {
            if let Some(&idx) = self.map.get(&h) {
                // Stamped blocks must form the front of the LRU list, so a stamped tail
                // means no older unpinned block is left.
                self.nodes[idx as usize].stamp = ep;
                if self.nodes[idx as usize].pins == 0 {
                    self.unlink(idx);
                    self.push_front(idx);
                }
                Self::flush(&mut stored, &mut run, run_parent);
                processed = i + 1;
                continue;
            }
            if self.map.len() >= self.capacity {
                let t = self.tail;
                if t == NIL || self.nodes[t as usize].stamp == ep {
                    break; // only pinned blocks or this call's own blocks are left
                }
                removed.push(self.evict(t));
            }
            if run.is_empty() {
                run_parent = i.checked_sub(1).map(|p| hashes[p]);
            }
            let idx = self.alloc(h, ep);
            self.map.insert(h, idx);
            self.push_front(idx);
            run.push(h);
            processed = i + 1;
        }
        Self::flush(&mut stored, &mut run, run_parent);
        // Parents most recent, so the deepest blocks are evicted first.
        self.touch_rev(&hashes[..processed]);
        if !removed.is_empty() {
            out.push(CacheEvent::Removed { hashes: removed });
        }
        out.append(&mut stored);
        self.prefix_len(hashes)
    }

    /// Pins the longest cached prefix of `hashes` (they cannot be evicted until
    /// unpinned) and returns its length. Pins nest.
    pub fn pin(&mut self, hashes: &[u64]) -> usize {
        let k = self.prefix_len(hashes);
        for h in &hashes[..k] {
            if let Some(&idx) = self.map.get(h) {
                if self.nodes[idx as usize].pins == 0 {
                    self.unlink(idx);
                    self.pinned += 1;
                }
                self.nodes[idx as usize].pins += 1;
            }
        }
        k
    }

    /// Releases one pin of each block of `hashes` (pass exactly what [`KvCache::pin`]
    /// pinned). Fully released blocks become the most recently used, parents first.
    pub fn unpin(&mut self, hashes: &[u64]) {
        for h in hashes.iter().rev() {
            if let Some(&idx) = self.map.get(h) {
                let n = &mut self.nodes[idx as usize];
                if n.pins == 0 {
                    continue;
                }
                n.pins -= 1;
                if n.pins == 0 {
                    self.pinned -= 1;
                    self.push_front(idx);
                }
            }
        }
    }

    fn flush(stored: &mut Vec<CacheEvent>, run: &mut Vec<u64>, parent: Option<u64>) {
        if !run.is_empty() {
            stored.push(CacheEvent::Stored {
                parent,
                hashes: std::mem::take(run),
            });
        }
    }

    /// Makes `hashes` (those cached and unpinned) most recently used, the first one
    /// ending up most recent.
    fn touch_rev(&mut self, hashes: &[u64]) {
        for h in hashes.iter().rev() {
            if let Some(&idx) = self.map.get(h) {
                if self.nodes[idx as usize].pins == 0 {
                    self.unlink(idx);
                    self.push_front(idx);
                }
            }
        }
    }

    fn alloc(&mut self, hash: u64, stamp: u64) -> u32 {
        let node = Node {
            hash,
            prev: NIL,
            next: NIL,
            pins: 0,
            stamp,
        };
        match self.free.pop() {
            Some(idx) => {
                self.nodes[idx as usize] = node;
                idx
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
        }
    }

    fn evict(&mut self, idx: u32) -> u64 {
        self.unlink(idx);
        let hash = self.nodes[idx as usize].hash;
        self.map.remove(&hash);
        self.free.push(idx);
        hash
    }

    fn unlink(&mut self, idx: u32) {
        let (prev, next) = {
            let n = &self.nodes[idx as usize];
            (n.prev, n.next)
        };
        if prev == NIL {
            self.head = next;
        } else {
            self.nodes[prev as usize].next = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            self.nodes[next as usize].prev = prev;
        }
        let n = &mut self.nodes[idx as usize];
        n.prev = NIL;
        n.next = NIL;
    }

    fn push_front(&mut self, idx: u32) {
        let old = self.head;
        {
            let n = &mut self.nodes[idx as usize];
            n.prev = NIL;
            n.next = old;
        }
        if old == NIL {
            self.tail = idx;
        } else {
            self.nodes[old as usize].prev = idx;
        }
        self.head = idx;
    }
}

#[cfg(test)]
mod tests;
