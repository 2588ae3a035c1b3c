//! loom model of `sync::board::LoadBoard`: one writer per core row, a reader summing.
//!
//! Run: `RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test --release
//! --no-default-features --test loom_board`.
//!
//! A core publishes twice for one worker slot while a reader reads the slot twice (one
//! core keeps the state space small enough for seconds: every relaxed load may read any
//! of the row's publications, so the exploration grows with cells x publications).
//! Publication `i` of core `c` writes `k * base(c, i)` into the field with multiplier
//! `k`, so every published value is recognisable. Checked (the guarantee documented in
//! `sync::board`):
//! - each summed field is a sum of values actually published (or initial) for that
//!   field, one per core: nothing torn or invented;
//! - a second read never goes back: each field is >= its value in the first read.
//!
//! `fields_are_not_a_snapshot` shows what is NOT guaranteed (fields of one row may come
//! from two publications); `reset_first_is_caught` injects a publish that zeroes the row
//! first and expects the model to fail.
#![cfg(loom)]

use kvroute::load::{OldestPrefill, WorkerAgg};
use kvroute::sync::board::{LoadBoard, Published};
use kvroute::sync::faults::{self, Fault};
use loom::sync::Arc;
use loom::thread;

const CORE_BASE: [u64; 2] = [1, 10];

fn published(base: u64) -> Published {
    Published {
        agg: WorkerAgg {
            active_requests: base as u32,
            prefill_requests: 2 * base as u32,
            prefill_tokens: 3 * base,
            blocks_total: 4 * base,
            output_blocks_milli: 5 * base,
            oldest_prefill: Some(OldestPrefill {
                started_us: 1000 - base,
                tokens: 8 * base,
                predicted_us: 9 * base,
            }),
        },
        blocks_unique: 6 * base,
        cached_blocks: 7 * base,
    }
}

/// The summed, non-oldest fields with their multipliers.
fn fields(p: &Published) -> [(u64, u64); 7] {
    let a = &p.agg;
    [
        (1, a.active_requests as u64),
        (2, a.prefill_requests as u64),
        (3, a.prefill_tokens),
        (4, a.blocks_total),
        (5, a.output_blocks_milli),
        (6, p.blocks_unique),
        (7, p.cached_blocks),
    ]
}

fn check_published_values(p: &Published, cores: usize) {
    // Core c has published base(c) * i for i in {1, 2}: each core contributes one of them.
    let bases: Vec<u64> = match cores {
        1 => vec![1, 2],
        _ => [1, 2]
            .iter()
            .flat_map(|a| [10, 20].map(|b| a + b))
            .collect(),
    };
    for (k, v) in fields(p) {
        assert!(
            bases.iter().any(|b| b * k == v),
            "field x{k} = {v} was never published: {p:?}"
        );
    }
    let o = p
        .agg
        .oldest_prefill
        .expect("every row holds an oldest prefill");
    let row_bases = [1, 2, 10, 20];
    assert!(row_bases.iter().any(|b| o.started_us == 1000 - b), "{o:?}");
    assert!(row_bases.iter().any(|b| o.tokens == 8 * b), "{o:?}");
    assert!(row_bases.iter().any(|b| o.predicted_us == 9 * b), "{o:?}");
}

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(1);
    }
    b.check(f);
}

fn board_model(cores: usize) {
    model(move || {
        let board = Arc::new(LoadBoard::new(cores, 1));
        for (c, base) in CORE_BASE.iter().enumerate().take(cores) {
            board.publish(c, 0, &published(*base));
        }
        let writers: Vec<_> = (0..cores)
            .map(|c| {
                let board = board.clone();
                thread::spawn(move || board.publish(c, 0, &published(2 * CORE_BASE[c])))
            })
            .collect();
        let first = board.read(0);
        check_published_values(&first, cores);
        let second = board.read(0);
        check_published_values(&second, cores);
        for ((k, a), (_, b)) in fields(&first).into_iter().zip(fields(&second)) {
            assert!(b >= a, "field x{k} went back from {a} to {b}");
        }
        for w in writers {
            w.join().unwrap();
        }
        assert_eq!(board.read(0), {
            let mut want = published(2 * CORE_BASE[0]);
            if cores > 1 {
                let other = published(2 * CORE_BASE[1]);
                want.agg.add(&other.agg);
                want.blocks_unique += other.blocks_unique;
                want.cached_blocks += other.cached_blocks;
            }
            want
        });
    });
}

#[test]
fn reads_only_published_values() {
    board_model(1);
}

#[test]
#[should_panic(expected = "never published")]
fn reset_first_is_caught() {
    faults::inject(Fault::BoardResetFirst);
    board_model(1);
}

/// Documents the limit of the guarantee: loom finds a read combining two publications.
#[test]
#[should_panic(expected = "mixed publications")]
fn fields_are_not_a_snapshot() {
    model(|| {
        let board = Arc::new(LoadBoard::new(1, 1));
        board.publish(0, 0, &published(1));
        let w = {
            let board = board.clone();
            thread::spawn(move || board.publish(0, 0, &published(2)))
        };
        let p = board.read(0);
        let base = p.agg.active_requests as u64;
        for (k, v) in fields(&p) {
            assert_eq!(v, k * base, "mixed publications in one read: {p:?}");
        }
        w.join().unwrap();
    });
}
