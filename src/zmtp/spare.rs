//! Frame buffers a decoder keeps for reuse, so a stream of large messages does not
//! fault in (and have the kernel zero) fresh pages for each.
//!
//! Guarantees: at most [`SPARES`] buffers, each of [`SPARE_MIN`] to [`SPARE_MAX`]
//! bytes of capacity (so at most 2 MiB per connection); when full, a larger buffer
//! handed back replaces the smallest kept one, so the kept ones settle on the sizes
//! the stream's messages need; a buffer handed out is empty and at least as large as
//! asked.

/// Buffers smaller than this are not worth keeping.
pub const SPARE_MIN: usize = 64 << 10;
/// Buffers larger than this are freed, not kept: a rare huge message does not hold
/// its memory for the connection's life.
pub const SPARE_MAX: usize = 1 << 20;
/// Buffers kept (a message has one large frame, its payload).
pub const SPARES: usize = 2;

#[derive(Debug, Default)]
pub struct Spares {
    bufs: Vec<Vec<u8>>,
}

impl Spares {
    /// An empty buffer with room for `len` bytes: the smallest kept one that fits,
    /// else a new one of exactly `len`.
    pub fn take(&mut self, len: usize) -> Vec<u8> {
        let fit = (len >= SPARE_MIN)
            .then(|| {
                (0..self.bufs.len())
                    .filter(|&i| self.bufs[i].capacity() >= len)
                    .min_by_key(|&i| self.bufs[i].capacity())
            })
            .flatten();
        match fit {
            Some(i) => {
                let mut b = self.bufs.swap_remove(i);
                b.clear();
                b
            }
            None => Vec::with_capacity(len),
        }
    }

    /// Hands a buffer back: kept if its size is worth it and there is room, or if it
    /// is larger than the smallest kept one (which it replaces).
    pub fn put(&mut self, buf: Vec<u8>) {
        if !(SPARE_MIN..=SPARE_MAX).contains(&buf.capacity()) {
            return;
        }
        if self.bufs.len() < SPARES {
            self.bufs.push(buf);
        } else if let Some(small) = self.bufs.iter_mut().min_by_key(|b| b.capacity()) {
            if small.capacity() < buf.capacity() {
                *small = buf;
            }
        }
    }

    /// Frees every kept buffer.
    pub fn clear(&mut self) {
        self.bufs = Vec::new();
    }

    /// Buffers kept.
    pub fn len(&self) -> usize {
        self.bufs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.bufs.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_largest_worthwhile_buffers_and_hands_out_the_best_fit() {
        let mut s = Spares::default();
        for cap in [SPARE_MIN - 1, SPARE_MAX + 1] {
            s.put(Vec::with_capacity(cap));
        }
        assert!(s.is_empty(), "too small and too large are freed");
        s.put(Vec::with_capacity(SPARE_MIN));
        s.put(Vec::with_capacity(2 * SPARE_MIN));
        s.put(Vec::with_capacity(SPARE_MIN + 1)); // full: replaces the smallest
        s.put(Vec::with_capacity(SPARE_MIN)); // smaller than both: freed
        let caps = |s: &Spares| {
            let mut v: Vec<usize> = s.bufs.iter().map(Vec::capacity).collect();
            v.sort_unstable();
            v
        };
        assert!(caps(&s)[0] > SPARE_MIN && caps(&s).len() == SPARES);
        // Best fit: the smaller kept buffer for a body it can hold.
        let b = s.take(SPARE_MIN + 1);
        assert!(b.is_empty() && b.capacity() > SPARE_MIN && b.capacity() < 2 * SPARE_MIN);
        // Nothing fits: a new buffer; small bodies never take a kept one.
        assert_eq!(s.take(4 * SPARE_MIN).capacity(), 4 * SPARE_MIN);
        assert_eq!((s.take(10).capacity(), s.len()), (10, 1));
        s.clear();
        assert!(s.is_empty());
    }
}
