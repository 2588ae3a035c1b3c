//! docs/CONFIGURATION.md against the real `kvroute` binary, so the reference cannot
//! drift from the code:
//! - every key `kvroute print-config` prints has a row, with the printed default;
//! - every row's key is a key of the settings file (the binary accepts it, and a
//!   value given there is the one printed back);
//! - every row's flag and variable are the ones `kvroute serve --help` lists, and each
//!   sets the row's key; every flag of `--help` is documented;
//! - every field of an `[[engines]]` entry is documented, and every documented field
//!   is accepted.
//!
//! The rows are read from the tables whose header is `| key | default | flag | env |
//! meaning |` (and `| field | default | meaning |` for engines); a key names its TOML
//! table with a dot (`limits.max_workers`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Output};

const DOC: &str = include_str!("../docs/CONFIGURATION.md");

/// One settings row of the doc.
#[derive(Debug)]
struct Row {
    key: String,
    /// The default cell as written.
    default: String,
    flag: Option<String>,
    env: Option<String>,
}

/// The code spans of a table cell, in order.
fn code_spans(cell: &str) -> Vec<&str> {
    cell.split('`').skip(1).step_by(2).collect()
}

fn cells(line: &str) -> Vec<&str> {
    line.trim()
        .trim_matches('|')
        .split(" | ")
        .map(str::trim)
        .collect()
}

/// The rows of the tables with `header` as their header line.
fn table_rows(header: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut inside = false;
    for line in DOC.lines() {
        if line.starts_with('|') {
            if line.starts_with(header) {
                inside = true;
            } else if inside && !line.starts_with("|---") {
                out.push(cells(line).iter().map(|c| c.to_string()).collect());
            }
        } else {
            inside = false;
        }
    }
    out
}

fn rows() -> Vec<Row> {
    let rows: Vec<Row> = table_rows("| key | default | flag | env | meaning |")
        .into_iter()
        .map(|c| {
            assert_eq!(c.len(), 5, "a settings row has 5 cells: {c:?}");
            let first = |cell: &str, prefix: &str| {
                code_spans(cell)
                    .into_iter()
                    .map(|s| s.split_whitespace().next().unwrap_or(""))
                    .find(|s| s.starts_with(prefix))
                    .map(str::to_string)
            };
            Row {
                key: code_spans(&c[0]).first().expect("a key").to_string(),
                default: c[1].clone(),
                flag: first(&c[2], "--"),
                env: first(&c[3], "KVROUTE_"),
            }
        })
        .collect();
    assert!(rows.len() > 80, "only {} settings rows found", rows.len());
    rows
}

/// `kvroute ARGS` with no `KVROUTE_*` variable of the test's environment.
fn kvroute(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_kvroute"));
    for (k, _) in std::env::vars() {
        if k.starts_with("KVROUTE_") {
            c.env_remove(k);
        }
    }
    c.args(args).envs(env.iter().copied()).output().unwrap()
}

/// `print-config` output as `key` (dotted with its table) → value text as printed
/// (strings without their quotes).
fn parse_printed(text: &str) -> BTreeMap<String, String> {
    let mut section = String::new();
    let mut out = BTreeMap::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if let Some(s) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = format!("{s}.");
            continue;
        }
        let (k, v) = line.split_once(" = ").unwrap_or_else(|| panic!("{line}"));
        let v = v.trim();
        let v = v
            .strip_prefix('"')
            .and_then(|x| x.strip_suffix('"'))
            .unwrap_or(v);
        out.insert(format!("{section}{k}"), v.to_string());
    }
    out
}

fn print_config(args: &[&str], env: &[(&str, &str)]) -> Result<BTreeMap<String, String>, String> {
    let mut all = vec!["print-config"];
    all.extend_from_slice(args);
    let out = kvroute(&all, env);
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).to_string());
    }
    Ok(parse_printed(&String::from_utf8_lossy(&out.stdout)))
}

/// `kvroute serve --help`: flag → (takes a value, its variable).
fn help_flags() -> BTreeMap<String, (bool, Option<String>)> {
    let out = kvroute(&["serve", "--help"], &[]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let mut flags = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        let t = line.trim_start();
        if let Some(rest) = t.strip_prefix("--") {
            let name = format!("--{}", rest.split_whitespace().next().unwrap_or(""));
            flags.insert(name.clone(), (rest.contains(" <"), None));
            current = Some(name);
        }
        if let (Some(name), Some(i)) = (&current, t.find("[env: ")) {
            let env: String = t[i + 6..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if let Some(f) = flags.get_mut(name) {
                f.1 = Some(env);
            }
        }
    }
    assert!(flags.len() > 80, "only {} flags in --help", flags.len());
    flags
}

/// A valid value other than the default `d` (as printed), when one can be derived:
/// booleans flip, integers add one, floats halve (0 becomes 0.5).
fn other_value(d: &str) -> Option<String> {
    match d {
        "true" => return Some("false".into()),
        "false" => return Some("true".into()),
        _ => {}
    }
    if let Ok(i) = d.parse::<u64>() {
        return Some((i + 1).to_string());
    }
    if d.contains('.') {
        if let Ok(f) = d.parse::<f64>() {
            return Some(if f == 0.0 { 0.5 } else { f / 2.0 }.to_string());
        }
    }
    None
}

fn same_value(printed: &str, want: &str) -> bool {
    match (printed.parse::<f64>(), want.parse::<f64>()) {
        (Ok(a), Ok(b)) => a == b,
        _ => printed == want,
    }
}

/// A settings file setting `key` (dotted) to the raw TOML `value`.
fn config_file(name: &str, key: &str, value: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!(
        "kvroute-config-doc-{}-{name}.toml",
        std::process::id()
    ));
    let text = match key.split_once('.') {
        Some((table, k)) => format!("[{table}]\n{k} = {value}\n"),
        None => format!("{key} = {value}\n"),
    };
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn every_printed_setting_is_documented_with_its_default() {
    let printed = print_config(&[], &[]).expect("print-config with no settings");
    let rows = rows();
    let mut missing = Vec::new();
    for (key, value) in &printed {
        match rows.iter().find(|r| &r.key == key) {
            None => missing.push(format!("{key} (default {value})")),
            Some(r) => {
                let doc = code_spans(&r.default).first().copied();
                assert!(
                    r.default.starts_with('`') && doc == Some(value.as_str()),
                    "{key}: print-config prints {value:?}, the doc says {:?}",
                    r.default
                );
            }
        }
    }
    assert!(
        missing.is_empty(),
        "not in docs/CONFIGURATION.md: {missing:?}"
    );
    // A default the binary does not print is unset: the doc must not show a value.
    for r in rows.iter().filter(|r| !printed.contains_key(&r.key)) {
        assert!(
            !r.default.starts_with('`'),
            "{}: documented default {} but print-config prints no value",
            r.key,
            r.default
        );
    }
}

#[test]
fn every_documented_key_is_a_settings_file_key() {
    let printed = print_config(&[], &[]).unwrap();
    for (i, r) in rows().iter().enumerate() {
        let other = printed.get(&r.key).and_then(|d| other_value(d));
        let value = other.clone().unwrap_or_else(|| "\"__probe__\"".into());
        let file = config_file(&format!("key{i}"), &r.key, &value);
        let res = print_config(&["--config", file.to_str().unwrap()], &[]);
        let _ = std::fs::remove_file(&file);
        match (res, other) {
            (Ok(p), Some(v)) => assert!(
                same_value(&p[&r.key], &v),
                "{} = {v} in the file printed {}",
                r.key,
                p[&r.key]
            ),
            (Ok(_), None) => {}
            (Err(e), Some(v)) => panic!("{} = {v} in the file was refused: {e}", r.key),
            // A probe of the wrong type or an unusable value may be refused, but never
            // as an unknown key.
            (Err(e), None) => assert!(
                !e.contains("unknown field"),
                "{} is not a settings key: {e}",
                r.key
            ),
        }
    }
}

#[test]
fn documented_flags_and_variables_are_the_binarys_and_set_their_key() {
    let help = help_flags();
    let printed = print_config(&[], &[]).unwrap();
    let rows = rows();
    for r in &rows {
        let Some(flag) = &r.flag else {
            assert!(r.env.is_none(), "{}: a variable but no flag", r.key);
            continue;
        };
        let (takes_value, env) = help
            .get(flag)
            .unwrap_or_else(|| panic!("{}: {flag} is not a `kvroute serve` flag", r.key));
        assert_eq!(
            &r.env, env,
            "{}: the doc's variable differs from --help's for {flag}",
            r.key
        );
        let Some(v) = printed.get(&r.key).and_then(|d| other_value(d)) else {
            continue;
        };
        let by_flag = if *takes_value {
            print_config(&[flag, &v], &[])
        } else if v == "true" {
            print_config(&[flag], &[])
        } else {
            continue;
        };
        let p = by_flag.unwrap_or_else(|e| panic!("{flag} {v}: {e}"));
        assert!(
            same_value(&p[&r.key], &v),
            "{flag} {v} set {} to {}",
            r.key,
            p[&r.key]
        );
        if let Some(env) = env {
            let p = print_config(&[], &[(env, &v)]).unwrap_or_else(|e| panic!("{env}={v}: {e}"));
            assert!(
                same_value(&p[&r.key], &v),
                "{env}={v} set {} to {}",
                r.key,
                p[&r.key]
            );
        }
    }
    for flag in help.keys().filter(|f| *f != "--help" && *f != "--version") {
        assert!(
            DOC.contains(&format!("`{flag}")),
            "`kvroute serve {flag}` is not documented in docs/CONFIGURATION.md"
        );
    }
}

#[test]
fn engine_entry_fields_are_documented_and_accepted() {
    let documented: Vec<String> = table_rows("| field | default | meaning |")
        .iter()
        .map(|c| code_spans(&c[0])[0].to_string())
        .collect();
    // Every field an entry has (options set, so that none is skipped).
    let e = kvroute::engines::config::EngineEndpoint::parse_compact(
        "worker_id=w,endpoint=tcp://127.0.0.1:5557,replay_endpoint=tcp://127.0.0.1:5558,\
         dp_rank=0,block_size=16,lora=a,url=http://127.0.0.1:8001",
    )
    .unwrap();
    let v = serde_json::to_value(&e).unwrap();
    for field in v.as_object().unwrap().keys() {
        assert!(
            documented.contains(field),
            "[[engines]] field {field} is not documented"
        );
    }
    for (i, field) in documented.iter().enumerate() {
        let path = std::env::temp_dir().join(format!(
            "kvroute-config-doc-{}-engine{i}.toml",
            std::process::id()
        ));
        let mut text =
            String::from("[[engines]]\nworker_id = \"w\"\nendpoint = \"tcp://127.0.0.1:5557\"\n");
        if field != "worker_id" && field != "endpoint" {
            text.push_str(&format!("{field} = \"__probe__\"\n"));
        }
        std::fs::write(&path, text).unwrap();
        let res = print_config(&["--config", path.to_str().unwrap()], &[]);
        let _ = std::fs::remove_file(&path);
        if let Err(e) = res {
            assert!(
                !e.contains("unknown field"),
                "[[engines]] {field} is not an entry field: {e}"
            );
        }
    }
}
