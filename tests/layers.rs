//! The crate's import graph, drawn from the sources (`layers/graph.rs`): no file of
//! `src/` imports another that (through any chain) imports it back, the service's
//! layers import downward only, and the proxy reaches the service through its narrow
//! doors. The layer order is the one written in `src/service/mod.rs`'s header.
//!
//! Run with `LAYERS_DUMP=1` to print every file and every file-level import.

#[path = "layers/graph.rs"]
mod graph;
#[path = "layers/parse.rs"]
mod parse;
#[path = "layers/rules.rs"]
mod rules;

use graph::Graph;
use rules::{layer_of, LAYERS, PROXY_DOORS, PROXY_DRIVER};
use std::path::Path;

fn graph() -> Graph {
    Graph::read(Path::new(env!("CARGO_MANIFEST_DIR")))
}

fn edge_text(g: &Graph, e: &graph::Edge) -> String {
    format!(
        "  {}:{} -> {} ({})",
        g.files[e.from].path, e.line, g.files[e.to].path, e.text
    )
}

#[test]
fn no_file_circle() {
    let g = graph();
    let mut found = Vec::new();
    for c in g.circles() {
        let mut files: Vec<&str> = c.iter().map(|&i| g.files[i].path.as_str()).collect();
        files.sort_unstable();
        let inside: Vec<String> = g
            .edges
            .iter()
            .filter(|e| c.contains(&e.from) && c.contains(&e.to))
            .map(|e| edge_text(&g, e))
            .collect();
        found.push(format!("{}\n{}", files.join(" "), inside.join("\n")));
    }
    assert!(found.is_empty(), "import circles:\n{}", found.join("\n\n"));
}

/// Every service layer (and the proxy's driver) imports only from its own layer or
/// those below it (`rules::LAYERS`, lowest first).
#[test]
fn layers_import_downward() {
    let g = graph();
    let mut up = Vec::new();
    for e in &g.edges {
        let (from, to) = (g.files[e.from].path.as_str(), g.files[e.to].path.as_str());
        let (lf, lt) = (layer_of(from), layer_of(to));
        if lf >= lt {
            continue;
        }
        up.push(format!(
            "{} ({} below {})",
            edge_text(&g, e),
            LAYERS[lf].0,
            LAYERS[lt].0
        ));
    }
    assert!(up.is_empty(), "imports up the layers:\n{}", up.join("\n"));
}

/// The proxy's driver names nothing of the service but its doors: the routing handle
/// (and its errors), the network layer and the metrics registry (`rules::PROXY_DOORS`).
#[test]
fn proxy_reaches_the_service_through_its_doors() {
    let g = graph();
    let mut bad = Vec::new();
    for e in &g.edges {
        let (from, to) = (g.files[e.from].path.as_str(), g.files[e.to].path.as_str());
        let driver = PROXY_DRIVER.iter().any(|p| from.starts_with(p));
        if !driver || !to.starts_with("src/service/") {
            continue;
        }
        if PROXY_DOORS.iter().any(|p| to.starts_with(p)) {
            continue;
        }
        bad.push(edge_text(&g, e));
    }
    assert!(
        bad.is_empty(),
        "the proxy past its doors:\n{}",
        bad.join("\n")
    );
}

/// The project's bar: no Rust file of `src/` over 600 lines (split by concept).
#[test]
fn no_file_over_600_lines() {
    let g = graph();
    let long: Vec<String> = g
        .files
        .iter()
        .filter(|f| f.lines > 600)
        .map(|f| format!("  {} ({} lines)", f.path, f.lines))
        .collect();
    assert!(
        long.is_empty(),
        "files over 600 lines:\n{}",
        long.join("\n")
    );
}

#[test]
fn dump() {
    if std::env::var_os("LAYERS_DUMP").is_none() {
        return;
    }
    let g = graph();
    for f in &g.files {
        println!(
            "{} = {} ({} lines, layer {})",
            f.module,
            f.path,
            f.lines,
            LAYERS[layer_of(&f.path)].0
        );
    }
    for e in &g.edges {
        println!("{}", edge_text(&g, e).trim_start());
    }
}
