//! A `kvroute-sim fleet` child process for tests: started with its arguments, ready
//! once it prints `ready:`, its workers (id, role, URL, `--engine` value) read from its
//! stdout, stopped with SIGTERM in `Drop`; plus small HTTP helpers for its
//! OpenAI endpoints.

use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Fast timing so tests do not wait on the model (1 ms prefill base, 2 ms per step).
pub const FAST: &str = "prefill_base_us=1000,prefill_us_per_token=1,prefill_attention_us=0,decode_step_base_us=2000,decode_us_per_seq=0";

pub struct SimWorker {
    pub id: String,
    pub role: String,
    pub url: String,
    pub engine: Option<String>,
}

pub struct Fleet {
    child: Option<Child>,
    pub workers: Vec<SimWorker>,
}

impl Fleet {
    pub fn start(args: &[&str]) -> Fleet {
        let mut child = Command::new(env!("CARGO_BIN_EXE_kvroute-sim"))
            .arg("fleet")
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn kvroute-sim fleet");
        let out = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(l);
            }
        });
        let mut f = Fleet {
            child: Some(child),
            workers: Vec::new(),
        };
        loop {
            let l = rx
                .recv_timeout(Duration::from_secs(30))
                .expect("fleet did not get ready");
            if l.starts_with("ready:") {
                break;
            }
            if let Some(rest) = l.strip_prefix("worker ") {
                let mut w = SimWorker {
                    id: String::new(),
                    role: String::new(),
                    url: String::new(),
                    engine: None,
                };
                for (i, tok) in rest.split(' ').enumerate() {
                    if i == 0 {
                        w.id = tok.to_string();
                    } else if let Some((k, v)) = tok.split_once('=') {
                        match k {
                            "role" => w.role = v.to_string(),
                            "url" => w.url = v.to_string(),
                            "engine" => w.engine = Some(v.to_string()),
                            _ => {}
                        }
                    }
                }
                f.workers.push(w);
            }
        }
        f
    }

    pub fn url(&self, i: usize, path: &str) -> String {
        format!("{}{path}", self.workers[i].url)
    }

    pub fn stats(&self, i: usize) -> Value {
        ureq::get(&self.url(i, "/stats"))
            .call()
            .unwrap()
            .into_json()
            .unwrap()
    }

    /// SIGTERM, then waits; returns whether it exited successfully.
    pub fn stop(&mut self) -> bool {
        let Some(mut c) = self.child.take() else {
            return false;
        };
        unsafe {
            libc::kill(c.id() as i32, libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(Some(st)) = c.try_wait() {
                return st.success();
            }
            if Instant::now() > deadline {
                let _ = c.kill();
                let _ = c.wait();
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        if let Some(c) = self.child.as_mut() {
            kvroute::process::terminate(c, Duration::from_secs(10));
        }
    }
}

pub fn post(url: &str, body: Value) -> (u16, String) {
    match ureq::post(url)
        .timeout(Duration::from_secs(60))
        .send_json(body)
    {
        Ok(r) => (r.status(), r.into_string().unwrap_or_default()),
        Err(ureq::Error::Status(c, r)) => (c, r.into_string().unwrap_or_default()),
        Err(e) => panic!("POST {url}: {e}"),
    }
}

pub fn words(range: std::ops::Range<u32>) -> String {
    range.map(|i| format!("t{i}")).collect::<Vec<_>>().join(" ")
}

/// The `data:` payloads of an SSE body, in order.
pub fn sse_data(body: &str) -> Vec<String> {
    body.split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .map(str::to_string)
        .collect()
}
