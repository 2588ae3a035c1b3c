//! Synthetic loads timed and sized by a CSV request log in the format of the public
//! Azure LLM inference traces: columns `TIMESTAMP,ContextTokens,GeneratedTokens`
//! (any order, other columns ignored).
//!
//! Such logs carry no prompt content, so the log gives each request its arrival time,
//! prompt length and output length, and the seeded synthetic generator
//! ([`super::synth`]) gives the content: the prompt starts with the shared prefix of
//! one of `groups` groups (chosen uniformly, cut to the prompt's length) and continues
//! with unique tokens. Every row is a single-turn request (the log has no conversation
//! ids). `TIMESTAMP` is either a date-time `YYYY-MM-DD HH:MM:SS[.fraction]` (a `T`
//! instead of the space and a trailing `Z` are accepted; read as UTC) or a number of
//! seconds; arrivals are taken relative to the earliest row and divided by the speed.
//!
//! Bad rows are errors naming their 1-based line; a prompt longer than
//! [`MAX_CONTEXT_TOKENS`] is refused before any token is generated for it.

use super::synth::SynthSpec;
use super::SimRequest;
use crate::hash::sequence_hashes;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Deserialize;
use std::path::Path;

/// Longest prompt a row may ask for.
pub const MAX_CONTEXT_TOKENS: u64 = 1 << 20;

/// One request of the log.
#[derive(Clone, Debug, PartialEq)]
pub struct CsvRow {
    /// Seconds, on the log's own time line.
    pub at_s: f64,
    pub context_tokens: u32,
    pub generated_tokens: u32,
}

#[derive(Deserialize)]
struct Raw {
    #[serde(rename = "TIMESTAMP")]
    timestamp: String,
    #[serde(rename = "ContextTokens")]
    context: u64,
    #[serde(rename = "GeneratedTokens")]
    generated: u64,
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Seconds of a `TIMESTAMP` value (see the module docs).
pub fn parse_timestamp(s: &str) -> Result<f64, String> {
    let s = s.trim();
    if let Ok(v) = s.parse::<f64>() {
        return if v.is_finite() && v >= 0.0 {
            Ok(v)
        } else {
            Err(format!("timestamp {s:?} must be finite and >= 0"))
        };
    }
    let bad = || format!("timestamp {s:?} is neither seconds nor YYYY-MM-DD HH:MM:SS[.f]");
    let t = s.strip_suffix('Z').unwrap_or(s);
    let (date, time) = t.split_once([' ', 'T']).ok_or_else(bad)?;
    let num = |v: &str, lo: i64, hi: i64| -> Result<i64, String> {
        let n: i64 = v.parse().map_err(|_| bad())?;
        if (lo..=hi).contains(&n) {
            Ok(n)
        } else {
            Err(bad())
        }
    };
    let mut d = date.splitn(3, '-');
    let (y, mo, da) = (
        num(d.next().ok_or_else(bad)?, 0, 9999)?,
        num(d.next().ok_or_else(bad)?, 1, 12)?,
        num(d.next().ok_or_else(bad)?, 1, 31)?,
    );
    let (hms, frac) = match time.split_once('.') {
        Some((a, f)) => (a, f),
        None => (time, ""),
    };
    let mut t = hms.splitn(3, ':');
    let (h, mi, se) = (
        num(t.next().ok_or_else(bad)?, 0, 23)?,
        num(t.next().ok_or_else(bad)?, 0, 59)?,
        num(t.next().ok_or_else(bad)?, 0, 60)?,
    );
    let frac = if frac.is_empty() {
        0.0
    } else if frac.len() <= 12 && frac.bytes().all(|b| b.is_ascii_digit()) {
        format!("0.{frac}").parse::<f64>().map_err(|_| bad())?
    } else {
        return Err(bad());
    };
    let days = days_from_civil(y, mo, da);
    Ok((days * 86_400 + h * 3600 + mi * 60 + se) as f64 + frac)
}

/// Reads the rows of a log (at most `limit`).
pub fn parse_azure_csv(
    reader: impl std::io::Read,
    limit: Option<usize>,
) -> Result<Vec<CsvRow>, String> {
    let mut rdr = csv::ReaderBuilder::new()
        .trim(csv::Trim::All)
        .from_reader(reader);
    let headers = rdr.headers().map_err(|e| format!("line 1: {e}"))?.clone();
    let limit = limit.unwrap_or(usize::MAX);
    let mut out = Vec::new();
    for rec in rdr.records() {
        if out.len() >= limit {
            break;
        }
        let line_of = |e: &csv::Error| e.position().map_or(0, |p| p.line());
        let rec = rec.map_err(|e| format!("line {}: {e}", line_of(&e)))?;
        let line = rec.position().map_or(0, |p| p.line());
        let err = |m: String| format!("line {line}: {m}");
        let raw: Raw = rec
            .deserialize(Some(&headers))
            .map_err(|e| err(e.to_string()))?;
        if raw.context > MAX_CONTEXT_TOKENS {
            return Err(err(format!(
                "ContextTokens {} above {MAX_CONTEXT_TOKENS}",
                raw.context
            )));
        }
        let generated = u32::try_from(raw.generated)
            .map_err(|_| err(format!("GeneratedTokens {} too large", raw.generated)))?;
        out.push(CsvRow {
            at_s: parse_timestamp(&raw.timestamp).map_err(err)?,
            context_tokens: raw.context as u32,
            generated_tokens: generated,
        });
    }
    Ok(out)
}

/// Reads a log file (see [`parse_azure_csv`]).
pub fn read_azure_csv(path: &Path, limit: Option<usize>) -> Result<Vec<CsvRow>, String> {
    let f = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    parse_azure_csv(std::io::BufReader::new(f), limit)
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// The workload of `rows` with content from `spec` (its seed, block size, groups and
/// prefix length; its rate, lengths and turns are not used), arrivals divided by
/// `speed`. Requests are `csv-N` in row order.
pub fn generate_from_rows(
    spec: &SynthSpec,
    rows: &[CsvRow],
    speed: f64,
) -> Result<Vec<SimRequest>, String> {
    if !(speed.is_finite() && speed > 0.0) {
        return Err("speed must be > 0".into());
    }
    if spec.block_size == 0 || spec.block_size as usize > crate::hash::MAX_BLOCK_SIZE {
        return Err(format!(
            "block_size must be 1..={}",
            crate::hash::MAX_BLOCK_SIZE
        ));
    }
    let mut rng = SmallRng::seed_from_u64(spec.seed);
    let vocab = 128_000u32;
    let prefixes: Vec<Vec<u32>> = (0..spec.groups)
        .map(|_| {
            (0..spec.prefix_tokens)
                .map(|_| rng.random_range(0..vocab))
                .collect()
        })
        .collect();
    let t0 = rows.iter().map(|r| r.at_s).fold(f64::INFINITY, f64::min);
    let mut out = Vec::with_capacity(rows.len());
    for (n, r) in rows.iter().enumerate() {
        let ctx = r.context_tokens as usize;
        let mut tokens: Vec<u32> = Vec::with_capacity(ctx);
        if spec.groups > 0 {
            let g = &prefixes[rng.random_range(0..spec.groups) as usize];
            tokens.extend_from_slice(&g[..g.len().min(ctx)]);
        }
        while tokens.len() < ctx {
            tokens.push(rng.random_range(0..vocab));
        }
        out.push(SimRequest {
            id: format!("csv-{n}"),
            arrival_us: ((r.at_s - t0).max(0.0) * 1e6 / speed).round() as u64,
            input_tokens: r.context_tokens,
            output_tokens: r.generated_tokens,
            hashes: sequence_hashes(&tokens, spec.block_size as usize),
            session: None,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_in_azure_and_numeric_forms() {
        let a = parse_timestamp("2023-11-16 18:15:46.6805900").unwrap();
        let b = parse_timestamp("2023-11-16T18:15:47.1805900Z").unwrap();
        assert!((b - a - 0.5).abs() < 1e-6, "{a} {b}");
        assert_eq!(parse_timestamp("1970-01-02 00:00:00").unwrap(), 86_400.0);
        assert_eq!(
            parse_timestamp("2000-03-01 00:00:00").unwrap(),
            951_868_800.0
        );
        assert_eq!(parse_timestamp(" 12.5 ").unwrap(), 12.5);
        for bad in [
            "",
            "-1",
            "nan",
            "2023-13-01 00:00:00",
            "2023-11-16",
            "x y",
            "2023-11-16 1:2:3.x",
        ] {
            assert!(parse_timestamp(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn rows_parse_by_header_name_and_errors_name_the_line() {
        let text = "ContextTokens,TIMESTAMP,GeneratedTokens,Extra\n\
                    100, 2023-11-16 18:15:46.5,20,x\n\
                    300,2023-11-16 18:15:47.5,40,y\n";
        let rows = parse_azure_csv(text.as_bytes(), None).unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(
            (rows[1].context_tokens, rows[1].generated_tokens),
            (300, 40)
        );
        assert_eq!(parse_azure_csv(text.as_bytes(), Some(1)).unwrap().len(), 1);
        let bad = "TIMESTAMP,ContextTokens,GeneratedTokens\n1,2,3\n2,-5,3\n";
        let e = parse_azure_csv(bad.as_bytes(), None).unwrap_err();
        assert!(e.starts_with("line 3"), "{e}");
        let huge = "TIMESTAMP,ContextTokens,GeneratedTokens\n1,99999999999,3\n";
        assert!(parse_azure_csv(huge.as_bytes(), None)
            .unwrap_err()
            .contains("line 2"));
        let missing = "TIMESTAMP,ContextTokens\n1,2\n";
        assert!(parse_azure_csv(missing.as_bytes(), None).is_err());
    }

    #[test]
    fn generated_requests_follow_the_rows_and_share_prefixes() {
        let rows = vec![
            CsvRow {
                at_s: 10.0,
                context_tokens: 1000,
                generated_tokens: 5,
            },
            CsvRow {
                at_s: 12.0,
                context_tokens: 700,
                generated_tokens: 7,
            },
        ];
        let spec = SynthSpec {
            groups: 1,
            prefix_tokens: 512,
            ..SynthSpec::default()
        };
        let reqs = generate_from_rows(&spec, &rows, 2.0).unwrap();
        assert_eq!(reqs[0].arrival_us, 0);
        assert_eq!(reqs[1].arrival_us, 1_000_000);
        assert_eq!((reqs[1].input_tokens, reqs[1].output_tokens), (700, 7));
        assert_eq!(reqs[0].hashes.len(), 1000 / 128);
        // Same group: the 4 prefix blocks match, the rest differ.
        assert_eq!(reqs[0].hashes[..4], reqs[1].hashes[..4]);
        assert_ne!(reqs[0].hashes[4], reqs[1].hashes[4]);
        assert_eq!(generate_from_rows(&spec, &rows, 2.0).unwrap(), reqs);
        assert!(generate_from_rows(&spec, &rows, 0.0).is_err());
    }
}
