//! Harness of the status page's browser test: headless Chromium driven by chromedriver
//! through the W3C WebDriver protocol (JSON over HTTP, with ureq; a WebDriver crate
//! would add an async runtime for the handful of calls used here).
//!
//! `Browser::start_or_skip` finds `chromedriver` and `chromium` (Debian packages
//! `chromium-driver` and `chromium`; or `KVROUTE_CHROMEDRIVER` / `KVROUTE_CHROMIUM`).
//! When they are missing it fails the test if `CI` is set and otherwise returns `None`
//! after saying why. The driver (and with it the browser) is stopped on drop, and the
//! browser profile is a fresh temporary directory.

use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The W3C element reference key.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

fn which(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    names.iter().find_map(|n| {
        std::env::split_paths(&path)
            .map(|d| d.join(n))
            .find(|p| p.is_file())
    })
}

fn find(env: &str, names: &[&str]) -> Option<PathBuf> {
    match std::env::var_os(env) {
        Some(p) => Some(PathBuf::from(p)).filter(|p| p.is_file()),
        None => which(names),
    }
}

pub struct Browser {
    driver: Child,
    base: String,
    session: String,
    _profile: tempfile::TempDir,
}

fn call(req: ureq::Request, body: Option<Value>) -> Result<Value, String> {
    let r = match body {
        Some(b) => req.send_json(b),
        None => req.call(),
    };
    let v: Value = match r {
        Ok(r) => r.into_json().map_err(|e| e.to_string())?,
        Err(ureq::Error::Status(code, r)) => {
            let v: Value = r.into_json().unwrap_or(Value::Null);
            return Err(format!("webdriver {code}: {}", v["value"]));
        }
        Err(e) => return Err(e.to_string()),
    };
    Ok(v["value"].clone())
}

impl Browser {
    /// Starts chromedriver and a headless Chromium session, or `None` (skip) when they
    /// are not installed and `CI` is not set.
    pub fn start_or_skip() -> Option<Browser> {
        Self::start_or_skip_with(&[])
    }

    /// [`Browser::start_or_skip`] with more Chromium flags (e.g. `--host-resolver-rules`).
    pub fn start_or_skip_with(extra: &[&str]) -> Option<Browser> {
        let driver = find("KVROUTE_CHROMEDRIVER", &["chromedriver"]);
        let chromium = find(
            "KVROUTE_CHROMIUM",
            &["chromium", "chromium-browser", "google-chrome"],
        );
        let (Some(driver), Some(chromium)) = (driver, chromium) else {
            let why = "chromium and chromedriver not found (Debian: apt-get install -y chromium chromium-driver; or set KVROUTE_CHROMIUM / KVROUTE_CHROMEDRIVER)";
            if std::env::var_os("CI").is_some() {
                panic!("browser test cannot run in CI: {why}");
            }
            eprintln!("skipping browser test: {why}");
            return None;
        };
        Some(Browser::start(&driver, &chromium, extra).unwrap_or_else(|e| panic!("browser: {e}")))
    }

    fn start(driver: &PathBuf, chromium: &PathBuf, extra: &[&str]) -> Result<Browser, String> {
        let port = super::free_port();
        let child = Command::new(driver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("spawn {}: {e}", driver.display()))?;
        let profile = tempfile::tempdir().map_err(|e| e.to_string())?;
        let mut b = Browser {
            driver: child,
            base: format!("http://127.0.0.1:{port}"),
            session: String::new(),
            _profile: profile,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while call(ureq::get(&format!("{}/status", b.base)), None)
            .map(|v| v["ready"] != true)
            .unwrap_or(true)
        {
            if Instant::now() > deadline {
                return Err("chromedriver did not become ready".into());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let mut args = vec![
            "--headless".to_string(),
            "--no-sandbox".into(),
            "--disable-gpu".into(),
            "--disable-background-networking".into(),
            "--no-first-run".into(),
            "--disable-dev-shm-usage".into(),
            format!("--user-data-dir={}", b._profile.path().display()),
        ];
        args.extend(extra.iter().map(|a| a.to_string()));
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": chromium, "args": args},
        }}});
        let v = call(ureq::post(&format!("{}/session", b.base)), Some(caps))?;
        b.session = v["sessionId"]
            .as_str()
            .ok_or_else(|| format!("no session id in {v}"))?
            .to_string();
        Ok(b)
    }

    fn url(&self, path: &str) -> String {
        format!("{}/session/{}{path}", self.base, self.session)
    }

    fn post(&self, path: &str, body: Value) -> Result<Value, String> {
        call(ureq::post(&self.url(path)), Some(body))
    }

    pub fn window(&self, width: u32, height: u32) {
        self.post("/window/rect", json!({"width": width, "height": height}))
            .expect("set window size");
    }

    pub fn goto(&self, url: &str) {
        self.post("/url", json!({ "url": url })).expect("navigate");
    }

    /// Runs `script` (a function body; `return` gives the value) in the page.
    pub fn js(&self, script: &str) -> Value {
        self.post("/execute/sync", json!({"script": script, "args": []}))
            .unwrap_or_else(|e| panic!("script failed: {e}\n{script}"))
    }

    /// Polls `script` until it returns true.
    pub fn wait_js(&self, what: &str, script: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while self.js(script) != Value::Bool(true) {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Clicks the first element matching `css` (retried while it is being re-rendered).
    pub fn click(&self, css: &str) {
        let mut last = String::new();
        for _ in 0..20 {
            let r = self
                .post("/element", json!({"using": "css selector", "value": css}))
                .and_then(|e| {
                    let id = e[ELEMENT]
                        .as_str()
                        .ok_or_else(|| format!("no element in {e}"))?
                        .to_string();
                    self.post(&format!("/element/{id}/click"), json!({}))
                });
            match r {
                Ok(_) => return,
                Err(e) => last = e,
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("click {css}: {last}");
    }

    /// A PNG of the viewport.
    pub fn screenshot(&self) -> Vec<u8> {
        use base64::Engine;
        let v = call(ureq::get(&self.url("/screenshot")), None).expect("screenshot");
        base64::engine::general_purpose::STANDARD
            .decode(v.as_str().unwrap_or_default())
            .expect("screenshot is base64")
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let _ = ureq::delete(&self.url("")).call();
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// `target/` of this build (for test artifacts).
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"))
}
