//! Answering the frames of one read concurrently (pipelined request connections).
//!
//! A frontend that pipelines sends many requests per read; answering them one after
//! the other would make each wait for the previous one's cross-core round trips. The
//! frames of a read are therefore cut into *segments* that may run concurrently, and
//! segments run one after the other:
//! - a segment never holds two frames about the same request id, so a lifecycle call
//!   sent right behind its own route (without waiting for the decision) still finds
//!   the request committed;
//! - admin frames (register, deregister) and anything without a request id form a
//!   segment of their own, so a route sent after a register sees the worker;
//! - a segment holds at most [`MAX_SEGMENT`] frames ([`join_all`] re-polls every
//!   unfinished future of its segment on each wake-up).
//!
//! Answers keep frame order (the protocol allows any order; keeping it is free here).
//! [`segments`] is pure; [`join_all`] polls a segment's futures on the current task, and
//! [`join_two`] does so for the common pair (a route and the previous request's finish)
//! without allocating.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// Frames answered concurrently at most.
pub const MAX_SEGMENT: usize = 32;

/// Segment boundaries for frames with the given keys (`Some(hash of request id)`, or
/// `None` for a frame that must run alone). Returns the exclusive end index of each
/// segment, in order; the segments cover `0..keys.len()`.
pub fn segments(keys: &[Option<u64>]) -> Vec<usize> {
    let mut ends = Vec::new();
    segments_into(keys, &mut ends, &mut Vec::new());
    ends
}

/// [`segments`] into reused buffers (a session keeps them across reads): `ends` is
/// replaced by the segment ends, `seen` is scratch.
pub fn segments_into(keys: &[Option<u64>], ends: &mut Vec<usize>, seen: &mut Vec<u64>) {
    ends.clear();
    seen.clear();
    let mut start = 0usize;
    for (i, k) in keys.iter().enumerate() {
        match k {
            None => {
                if i > start {
                    ends.push(i);
                }
                ends.push(i + 1);
                start = i + 1;
                seen.clear();
            }
            Some(h) => {
                if seen.contains(h) || i - start >= MAX_SEGMENT {
                    ends.push(i);
                    start = i;
                    seen.clear();
                }
                seen.push(*h);
            }
        }
    }
    if keys.len() > start {
        ends.push(keys.len());
    }
}

/// A future of [`join_all`] and its output once ready.
type Slot<F> = (Pin<Box<F>>, Option<<F as Future>::Output>);

/// Runs `a` and `b` concurrently on the current task (no allocation: the common read
/// of a pipelining frontend holds one route and the previous request's finish).
pub async fn join_two<F: Future>(a: F, b: F) -> [F::Output; 2] {
    let (x, y) = futures_lite::future::zip(a, b).await;
    [x, y]
}

/// Runs `futs` concurrently on the current task; outputs in input order.
pub async fn join_all<F: Future>(futs: Vec<F>) -> Vec<F::Output> {
    let mut slots: Vec<Slot<F>> = futs.into_iter().map(|f| (Box::pin(f), None)).collect();
    futures_lite::future::poll_fn(|cx: &mut Context<'_>| {
        let mut pending = false;
        for (f, out) in slots.iter_mut() {
            if out.is_none() {
                match f.as_mut().poll(cx) {
                    Poll::Ready(v) => *out = Some(v),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    slots.into_iter().filter_map(|(_, o)| o).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distinct_ids_share_one_segment() {
        assert_eq!(segments(&[Some(1), Some(2), Some(3)]), vec![3]);
        assert_eq!(segments(&[]), Vec::<usize>::new());
    }

    #[test]
    fn a_repeated_id_starts_a_new_segment() {
        // route 1, route 2, finish 1, route 3, finish 2
        assert_eq!(
            segments(&[Some(1), Some(2), Some(1), Some(3), Some(2)]),
            vec![2, 5]
        );
    }

    #[test]
    fn segments_are_bounded() {
        let keys: Vec<Option<u64>> = (0..70).map(Some).collect();
        assert_eq!(segments(&keys), vec![32, 64, 70]);
    }

    #[test]
    fn admin_frames_run_alone() {
        assert_eq!(
            segments(&[Some(1), None, Some(2), Some(3), None]),
            vec![1, 2, 4, 5]
        );
        assert_eq!(segments(&[None, None]), vec![1, 2]);
    }

    #[test]
    fn segments_into_reuses_its_buffers() {
        let (mut ends, mut seen) = (vec![9, 9, 9], vec![7]);
        segments_into(&[Some(1), Some(1), None], &mut ends, &mut seen);
        assert_eq!(ends, vec![1, 2, 3]);
        segments_into(&[], &mut ends, &mut seen);
        assert!(ends.is_empty());
    }

    #[test]
    fn join_two_keeps_order() {
        let out = futures_lite::future::block_on(join_two(
            Box::pin(async {
                futures_lite::future::yield_now().await;
                1
            }) as Pin<Box<dyn Future<Output = i32>>>,
            Box::pin(async { 2 }),
        ));
        assert_eq!(out, [1, 2]);
    }

    #[test]
    fn join_all_keeps_order() {
        let out = futures_lite::future::block_on(join_all(vec![
            Box::pin(async { 1 }) as Pin<Box<dyn Future<Output = i32>>>,
            Box::pin(async {
                futures_lite::future::yield_now().await;
                2
            }),
            Box::pin(async { 3 }),
        ]));
        assert_eq!(out, vec![1, 2, 3]);
    }
}
