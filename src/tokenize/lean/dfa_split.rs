//! The split regexes of GPT-2, Llama 3, Qwen 2 and their kin without the backtracking
//! VM: the same matches from the `regex` crate's automata plus one fix-up.
//!
//! Why: these patterns end in `…|\s+(?!\S)|\s+`. The look-ahead sends the whole
//! pattern into fancy-regex's backtracking VM, which was most of a byte-level BPE
//! prompt's tokenizing. Everything else in them is plain regex, and fancy-regex
//! delegates plain parts to the `regex` crate anyway, so the character classes
//! (`\s`, `\p{L}`, `\p{N}`, case folding) are the same tables.
//!
//! Exactness, for a pattern `A|\s+(?!\S)|\s+` with `A` free of look-around (else
//! [`DfaSplit::new`] gives None): a backtracking engine and the `regex` crate both
//! take the leftmost start at which some alternative matches, and at that start the
//! first alternative that matches, each alternative with the same greedy preference.
//! `A|\s+` (what is compiled) matches at exactly the starts where the full pattern
//! does (`\s+(?!\S)` matches only where `\s+` does). At a start where `A` matches,
//! both take `A`'s match. Elsewhere the full pattern takes `\s+(?!\S)`: the maximal
//! whitespace run minus its last char when a non-space follows it and the run has
//! two chars or more; otherwise `\s+`, the whole run. `A|\s+` takes the whole run, and
//! [`DfaSplit::pieces`] shortens it by that rule. Which branch matched is told by
//! whether `A`, anchored, matches at the start (asked only for whitespace-only
//! matches; `\s+` gives nothing else). The walk's load probes, its sampled run-time
//! check and the `tokenize_lean` fuzz target compare the result with HF's.

/// The look-ahead tail these patterns end with.
const TAIL: &str = r"|\s+(?!\S)|\s+";

/// A split regex of the `A|\s+(?!\S)|\s+` form, compiled without its look-ahead.
#[derive(Debug)]
pub(super) struct DfaSplit {
    /// `A|\s+`.
    all: regex::Regex,
    /// `\A(?:A)`: whether `A` matches at a start.
    head: regex::Regex,
}

impl DfaSplit {
    /// The split for `pattern`, or None when it is not of that form (or `A` needs
    /// fancy-regex: the `regex` crate refuses look-around and back-references).
    pub(super) fn new(pattern: &str) -> Option<DfaSplit> {
        let a = pattern.strip_suffix(TAIL)?;
        if a.is_empty() {
            return None;
        }
        Some(DfaSplit {
            all: regex::Regex::new(&format!(r"{a}|\s+")).ok()?,
            head: regex::Regex::new(&format!(r"\A(?:{a})")).ok()?,
        })
    }

    /// Pieces of `s` between and at the matches, as HF's `Pattern for &SysRegex` gives
    /// them for the full pattern: `(piece, is_match)`, covering `s` in order.
    pub(super) fn pieces<'t>(
        &self,
        s: &'t str,
        f: impl FnMut(&'t str, bool) -> Result<(), String>,
    ) -> Result<(), String> {
        cover(s, self.matches(s), f)
    }

    /// The full pattern's matches in `s`, in order (an empty match, which these
    /// patterns cannot give, is an error rather than a loop).
    fn matches<'s>(
        &'s self,
        s: &'s str,
    ) -> impl Iterator<Item = Result<(usize, usize), String>> + 's {
        let mut at = 0;
        std::iter::from_fn(move || {
            if at >= s.len() {
                return None;
            }
            let m = self.all.find_at(s, at)?;
            let (start, mut end) = (m.start(), m.end());
            if end == start {
                at = s.len();
                return Some(Err("empty split match".into()));
            }
            let run = &s[start..end];
            if run.chars().all(char::is_whitespace) && !self.head.is_match(&s[start..]) {
                // The `\s+` branch: `\s+(?!\S)` leaves the last char of a run of two
                // or more for what follows it.
                if end < s.len() {
                    if let Some((last, _)) = run.char_indices().last().filter(|&(l, _)| l > 0) {
                        end = start + last;
                    }
                }
            }
            at = end;
            Some(Ok((start, end)))
        })
    }
}

/// Pieces of `s` between and at `matches` (ascending, non-overlapping byte ranges),
/// as HF's `Pattern` impls give them: `(piece, is_match)`, covering `s` in order.
pub(super) fn cover<'t>(
    s: &'t str,
    matches: impl IntoIterator<Item = Result<(usize, usize), String>>,
    mut f: impl FnMut(&'t str, bool) -> Result<(), String>,
) -> Result<(), String> {
    let mut prev = 0;
    for m in matches {
        let (start, end) = m?;
        if prev != start {
            f(&s[prev..start], false)?;
        }
        f(&s[start..end], true)?;
        prev = end;
    }
    if prev != s.len() {
        f(&s[prev..], false)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokenizers::utils::SysRegex;

    const GPT2: &str =
        r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
    const LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    const QWEN2: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

    /// fancy-regex's pieces (as the walk's HF-compared path makes them).
    fn fancy(re: &SysRegex, s: &str) -> Vec<(String, bool)> {
        let mut out = Vec::new();
        super::cover(s, re.find_iter(s).map(Ok), |p, m| {
            out.push((p.to_string(), m));
            Ok(())
        })
        .unwrap();
        out
    }

    fn dfa(d: &DfaSplit, s: &str) -> Vec<(String, bool)> {
        let mut out = Vec::new();
        d.pieces(s, |p, m| {
            out.push((p.to_string(), m));
            Ok(())
        })
        .unwrap();
        out
    }

    const PIECES: &[&str] = &[
        " ", "  ", "   ", "\t", "\n", "\r\n", " \n", "\n ", "\u{3000}", "\u{a0}", "a", "Ab",
        "word", "'s", "'LL", "'", "1", "12", "1234", ".", "...", "!?", "é", "日本", "😀",
        "\u{301}", "_", "-x", "(", "\r",
    ];

    /// Each pattern compiled both ways, once.
    static BOTH: std::sync::LazyLock<Vec<(SysRegex, DfaSplit)>> = std::sync::LazyLock::new(|| {
        [GPT2, LLAMA3, QWEN2]
            .iter()
            .map(|p| (SysRegex::new(p).unwrap(), DfaSplit::new(p).unwrap()))
            .collect()
    });

    proptest::proptest! {
        #[test]
        fn the_dfa_split_gives_fancy_regexs_pieces(picks in proptest::collection::vec(0..PIECES.len(), 0..40)) {
            let text: String = picks.iter().map(|&i| PIECES[i]).collect();
            for (re, d) in BOTH.iter() {
                proptest::prop_assert_eq!(dfa(d, &text), fancy(re, &text));
            }
        }
    }

    #[test]
    fn whitespace_runs_leave_their_last_char_to_what_follows() {
        let d = DfaSplit::new(LLAMA3).unwrap();
        let re = SysRegex::new(LLAMA3).unwrap();
        for s in [
            "a   b",
            "a \u{3000}b",
            "  \n  x",
            "x  ",
            " x",
            "a\t\tb",
            "   ",
        ] {
            assert_eq!(dfa(&d, s), fancy(&re, s), "{s:?}");
        }
        assert_eq!(
            dfa(&d, "a   b"),
            [("a", true), ("  ", true), (" b", true)].map(|(p, m)| (p.to_string(), m))
        );
    }

    #[test]
    fn other_patterns_keep_fancy_regex() {
        assert!(DfaSplit::new(r"\w+|[^\w\s]+").is_none());
        assert!(DfaSplit::new(r"(?=x)a|\s+(?!\S)|\s+").is_none());
        assert!(DfaSplit::new(r"|\s+(?!\S)|\s+").is_none());
    }
}
