//! Connection slots of one listener on one core: whether a new connection is admitted,
//! and which open connection it displaces. Pure (no sockets, no clock: the caller
//! passes the time in), so the policy is unit-tested here and the accept loop only
//! carries its decision out (`conn_slot`).
//!
//! Guarantees:
//! - Slow or idle peers cannot monopolise a listener: at `max_connections`, a new
//!   connection displaces one that is still pre-handshake, idle, or waiting for the
//!   rest of a request body, and is refused only when every slot is busy (a request
//!   being answered or written, or its body being read as fast as it arrives).
//! - A new connection is not displaced before it could send its first request: for
//!   `PREAUTH_GRACE_MS` it goes only when nothing else can, so a burst of connections
//!   does not cut an earlier one whose request is already on the wire.
//! - Connections that have not completed their handshake never hold more than
//!   `max_preauth` slots: over that cap the oldest of them is dropped, whatever the
//!   total, so a flood of silent sockets cannot lock authenticated peers out.
//! - Open connections stay bounded: displaced ones close within one executor turn, and
//!   while `max_connections` of them are still closing nothing more is admitted, so at
//!   most `2 × max_connections` sockets exist per listener per core.

/// What a connection is doing, as far as its slot is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activity {
    /// Handshake not complete (binary: no `Hello` yet; HTTP: no complete first request
    /// head), connected since `since_ms`.
    PreAuth { since_ms: u64 },
    /// Handshake done, waiting for the peer with nothing in progress since `since_ms`.
    /// Displaceable only once idle for `min_idle_ms` (0 for request connections; the
    /// heartbeat timeout for event connections, whose healthy peers are never silent
    /// that long).
    Idle { since_ms: u64, min_idle_ms: u64 },
    /// HTTP: reading a request body and waiting for the peer; the read fails at
    /// `due_ms` (the body's stall or rate deadline, `http_clock`) unless bytes come.
    /// Displaceable, after pre-handshake and idle connections: a body the peer keeps
    /// unfinished holds a slot as a slow head would.
    Body { due_ms: u64 },
    /// A request is in progress: never displaced.
    Busy,
}

/// One open connection of the listener.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Occupant {
    pub key: u64,
    pub activity: Activity,
    /// Already told to close (displaced or timed out), not yet gone.
    pub closing: bool,
}

/// Caps of one listener on one core.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caps {
    pub max_connections: usize,
    pub max_preauth: usize,
}

/// What to do with a new connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// A slot is free.
    Admit,
    /// Admit it and close the occupant with this key.
    Displace { key: u64, why: Reason },
    /// Every slot is busy (or too many displaced connections are still closing).
    Refuse,
}

/// What the displaced occupant was doing (a metric label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// Still pre-handshake: over the pre-handshake cap (the oldest goes), or at
    /// `max_connections`.
    PreAuth,
    /// Idle after its handshake, at `max_connections` (the longest idle goes).
    Idle,
    /// Waiting for more of a request body, at `max_connections` (the one nearest its
    /// deadline goes: the slowest relative to the body rate).
    Body,
}

impl Reason {
    pub fn label(self) -> &'static str {
        match self {
            Reason::PreAuth => "preauth_displaced",
            Reason::Idle => "idle_displaced",
            Reason::Body => "body_displaced",
        }
    }
}

/// How long a new connection has to send its handshake before it ranks as a silent
/// socket. Accepting runs ahead of reading: in a burst of connections, the accept loop
/// takes the next ones before the first read of an earlier one has come back from the
/// ring, so a client whose request head was already on the wire would be displaced for
/// the next connection of the burst, unread.
pub const PREAUTH_GRACE_MS: u64 = 50;

/// Rank of a displacement candidate: lower goes first. Pre-handshake connections go
/// before idle sessions (a silent socket is likelier an attacker than an established
/// client), each oldest / longest-idle first; then connections waiting for a request
/// body, the nearest to its deadline first (a body arriving at a real client's pace
/// has earned a far deadline; one trickled to hold the slot has not); last,
/// connections younger than [`PREAUTH_GRACE_MS`], the oldest first.
fn rank(a: Activity, now_ms: u64) -> Option<(u8, u64)> {
    match a {
        Activity::PreAuth { since_ms } if now_ms.saturating_sub(since_ms) < PREAUTH_GRACE_MS => {
            Some((3, since_ms))
        }
        Activity::PreAuth { since_ms } => Some((0, since_ms)),
        Activity::Idle {
            since_ms,
            min_idle_ms,
        } if now_ms.saturating_sub(since_ms) >= min_idle_ms => Some((1, since_ms)),
        Activity::Body { due_ms } => Some((2, due_ms)),
        _ => None,
    }
}

/// Decides on a new connection (which will start pre-handshake) given the listener's
/// current occupants.
pub fn admit(occupants: &[Occupant], caps: Caps, now_ms: u64) -> Admission {
    let closing = occupants.iter().filter(|o| o.closing).count();
    if closing >= caps.max_connections {
        return Admission::Refuse;
    }
    let live = || occupants.iter().filter(|o| !o.closing);
    let preauth = live()
        .filter(|o| matches!(o.activity, Activity::PreAuth { .. }))
        .min_by_key(|o| match o.activity {
            Activity::PreAuth { since_ms } => (since_ms, o.key),
            _ => (u64::MAX, o.key),
        });
    let n_preauth = live()
        .filter(|o| matches!(o.activity, Activity::PreAuth { .. }))
        .count();
    if n_preauth >= caps.max_preauth {
        if let Some(o) = preauth {
            return Admission::Displace {
                key: o.key,
                why: Reason::PreAuth,
            };
        }
    }
    if live().count() < caps.max_connections {
        return Admission::Admit;
    }
    match live()
        .filter_map(|o| rank(o.activity, now_ms).map(|r| (r, o.key)))
        .min()
    {
        Some(((class, _), key)) => Admission::Displace {
            key,
            why: match class {
                0 | 3 => Reason::PreAuth,
                1 => Reason::Idle,
                _ => Reason::Body,
            },
        },
        None => Admission::Refuse,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn occ(key: u64, activity: Activity) -> Occupant {
        Occupant {
            key,
            activity,
            closing: false,
        }
    }
    fn pre(since_ms: u64) -> Activity {
        Activity::PreAuth { since_ms }
    }
    fn idle(since_ms: u64) -> Activity {
        Activity::Idle {
            since_ms,
            min_idle_ms: 0,
        }
    }
    const CAPS: Caps = Caps {
        max_connections: 3,
        max_preauth: 2,
    };

    #[test]
    fn admits_while_slots_are_free() {
        assert_eq!(admit(&[], CAPS, 0), Admission::Admit);
        let o = [occ(1, Activity::Busy), occ(2, pre(5))];
        assert_eq!(admit(&o, CAPS, 10), Admission::Admit);
    }

    #[test]
    fn refuses_only_when_every_slot_is_busy() {
        let o = [
            occ(1, Activity::Busy),
            occ(2, Activity::Busy),
            occ(3, Activity::Busy),
        ];
        assert_eq!(admit(&o, CAPS, 10), Admission::Refuse);
    }

    #[test]
    fn full_listener_displaces_the_longest_idle() {
        let o = [occ(1, idle(7)), occ(2, Activity::Busy), occ(3, idle(3))];
        assert_eq!(
            admit(&o, CAPS, 10),
            Admission::Displace {
                key: 3,
                why: Reason::Idle
            }
        );
    }

    #[test]
    fn pre_handshake_goes_before_idle_sessions() {
        let o = [occ(1, idle(1)), occ(2, Activity::Busy), occ(3, pre(8))];
        assert_eq!(
            admit(&o, CAPS, 8 + PREAUTH_GRACE_MS),
            Admission::Displace {
                key: 3,
                why: Reason::PreAuth
            }
        );
    }

    #[test]
    fn a_connection_in_its_grace_goes_last_the_oldest_first() {
        let caps = Caps {
            max_connections: 3,
            max_preauth: 10,
        };
        let body = Activity::Body { due_ms: 900 };
        let young = [occ(1, pre(95)), occ(2, pre(90)), occ(3, body)];
        let now = 90 + PREAUTH_GRACE_MS - 1;
        assert_eq!(
            admit(&young, caps, now),
            Admission::Displace {
                key: 3,
                why: Reason::Body
            }
        );
        let o = [young[0], young[1], occ(3, Activity::Busy)];
        assert_eq!(
            admit(&o, caps, now),
            Admission::Displace {
                key: 2,
                why: Reason::PreAuth
            }
        );
        // Once its grace is over, a silent socket goes first again.
        assert_eq!(
            admit(&young, caps, now + 1),
            Admission::Displace {
                key: 2,
                why: Reason::PreAuth
            }
        );
    }

    #[test]
    fn idle_shorter_than_its_minimum_is_not_displaced() {
        let ev = |since_ms| Activity::Idle {
            since_ms,
            min_idle_ms: 100,
        };
        let o = [occ(1, ev(50)), occ(2, ev(60)), occ(3, Activity::Busy)];
        assert_eq!(admit(&o, CAPS, 120), Admission::Refuse);
        assert_eq!(
            admit(&o, CAPS, 150),
            Admission::Displace {
                key: 1,
                why: Reason::Idle
            }
        );
    }

    #[test]
    fn preauth_cap_drops_the_oldest_even_with_free_slots() {
        let caps = Caps {
            max_connections: 10,
            max_preauth: 2,
        };
        let o = [occ(1, pre(4)), occ(2, Activity::Busy), occ(3, pre(2))];
        assert_eq!(
            admit(&o, caps, 10),
            Admission::Displace {
                key: 3,
                why: Reason::PreAuth
            }
        );
    }

    #[test]
    fn closing_connections_neither_count_nor_get_picked_twice() {
        let mut o = [occ(1, idle(1)), occ(2, idle(2)), occ(3, idle(3))];
        o[0].closing = true;
        // Two live of three: a slot is free.
        assert_eq!(admit(&o, CAPS, 10), Admission::Admit);
        let o2 = [o[0], o[1], o[2], occ(4, Activity::Busy)];
        assert_eq!(
            admit(&o2, CAPS, 10),
            Admission::Displace {
                key: 2,
                why: Reason::Idle
            }
        );
    }

    #[test]
    fn too_many_closing_refuses_to_bound_open_sockets() {
        let mut o: Vec<Occupant> = (0..3).map(|k| occ(k, idle(k))).collect();
        for x in &mut o {
            x.closing = true;
        }
        o.push(occ(9, pre(1)));
        assert_eq!(admit(&o, CAPS, 10), Admission::Refuse);
    }

    #[test]
    fn a_body_reader_goes_after_idle_ones_nearest_deadline_first() {
        let body = |due_ms| Activity::Body { due_ms };
        let o = [occ(1, body(900)), occ(2, body(400)), occ(3, idle(5))];
        assert_eq!(
            admit(&o, CAPS, 10),
            Admission::Displace {
                key: 3,
                why: Reason::Idle
            }
        );
        let o = [occ(1, body(900)), occ(2, body(400)), occ(3, Activity::Busy)];
        assert_eq!(
            admit(&o, CAPS, 10),
            Admission::Displace {
                key: 2,
                why: Reason::Body
            }
        );
    }

    #[test]
    fn ties_break_by_key_deterministically() {
        let o = [occ(5, idle(1)), occ(4, idle(1)), occ(6, Activity::Busy)];
        assert_eq!(
            admit(&o, CAPS, 10),
            Admission::Displace {
                key: 4,
                why: Reason::Idle
            }
        );
    }

    mod props {
        use super::super::*;
        use proptest::prelude::*;

        fn activity() -> impl Strategy<Value = Activity> {
            prop_oneof![
                (0u64..100).prop_map(|since_ms| Activity::PreAuth { since_ms }),
                (0u64..100, 0u64..50).prop_map(|(since_ms, min_idle_ms)| Activity::Idle {
                    since_ms,
                    min_idle_ms
                }),
                (0u64..300).prop_map(|due_ms| Activity::Body { due_ms }),
                Just(Activity::Busy),
            ]
        }

        proptest! {
            #[test]
            fn decisions_respect_the_guarantees(
                acts in proptest::collection::vec((activity(), any::<bool>()), 0..24),
                max_connections in 1usize..12,
                max_preauth in 1usize..12,
                now_ms in 0u64..200,
            ) {
                let occ: Vec<Occupant> = acts
                    .iter()
                    .enumerate()
                    .map(|(k, &(activity, closing))| Occupant { key: k as u64, activity, closing })
                    .collect();
                let caps = Caps { max_connections, max_preauth };
                let live = occ.iter().filter(|o| !o.closing).count();
                let closing = occ.len() - live;
                match admit(&occ, caps, now_ms) {
                    Admission::Admit => {
                        let preauth = occ
                            .iter()
                            .filter(|o| !o.closing && matches!(o.activity, Activity::PreAuth { .. }))
                            .count();
                        prop_assert!(live < max_connections && closing < max_connections);
                        prop_assert!(preauth < max_preauth, "over the pre-handshake cap");
                    }
                    Admission::Displace { key, why } => {
                        let v = occ[key as usize];
                        prop_assert!(!v.closing, "never picks a closing occupant");
                        prop_assert!(closing < max_connections);
                        match (v.activity, why) {
                            (Activity::PreAuth { since_ms }, Reason::PreAuth) => {
                                // One in its grace only when nothing else could go, or
                                // over the pre-handshake cap.
                                let n_pre = occ.iter().filter(|o| !o.closing
                                    && matches!(o.activity, Activity::PreAuth { .. })).count();
                                let others = occ.iter().any(|o| !o.closing
                                    && matches!(rank(o.activity, now_ms), Some((0..=2, _))));
                                prop_assert!(n_pre >= max_preauth
                                    || now_ms.saturating_sub(since_ms) >= PREAUTH_GRACE_MS
                                    || !others);
                            }
                            (Activity::Idle { since_ms, min_idle_ms }, Reason::Idle) => {
                                prop_assert!(now_ms.saturating_sub(since_ms) >= min_idle_ms);
                            }
                            (Activity::Body { .. }, Reason::Body) => {
                                // Only when nothing pre-handshake or idle could go.
                                prop_assert!(!occ.iter().any(|o| !o.closing
                                    && matches!(rank(o.activity, now_ms), Some((0 | 1, _)))));
                            }
                            other => prop_assert!(false, "displaced {:?}", other),
                        }
                    }
                    Admission::Refuse => {
                        // Refused only if too many are closing, or the listener is full
                        // with nothing displaceable.
                        let displaceable = occ.iter().any(|o| !o.closing && rank(o.activity, now_ms).is_some());
                        prop_assert!(closing >= max_connections || (live >= max_connections && !displaceable));
                    }
                }
            }
        }
    }
}
