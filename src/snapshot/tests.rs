//! Unit tests of the snapshot format (encode/decode, checksum, older versions, atomic
//! file) and of the all-or-nothing restore check.

use super::*;
use crate::load::CarriedRequest;

fn sample() -> Snapshot {
    let mut a = WorkerSpec::new("a");
    a.epoch = 3;
    Snapshot {
        params: Some(HashParams::current(128)),
        workers: vec![
            SavedWorker {
                spec: a,
                heartbeat: true,
                next_seq: 42,
                approximate: false,
            },
            SavedWorker {
                spec: WorkerSpec::new("b"),
                heartbeat: false,
                next_seq: 0,
                approximate: true,
            },
        ],
        entries: vec![vec![(Tier::Device, 1), (Tier::Host, u64::MAX)], vec![]],
        requests: vec![
            SavedRequest {
                request: CarriedRequest {
                    id: "r-1".into(),
                    decode_worker: 1,
                    prefill_worker: Some(0),
                    input_tokens: 300,
                    cached_tokens: 128,
                    prompt_blocks: 3,
                    hashes: vec![5, 6, 7],
                    expected_output_tokens: Some(50),
                    in_prefill: true,
                    output_tokens: 0,
                    age_us: 1234,
                    first_token_age_us: None,
                    pinned: false,
                    idle_us: 0,
                    local: false,
                },
                reroute: Some(SavedReroute {
                    filters: crate::select::Filters {
                        model: "m".into(),
                        ..Default::default()
                    },
                    mode: crate::config::Mode::Kv,
                }),
                proxied_here: false,
            },
            SavedRequest {
                request: CarriedRequest {
                    id: "r-2".into(),
                    decode_worker: 0,
                    prefill_worker: None,
                    input_tokens: 10,
                    cached_tokens: 0,
                    prompt_blocks: 1,
                    hashes: vec![],
                    expected_output_tokens: None,
                    in_prefill: false,
                    output_tokens: 17,
                    age_us: 0,
                    first_token_age_us: Some(9),
                    pinned: false,
                    idle_us: 0,
                    local: false,
                },
                reroute: None,
                proxied_here: true,
            },
        ],
    }
}

/// `s` as an older build wrote it: version 2 (no hash parameters, no checksum) or
/// version 1 (also no request section; `s` must have no requests).
fn legacy(s: &Snapshot, version: u16) -> Vec<u8> {
    let mut bytes = s.encode();
    bytes.truncate(bytes.len() - 8); // the checksum
    let scheme = s.params.as_ref().map_or(0, |p| p.scheme.len());
    bytes.drain(6..6 + 4 + 8 + 1 + scheme);
    if version == 1 {
        assert!(s.requests.is_empty());
        bytes.truncate(bytes.len() - 8); // version 1 ends after the index entries
    }
    bytes[4..6].copy_from_slice(&version.to_le_bytes());
    bytes
}

fn dir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("kvroute-snap-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

#[test]
fn roundtrip_and_atomic_file() {
    let s = sample();
    assert_eq!(Snapshot::decode(&s.encode()).unwrap(), s);
    let dir = dir("rt");
    assert!(read(&dir).unwrap().is_none());
    probe_dir(&dir).unwrap();
    assert!(!dir.join(PROBE_NAME).exists());
    let n = write(&dir, &s).unwrap();
    assert_eq!(n, s.encode().len());
    assert_eq!(read(&dir).unwrap().unwrap(), s);
    assert!(!dir.join(TMP_NAME).exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn corrupt_input_is_an_error_never_a_panic() {
    let bytes = sample().encode();
    for cut in 0..bytes.len() {
        assert!(Snapshot::decode(&bytes[..cut]).is_err(), "cut at {cut}");
    }
    let mut extra = bytes.clone();
    extra.push(0);
    assert!(Snapshot::decode(&extra).is_err());
    assert!(Snapshot::decode(b"nope").is_err());
    // The structural checks behind the checksum (version 2 has none in front of them).
    let s = sample();
    let mut no_requests = s.clone();
    no_requests.requests.clear();
    let mut bad_tier = legacy(&no_requests, 2);
    let pos = bad_tier.len() - 8 - 8 - 9;
    bad_tier[pos] = 9;
    assert!(Snapshot::decode(&bad_tier).is_err());
    // A request naming a worker the snapshot does not have.
    let mut bad_worker = s.clone();
    bad_worker.requests[1].request.decode_worker = 2;
    assert!(Snapshot::decode(&bad_worker.encode()).is_err());
    // A huge request count is refused before allocating.
    let mut huge = legacy(&no_requests, 2);
    let n = huge.len();
    huge[n - 8..].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(Snapshot::decode(&huge).is_err());
    // Version 2: every single-byte corruption is an error or a valid snapshot.
    let v2 = legacy(&s, 2);
    for i in 0..v2.len() {
        let mut b = v2.clone();
        b[i] ^= 0xa5;
        let _ = Snapshot::decode(&b);
    }
}

#[test]
fn every_flipped_bit_of_a_version_3_file_is_refused() {
    let bytes = sample().encode();
    for i in 0..bytes.len() {
        for bit in 0..8 {
            let mut b = bytes.clone();
            b[i] ^= 1 << bit;
            assert!(
                Snapshot::decode(&b).is_err(),
                "bit {bit} of byte {i} flipped, still accepted"
            );
        }
    }
    // A flipped byte of an index entry's hash names the checksum.
    let mut b = bytes.clone();
    let pos = bytes
        .windows(8)
        .position(|w| w == u64::MAX.to_le_bytes())
        .unwrap();
    b[pos] ^= 1;
    let e = Snapshot::decode(&b).unwrap_err().to_string();
    assert!(e.contains("checksum mismatch"), "{e}");
}

#[test]
fn older_versions_are_read_without_params_and_others_refused() {
    let mut s = sample();
    let mut v2 = s.clone();
    v2.params = None;
    assert_eq!(Snapshot::decode(&legacy(&s, 2)).unwrap(), v2);
    s.requests.clear();
    let mut bytes = legacy(&s, 1);
    let mut v1 = s.clone();
    v1.params = None;
    assert_eq!(Snapshot::decode(&bytes).unwrap(), v1);
    bytes[4..6].copy_from_slice(&4u16.to_le_bytes());
    let e = Snapshot::decode(&bytes).unwrap_err().to_string();
    assert!(e.contains("unsupported version 4"), "{e}");
}

#[test]
fn a_failed_write_leaves_no_temporary_file_and_the_old_snapshot() {
    let d = dir("fail");
    probe_dir(&d).unwrap();
    let s = sample();
    write(&d, &s).unwrap();
    // A directory where the snapshot goes: the rename fails after the tmp is written.
    std::fs::remove_file(d.join(FILE_NAME)).unwrap();
    std::fs::create_dir(d.join(FILE_NAME)).unwrap();
    std::fs::write(d.join(FILE_NAME).join("x"), b"x").unwrap();
    assert!(write(&d, &s).is_err());
    assert!(!d.join(TMP_NAME).exists());
    std::fs::remove_dir_all(d.join(FILE_NAME)).unwrap();
    // A link planted as the temporary file is replaced, never written through.
    let target = d.join("target");
    std::fs::write(&target, b"keep").unwrap();
    std::os::unix::fs::symlink(&target, d.join(TMP_NAME)).unwrap();
    write(&d, &s).unwrap();
    assert_eq!(std::fs::read(&target).unwrap(), b"keep");
    assert_eq!(read(&d).unwrap().unwrap(), s);
    // The directory is gone: an error, and it is not recreated.
    std::fs::remove_dir_all(&d).unwrap();
    assert!(write(&d, &s).is_err());
    assert!(!d.exists());
}

#[test]
fn probe_refuses_a_directory_that_cannot_hold_files() {
    let d = dir("probe");
    std::fs::create_dir_all(&d).unwrap();
    let file = d.join("plain");
    std::fs::write(&file, b"").unwrap();
    let e = probe_dir(&file.join("state")).unwrap_err().to_string();
    assert!(e.contains("plain/state"), "{e}");
    // A stale temporary file is removed at start.
    std::fs::write(d.join(TMP_NAME), b"half").unwrap();
    probe_dir(&d).unwrap();
    assert!(!d.join(TMP_NAME).exists());
    let _ = std::fs::remove_dir_all(&d);
}

fn expect() -> Expect {
    Expect {
        params: HashParams::current(128),
        max_workers: 8,
        max_blocks_per_worker: 1 << 22,
    }
}

#[test]
fn check_accepts_a_valid_snapshot_and_older_files() {
    let s = sample();
    check(&s, &expect()).unwrap();
    let mut v2 = s.clone();
    v2.params = None;
    check(&v2, &expect()).unwrap();
}

#[test]
fn check_names_what_cannot_be_restored() {
    let e = |s: &Snapshot, x: &Expect| check(s, x).unwrap_err().to_string();
    let mut x = expect();
    x.params.block_size = 64;
    let m = e(&sample(), &x);
    assert!(
        m.contains("block_size 128") && m.contains("--block-size"),
        "{m}"
    );
    let mut x = expect();
    x.params.seed = 7;
    assert!(e(&sample(), &x).contains("hash seed"));
    let mut x = expect();
    x.max_workers = 1;
    let m = e(&sample(), &x);
    assert!(
        m.contains("2 workers") && m.contains("--max-workers"),
        "{m}"
    );
    let mut s = sample();
    s.workers[1].spec.capacity_blocks = 0;
    let m = e(&s, &expect());
    assert!(m.contains("\"b\"") && m.contains("capacity_blocks"), "{m}");
    let mut s = sample();
    s.workers[0].spec.id.clear();
    assert!(e(&s, &expect()).contains("worker #0"));
    let mut s = sample();
    s.workers[1].spec.id = "a".into();
    let m = e(&s, &expect());
    assert!(m.contains("\"a\" is saved twice"), "{m}");
    // Caps are the restore's to judge (they depend on the split over cores).
    let mut x = expect();
    x.max_blocks_per_worker = 1;
    check(&sample(), &x).unwrap();
    let mut s = sample();
    s.requests[1].request.id = "r-1".into();
    assert!(e(&s, &expect()).contains("\"r-1\" is saved twice"));
    let mut s = sample();
    s.requests[0].request.id.clear();
    assert!(e(&s, &expect()).contains("request #0"));
}

/// The request section's bytes, pinned (snapshots of older builds must still load). The
/// re-route inputs are JSON of `select::Filters`, whose fields are not this format's.
#[test]
fn request_bytes_are_pinned() {
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    let s = sample();
    let reroute = serde_json::to_vec(s.requests[0].reroute.as_ref().unwrap()).unwrap();
    let mut out = Vec::new();
    s.requests[0].encode(&mut out);
    let want = [
        "0300722d31",       // id
        "01000000",         // decode worker 1
        "00000000",         // prefill worker 0
        "2c010000",         // 300 input tokens
        "80000000",         // 128 cached
        "03000000",         // 3 prompt blocks
        "0b",               // in prefill | OSL | re-route
        "00000000",         // output tokens
        "d204000000000000", // age 1234 µs
        "32000000",         // OSL 50
        &hex(&(reroute.len() as u32).to_le_bytes()),
        &hex(&reroute),
        "03000000050000000000000006000000000000000700000000000000", // hashes 5, 6, 7
    ]
    .concat();
    assert_eq!(hex(&out), want);
    let mut out = Vec::new();
    s.requests[1].encode(&mut out);
    let want = [
        "0300722d32",       // id
        "00000000",         // decode worker 0
        "ffffffff",         // no prefill worker
        "0a000000",         // 10 input tokens
        "00000000",         // none cached
        "01000000",         // 1 prompt block
        "14",               // first token | proxied here
        "11000000",         // 17 output tokens
        "0000000000000000", // age 0
        "0900000000000000", // first token 9 µs ago
        "00000000",         // no hashes
    ]
    .concat();
    assert_eq!(hex(&out), want);
}
