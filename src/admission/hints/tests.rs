//! Hint extraction: each source, their precedence, polarity, clamping, malformed
//! values, and no panic on any body.

use super::*;
use proptest::prelude::*;
use serde_json::json;

fn hints(headers: &[(&str, &str)], body: Value) -> Result<Hints, BadHint> {
    hints_with(&HintConfig::default(), headers, body, None)
}

fn hints_with(
    cfg: &HintConfig,
    headers: &[(&str, &str)],
    body: Value,
    pinned: Option<i32>,
) -> Result<Hints, BadHint> {
    read(
        cfg,
        headers.iter().map(|(n, v)| (*n, v.as_bytes())),
        &body,
        pinned,
        0,
        1_000_000,
    )
}

fn prio(h: Result<Hints, BadHint>) -> (i32, PrioritySource) {
    let h = h.unwrap();
    (h.priority, h.source)
}

#[test]
fn each_source_alone_with_its_polarity() {
    use PrioritySource::*;
    assert_eq!(prio(hints(&[], json!({}))), (0, Default));
    assert_eq!(
        prio(hints(&[("X-KVRoute-Priority", " -3 ")], json!({}))),
        (-3, Header)
    );
    // Dynamo: higher first, so negated.
    assert_eq!(
        prio(hints(&[("x-dynamo-request-priority", "5")], json!({}))),
        (-5, DynamoHeader)
    );
    // vLLM: lower first, as is.
    assert_eq!(prio(hints(&[], json!({"priority": 4}))), (4, Body));
    assert_eq!(
        prio(hints(
            &[],
            json!({"nvext": {"agent_hints": {"priority": 2}}})
        )),
        (-2, AgentHints)
    );
    assert_eq!(prio(hints(&[], json!({"priority": 2.0}))), (2, Body));
    assert_eq!(prio(hints(&[], json!({"priority": null}))), (0, Default));
}

#[test]
fn the_first_source_present_wins() {
    use PrioritySource::*;
    let body = json!({"priority": 4, "nvext": {"agent_hints": {"priority": 9}}});
    let all = [
        ("x-kvroute-priority", "1"),
        ("x-dynamo-request-priority", "7"),
    ];
    assert_eq!(
        prio(hints_with(
            &HintConfig::default(),
            &all,
            body.clone(),
            Some(6)
        )),
        (6, Pinned)
    );
    assert_eq!(prio(hints(&all, body.clone())), (1, Header));
    assert_eq!(prio(hints(&all[1..], body.clone())), (-7, DynamoHeader));
    assert_eq!(prio(hints(&[], body)), (4, Body));
}

#[test]
fn priorities_are_clamped_even_at_the_extremes() {
    assert_eq!(
        prio(hints(&[("x-kvroute-priority", "-99")], json!({}))).0,
        -10
    );
    assert_eq!(prio(hints(&[], json!({"priority": u64::MAX}))).0, 10);
    assert_eq!(prio(hints(&[], json!({"priority": i64::MIN}))).0, -10);
    assert_eq!(
        prio(hints(
            &[],
            json!({"nvext": {"agent_hints": {"priority": i64::MIN}}})
        ))
        .0,
        10
    );
    let pinned = hints_with(&HintConfig::default(), &[], json!({}), Some(i32::MIN));
    assert_eq!(prio(pinned).0, -10);
    let none = HintConfig {
        max_priority: 0,
        ..Default::default()
    };
    assert_eq!(
        prio(hints_with(
            &none,
            &[("x-kvroute-priority", "5")],
            json!({}),
            None
        ))
        .0,
        0
    );
}

#[test]
fn deadline_is_a_budget_from_arrival_and_osl_comes_from_agent_hints() {
    let h = hints(
        &[("x-kvroute-deadline-ms", "250")],
        json!({"nvext": {"agent_hints": {"osl": 512}}}),
    )
    .unwrap();
    assert_eq!(h.deadline_us, Some(1_250_000));
    assert_eq!(h.osl, Some(512));
    let h = hints(&[], json!({})).unwrap();
    assert_eq!((h.deadline_us, h.osl, h.session), (None, None, None));
}

#[test]
fn malformed_hints_are_refused_with_their_name() {
    for (headers, body, needle) in [
        (
            vec![("x-kvroute-priority", "high")],
            json!({}),
            "x-kvroute-priority",
        ),
        (
            vec![("x-dynamo-request-priority", "1.5")],
            json!({}),
            "x-dynamo-request-priority",
        ),
        (
            vec![("x-kvroute-deadline-ms", "-1")],
            json!({}),
            "x-kvroute-deadline-ms",
        ),
        (
            vec![("x-kvroute-deadline-ms", "86400001")],
            json!({}),
            "x-kvroute-deadline-ms",
        ),
        (vec![], json!({"priority": "1"}), "priority"),
        (vec![], json!({"priority": 1.5}), "priority"),
        (vec![], json!({"nvext": {"agent_hints": 3}}), "agent_hints"),
        (
            vec![],
            json!({"nvext": {"agent_hints": {"osl": -1}}}),
            "osl",
        ),
        (
            vec![],
            json!({"nvext": {"agent_hints": {"priority": []}}}),
            "agent_hints.priority",
        ),
    ] {
        let e = hints(&headers, body.clone()).unwrap_err();
        assert!(e.0.contains(needle), "{headers:?} {body}: {e}");
    }
    let bad_user = HintConfig {
        session_from_user: true,
        ..Default::default()
    };
    assert!(hints_with(&bad_user, &[], json!({"user": 5}), None).is_err());
    // Without the option, `user` is not read at all.
    assert!(hints(&[], json!({"user": 5})).is_ok());
}

#[test]
fn sessions_come_from_the_header_or_user_and_are_scoped_by_tenant() {
    let by_user = HintConfig {
        session_from_user: true,
        ..Default::default()
    };
    let h = hints_with(
        &by_user,
        &[("x-session-id", "abc")],
        json!({"user": "u"}),
        None,
    )
    .unwrap();
    assert_eq!(h.session, Some(session_hash(0, b"abc")), "the header wins");
    let u = hints_with(&by_user, &[], json!({"user": "u"}), None).unwrap();
    assert_eq!(u.session, Some(session_hash(0, b"u")));
    assert_eq!(hints(&[], json!({"user": "u"})).unwrap().session, None);
    assert_eq!(
        hints(&[("x-session-id", "")], json!({})).unwrap().session,
        None
    );
    assert_ne!(session_hash(1, b"abc"), session_hash(2, b"abc"));
    let off = HintConfig {
        session_header: String::new(),
        ..Default::default()
    };
    assert_eq!(
        hints_with(&off, &[("x-session-id", "a")], json!({}), None)
            .unwrap()
            .session,
        None
    );
}

proptest! {
    #[test]
    fn never_panics_and_always_clamps(
        body in "\\PC{0,64}",
        prio in any::<i64>(),
        header in prop::collection::vec(any::<u8>(), 0..12),
        max in -3i32..12,
    ) {
        let cfg = HintConfig { max_priority: max, session_from_user: true, ..Default::default() };
        let values = [
            serde_json::from_str::<Value>(&body).unwrap_or(Value::Null),
            json!({"priority": prio, "nvext": {"agent_hints": {"priority": prio, "osl": prio}}}),
            json!({"user": body, "nvext": null}),
        ];
        for v in &values {
            let headers = [("x-kvroute-priority", header.as_slice()), ("x-kvroute-deadline-ms", header.as_slice()), ("x-session-id", header.as_slice())];
            if let Ok(h) = read(&cfg, headers, v, None, 7, u64::MAX) {
                prop_assert!(h.priority.abs() <= max.max(0));
            }
        }
    }
}
