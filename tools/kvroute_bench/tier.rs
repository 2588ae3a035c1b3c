//! The replica tier of a soak (`--replicas N` with `--spawn`): a `nats-server` with
//! JetStream, a `kvroute-sim fleet` whose workers publish their KV events over ZMQ and
//! answer OpenAI requests, and N `kvroute serve --cluster` replicas subscribed to every
//! worker (`--engine`), each with its own state directory and proxy port. A replica is
//! restarted the way an operator does it (SIGTERM, drain, start again on the same
//! ports and state). Every child is stopped, and the state removed (the replicas' logs
//! are kept), on drop.
//!
//! Loopback only; every wait is bounded.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How the tier is made.
pub struct TierArgs<'a> {
    pub kvroute: &'a str,
    pub sim: String,
    pub replicas: usize,
    pub cores: usize,
    pub fleet_workers: usize,
    /// `kvroute-sim fleet --timing` (the workers' speed).
    pub timing: &'a str,
    /// More `kvroute serve` flags for every replica (`--replica-arg`).
    pub extra: &'a [String],
    /// A running NATS server with JetStream; none: one is started (`nats-server`).
    pub nats: Option<&'a str>,
}

/// One replica: its addresses and the command line it is (re)started with.
pub struct Replica {
    pub name: String,
    pub events: String,
    pub api: String,
    pub http: String,
    pub proxy: String,
    args: Vec<String>,
    log: PathBuf,
    child: Option<Child>,
}

pub struct Tier {
    pub replicas: Vec<Replica>,
    /// The fleet's workers' base URLs (for `/stats`).
    pub worker_urls: Vec<String>,
    kvroute: String,
    nats: Option<Child>,
    fleet: Option<Child>,
    pub dir: PathBuf,
}

fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("free port: {e}"))
}

fn addr() -> Result<String, String> {
    Ok(format!("127.0.0.1:{}", free_port()?))
}

fn wait_for(what: &str, within: Duration, mut ok: impl FnMut() -> bool) -> Result<(), String> {
    let deadline = Instant::now() + within;
    while !ok() {
        if Instant::now() > deadline {
            return Err(format!("{what}: not within {within:?}"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// GET `url`: status and body (0 on a transport error).
pub fn get(url: &str) -> (u16, String) {
    let agent = ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(10))
        .build();
    match agent.get(url).call() {
        Ok(r) => (r.status(), r.into_string().unwrap_or_default()),
        Err(ureq::Error::Status(c, r)) => (c, r.into_string().unwrap_or_default()),
        Err(_) => (0, String::new()),
    }
}

/// The first sample of metric `name` (exact name, no labels) in `/metrics` of `http`.
pub fn metric(http: &str, name: &str) -> Option<f64> {
    let (_, text) = get(&format!("http://{http}/metrics"));
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

impl Replica {
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    fn spawn(&mut self, kvroute: &str) -> Result<(), String> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(|e| format!("{}: {e}", self.log.display()))?;
        let child = Command::new(kvroute)
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot start {kvroute}: {e}"))?;
        self.child = Some(child);
        Ok(())
    }

    /// Waits until `/readyz` answers 200 (caught up with the tier).
    pub fn wait_ready(&self, within: Duration) -> Result<(), String> {
        let url = format!("http://{}/readyz", self.http);
        wait_for(&format!("replica {} ready", self.name), within, || {
            get(&url).0 == 200
        })
        .map_err(|e| {
            // Most often the replica refused to start: its log says why.
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(5).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            format!(
                "{e}; its log ({}) ends:\n{}",
                self.log.display(),
                tail.join("\n")
            )
        })
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            kvroute::process::terminate(&mut c, Duration::from_secs(30));
        }
    }
}

impl Tier {
    pub fn start(a: &TierArgs) -> Result<Tier, String> {
        let dir = std::env::temp_dir().join(format!("kvroute-soak-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let mut t = Tier {
            replicas: Vec::new(),
            worker_urls: Vec::new(),
            kvroute: a.kvroute.to_string(),
            nats: None,
            fleet: None,
            dir,
        };
        let nats = match a.nats {
            Some(u) => u.to_string(),
            None => t.start_nats()?,
        };
        let engines = t.start_fleet(a)?;
        // The tier secret replicas seal their NATS messages with: fresh for each run,
        // in a file (not on the command line, where `ps` shows it).
        let secret_file = t.dir.join("cluster-secret");
        let secret: String = (0..32)
            .map(|_| format!("{:02x}", rand::random::<u8>()))
            .collect();
        std::fs::write(&secret_file, secret)
            .map_err(|e| format!("{}: {e}", secret_file.display()))?;
        for i in 0..a.replicas {
            let name = format!("r{i}");
            let (events, api, http, proxy) = (addr()?, addr()?, addr()?, addr()?);
            let state = t.dir.join(&name);
            let mut args: Vec<String> = [
                "serve",
                "--cores",
                &a.cores.to_string(),
                "--pin-cores",
                "false",
                "--events-addr",
                &events,
                "--api-addr",
                &api,
                "--http-addr",
                &http,
                "--proxy-addr",
                &proxy,
                "--cluster",
                &nats,
                "--cluster-replica-id",
                &name,
                "--cluster-secret-file",
                &secret_file.to_string_lossy(),
                "--state-dir",
                &state.to_string_lossy(),
                "--snapshot-interval-ms",
                "5000",
                "--proxy-drain-ms",
                "5000",
                "--max-blocks-per-worker",
                "100000000",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            for e in &engines {
                args.extend(["--engine".to_string(), e.clone()]);
            }
            args.extend(a.extra.iter().cloned());
            let mut r = Replica {
                log: t.dir.join(format!("{name}.log")),
                name,
                events,
                api,
                http,
                proxy,
                args,
                child: None,
            };
            // One after the other, as a rollout would: the first creates the tier's
            // stream and buckets. (Two replicas started at the same instant on a
            // loaded machine once left one without its stream, never ready.)
            r.spawn(a.kvroute)?;
            let ready = r.wait_ready(Duration::from_secs(120));
            t.replicas.push(r);
            ready?;
        }
        Ok(t)
    }

    fn start_nats(&mut self) -> Result<String, String> {
        let port = free_port()?;
        let store = self.dir.join("nats");
        let child = Command::new("nats-server")
            .args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"])
            .arg(&store)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start nats-server (install it, or pass --nats): {e}"))?;
        self.nats = Some(child);
        wait_for("nats-server", Duration::from_secs(30), || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        })?;
        Ok(format!("nats://127.0.0.1:{port}"))
    }

    /// Starts the fleet; its workers' `--engine` values.
    fn start_fleet(&mut self, a: &TierArgs) -> Result<Vec<String>, String> {
        let mut child = Command::new(&a.sim)
            .args(["fleet", "--workers", &a.fleet_workers.to_string()])
            .args(["--timing", a.timing, "--threads", "2"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start {} fleet: {e}", a.sim))?;
        let out = child.stdout.take().ok_or("fleet stdout")?;
        self.fleet = Some(child);
        let mut engines = Vec::new();
        for line in BufReader::new(out).lines() {
            let line = line.map_err(|e| format!("fleet: {e}"))?;
            if line.starts_with("ready:") {
                return Ok(engines);
            }
            for tok in line.split(' ') {
                if let Some(e) = tok.strip_prefix("engine=") {
                    engines.push(e.to_string());
                }
                if let Some(u) = tok.strip_prefix("url=") {
                    self.worker_urls.push(u.to_string());
                }
            }
        }
        Err("the fleet exited before it was ready".into())
    }

    /// Restarts replica `i` as an operator would: SIGTERM (the proxy drains, a snapshot
    /// is written), then the same command line; returns once it is ready again, with
    /// the time from the signal to ready.
    pub fn restart(&mut self, i: usize) -> Result<Duration, String> {
        let t0 = Instant::now();
        let r = self.replicas.get_mut(i).ok_or("no such replica")?;
        r.stop();
        r.spawn(&self.kvroute)?;
        r.wait_ready(Duration::from_secs(120))?;
        Ok(t0.elapsed())
    }

    /// Every fleet worker's `/stats` (`active`, `requests`, `finished`, ...).
    pub fn worker_stats(&self) -> Vec<serde_json::Value> {
        self.worker_urls
            .iter()
            .map(|u| serde_json::from_str(&get(&format!("{u}/stats")).1).unwrap_or_default())
            .collect()
    }
}

impl Drop for Tier {
    fn drop(&mut self) {
        for r in &mut self.replicas {
            r.stop();
        }
        for c in [self.fleet.take(), self.nats.take()].into_iter().flatten() {
            let mut c = c;
            kvroute::process::terminate(&mut c, Duration::from_secs(10));
        }
        // The state and the NATS store go; the replicas' logs stay for a look.
        if let Ok(entries) = std::fs::read_dir(&self.dir) {
            for e in entries.flatten() {
                if e.path().is_dir() {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
    }
}
