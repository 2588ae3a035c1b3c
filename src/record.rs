//! Recording routed traffic as a Mooncake-format trace (`kvroute serve --record FILE`):
//! the pure encoder; `service::runtime::recorder` runs it on a writer thread.
//!
//! Each ended request becomes one JSONL line
//! `{"timestamp": ms, "input_length": n, "output_length": m, "hash_ids": [..]}`, the
//! format `kvroute-sim --trace` reads (`sim::trace`):
//! - `timestamp`: milliseconds from service start to the request's routing;
//! - `input_length`: the prompt's tokens as routed;
//! - `output_length`: the last output count the frontend reported (progress); for a
//!   request that reported none, its OSL hint (`expected_output_tokens`) if it had
//!   one, else 1 if its first token was reported, else 0. (A frontend that reports
//!   progress every N tokens under-reports by less than N.)
//! - `hash_ids`: one id per 512 prompt tokens (the Mooncake unit): chunk `j` of
//!   `512 / block_size` router blocks is named by the sequence hash of its last block
//!   (a last, partial chunk by its last block), so equal ids at equal positions mean
//!   equal prefixes, as in Mooncake traces. Prefix sharing is thus kept to 512-token
//!   granularity. Ids are renumbered to small integers 0, 1, 2, … in first-seen order.
//!   No token and no real hash is written.
//!
//! Lines are written in the order requests end, not by timestamp (the simulator sorts
//! by arrival). Guarantees: the output never exceeds `max_bytes` (a line that would
//! pass it stops the recording, it is not cut), the renumbering map never holds more
//! than `max_ids` ids (a line needing more stops the recording); once stopped, every
//! later line is refused. Pure: no I/O.

use std::fmt::Write as _;

/// Tokens one Mooncake hash id covers.
pub const TOKENS_PER_ID: u32 = 512;

/// One ended request, as the service hands it to the recorder.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ended {
    /// Microseconds from service start to routing.
    pub routed_at_us: u64,
    pub input_tokens: u32,
    /// Output tokens last reported (0 if none).
    pub output_tokens: u32,
    /// The request's OSL hint, if it had one.
    pub expected_output_tokens: Option<u32>,
    /// The first token was reported.
    pub first_token: bool,
    /// The prompt's router sequence hashes.
    pub hashes: std::sync::Arc<[u64]>,
}

/// Why the recording stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// The next line would pass `max_bytes`.
    MaxBytes,
    /// The next line needs more than `max_ids` distinct ids.
    MaxIds,
}

impl Stop {
    pub fn name(self) -> &'static str {
        match self {
            Stop::MaxBytes => "record_max_bytes",
            Stop::MaxIds => "record_max_ids",
        }
    }
}

/// The encoder state of one recording. See the module docs.
#[derive(Debug)]
pub struct Encoder {
    blocks_per_id: usize,
    max_bytes: u64,
    max_ids: usize,
    ids: hashbrown::HashMap<u64, u64>,
    written: u64,
    stopped: Option<Stop>,
    /// Hash ids of the line being encoded (reused).
    scratch: Vec<u64>,
}

impl Encoder {
    /// An encoder for router blocks of `block_size` tokens (must divide 512; checked
    /// by the settings), writing at most `max_bytes` and `max_ids` distinct ids.
    pub fn new(block_size: u32, max_bytes: u64, max_ids: usize) -> Encoder {
        let bs = block_size.clamp(1, TOKENS_PER_ID);
        Encoder {
            blocks_per_id: (TOKENS_PER_ID / bs).max(1) as usize,
            max_bytes,
            max_ids,
            ids: hashbrown::HashMap::new(),
            written: 0,
            stopped: None,
            scratch: Vec::new(),
        }
    }

    /// Bytes accepted so far.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// Why the recording stopped, if it did.
    pub fn stopped(&self) -> Option<Stop> {
        self.stopped
    }

    /// Appends `r`'s line (with its newline) to `out`; `Err` (and nothing appended)
    /// once the recording has stopped, or when this line stops it.
    pub fn line(&mut self, r: &Ended, out: &mut String) -> Result<(), Stop> {
        if let Some(s) = self.stopped {
            return Err(s);
        }
        // Ids first, without committing new ones, so a refused line changes nothing.
        self.scratch.clear();
        let mut fresh: Vec<u64> = Vec::new();
        let mut next = self.ids.len() as u64;
        for chunk in r.hashes.chunks(self.blocks_per_id) {
            let Some(&last) = chunk.last() else { continue };
            let id = match self.ids.get(&last) {
                Some(&id) => id,
                None => match fresh.iter().position(|&h| h == last) {
                    Some(i) => self.ids.len() as u64 + i as u64,
                    None => {
                        fresh.push(last);
                        next += 1;
                        next - 1
                    }
                },
            };
            self.scratch.push(id);
        }
        if self.ids.len() + fresh.len() > self.max_ids {
            self.stopped = Some(Stop::MaxIds);
            return Err(Stop::MaxIds);
        }
        let output = match (r.output_tokens, r.expected_output_tokens) {
            (0, Some(hint)) => hint,
            (0, None) if r.first_token => 1,
            (n, _) => n,
        };
        let start = out.len();
        let _ = write!(
            out,
            "{{\"timestamp\":{},\"input_length\":{},\"output_length\":{},\"hash_ids\":[",
            r.routed_at_us / 1000,
            r.input_tokens,
            output
        );
        for (i, id) in self.scratch.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            let _ = write!(out, "{id}");
        }
        out.push_str("]}\n");
        let len = (out.len() - start) as u64;
        if self.written + len > self.max_bytes {
            out.truncate(start);
            self.stopped = Some(Stop::MaxBytes);
            return Err(Stop::MaxBytes);
        }
        self.written += len;
        let base = self.ids.len() as u64;
        for (i, h) in fresh.into_iter().enumerate() {
            self.ids.insert(h, base + i as u64);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::{parse_mooncake, TraceOptions};

    fn ended(at_ms: u64, hashes: &[u64], out: u32) -> Ended {
        Ended {
            routed_at_us: at_ms * 1000 + 7,
            input_tokens: hashes.len() as u32 * 128 + 5,
            output_tokens: out,
            expected_output_tokens: None,
            first_token: true,
            hashes: hashes.into(),
        }
    }

    #[test]
    fn renumbers_per_512_tokens_in_first_seen_order() {
        let mut e = Encoder::new(128, 1 << 20, 100);
        let mut s = String::new();
        // 10 blocks of 128 tokens: chunks [0..4) [4..8) [8..10).
        let a: Vec<u64> = (100..110).collect();
        e.line(&ended(5, &a, 9), &mut s).unwrap();
        // Shares the first 6 blocks: the first chunk only, at 512-token granularity.
        let mut b: Vec<u64> = (100..106).collect();
        b.extend(200..203);
        e.line(&ended(7, &b, 0), &mut s).unwrap();
        assert_eq!(
            s,
            "{\"timestamp\":5,\"input_length\":1285,\"output_length\":9,\"hash_ids\":[0,1,2]}\n\
             {\"timestamp\":7,\"input_length\":1157,\"output_length\":1,\"hash_ids\":[0,3,4]}\n"
        );
        assert_eq!(e.written(), s.len() as u64);
        // The simulator reads it back: lengths, times, shared first chunk.
        let reqs = parse_mooncake(s.as_bytes(), &TraceOptions::default()).unwrap();
        assert_eq!(reqs.len(), 2);
        assert_eq!(
            (
                reqs[0].arrival_us,
                reqs[0].input_tokens,
                reqs[0].output_tokens
            ),
            (5_000, 1285, 9)
        );
        assert_eq!(reqs[0].hashes.len(), 10);
        assert_eq!(reqs[0].hashes[..4], reqs[1].hashes[..4]);
        assert_ne!(reqs[0].hashes[4], reqs[1].hashes[4]);
    }

    #[test]
    fn stops_at_the_byte_limit_without_cutting_a_line() {
        let mut e = Encoder::new(128, 150, 100);
        let mut s = String::new();
        e.line(&ended(1, &[1, 2, 3, 4], 3), &mut s).unwrap();
        let before = s.clone();
        assert_eq!(e.line(&ended(2, &[9; 40], 3), &mut s), Err(Stop::MaxBytes));
        assert_eq!(s, before);
        // Stopped for good, even for a line that would fit.
        assert_eq!(e.line(&ended(3, &[1], 3), &mut s), Err(Stop::MaxBytes));
        assert_eq!(e.stopped(), Some(Stop::MaxBytes));
        assert!(e.written() <= 150);
    }

    #[test]
    fn the_id_map_is_bounded() {
        let mut e = Encoder::new(128, 1 << 20, 3);
        let mut s = String::new();
        e.line(&ended(1, &(0..8).collect::<Vec<_>>(), 1), &mut s)
            .unwrap();
        // Known ids cost nothing.
        e.line(&ended(1, &(0..8).collect::<Vec<_>>(), 1), &mut s)
            .unwrap();
        assert_eq!(
            e.line(&ended(2, &(10..18).collect::<Vec<_>>(), 1), &mut s),
            Err(Stop::MaxIds)
        );
        assert_eq!(s.lines().count(), 2);
        assert!(e.ids.len() <= 3);
    }

    #[test]
    fn repeated_chunks_in_one_line_get_one_id() {
        let mut e = Encoder::new(256, 1 << 20, 10);
        let mut s = String::new();
        // block_size 256: 2 blocks per id; chunk ends 2 and 2 again.
        e.line(&ended(0, &[1, 2, 1, 2, 3], 1), &mut s).unwrap();
        assert!(s.contains("\"hash_ids\":[0,0,1]"), "{s}");
    }
}
