//! A `kvroute serve` child started from any command line (under `taskset`, `unshare`,
//! with limits or a seccomp filter set between fork and exec), its stdout and stderr
//! collected line by line; the HTTP address read from its listening line.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_kvroute");

/// The `serve` arguments for free loopback ports (port 0; the bound ones are logged).
pub fn serve_args() -> Vec<&'static str> {
    vec![
        "serve",
        "--events-addr",
        "127.0.0.1:0",
        "--api-addr",
        "127.0.0.1:0",
        "--http-addr",
        "127.0.0.1:0",
        "--proxy-addr",
        "127.0.0.1:0",
    ]
}

/// `kvroute serve` on free ports with `extra` flags.
pub fn serve(extra: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.args(serve_args()).args(extra);
    // Replicas (`--cluster`) need a tier secret; ignored without `--cluster`.
    c.env("KVROUTE_CLUSTER_SECRET", super::cluster::TEST_SECRET);
    c
}

/// A started child; SIGTERM (then SIGKILL) on drop.
pub struct Run {
    pub child: Child,
    out: Arc<Mutex<Vec<String>>>,
    err: Arc<Mutex<Vec<String>>>,
}

fn collect(r: impl std::io::Read + Send + 'static) -> Arc<Mutex<Vec<String>>> {
    let lines = Arc::new(Mutex::new(Vec::new()));
    let l = lines.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(r).lines().map_while(Result::ok) {
            eprintln!("[kvroute] {line}");
            l.lock().unwrap_or_else(|p| p.into_inner()).push(line);
        }
    });
    lines
}

impl Run {
    pub fn spawn(mut c: Command) -> Run {
        let mut child = c
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn kvroute");
        let out = collect(child.stdout.take().expect("stdout"));
        let err = collect(child.stderr.take().expect("stderr"));
        Run { child, out, err }
    }

    pub fn stdout(&self) -> Vec<String> {
        self.out.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn stderr(&self) -> Vec<String> {
        self.err.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Until the process exits (`Some`) or prints its listening line (`None`), within
    /// `within` (a failure past it).
    pub fn exit_or_listen(&mut self, within: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + within;
        loop {
            if let Ok(Some(st)) = self.child.try_wait() {
                // Let the readers drain the pipes.
                std::thread::sleep(Duration::from_millis(50));
                return Some(st);
            }
            if self.stdout().iter().any(|l| l.contains("listening")) {
                return None;
            }
            assert!(
                Instant::now() < deadline,
                "kvroute neither started nor exited within {within:?}: {:?}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits for the listening line (a failure if the process exits first).
    pub fn started(mut self) -> Run {
        let st = self.exit_or_listen(Duration::from_secs(20));
        assert!(st.is_none(), "kvroute exited: {st:?} {:?}", self.stderr());
        self
    }

    /// The address after `what ` in the listening line (`http`, `events`, `api`), or
    /// the proxy's line (`proxy`).
    pub fn addr(&self, what: &str) -> String {
        let lines = self.stdout();
        let pat = if what == "proxy" {
            "proxy listening: ".to_string()
        } else {
            format!("{what} ")
        };
        // The service prints one listening line per front end; the later ones may not
        // be read yet when the first arrived.
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut lines = lines;
        loop {
            let found = lines
                .iter()
                .filter(|l| l.contains("listening"))
                .find_map(|l| {
                    let i = l.find(&pat)? + pat.len();
                    l[i..].split(' ').next().map(str::to_string)
                });
            match found {
                Some(a) => return a,
                None if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10));
                    lines = self.stdout();
                }
                None => panic!("no {what} address in {lines:?}"),
            }
        }
    }

    /// `GET http://{http}{path}`: (status, body).
    pub fn get(&self, path: &str) -> (u16, String) {
        match ureq::get(&format!("http://{}{path}", self.addr("http"))).call() {
            Ok(r) => (r.status(), r.into_string().unwrap_or_default()),
            Err(ureq::Error::Status(c, r)) => (c, r.into_string().unwrap_or_default()),
            Err(e) => panic!("GET {path}: {e}"),
        }
    }

    /// `GET /v1/workers`.
    pub fn workers(&self) -> Vec<serde_json::Value> {
        serde_json::from_str(&self.get("/v1/workers").1).unwrap_or_default()
    }

    /// Polls `f` every 20 ms until it holds, failing after `within`.
    pub fn wait_until(&self, what: &str, within: Duration, mut f: impl FnMut(&Run) -> bool) {
        let deadline = Instant::now() + within;
        while !f(self) {
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}; stderr: {:?}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, sig);
        }
    }

    /// SIGTERM, and the exit status within 10 s.
    pub fn stop(&mut self) -> ExitStatus {
        kvroute::process::sigterm(&self.child);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(Some(st)) = self.child.try_wait() {
                return st;
            }
            assert!(Instant::now() < deadline, "kvroute did not stop at SIGTERM");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        kvroute::process::terminate(&mut self.child, Duration::from_secs(5));
    }
}
