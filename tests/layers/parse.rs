//! What one source file says, read with a small tokenizer (no parser crate): the
//! modules it declares (`mod x;`, `#[path]`, inline `mod x { .. }`), the paths it
//! names (`use` trees expanded, paths in code), its `pub use` items and the names of
//! the items it defines. Comments, string and char literals and lifetimes never count.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, PartialEq)]
pub enum Tok {
    Ident(String),
    /// `::`
    Sep,
    Punct(char),
    /// A string literal's content (for `#[path = ".."]`).
    Str(String),
}

/// Tokens and their line numbers; comments, char literals and lifetimes are dropped.
fn tokenize(src: &str) -> Vec<(Tok, usize)> {
    let b = src.as_bytes();
    let (mut i, mut line, mut out) = (0, 1, Vec::new());
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    while i < b.len() {
        let c = b[i];
        let next = b.get(i + 1).copied().unwrap_or(0);
        if c == b'\n' {
            line += 1;
            i += 1;
        } else if c.is_ascii_whitespace() {
            i += 1;
        } else if c == b'/' && next == b'/' {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if c == b'/' && next == b'*' {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
                    depth += 1;
                    i += 2;
                } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    line += usize::from(b[i] == b'\n');
                    i += 1;
                }
            }
        } else if let Some((len, hashes)) = raw_string_start(&b[i..]) {
            // r"..", r#".."#, br"..": no escapes; ends at `"` and as many `#`.
            let start = i + len;
            let mut j = start;
            loop {
                if j >= b.len() {
                    break;
                }
                if b[j] == b'"'
                    && b[j + 1..]
                        .iter()
                        .take(hashes)
                        .filter(|&&h| h == b'#')
                        .count()
                        == hashes
                {
                    break;
                }
                j += 1;
            }
            let text = &src[start..j.min(b.len())];
            line += text.matches('\n').count();
            out.push((Tok::Str(text.to_string()), line));
            i = j + 1 + hashes;
        } else if c == b'"' || (c == b'b' && next == b'"') {
            let start = i + if c == b'b' { 2 } else { 1 };
            let mut j = start;
            while j < b.len() && b[j] != b'"' {
                j += if b[j] == b'\\' { 2 } else { 1 };
            }
            let text = &src[start..j.min(b.len())];
            line += text.matches('\n').count();
            out.push((Tok::Str(text.to_string()), line));
            i = j + 1;
        } else if c == b'\'' || (c == b'b' && next == b'\'') {
            // A char literal ('a', '\n', '\u{1F600}', b'x') or a lifetime ('a).
            let j = i + if c == b'b' { 1 } else { 0 };
            if b.get(j + 1) == Some(&b'\\') {
                let mut k = j + 2;
                while k < b.len() && b[k] != b'\'' {
                    k += 1;
                }
                i = k + 1;
            } else {
                // One (UTF-8) character then a quote: a literal; else a lifetime.
                let ch_len = src[j + 1..].chars().next().map_or(1, char::len_utf8);
                if b.get(j + 1 + ch_len) == Some(&b'\'') {
                    i = j + 2 + ch_len;
                } else {
                    i = j + 1;
                    while i < b.len() && ident(b[i]) {
                        i += 1;
                    }
                }
            }
        } else if c == b'$' && b[i + 1..].starts_with(b"crate") {
            out.push((Tok::Ident("crate".into()), line));
            i += 6;
        } else if c == b'r' && next == b'#' && b.get(i + 2).is_some_and(|&c| ident(c)) {
            let s = i + 2;
            i = s;
            while i < b.len() && ident(b[i]) {
                i += 1;
            }
            out.push((Tok::Ident(src[s..i].to_string()), line));
        } else if ident(c) {
            let s = i;
            while i < b.len() && ident(b[i]) {
                i += 1;
            }
            out.push((Tok::Ident(src[s..i].to_string()), line));
        } else if c == b':' && next == b':' {
            out.push((Tok::Sep, line));
            i += 2;
        } else {
            let ch = src[i..].chars().next().unwrap_or(' ');
            out.push((Tok::Punct(ch), line));
            i += ch.len_utf8();
        }
    }
    out
}

/// `r"`, `r#"`, `br##"`...: the prefix's length and the number of `#`.
fn raw_string_start(b: &[u8]) -> Option<(usize, usize)> {
    let mut i = 0;
    if b.first() == Some(&b'b') {
        i += 1;
    }
    if b.get(i) != Some(&b'r') {
        return None;
    }
    i += 1;
    let hashes = b[i..].iter().take_while(|&&c| c == b'#').count();
    (b.get(i + hashes) == Some(&b'"')).then_some((i + hashes + 1, hashes))
}

/// What one file says: its module declarations and the paths it names.
pub struct Parsed {
    /// (module path, file to load or None for inline) of each `mod` declared.
    pub mods: Vec<(String, Option<PathBuf>)>,
    /// (absolute module path of the naming scope, segments as written, line).
    pub paths: Vec<(String, Vec<String>, usize)>,
    /// `pub use` items: (scope, local name, segments as written, line).
    pub reexports: Vec<(String, String, Vec<String>, usize)>,
    /// How often each identifier appears outside `use` items.
    pub words: BTreeMap<String, usize>,
    /// Items defined: (scope, name).
    pub items: Vec<(String, String)>,
}

fn is_word(t: Option<&(Tok, usize)>, w: &str) -> bool {
    matches!(t, Some((Tok::Ident(s), _)) if s == w)
}

/// Parses one file whose module is `module`; `dir` is where its `mod x;` files live.
pub fn parse(src: &str, module: &str, dir: &Path, file_dir: &Path) -> Parsed {
    let toks = tokenize(src);
    let mut p = Parsed {
        mods: vec![],
        paths: vec![],
        reexports: vec![],
        words: BTreeMap::new(),
        items: vec![],
    };
    // Inline modules: (name, brace depth at which it closes).
    let mut scope: Vec<(String, usize)> = vec![];
    let (mut depth, mut i) = (0usize, 0usize);
    let mut path_attr: Option<String> = None;
    let cur = |scope: &[(String, usize)]| {
        let mut m = module.to_string();
        for (s, _) in scope {
            m = format!("{m}::{s}");
        }
        m
    };
    let dir_of = |scope: &[(String, usize)]| {
        let mut d = dir.to_path_buf();
        for (s, _) in scope {
            d.push(s);
        }
        d
    };
    while i < toks.len() {
        match &toks[i].0 {
            Tok::Punct('{') => depth += 1,
            Tok::Punct('}') => {
                depth = depth.saturating_sub(1);
                if scope.last().is_some_and(|(_, d)| *d == depth) {
                    scope.pop();
                }
            }
            Tok::Punct('#')
                if matches!(toks.get(i + 1), Some((Tok::Punct('['), _)))
                    && is_word(toks.get(i + 2), "path") =>
            {
                if let Some((Tok::Str(s), _)) = toks.get(i + 4) {
                    path_attr = Some(s.clone());
                }
            }
            Tok::Ident(w) if w == "mod" => {
                if let Some((Tok::Ident(name), _)) = toks.get(i + 1) {
                    let m = format!("{}::{name}", cur(&scope));
                    match toks.get(i + 2) {
                        Some((Tok::Punct(';'), _)) => {
                            let f = match path_attr.take() {
                                Some(pa) if scope.is_empty() => file_dir.join(pa),
                                Some(pa) => dir_of(&scope).join(pa),
                                None => {
                                    let d = dir_of(&scope);
                                    let flat = d.join(format!("{name}.rs"));
                                    if flat.exists() {
                                        flat
                                    } else {
                                        d.join(name).join("mod.rs")
                                    }
                                }
                            };
                            p.mods.push((m, Some(f)));
                            i += 3;
                            continue;
                        }
                        Some((Tok::Punct('{'), _)) => {
                            p.mods.push((m, None));
                            scope.push((name.clone(), depth));
                            depth += 1;
                            path_attr = None;
                            i += 3;
                            continue;
                        }
                        _ => {}
                    }
                }
            }
            Tok::Ident(w) if w == "use" => {
                let line = toks[i].1;
                let public = is_word(toks.get(i.wrapping_sub(1)), "pub")
                    || (matches!(toks.get(i.wrapping_sub(1)), Some((Tok::Punct(')'), _)))
                        && is_word(toks.get(i.wrapping_sub(4)), "pub"));
                let mut trees = vec![];
                i = use_tree(&toks, i + 1, vec![], None, &mut trees);
                for (t, alias) in trees {
                    let last = match t.as_slice() {
                        [.., a, s] if s == "self" => a.clone(),
                        [.., s] => s.clone(),
                        [] => continue,
                    };
                    if public {
                        p.reexports
                            .push((cur(&scope), alias.unwrap_or(last), t, line));
                    } else {
                        p.paths.push((cur(&scope), t, line));
                    }
                }
                continue;
            }
            Tok::Ident(kw)
                if matches!(
                    kw.as_str(),
                    "fn" | "struct" | "enum" | "const" | "static" | "type" | "trait" | "union"
                ) && matches!(toks.get(i + 1), Some((Tok::Ident(_), _))) =>
            {
                if let Some((Tok::Ident(name), _)) = toks.get(i + 1) {
                    p.items.push((cur(&scope), name.clone()));
                }
            }
            Tok::Ident(first) => {
                *p.words.entry(first.clone()).or_default() += 1;
                // `pub(in crate::a)` names a visibility, not an import.
                let visibility = is_word(toks.get(i.wrapping_sub(1)), "in")
                    && matches!(toks.get(i.wrapping_sub(2)), Some((Tok::Punct('('), _)));
                if !visibility
                    && !matches!(toks.get(i.wrapping_sub(1)), Some((Tok::Sep, _)))
                    && matches!(toks.get(i + 1), Some((Tok::Sep, _)))
                {
                    let line = toks[i].1;
                    let mut segs = vec![first.clone()];
                    let mut j = i + 1;
                    while let (Some((Tok::Sep, _)), Some((Tok::Ident(s), _))) =
                        (toks.get(j), toks.get(j + 1))
                    {
                        *p.words.entry(s.clone()).or_default() += 1;
                        segs.push(s.clone());
                        j += 2;
                    }
                    p.paths.push((cur(&scope), segs, line));
                    i = j;
                    continue;
                }
            }
            _ => {}
        }
        if matches!(toks[i].0, Tok::Punct(';' | '{' | '}')) {
            // `#[path]` applies to the next item only.
            path_attr = None;
        }
        i += 1;
    }
    p
}

/// Expands the `use` tree starting at `i` (after `use`) into full paths; returns the
/// index after the tree (its `;` or the `,` / `}` that ends it).
fn use_tree(
    toks: &[(Tok, usize)],
    mut i: usize,
    mut prefix: Vec<String>,
    _alias: Option<String>,
    out: &mut Vec<(Vec<String>, Option<String>)>,
) -> usize {
    if matches!(toks.get(i), Some((Tok::Sep, _))) {
        i += 1; // `use ::std::..`
    }
    loop {
        match toks.get(i) {
            Some((Tok::Ident(s), _)) if s != "as" => {
                prefix.push(s.clone());
                i += 1;
                if matches!(toks.get(i), Some((Tok::Sep, _))) {
                    i += 1;
                    continue;
                }
                let mut alias = None;
                if is_word(toks.get(i), "as") {
                    if let Some((Tok::Ident(a), _)) = toks.get(i + 1) {
                        alias = Some(a.clone());
                    }
                    i += 2;
                }
                out.push((prefix, alias));
                return i;
            }
            Some((Tok::Punct('*'), _)) => {
                out.push((prefix, Some("*".into())));
                return i + 1;
            }
            Some((Tok::Punct('{'), _)) => {
                i += 1;
                loop {
                    match toks.get(i) {
                        Some((Tok::Punct('}'), _)) => return i + 1,
                        Some((Tok::Punct(','), _)) => i += 1,
                        None => return i,
                        _ => i = use_tree(toks, i, prefix.clone(), None, out),
                    }
                }
            }
            _ => {
                if !prefix.is_empty() {
                    out.push((prefix, None));
                }
                return i;
            }
        }
    }
}
