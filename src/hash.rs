//! Block hashing: token ids → local block hashes → sequence hashes (DESIGN §1).
//!
//! The scheme is NVIDIA Dynamo's, so hashes interoperate with it:
//! - local hash of a block = XXH3-64, seed 1337, over the block's token ids as
//!   little-endian `u32`s;
//! - `seq[0] = local[0]`, `seq[i] = XXH3-64(le(seq[i-1]) ‖ le(local[i]), seed 1337)`.
//!
//! Only complete blocks are hashed; a trailing partial block is ignored. A sequence
//! hash names a whole prefix: equal sequence hash ⇒ equal prefix (up to collisions).

use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Seed of every XXH3 call in the scheme.
pub const SEED: u64 = 1337;

/// Default tokens per block.
pub const DEFAULT_BLOCK_SIZE: usize = 128;

/// Largest block size accepted anywhere.
pub const MAX_BLOCK_SIZE: usize = 4096;

/// Local hash of one block of token ids: XXH3 of the block's little-endian byte
/// string, in one call. On a little-endian target that string is the tokens' own
/// memory, hashed where it lies (a zeroed 16 KiB stack buffer per block used to cost
/// more than the hash itself: 16 MiB of `memset` for a 16k-token prompt).
pub fn local_block_hash(tokens: &[u32]) -> u64 {
    #[cfg(target_endian = "little")]
    {
        // SAFETY: `u32` has no padding and every byte is a valid `u8`; the slice
        // covers exactly the memory of `tokens`, borrowed for this call, and on a
        // little-endian target it is the tokens' little-endian byte string.
        let bytes = unsafe {
            std::slice::from_raw_parts(tokens.as_ptr().cast::<u8>(), std::mem::size_of_val(tokens))
        };
        xxh3_64_with_seed(bytes, SEED)
    }
    #[cfg(not(target_endian = "little"))]
    {
        let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
        xxh3_64_with_seed(&bytes, SEED)
    }
}

/// One step of the sequence-hash chain: the sequence hash of a block whose parent
/// prefix has sequence hash `parent` and whose own local hash is `local`.
pub fn chain(parent: u64, local: u64) -> u64 {
    let mut buf = [0u8; 16];
    buf[..8].copy_from_slice(&parent.to_le_bytes());
    buf[8..].copy_from_slice(&local.to_le_bytes());
    xxh3_64_with_seed(&buf, SEED)
}

/// Sequence hashes continuing after `parent` (`None` = start of the prompt) for the
/// given local hashes.
pub fn sequence_from_locals(parent: Option<u64>, locals: &[u64], out: &mut Vec<u64>) {
    let mut prev = parent;
    for &l in locals {
        let s = match prev {
            None => l,
            Some(p) => chain(p, l),
        };
        out.push(s);
        prev = Some(s);
    }
}

/// Local hashes of every complete block of `tokens`.
pub fn local_hashes(tokens: &[u32], block_size: usize) -> Vec<u64> {
    if block_size == 0 {
        return Vec::new();
    }
    tokens
        .chunks_exact(block_size)
        .map(local_block_hash)
        .collect()
}

/// Sequence hashes of every complete block of `tokens`, appended to `out`.
pub fn sequence_hashes_into(tokens: &[u32], block_size: usize, out: &mut Vec<u64>) {
    sequence_hashes_after(None, tokens, block_size, out);
}

/// Like [`sequence_hashes_into`], continuing the chain after `parent` (`None` = start of
/// the prompt; a salt such as a LoRA name's hash starts a separate hash space).
pub fn sequence_hashes_after(
    parent: Option<u64>,
    tokens: &[u32],
    block_size: usize,
    out: &mut Vec<u64>,
) {
    if block_size == 0 {
        return;
    }
    let mut prev = parent;
    for block in tokens.chunks_exact(block_size) {
        let l = local_block_hash(block);
        let s = match prev {
            None => l,
            Some(p) => chain(p, l),
        };
        out.push(s);
        prev = Some(s);
    }
}

/// Sequence hashes of every complete block of `tokens`.
pub fn sequence_hashes(tokens: &[u32], block_size: usize) -> Vec<u64> {
    let mut out = Vec::with_capacity(tokens.len() / block_size.max(1));
    sequence_hashes_into(tokens, block_size, &mut out);
    out
}

/// Turns opaque per-position ids that already identify prefixes (e.g. Mooncake
/// `hash_ids`) into well-mixed 64-bit sequence hashes. Deterministic, so a worker
/// simulator and a load generator that both use it agree.
pub fn mix_external_id(id: u64) -> u64 {
    xxh3_64_with_seed(&id.to_le_bytes(), SEED)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_hash_is_xxh3_over_le_u32() {
        let toks = [1u32, 2, 3, 4];
        let bytes: Vec<u8> = toks.iter().flat_map(|t| t.to_le_bytes()).collect();
        assert_eq!(local_block_hash(&toks), xxh3_64_with_seed(&bytes, 1337));
        // Every size, up to past the largest block, and ids that use all four bytes.
        let long: Vec<u32> = (0..5000u32).map(|i| i.wrapping_mul(0x9e37_79b9)).collect();
        for n in [0, 1, 15, 16, 17, 64, 1000, MAX_BLOCK_SIZE, 5000] {
            let bytes: Vec<u8> = long[..n].iter().flat_map(|t| t.to_le_bytes()).collect();
            assert_eq!(
                local_block_hash(&long[..n]),
                xxh3_64_with_seed(&bytes, SEED),
                "{n}"
            );
        }
        // A block that does not start at the beginning of its prompt.
        let bytes: Vec<u8> = long[3..19].iter().flat_map(|t| t.to_le_bytes()).collect();
        assert_eq!(
            local_block_hash(&long[3..19]),
            xxh3_64_with_seed(&bytes, SEED)
        );
    }

    #[test]
    fn sequence_chain_matches_definition() {
        let toks: Vec<u32> = (0..10).collect();
        let seq = sequence_hashes(&toks, 4);
        assert_eq!(seq.len(), 2, "partial trailing block ignored");
        let l0 = local_block_hash(&toks[0..4]);
        let l1 = local_block_hash(&toks[4..8]);
        assert_eq!(seq[0], l0);
        let mut buf = Vec::new();
        buf.extend_from_slice(&l0.to_le_bytes());
        buf.extend_from_slice(&l1.to_le_bytes());
        assert_eq!(seq[1], xxh3_64_with_seed(&buf, 1337));
        let mut out = Vec::new();
        sequence_from_locals(None, &local_hashes(&toks, 4), &mut out);
        assert_eq!(out, seq);
    }

    /// Fixed vectors: a regression guard so the scheme can never drift silently.
    #[test]
    fn test_vectors() {
        assert_eq!(local_block_hash(&[]), xxh3_64_with_seed(&[], 1337));
        let toks: Vec<u32> = (0..256).collect();
        let seq = sequence_hashes(&toks, 128);
        assert_eq!(seq.len(), 2);
        assert_eq!(seq[0], local_block_hash(&toks[..128]));
        assert_eq!(seq[1], chain(seq[0], local_block_hash(&toks[128..])));
        assert_eq!(
            (seq[0], seq[1]),
            (TV0, TV1),
            "XXH3 vectors changed: {:#x} {:#x}",
            seq[0],
            seq[1]
        );
    }
    // Computed independently with Python `xxhash.xxh3_64_intdigest(..., seed=1337)`.
    const TV0: u64 = 0x83f9_0a7d_ebd4_f39c;
    const TV1: u64 = 0x407b_9042_2a54_cf6f;

    #[test]
    fn shared_prefix_shares_hashes() {
        let a: Vec<u32> = (0..512).collect();
        let mut b = a.clone();
        b[300] = 9999;
        let ha = sequence_hashes(&a, 128);
        let hb = sequence_hashes(&b, 128);
        assert_eq!(ha[..2], hb[..2]);
        assert_ne!(ha[2], hb[2]);
        assert_ne!(ha[3], hb[3], "divergence propagates through the chain");
    }
}
