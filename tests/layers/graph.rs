//! The crate's file-level `use` graph, read from the sources with a small tokenizer (no
//! parser crate): which file of `src/` names a path in which other file.
//!
//! The module tree is walked from `src/lib.rs` (and `src/main.rs`, whose `kvroute::`
//! paths are the library's `crate::`), following `mod x;` declarations (with
//! `#[path]`) and inline `mod x { .. }` blocks. A file imports another when it names a
//! path that resolves into it:
//! - `use` trees, with braces and globs expanded;
//! - paths in code that start with `crate`, `super` or `self` (or `kvroute` in the
//!   binary), or with the name of a module the file itself declares.
//!
//! A path resolves to the file of its longest prefix that is a module, so
//! `crate::a::b::Item` is an import of `a/b.rs` when that module exists and of `a.rs`
//! (or `a/mod.rs`) otherwise. Declaring a child (`mod x;`) is not an import; naming an
//! item of the parent's own file (`super::Item`) is one.

use crate::parse::parse;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// One source file of the crate.
#[derive(Debug)]
pub struct File {
    /// Relative to the crate root: `src/service/mod.rs`.
    pub path: String,
    /// `crate::service` (`bin` for `src/main.rs`).
    pub module: String,
    pub lines: usize,
}

/// A file-level import: `from` names `text`, which resolves into `to`.
#[derive(Debug, Clone)]
pub struct Edge {
    pub from: usize,
    pub to: usize,
    /// The path as written (expanded), for messages.
    pub text: String,
    pub line: usize,
}

#[derive(Debug, Default)]
pub struct Graph {
    pub files: Vec<File>,
    pub edges: Vec<Edge>,
    /// Module path → index of the file that holds it (inline modules included).
    modules: BTreeMap<String, usize>,
    /// Module path → its `pub use` items: (local name, segments as written).
    reexports: BTreeMap<String, Vec<(String, Vec<String>)>>,
    /// Module path → the names of the items it defines.
    items: BTreeMap<String, BTreeSet<String>>,
}

impl Graph {
    /// Reads the crate whose `Cargo.toml` is in `root`.
    pub fn read(root: &Path) -> Graph {
        let mut g = Graph::default();
        let mut parsed = vec![];
        let mut todo = vec![
            (root.join("src/lib.rs"), "crate".to_string()),
            (root.join("src/main.rs"), "bin".to_string()),
        ];
        while let Some((file, module)) = todo.pop() {
            let src = std::fs::read_to_string(&file)
                .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            let name = file
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default();
            let file_dir = file.parent().unwrap_or(root).to_path_buf();
            let dir = if matches!(name, "lib.rs" | "main.rs" | "mod.rs") {
                file_dir.clone()
            } else {
                file_dir.join(name.trim_end_matches(".rs"))
            };
            let p = parse(&src, &module, &dir, &file_dir);
            let idx = g.files.len();
            g.files.push(File {
                path: file
                    .strip_prefix(root)
                    .unwrap_or(&file)
                    .display()
                    .to_string(),
                module: module.clone(),
                lines: src.lines().count(),
            });
            g.modules.insert(module.clone(), idx);
            for (m, f) in &p.mods {
                match f {
                    Some(f) => todo.push((f.clone(), m.clone())),
                    None => {
                        g.modules.insert(m.clone(), idx);
                    }
                }
            }
            parsed.push(p);
        }
        for p in &parsed {
            for (scope, name) in &p.items {
                g.items
                    .entry(scope.clone())
                    .or_default()
                    .insert(name.clone());
            }
            for (scope, name, segs, _) in &p.reexports {
                let r = g.reexports.entry(scope.clone()).or_default();
                r.push((name.clone(), segs.clone()));
            }
        }
        for (from, p) in parsed.iter().enumerate() {
            // A `pub use` is a way through, not an import of the file that writes it,
            // unless the file also uses the name itself.
            let used = p
                .reexports
                .iter()
                .filter(|(_, name, _, _)| p.words.get(name).is_some_and(|&n| n > 0))
                .map(|(scope, _, segs, line)| (scope.clone(), segs.clone(), *line));
            for (scope, segs, line) in p.paths.iter().cloned().chain(used) {
                let Some(abs) = g.absolute(&scope, &segs) else {
                    continue;
                };
                let Some((to, abs)) = g.resolve(&abs, 0) else {
                    continue;
                };
                if to != from {
                    g.edges.push(Edge {
                        from,
                        to,
                        text: abs.join("::"),
                        line,
                    });
                }
            }
        }
        g
    }

    /// The absolute form of a path named in module `scope`, or None when it leaves the
    /// crate (std, dependencies, locals).
    fn absolute(&self, scope: &str, segs: &[String]) -> Option<Vec<String>> {
        let in_bin = scope == "bin" || scope.starts_with("bin::");
        let mut base: Vec<String> = scope.split("::").map(String::from).collect();
        let mut rest = segs;
        match segs.first().map(String::as_str) {
            Some("crate") if in_bin => return None,
            Some("crate") => {
                base.truncate(1);
                rest = &segs[1..];
            }
            Some("kvroute") if in_bin => {
                base = vec!["crate".into()];
                rest = &segs[1..];
            }
            Some("self") => rest = &segs[1..],
            Some("super") => {
                while rest.first().map(String::as_str) == Some("super") {
                    base.pop();
                    rest = &rest[1..];
                }
            }
            Some(first) => {
                // A relative path: a module declared in this scope.
                let child = format!("{scope}::{first}");
                if !self.modules.contains_key(&child) {
                    return None;
                }
            }
            None => return None,
        }
        base.extend(rest.iter().cloned());
        Some(base)
    }

    /// The file holding the longest module prefix of `abs`, through `pub use` items
    /// to the file that defines the name; and the path followed.
    fn resolve(&self, abs: &[String], hops: usize) -> Option<(usize, Vec<String>)> {
        let n = (1..=abs.len())
            .rev()
            .find(|&n| self.modules.contains_key(&abs[..n].join("::")))?;
        let module = abs[..n].join("::");
        let file = self.modules[&module];
        let defined = |name: &String| self.items.get(&module).is_some_and(|s| s.contains(name));
        if let (Some(name), true) = (abs.get(n).filter(|n| !defined(n)), hops < 16) {
            let through: Vec<_> = self.reexports.get(&module).into_iter().flatten().collect();
            // A name re-exported by name, else through a glob.
            let named = through.iter().find(|(local, _)| local == name);
            let glob = through.iter().filter(|(local, _)| local == "*");
            for (local, segs) in named.into_iter().chain(glob) {
                let mut target = self.absolute(&module, segs)?;
                if local == "*" {
                    target.push(name.clone());
                }
                target.extend(abs[n + 1..].iter().cloned());
                if let Some(r) = self.resolve(&target, hops + 1) {
                    return Some(r);
                }
            }
        }
        Some((file, abs.to_vec()))
    }

    /// Edges as a set of (from, to) pairs.
    pub fn pairs(&self) -> BTreeSet<(usize, usize)> {
        self.edges.iter().map(|e| (e.from, e.to)).collect()
    }

    /// The strongly connected components of more than one file (Tarjan).
    pub fn circles(&self) -> Vec<Vec<usize>> {
        let n = self.files.len();
        let mut adj = vec![vec![]; n];
        for (a, b) in self.pairs() {
            adj[a].push(b);
        }
        struct T<'a> {
            adj: &'a [Vec<usize>],
            index: Vec<Option<usize>>,
            low: Vec<usize>,
            on: Vec<bool>,
            stack: Vec<usize>,
            next: usize,
            out: Vec<Vec<usize>>,
        }
        fn visit(t: &mut T, v: usize) {
            t.index[v] = Some(t.next);
            t.low[v] = t.next;
            t.next += 1;
            t.stack.push(v);
            t.on[v] = true;
            for k in 0..t.adj[v].len() {
                let w = t.adj[v][k];
                match t.index[w] {
                    None => {
                        visit(t, w);
                        t.low[v] = t.low[v].min(t.low[w]);
                    }
                    Some(iw) if t.on[w] => t.low[v] = t.low[v].min(iw),
                    _ => {}
                }
            }
            if Some(t.low[v]) == t.index[v] {
                let mut c = vec![];
                while let Some(w) = t.stack.pop() {
                    t.on[w] = false;
                    c.push(w);
                    if w == v {
                        break;
                    }
                }
                if c.len() > 1 {
                    c.sort();
                    t.out.push(c);
                }
            }
        }
        let mut t = T {
            adj: &adj,
            index: vec![None; n],
            low: vec![0; n],
            on: vec![false; n],
            stack: vec![],
            next: 0,
            out: vec![],
        };
        for v in 0..n {
            if t.index[v].is_none() {
                visit(&mut t, v);
            }
        }
        t.out
    }
}
