//! The processes of `kvroute-sim demo`: a simulated fleet (this binary's `fleet`
//! subcommand) and the real `kvroute serve` with its OpenAI proxy in front of it.
//!
//! Guarantees: every child is started in its own process group (a Ctrl-C at the
//! terminal reaches the demo alone, which stops its children in order) with
//! `PR_SET_PDEATHSIG`, so it dies with the demo whatever kills the demo; a [`Proc`]
//! stops its child (SIGTERM, then SIGKILL after a bounded wait) when dropped, so an
//! error or an interrupt anywhere in the demo leaves nothing running. Every wait is
//! bounded.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How long a child may take to come up (a debug build on a loaded machine is slow).
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// A child process that is stopped when this is dropped.
pub struct Proc {
    child: Child,
    pub what: String,
}

impl Proc {
    /// Starts `cmd` in its own process group, dying with this process; stdout piped,
    /// stderr appended to `log`.
    fn spawn(mut cmd: Command, what: &str, log: &Path) -> Result<Proc, String> {
        let err = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(|e| format!("{}: {e}", log.display()))?;
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(err));
        // SAFETY: the closure runs in the forked child before exec and calls only
        // async-signal-safe functions (setpgid, prctl, getppid), allocating nothing.
        unsafe {
            cmd.pre_exec(|| {
                libc::setpgid(0, 0);
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                // The demo died between fork and prctl: do not outlive it.
                if libc::getppid() == 1 {
                    libc::_exit(1);
                }
                Ok(())
            });
        }
        let child = cmd.spawn().map_err(|e| format!("starting {what}: {e}"))?;
        Ok(Proc {
            child,
            what: what.to_string(),
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// An error naming the exit status if the child has exited.
    fn exited(&mut self) -> Option<String> {
        match self.child.try_wait() {
            Ok(Some(status)) => Some(format!("{} exited ({status})", self.what)),
            _ => None,
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        kvroute::process::terminate(&mut self.child, Duration::from_secs(5));
    }
}

/// A running simulated fleet: its workers' base URLs and the `--engine` value of each.
pub struct Fleet {
    pub proc: Proc,
    pub urls: Vec<String>,
    pub engines: Vec<String>,
}

/// What the fleet is asked to be.
pub struct FleetPlan<'a> {
    pub workers: usize,
    pub capacity_blocks: usize,
    pub time_scale: f64,
    pub tokenizer: &'a Path,
    pub model: &'a str,
}

impl Fleet {
    /// Starts `kvroute-sim fleet` (this binary) on free loopback ports and waits for
    /// its `ready` line (bounded); its workers publish their KV events over ZMQ.
    pub fn start(p: &FleetPlan, log: &Path) -> Result<Fleet, String> {
        let me = std::env::current_exe().map_err(|e| format!("own path: {e}"))?;
        let mut cmd = Command::new(me);
        cmd.arg("fleet")
            .args(["--workers", &p.workers.to_string()])
            .args(["--capacity-blocks", &p.capacity_blocks.to_string()])
            .args(["--time-scale", &p.time_scale.to_string()])
            .args(["--model", p.model])
            .arg("--tokenizer")
            .arg(p.tokenizer);
        let mut proc = Proc::spawn(cmd, "the simulated fleet", log)?;
        let stdout = proc
            .child
            .stdout
            .take()
            .ok_or("the fleet's stdout is not piped")?;
        let lines = read_lines(stdout);
        let (mut urls, mut engines) = (Vec::new(), Vec::new());
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(e) = proc.exited() {
                return Err(format!("{e}; see {}", log.display()));
            }
            if Instant::now() > deadline {
                return Err(format!("the fleet did not start; see {}", log.display()));
            }
            let Ok(line) = lines.recv_timeout(Duration::from_millis(50)) else {
                continue;
            };
            if line.starts_with("ready") {
                break;
            }
            if let Some(rest) = line.strip_prefix("worker ") {
                for field in rest.split(' ') {
                    if let Some(u) = field.strip_prefix("url=") {
                        urls.push(u.to_string());
                    } else if let Some(e) = field.strip_prefix("engine=") {
                        engines.push(e.to_string());
                    }
                }
            }
        }
        if urls.len() != p.workers || engines.len() != p.workers {
            return Err(format!(
                "the fleet announced {} workers and {} engines, not {}",
                urls.len(),
                engines.len(),
                p.workers
            ));
        }
        Ok(Fleet {
            proc,
            urls,
            engines,
        })
    }
}

/// Forwards `r`'s lines to a channel from a thread that ends with the stream (the
/// child's stdout is read to its end, so the child never blocks on a full pipe).
fn read_lines(r: impl std::io::Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(r).lines() {
            let Ok(line) = line else { break };
            let _ = tx.send(line);
        }
    });
    rx
}

/// A running `kvroute serve` with its proxy.
pub struct Router {
    pub proc: Proc,
    /// `http://127.0.0.1:PORT` of the OpenAI proxy.
    pub proxy_url: String,
    /// The `kvroute serve` arguments, for the user to run it by hand.
    pub args: Vec<String>,
}

impl Router {
    /// Starts `bin serve --mode MODE` on free loopback ports, subscribed to the fleet's
    /// engines and proxying to its workers; waits (bounded) until the proxy answers and
    /// every worker is registered. A port taken meanwhile is retried on new ports.
    pub fn start(
        bin: &Path,
        mode: &str,
        fleet: &Fleet,
        model: &str,
        tokenizer: &Path,
        log: &Path,
    ) -> Result<Router, String> {
        let mut last = String::new();
        for _ in 0..3 {
            match Router::try_start(bin, mode, fleet, model, tokenizer, log) {
                Ok(r) => return Ok(r),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    fn try_start(
        bin: &Path,
        mode: &str,
        fleet: &Fleet,
        model: &str,
        tokenizer: &Path,
        log: &Path,
    ) -> Result<Router, String> {
        let port = || crate::runner::free_loopback_addr();
        let (proxy, http, events, api) = (port()?, port()?, port()?, port()?);
        let mut args: Vec<String> = [
            "serve",
            "--cores",
            "1",
            "--pin-cores",
            "false",
            "--mode",
            mode,
            "--proxy-drain-ms",
            "0",
            "--proxy-addr",
            &proxy,
            "--http-addr",
            &http,
            "--events-addr",
            &events,
            "--api-addr",
            &api,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.push("--tokenizer".into());
        args.push(format!("{model}={}", tokenizer.display()));
        for e in &fleet.engines {
            args.push("--engine".into());
            args.push(e.clone());
        }
        let mut cmd = Command::new(bin);
        cmd.args(&args);
        let what = format!("kvroute serve --mode {mode}");
        let mut proc = Proc::spawn(cmd, &what, log)?;
        // Nothing is printed on stdout; drain it anyway.
        if let Some(out) = proc.child.stdout.take() {
            let _ = read_lines(out);
        }
        let deadline = Instant::now() + START_TIMEOUT;
        let workers_url = format!("http://{http}/v1/workers");
        let health_url = format!("http://{proxy}/health");
        loop {
            if let Some(e) = proc.exited() {
                return Err(format!("{e}; see {}", log.display()));
            }
            if Instant::now() > deadline {
                return Err(format!("{what} did not start; see {}", log.display()));
            }
            let up = get_json(&health_url).is_some();
            let registered = get_json(&workers_url)
                .and_then(|v| v.as_array().map(|a| a.len()))
                .unwrap_or(0);
            if up && registered >= fleet.urls.len() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        // The engines' ZMQ subscriptions connect right after start-up: a PUB socket
        // drops what it sends before a subscriber is connected.
        std::thread::sleep(Duration::from_millis(500));
        Ok(Router {
            proc,
            proxy_url: format!("http://{proxy}"),
            args,
        })
    }
}

/// `GET url` as JSON (short timeout), or None.
fn get_json(url: &str) -> Option<serde_json::Value> {
    ureq::get(url)
        .timeout(Duration::from_secs(2))
        .call()
        .ok()?
        .into_json()
        .ok()
}

/// The `kvroute` binary next to this one (where cargo builds both), or `explicit`.
pub fn kvroute_bin(explicit: Option<&PathBuf>) -> Result<PathBuf, String> {
    if let Some(p) = explicit {
        return Ok(p.clone());
    }
    let me = std::env::current_exe().map_err(|e| format!("own path: {e}"))?;
    let dir = me.parent().ok_or("own path has no directory")?;
    let bin = dir.join("kvroute");
    if bin.is_file() {
        Ok(bin)
    } else {
        Err(format!(
            "the demo runs the real router, {}, which is not built: \
             `cargo build --release` builds both (or pass --kvroute PATH)",
            bin.display()
        ))
    }
}
