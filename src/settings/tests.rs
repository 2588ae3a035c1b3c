//! Tests of the settings: defaults, TOML layered over them, and the validation of
//! keys whose owners (`record`, `cluster::config`) only define their values.

use super::*;

#[test]
fn defaults_are_valid_and_match_the_documented_ports() {
    let s = Settings::default();
    s.validate().unwrap();
    assert_eq!(s.events_addr, "127.0.0.1:7400");
    assert_eq!(s.api_addr, "127.0.0.1:7401");
    assert_eq!(s.http_addr, "127.0.0.1:7480");
}

#[test]
fn toml_layers_over_defaults() {
    let s = Settings::from_toml(
        "cores = 1\n[router]\noverlap_score_credit = 0.25\n[limits]\nmax_workers = 8\n",
    )
    .unwrap();
    assert_eq!(s.cores, Some(1));
    assert_eq!(s.router.overlap_score_credit, 0.25);
    assert_eq!(s.limits.max_workers, 8);
    assert_eq!(s.limits.queue_depth, 8192);
    assert!(Settings::from_toml("bogus = 1").is_err());
    let bad = Settings {
        http_addr: "nope".into(),
        ..Default::default()
    };
    assert!(bad.validate().is_err());
}

#[test]
fn record_keys_from_toml_and_validation() {
    let s = Settings::from_toml(
        "record = \"/tmp/t.jsonl\"\nrecord_max_bytes = 1000\nrecord_max_ids = 10\n\
         [router]\nspeculative_ttl_ms = 500\nspeculative_max_blocks = 7\n",
    )
    .unwrap();
    assert_eq!(s.record.as_deref(), Some("/tmp/t.jsonl"));
    assert_eq!((s.record_max_bytes, s.record_max_ids), (1000, 10));
    assert_eq!(s.router.speculative_ttl_ms, 500);
    assert_eq!(s.router.speculative_max_blocks, 7);
    s.validate().unwrap();
    let d = Settings::default();
    assert_eq!(d.record, None);
    assert_eq!(d.router.speculative_ttl_ms, 2_000);
    // A block size that does not divide 512 cannot be written as hash ids.
    let mut bad = s.clone();
    bad.router.block_size = 48;
    assert!(bad.validate().is_err());
    let mut bad = s;
    bad.record_max_bytes = 0;
    assert!(bad.validate().is_err());
}

#[test]
fn cluster_section_from_toml() {
    let s = Settings::from_toml(
        "[cluster]\nurl = \"nats://127.0.0.1:4222\"\nname = \"prod\"\nmax_age_ms = 1000\n\
         secret = \"0123456789abcdef\"\n",
    )
    .unwrap();
    assert_eq!(s.cluster.url.as_deref(), Some("nats://127.0.0.1:4222"));
    assert_eq!(s.cluster.name, "prod");
    assert_eq!(s.cluster.max_age_ms, 1000);
    assert_eq!(s.cluster.max_bytes, 1 << 30);
    s.validate().unwrap();
    assert!(Settings::from_toml("[cluster]\nbogus = 1\n").is_err());
}
