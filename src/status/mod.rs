//! The live status page's state, shared by all cores: what the routing pipeline
//! records (`counters`, hot path, lock-free), the pure history / window / warning
//! logic (`model`), and [`StatusState`], which holds both with the cached document.
//! The service's `api::status` samples it once a second and builds the page's data
//! from it; the cores only write counters.

pub mod counters;
pub mod model;

use bytes::Bytes;
use counters::Counters;
use model::{History, Window};
use std::sync::atomic::AtomicBool;
use std::sync::Mutex;

/// The once-a-second sampler's memory: the history and the sliding window.
#[derive(Default)]
pub struct Sampler {
    pub history: History,
    pub window: Window,
}

/// Status state shared by all cores (a field of the service's shared state).
pub struct StatusState {
    pub counters: Counters,
    pub sampler: Mutex<Sampler>,
    /// The last status document built, with the time it was built (ms).
    pub cache: Mutex<Option<(u64, Bytes)>>,
    /// A core is building a fresh document (the others serve the cached one).
    pub building: AtomicBool,
}

impl StatusState {
    pub fn new(cores: usize, max_workers: usize) -> StatusState {
        StatusState {
            counters: Counters::new(cores, max_workers),
            sampler: Mutex::new(Sampler::default()),
            cache: Mutex::new(None),
            building: AtomicBool::new(false),
        }
    }
}
