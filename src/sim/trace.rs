//! Mooncake JSONL trace reader.
//!
//! Each line is one request: `{"timestamp": ms, "input_length": n, "output_length": m,
//! "hash_ids": [..]}`, or `"delay": ms` (time since the previous request) instead of
//! `timestamp`. Unknown fields are ignored and blank lines skipped; any other malformed
//! line is an error naming its 1-based line number.
//!
//! # From `hash_ids` to router sequence hashes
//! A Mooncake hash id names 512 prompt tokens *and everything before them*
//! (equal ids at equal positions ⇔ equal prefixes). The router works on blocks of
//! `block_size` tokens (512 must be a multiple of it, and `block_size >= 8`), so hash id
//! `h` covers `512 / block_size` router blocks. Sub-block `s` of id `h` gets the local
//! hash `kvroute::hash::mix_external_id(h * 64 + s)` (64 is the largest number of
//! sub-blocks, reached at `block_size = 8`), and the local hashes are chained into
//! sequence hashes with `kvroute::hash::sequence_from_locals(None, ..)` exactly like
//! token-derived hashes. Only complete blocks count: `floor(input_length / block_size)`,
//! capped by `hash_ids.len() * 512 / block_size`.
//!
//! With this mapping the shared-unlimited-cache bound ([`super::bound`]) of the full
//! conversation trace is 37.36% of input tokens at `block_size` 128, matching the
//! 37.4% the product issue quotes.

use super::SimRequest;
use crate::hash::{mix_external_id, sequence_from_locals};
use serde::Deserialize;
use std::io::BufRead;
use std::path::Path;

/// Tokens covered by one Mooncake hash id.
pub const MOONCAKE_TOKENS_PER_ID: u32 = 512;

/// Errors of the trace reader.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TraceError {
    /// The file could not be opened or read.
    #[error("trace I/O error: {0}")]
    Io(String),
    /// A line is not a valid request; `line` is 1-based.
    #[error("trace line {line}: {msg}")]
    Line { line: usize, msg: String },
    /// The reader options are unusable.
    #[error("trace options: {0}")]
    Options(String),
}

/// How a trace is read.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceOptions {
    /// Router block size in tokens; must divide 512 and be at least 8. Default 128.
    pub block_size: u32,
    /// Replay speed: arrival times are divided by it (2.0 = twice as fast). Default 1.
    pub speed: f64,
    /// Read at most this many requests. Default: all.
    pub limit: Option<usize>,
}

impl Default for TraceOptions {
    fn default() -> Self {
        TraceOptions {
            block_size: crate::hash::DEFAULT_BLOCK_SIZE as u32,
            speed: 1.0,
            limit: None,
        }
    }
}

impl TraceOptions {
    /// Rejects a block size the hash-id mapping cannot express and a non-positive speed.
    pub fn validate(&self) -> Result<(), TraceError> {
        let bs = self.block_size;
        if bs < 8 || !MOONCAKE_TOKENS_PER_ID.is_multiple_of(bs) {
            return Err(TraceError::Options(format!(
                "block_size {bs} must divide {MOONCAKE_TOKENS_PER_ID} and be >= 8"
            )));
        }
        if !(self.speed.is_finite() && self.speed > 0.0) {
            return Err(TraceError::Options(format!(
                "speed must be > 0 (got {})",
                self.speed
            )));
        }
        Ok(())
    }
}

/// One line of the trace as written.
#[derive(Deserialize)]
struct Line {
    timestamp: Option<f64>,
    delay: Option<f64>,
    input_length: u64,
    output_length: u64,
    hash_ids: Vec<u64>,
}

/// Router sequence hashes of a Mooncake request (see the module docs for the mapping).
/// `block_size` must divide 512 and be at least 8 (checked by [`TraceOptions::validate`];
/// other values yield an empty list).
pub fn mooncake_hashes(hash_ids: &[u64], input_tokens: u64, block_size: u32) -> Vec<u64> {
    if block_size < 8 || !MOONCAKE_TOKENS_PER_ID.is_multiple_of(block_size) {
        return Vec::new();
    }
    let per_id = (MOONCAKE_TOKENS_PER_ID / block_size) as u64;
    let blocks = (input_tokens / block_size as u64).min(hash_ids.len() as u64 * per_id);
    let locals: Vec<u64> = (0..blocks)
        .map(|i| {
            let h = hash_ids[(i / per_id) as usize];
            mix_external_id(h.wrapping_mul(64).wrapping_add(i % per_id))
        })
        .collect();
    let mut out = Vec::with_capacity(locals.len());
    sequence_from_locals(None, &locals, &mut out);
    out
}

/// Reads a Mooncake JSONL trace file.
pub fn read_mooncake(path: &Path, opts: &TraceOptions) -> Result<Vec<SimRequest>, TraceError> {
    let file = std::fs::File::open(path)
        .map_err(|e| TraceError::Io(format!("{}: {e}", path.display())))?;
    parse_mooncake(std::io::BufReader::new(file), opts)
}

/// Parses Mooncake JSONL from any buffered reader (a file, or `&[u8]` in tests).
pub fn parse_mooncake(
    reader: impl BufRead,
    opts: &TraceOptions,
) -> Result<Vec<SimRequest>, TraceError> {
    opts.validate()?;
    let limit = opts.limit.unwrap_or(usize::MAX);
    let mut out = Vec::new();
    let mut prev_ms = 0.0f64;
    for (i, line) in reader.lines().enumerate() {
        if out.len() >= limit {
            break;
        }
        let lineno = i + 1;
        let err = |msg: String| TraceError::Line { line: lineno, msg };
        let line = line.map_err(|e| TraceError::Io(format!("line {lineno}: {e}")))?;
        if line.trim().is_empty() {
            continue;
        }
        let l: Line = serde_json::from_str(&line).map_err(|e| err(e.to_string()))?;
        let ms = match (l.timestamp, l.delay) {
            (Some(t), _) => t,
            (None, Some(d)) => prev_ms + d,
            (None, None) => return Err(err("needs \"timestamp\" or \"delay\"".into())),
        };
        if !(ms.is_finite() && ms >= 0.0) || l.delay.is_some_and(|d| !(d.is_finite() && d >= 0.0)) {
            return Err(err(format!("time must be finite and >= 0 (got {ms})")));
        }
        prev_ms = ms;
        let input_tokens = u32::try_from(l.input_length)
            .map_err(|_| err(format!("input_length {} too large", l.input_length)))?;
        let output_tokens = u32::try_from(l.output_length)
            .map_err(|_| err(format!("output_length {} too large", l.output_length)))?;
        let arrival = ms * 1000.0 / opts.speed;
        if arrival >= u64::MAX as f64 {
            return Err(err(format!("timestamp {ms} too large")));
        }
        out.push(SimRequest {
            id: format!("mc-{}", out.len()),
            arrival_us: arrival.round() as u64,
            input_tokens,
            output_tokens,
            hashes: mooncake_hashes(&l.hash_ids, l.input_length, opts.block_size),
            session: None,
        });
    }
    Ok(out)
}

/// Where the ignored full-trace tests read the whole conversation trace (not in the
/// repository): `KVROUTE_MOONCAKE_TRACE`, default
/// `../shared/traces/mooncake_conversation_trace.jsonl` beside the checkout.
#[cfg(test)]
pub(crate) fn full_trace_path() -> String {
    std::env::var("KVROUTE_MOONCAKE_TRACE").unwrap_or_else(|_| {
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../shared/traces/mooncake_conversation_trace.jsonl"
        )
        .to_string()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str, opts: &TraceOptions) -> Result<Vec<SimRequest>, TraceError> {
        parse_mooncake(text.as_bytes(), opts)
    }

    #[test]
    fn parses_timestamp_form_and_maps_hashes() {
        let text = r#"{"timestamp": 0, "input_length": 1100, "output_length": 7, "hash_ids": [0, 1, 2]}
{"timestamp": 1500, "input_length": 600, "output_length": 3, "hash_ids": [0, 9], "extra": 1}
"#;
        let reqs = parse(text, &TraceOptions::default()).unwrap();
        assert_eq!(reqs.len(), 2);
        assert_eq!(reqs[0].id, "mc-0");
        assert_eq!(reqs[1].arrival_us, 1_500_000);
        assert_eq!((reqs[0].input_tokens, reqs[0].output_tokens), (1100, 7));
        // floor(1100 / 128) = 8 blocks: id 0 covers blocks 0..4, id 1 covers 4..8.
        assert_eq!(reqs[0].hashes.len(), 8);
        let mut locals = Vec::new();
        for h in [0u64, 1] {
            for s in 0..4 {
                locals.push(mix_external_id(h * 64 + s));
            }
        }
        let mut want = Vec::new();
        sequence_from_locals(None, &locals, &mut want);
        assert_eq!(reqs[0].hashes, want);
        // Same first hash id ⇒ same first 4 sequence hashes, then divergence.
        assert_eq!(reqs[1].hashes.len(), 4);
        assert_eq!(reqs[1].hashes[..], reqs[0].hashes[..4]);
    }

    #[test]
    fn delay_form_accumulates_and_speed_divides() {
        let text = r#"{"delay": 10, "input_length": 1, "output_length": 1, "hash_ids": [1]}

{"delay": 30, "input_length": 1, "output_length": 1, "hash_ids": [2]}
{"delay": 0.5, "input_length": 1, "output_length": 1, "hash_ids": [3]}"#;
        let opts = TraceOptions {
            speed: 2.0,
            ..Default::default()
        };
        let reqs = parse(text, &opts).unwrap();
        let arr: Vec<u64> = reqs.iter().map(|r| r.arrival_us).collect();
        assert_eq!(arr, vec![5_000, 20_000, 20_250]);
        assert!(
            reqs.iter().all(|r| r.hashes.is_empty()),
            "1 token < 1 block"
        );
    }

    #[test]
    fn malformed_line_reports_its_number() {
        let text = "{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": []}\n\n{\"timestamp\": 1, \"input_length\": \"x\"}\n";
        match parse(text, &TraceOptions::default()) {
            Err(TraceError::Line { line, .. }) => assert_eq!(line, 3),
            other => panic!("expected a line error, got {other:?}"),
        }
        let no_time = r#"{"input_length": 1, "output_length": 1, "hash_ids": []}"#;
        assert!(matches!(
            parse(no_time, &TraceOptions::default()),
            Err(TraceError::Line { line: 1, .. })
        ));
        let neg = r#"{"timestamp": -5, "input_length": 1, "output_length": 1, "hash_ids": []}"#;
        assert!(parse(neg, &TraceOptions::default()).is_err());
    }

    #[test]
    fn options_are_validated_and_limit_applies() {
        for bs in [0, 7, 100, 1024] {
            let o = TraceOptions {
                block_size: bs,
                ..Default::default()
            };
            assert!(matches!(parse("", &o), Err(TraceError::Options(_))), "{bs}");
        }
        let o = TraceOptions {
            speed: 0.0,
            ..Default::default()
        };
        assert!(parse("", &o).is_err());
        let line = r#"{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": []}"#;
        let text = [line; 5].join("\n");
        let o = TraceOptions {
            limit: Some(3),
            ..Default::default()
        };
        assert_eq!(parse(&text, &o).unwrap().len(), 3);
    }

    #[test]
    fn block_count_is_capped_by_hash_ids_and_scales_with_block_size() {
        // 2000 tokens but only one hash id: at most 512 / bs blocks.
        assert_eq!(mooncake_hashes(&[5], 2000, 128).len(), 4);
        assert_eq!(mooncake_hashes(&[5, 6], 2000, 512).len(), 2);
        assert_eq!(mooncake_hashes(&[5, 6], 1000, 8).len(), 125);
        assert!(mooncake_hashes(&[5], 2000, 100).is_empty());
    }

    #[test]
    fn reads_the_committed_slice() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/mooncake_slice.jsonl");
        let reqs = read_mooncake(&path, &TraceOptions::default()).unwrap();
        assert_eq!(reqs.len(), 1000);
        assert!(reqs.windows(2).all(|w| w[0].arrival_us <= w[1].arrival_us));
        // DESIGN §5: every request starts with the same hash id.
        assert!(reqs.iter().all(|r| r.hashes[0] == reqs[0].hashes[0]));
        let missing = read_mooncake(Path::new("/nonexistent/x.jsonl"), &TraceOptions::default());
        assert!(matches!(missing, Err(TraceError::Io(_))));
    }
}
