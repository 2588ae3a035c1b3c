//! `index_layout` through the running service: with every core holding the whole
//! index (`replicated`) a request id is still held at most once service-wide,
//! whichever cores its concurrent routes land on, every way a request ends frees its
//! id on every core, and the proxy's reserved id space is refused at the route APIs
//! in either layout. (Decisions, tiers, filters and disaggregation are
//! compared across layouts in `service_routing.rs`; warm restarts between layouts in
//! `service_reliability.rs`; the proxy in `proxy.rs`.)

mod common;
use common::{hashes, req, Server};
use kvroute::client::{ClientError, RequestClient};
use kvroute::codec::ErrorCode;
use serde_json::json;

#[test]
fn a_request_id_is_held_once_whichever_core_routes_it() {
    for layout in ["sharded", "replicated"] {
        let s = Server::start(2, &["--index-layout", layout]);
        s.register(json!({"id": "a", "capacity_blocks": 1000}));
        s.register(json!({"id": "b", "capacity_blocks": 1000}));
        let h = hashes(21, 4);
        // Held: every later route of the id, on eight new connections (spread over
        // both cores), is refused.
        let mut first = RequestClient::connect(&s.api, "").unwrap();
        first.route(&req("held", &h)).unwrap();
        for _ in 0..8 {
            let mut c = RequestClient::connect(&s.api, "").unwrap();
            match c.route(&req("held", &h)) {
                Err(ClientError::Router { code, .. }) => {
                    assert_eq!(code, ErrorCode::DuplicateRequest.as_u16())
                }
                other => panic!("{layout}: held id routed twice: {other:?}"),
            }
        }
        first.finish("held").unwrap();
        for round in 0..10 {
            let id = format!("dup{round}");
            // Eight connections at once: the listener spreads them over both cores.
            let outcomes: Vec<Result<(), u16>> = std::thread::scope(|sc| {
                let handles: Vec<_> = (0..8)
                    .map(|_| {
                        let (api, id, h) = (&s.api, &id, &h);
                        sc.spawn(move || {
                            let mut c = RequestClient::connect(api, "").unwrap();
                            match c.route(&req(id, h)) {
                                Ok(_) => Ok(()),
                                Err(ClientError::Router { code, .. }) => Err(code),
                                Err(e) => panic!("{e:?}"),
                            }
                        })
                    })
                    .collect();
                handles.into_iter().map(|t| t.join().unwrap()).collect()
            });
            // At most one wins. Sharded, two cores claiming at the same moment both
            // refuse (each sees the other's claim), so none is possible too;
            // replicated, the service-wide register admits exactly one.
            let ok = outcomes.iter().filter(|o| o.is_ok()).count();
            assert!(ok <= 1, "{layout} {id}: {outcomes:?}");
            if layout == "replicated" {
                assert_eq!(ok, 1, "{id}: {outcomes:?}");
            }
            assert!(
                outcomes
                    .iter()
                    .all(|o| *o == Ok(()) || *o == Err(ErrorCode::DuplicateRequest.as_u16())),
                "{outcomes:?}"
            );
            // Later routes of the id, on connections to either core, are refused
            // while it is held.
            if ok == 1 {
                for _ in 0..4 {
                    let mut c = RequestClient::connect(&s.api, "").unwrap();
                    match c.route(&req(&id, &h)) {
                        Err(ClientError::Router { code, .. }) => {
                            assert_eq!(code, ErrorCode::DuplicateRequest.as_u16())
                        }
                        other => panic!("{layout} {id} routed twice: {other:?}"),
                    }
                }
                let mut c = RequestClient::connect(&s.api, "").unwrap();
                c.finish(&id).unwrap();
            }
        }
        s.wait_until("no request left", |s| {
            s.workers().iter().all(|w| w["active_requests"] == 0)
        });
    }
}

/// Routes `id` on eight connections (both cores): exactly one must win, and `id` is
/// then held. Returns the connection that routed it.
fn route_once(s: &Server, id: &str, h: &[u64], model: Option<&str>) -> RequestClient {
    let mut won = None;
    for _ in 0..8 {
        let mut c = RequestClient::connect(&s.api, "").unwrap();
        let mut r = req(id, h);
        r.model = model.map(str::to_string);
        match c.route(&r) {
            Ok(_) if won.is_none() => won = Some(c),
            Ok(_) => panic!("{id} routed twice"),
            Err(ClientError::Router { code, .. }) => {
                assert_eq!(code, ErrorCode::DuplicateRequest.as_u16(), "{id}")
            }
            Err(e) => panic!("{id}: {e:?}"),
        }
    }
    won.unwrap_or_else(|| panic!("{id}: no route succeeded"))
}

#[test]
fn every_way_a_request_ends_frees_its_id_on_every_core() {
    for layout in ["sharded", "replicated"] {
        let s = Server::start(2, &["--index-layout", layout]);
        s.register(json!({"id": "a", "model": "m", "capacity_blocks": 1000}));
        s.register(json!({"id": "b", "model": "m", "capacity_blocks": 1000}));
        s.register(json!({"id": "p", "role": "prefill", "model": "pd", "capacity_blocks": 1000}));
        s.register(json!({"id": "d", "role": "decode", "model": "pd", "capacity_blocks": 1000}));
        let h = hashes(23, 4);
        // Finish, sent on connections to both cores (the other core's call finds the
        // request where it lives).
        for round in 0..4 {
            drop(route_once(&s, "fin", &h, Some("m")));
            let mut c = RequestClient::connect(&s.api, "").unwrap();
            c.finish("fin")
                .unwrap_or_else(|e| panic!("{layout} {round}: {e:?}"));
        }
        // A routing that fails leaves nothing held.
        for _ in 0..4 {
            let mut c = RequestClient::connect(&s.api, "").unwrap();
            let mut r = req("err", &h);
            r.model = Some("nobody-serves-this".into());
            assert!(c.route(&r).is_err(), "{layout}");
        }
        route_once(&s, "err", &h, Some("m")).finish("err").unwrap();
        // A prefill failure frees the id and its decode-only reroute holds it again.
        let mut c = route_once(&s, "pf", &h, Some("pd"));
        let d = c.prefill_failed("pf").unwrap();
        assert_eq!(d.decode_worker, "d", "{layout}");
        let mut other = RequestClient::connect(&s.api, "").unwrap();
        for _ in 0..4 {
            let mut o = RequestClient::connect(&s.api, "").unwrap();
            let mut r = req("pf", &h);
            r.model = Some("pd".into());
            match o.route(&r) {
                Err(ClientError::Router { code, .. }) => {
                    assert_eq!(code, ErrorCode::DuplicateRequest.as_u16())
                }
                r => panic!("{layout}: rerouted id routed again: {r:?}"),
            }
        }
        other.finish("pf").unwrap();
        drop(route_once(&s, "pf", &h, Some("pd")));
        RequestClient::connect(&s.api, "")
            .unwrap()
            .finish("pf")
            .unwrap();
        // Removing the worker ends its requests, and their ids are free again.
        let mut ids = Vec::new();
        for i in 0..6 {
            let id = format!("rm{i}");
            let mut r = req(&id, &h);
            r.pin = Some("a".into());
            r.model = Some("m".into());
            RequestClient::connect(&s.api, "")
                .unwrap()
                .route(&r)
                .unwrap();
            ids.push(id);
        }
        let (code, body) = s.delete("/v1/workers/a");
        assert!(code < 300, "{code} {body}");
        for id in &ids {
            route_once(&s, id, &h, Some("m")).finish(id).unwrap();
        }
        s.wait_until("no request left", |s| {
            s.workers().iter().all(|w| w["active_requests"] == 0)
        });
    }
}

#[test]
fn the_proxys_id_space_is_refused_at_the_route_apis() {
    for layout in ["sharded", "replicated"] {
        let s = Server::start(2, &["--index-layout", layout]);
        s.register(json!({"id": "a", "capacity_blocks": 1000}));
        let id = format!("{}0.1", kvroute::ids::PROXY_ID_PREFIX);
        let (code, body) = s.post(
            "/v1/route",
            json!({"request_id": id, "block_hashes": hashes(22, 2)}),
        );
        assert_eq!(code, 400, "{body}");
        assert!(body.to_string().contains("reserved"), "{body}");
        let mut c = RequestClient::connect(&s.api, "").unwrap();
        match c.route(&req(&id, &hashes(22, 2))) {
            Err(ClientError::Router { code, .. }) => {
                assert_eq!(code, ErrorCode::BadRequest.as_u16())
            }
            other => panic!("{other:?}"),
        }
        // The connection and the service keep serving.
        c.route(&req("fine", &hashes(22, 2))).unwrap();
        c.finish("fine").unwrap();
    }
}

#[test]
fn the_layout_reads_from_default_toml_env_and_flag() {
    use std::process::Command;
    let dir = std::env::temp_dir().join(format!("kvroute-layout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("k.toml");
    std::fs::write(&cfg, "index_layout = \"replicated\"\n").unwrap();
    let cfg_s = cfg.to_str().unwrap();
    let print = |env: &[(&str, &str)], flags: &[&str]| -> Result<String, String> {
        let out = Command::new(env!("CARGO_BIN_EXE_kvroute"))
            .arg("print-config")
            .args(flags)
            .env_remove("KVROUTE_INDEX_LAYOUT")
            .envs(env.iter().copied())
            .output()
            .unwrap();
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        let v: toml::Value = toml::from_str(&String::from_utf8_lossy(&out.stdout)).unwrap();
        Ok(v["index_layout"].as_str().unwrap_or("").to_string())
    };
    assert_eq!(print(&[], &[]).unwrap(), "sharded");
    assert_eq!(print(&[], &["--config", cfg_s]).unwrap(), "replicated");
    let env = [("KVROUTE_INDEX_LAYOUT", "replicated")];
    assert_eq!(print(&env, &[]).unwrap(), "replicated");
    // Flags over env over the file.
    assert_eq!(
        print(&env, &["--config", cfg_s, "--index-layout", "sharded"]).unwrap(),
        "sharded"
    );
    let bad = print(&[], &["--index-layout", "mirrored"]).unwrap_err();
    assert!(bad.contains("sharded | replicated"), "{bad}");
    std::fs::write(&cfg, "index_layout = \"mirrored\"\n").unwrap();
    assert!(print(&[], &["--config", cfg_s]).is_err());
    let _ = std::fs::remove_dir_all(&dir);
}
