//! How a block hash is spread: the bijective mixer the index keys by ([`mix`],
//! [`unmix`]) and the shard that owns a hash ([`shard_of`]). A leaf of `index`: every
//! shard, the sharded wrapper and the service's cores agree on these.

/// Largest supported `shard_bits` (65 536 shards).
pub const MAX_SHARD_BITS: u32 = 16;

/// Fixed bijective 64-bit mixer (the SplitMix64 finaliser).
///
/// Client-supplied precomputed hashes may be small integers (e.g. Mooncake `hash_ids`);
/// mixing spreads them uniformly over shards and hash-table buckets. Being a bijection,
/// the mixed value can itself serve as the table key: two different hashes never share
/// a key, so the index stores `mix(h)` and never `h`.
#[inline]
pub fn mix(h: u64) -> u64 {
    let mut z = h.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Inverse of [`mix`] (each xor-shift and odd multiplication of the finaliser undone).
#[inline]
pub fn unmix(z: u64) -> u64 {
    let mut z = z ^ (z >> 31) ^ (z >> 62);
    z = z.wrapping_mul(0x3196_42B2_D24D_8EC3);
    z = z ^ (z >> 27) ^ (z >> 54);
    z = z.wrapping_mul(0x96DE_1B17_3F11_9089);
    z = z ^ (z >> 30) ^ (z >> 60);
    z.wrapping_sub(0x9E37_79B9_7F4A_7C15)
}

/// Shard owning hash `h` among `1 << shard_bits` shards: the top `shard_bits` bits of
/// `mix(h)` (0 when `shard_bits == 0`). `shard_bits` is clamped to [`MAX_SHARD_BITS`].
#[inline]
pub fn shard_of(h: u64, shard_bits: u32) -> usize {
    let bits = shard_bits.min(MAX_SHARD_BITS);
    if bits == 0 {
        0
    } else {
        (mix(h) >> (64 - bits)) as usize
    }
}
