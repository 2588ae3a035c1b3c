//! A test tokenizer for model `m`: `kvroute::tokenize::testing::write_dir` in a fresh
//! temporary directory (removed on drop), with the `--tokenizer` flag value that
//! serves it and the same tokenizer loaded in-process, so a test can compute the
//! token ids the router will see. Shared by the proxy tests (`tests/proxy.rs`,
//! `tests/proxy_tokenize_offload.rs`); the tests of `kvroute-sim tokenizer` itself
//! (`tests/tokenize.rs`, `tests/sim_fleet_router.rs`) write theirs with that tool.

use kvroute::tokenize::Tokenizers;
use std::path::Path;

/// The model the tokenizer is registered for.
pub const MODEL: &str = "m";

pub struct TestTokenizer {
    dir: tempfile::TempDir,
}

impl TestTokenizer {
    /// Writes a tokenizer of `vocab` words (`t0`, `t1`, …; see `tokenize::testing`).
    pub fn new(vocab: u32) -> TestTokenizer {
        let dir = tempfile::Builder::new()
            .prefix("kvroute-test-tok-")
            .tempdir()
            .expect("temp dir");
        kvroute::tokenize::testing::write_dir(dir.path(), vocab).expect("write tokenizer");
        TestTokenizer { dir }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The `--tokenizer` value: `m=DIR`.
    pub fn flag(&self) -> String {
        format!("{MODEL}={}", self.path().display())
    }

    /// The same tokenizer, loaded as the router loads it.
    pub fn load(&self) -> Tokenizers {
        Tokenizers::load(&[(MODEL.into(), self.path().to_path_buf())]).expect("load tokenizer")
    }
}
