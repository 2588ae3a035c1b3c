//! The layer order of the crate, lowest first, as `src/service/mod.rs` states it: a
//! file may import files of its own layer and of the layers below, never above.
//! Everything of `src/` not named here is the pure library, the lowest layer.

/// (layer, the path prefixes of its files), lowest first.
pub const LAYERS: &[(&str, &[&str])] = &[
    ("library", &[]),
    (
        "service::metrics",
        &["src/service/metrics.rs", "src/service/metrics/"],
    ),
    ("service::net", &["src/service/net/"]),
    ("service::runtime", &["src/service/runtime/"]),
    ("service::routing", &["src/service/routing/"]),
    ("service::cluster", &["src/service/cluster/"]),
    ("service::state", &["src/service/state/"]),
    ("service::ingest", &["src/service/ingest/"]),
    ("service::api", &["src/service/api/"]),
    ("proxy driver", PROXY_DRIVER),
    (
        "service (top)",
        &[
            "src/service/mod.rs",
            "src/service/accept.rs",
            "src/service/epp_bridge.rs",
        ],
    ),
    ("bin", &["src/main.rs"]),
];

/// The proxy's driver half (glommio/hyper: it runs on the cores); the rest of
/// `src/proxy/` is pure library.
pub const PROXY_DRIVER: &[&str] = &[
    "src/proxy/body.rs",
    "src/proxy/forward.rs",
    "src/proxy/forward/",
    "src/proxy/agents/front.rs",
    "src/proxy/front.rs",
    "src/proxy/front_door.rs",
    "src/proxy/health.rs",
    "src/proxy/io.rs",
    "src/proxy/offload.rs",
    "src/proxy/policies.rs",
    "src/proxy/pool.rs",
    "src/proxy/queued.rs",
    "src/proxy/refuse.rs",
    "src/proxy/respond.rs",
    "src/proxy/server.rs",
    "src/proxy/state.rs",
    "src/proxy/watch.rs",
    "src/proxy/mod.rs",
];

/// What of the service the proxy's driver may name: the routing handle (and its error
/// type with the one mapping to statuses), the network layer, the metrics registry.
pub const PROXY_DOORS: &[&str] = &[
    "src/service/routing/handle.rs",
    "src/service/routing/errors.rs",
    "src/service/net/",
    "src/service/metrics.rs",
    "src/service/metrics/",
];

/// The layer of the file at `path` (an index into [`LAYERS`]); longest prefix wins.
pub fn layer_of(path: &str) -> usize {
    let mut best = (0, 0);
    for (i, (_, prefixes)) in LAYERS.iter().enumerate() {
        for p in *prefixes {
            if path.starts_with(p) && p.len() > best.1 {
                best = (i, p.len());
            }
        }
    }
    best.0
}
