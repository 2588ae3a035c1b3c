//! NATS harness for the replica tests (tests/cluster.rs): a `nats-server` with
//! JetStream on a free loopback port and a temporary store directory, killed in Drop.
//! `restart` keeps the port and the store (a NATS restart mid-run).

use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct NatsServer {
    child: Option<Child>,
    pub port: u16,
    dir: tempfile::TempDir,
}

/// Whether `nats-server` is installed. Without it the tests skip with a message,
/// except under CI, where `.ci/run` installs it and a missing binary is a failure.
pub fn nats_available() -> bool {
    let ok = Command::new("nats-server")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        assert!(
            std::env::var_os("CI").is_none(),
            "nats-server missing under CI (.ci/run installs it)"
        );
        eprintln!("SKIPPED: nats-server is not installed (apt-get install nats-server)");
    }
    ok
}

impl NatsServer {
    pub fn start() -> NatsServer {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut s = NatsServer {
            child: None,
            port: super::free_port(),
            dir,
        };
        s.spawn();
        s
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    fn spawn(&mut self) {
        let child = Command::new("nats-server")
            .args([
                "-js",
                "-a",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-sd",
            ])
            .arg(self.dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn nats-server");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < deadline, "nats-server did not listen");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kills the server (SIGKILL: no goodbye to the clients).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on the same port with the same store.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill();
    }
}
