//! The worked hex examples of docs/PROTOCOL.md are produced by the encoders, and this
//! test fails if the document and the code ever disagree.

use super::*;

const PROTOCOL_MD: &str = include_str!("../../../docs/PROTOCOL.md");

/// 16 bytes per line, lower-case hex, space separated (the document's format).
fn hex_dump(bytes: &[u8]) -> String {
    bytes
        .chunks(16)
        .map(|line| {
            line.iter()
                .map(|b| format!("{b:02x}"))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

pub(super) fn example_hello() -> EventMsg {
    EventMsg::Hello(EventHello {
        auth_token: "tok".into(),
        spec: WorkerSpec {
            id: "w1".into(),
            role: Role::Aggregated,
            device: DeviceClass::Gpu,
            model: "m".into(),
            dp_ranks: DpRanks { lo: 0, hi: 0 },
            taints: vec!["spot".into()],
            topology: String::new(),
            capacity_blocks: 1024,
            epoch: 1,
            throughput_weight: None,
            url: None,
        },
    })
}

pub(super) fn example_stored() -> EventMsg {
    EventMsg::Stored {
        seq: 0,
        tier: Tier::Device,
        parent: None,
        hashes: HashList::from_slice(&[0x0123_4567_89ab_cdef, 0xfedc_ba98_7654_3210]),
    }
}

fn assert_documented(name: &str, msg: &EventMsg) {
    let dump = hex_dump(&encoded(msg));
    assert!(
        PROTOCOL_MD.contains(&dump),
        "docs/PROTOCOL.md lacks the {name} example; it should read:\n{dump}"
    );
    // And the bytes decode back to the documented message.
    let f = Frame::from_encoded(&encoded(msg)).unwrap();
    assert_eq!(&EventMsg::decode(&f).unwrap(), msg);
}

#[test]
fn hello_example_matches_the_document() {
    assert_documented("Hello", &example_hello());
}

#[test]
fn stored_example_matches_the_document() {
    assert_documented("Stored", &example_stored());
}

/// A LoRA token `Route` (prompt kind 2, revision 1.1).
pub(super) fn example_lora_route() -> RequestMsg {
    RequestMsg::Route(Route {
        model: "m".into(),
        lora_name: Some("sql".into()),
        ..Route::new(1, "r1", Prompt::from_tokens(&[1, 2]))
    })
}

#[test]
fn lora_route_example_matches_the_document() {
    let msg = example_lora_route();
    let dump = hex_dump(&encoded(&msg));
    assert!(
        PROTOCOL_MD.contains(&dump),
        "docs/PROTOCOL.md lacks the LoRA Route example; it should read:\n{dump}"
    );
    let f = Frame::from_encoded(&encoded(&msg)).unwrap();
    assert_eq!(RequestMsg::decode(&f).unwrap(), msg);
}

/// A salted token `Route` (prompt kind 4, revision 1.2).
pub(super) fn example_salted_route() -> RequestMsg {
    RequestMsg::Route(Route {
        model: "m".into(),
        cache_salt: Some("t1".into()),
        ..Route::new(1, "r1", Prompt::from_tokens(&[1, 2]))
    })
}

#[test]
fn salted_route_example_matches_the_document() {
    let msg = example_salted_route();
    let dump = hex_dump(&encoded(&msg));
    assert!(
        PROTOCOL_MD.contains(&dump),
        "docs/PROTOCOL.md lacks the salted Route example; it should read:\n{dump}"
    );
    let f = Frame::from_encoded(&encoded(&msg)).unwrap();
    assert_eq!(RequestMsg::decode(&f).unwrap(), msg);
}

#[test]
fn documented_kind_bytes_match_the_code() {
    for (name, k) in [
        ("Hello", kind::EV_HELLO),
        ("Stored", kind::EV_STORED),
        ("Removed", kind::EV_REMOVED),
        ("Cleared", kind::EV_CLEARED),
        ("Heartbeat", kind::EV_HEARTBEAT),
        ("ResyncBegin", kind::EV_RESYNC_BEGIN),
        ("ResyncEnd", kind::EV_RESYNC_END),
        ("HelloAck", kind::WB_HELLO_ACK),
        ("Resync", kind::WB_RESYNC),
        ("Error", kind::WB_ERROR),
        ("Hello", kind::RQ_HELLO),
        ("Route", kind::RQ_ROUTE),
        ("Lifecycle", kind::RQ_LIFECYCLE),
        ("Register", kind::RQ_REGISTER),
        ("Deregister", kind::RQ_DEREGISTER),
        ("HelloAck", kind::RS_HELLO_ACK),
        ("Decision", kind::RS_DECISION),
        ("Ack", kind::RS_ACK),
        ("Error", kind::RS_ERROR),
    ] {
        let heading = format!("`0x{k:02x}` {name}");
        assert!(
            PROTOCOL_MD.contains(&heading),
            "missing heading {heading:?}"
        );
    }
    for c in ErrorCode::ALL {
        let row = format!("| {} | `{}` | {} |", c.as_u16(), c.name(), c.http_status());
        assert!(PROTOCOL_MD.contains(&row), "missing error row {row:?}");
    }
}
