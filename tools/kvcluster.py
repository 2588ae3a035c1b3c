"""Shared start-up of a loopback router cluster for the tools (`cluster_lag.py`,
`replicas.py`): one nats-server with JetStream on a temporary store and a free port,
and `kvroute serve --cluster` replicas on free ports, each waited for until its
/readyz answers 200. The replicas share a tier secret made afresh for each cluster
(`KVROUTE_CLUSTER_SECRET`, docs/SECURITY.md).

Guarantees: `with Cluster() as c:` stops everything it started when the block ends,
also on failure, `sys.exit` or Ctrl-C (SIGTERM in reverse start order, then up to 10 s
each before SIGKILL), and removes the temporary store. A wait that runs out exits
with "timed out waiting for WHAT". Started processes' output goes to /dev/null.
"""
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def wait(what, f, secs=60):
    """Polls `f` every 50 ms until true (an OSError counts as not yet)."""
    end = time.time() + secs
    while time.time() < end:
        try:
            if f():
                return
        except OSError:
            pass
        time.sleep(0.05)
    sys.exit(f"timed out waiting for {what}")


def ready(url):
    """Whether the replica at `url` (http://host:port) answers /readyz with 200."""
    try:
        with urllib.request.urlopen(url + "/readyz", timeout=5) as r:
            return r.status == 200
    except OSError:
        return False


class Replica:
    """A started replica's listen addresses (host:port)."""

    def __init__(self, events, api, http):
        self.events, self.api, self.http = events, api, http


class Cluster:
    def __init__(self):
        self.procs = []
        self.store = tempfile.mkdtemp()
        self.nats_url = None
        self.secret = secrets.token_hex(32)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
        return False

    def spawn(self, argv):
        """Starts `argv` (output discarded); stopped with the cluster."""
        env = dict(os.environ, KVROUTE_CLUSTER_SECRET=self.secret)
        p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             env=env)
        self.procs.append(p)
        return p

    def start_nats(self, what="nats-server"):
        """Starts nats-server with JetStream and waits until it accepts connections."""
        port = free_port()
        self.spawn(["nats-server", "-js", "-a", "127.0.0.1", "-p", str(port),
                    "-sd", self.store])
        wait(what, lambda: socket.create_connection(("127.0.0.1", port), 1).close() or True)
        self.nats_url = f"nats://127.0.0.1:{port}"
        return self.nats_url

    def start_replica(self, kvroute, cores, name, extra=(), what="readyz"):
        """Starts one `kvroute serve --cluster` replica (no proxy) of cluster `name`
        and waits for its /readyz."""
        r = Replica(*(f"127.0.0.1:{free_port()}" for _ in range(3)))
        self.spawn([kvroute, "serve", "--cores", str(cores), "--events-addr", r.events,
                    "--api-addr", r.api, "--http-addr", r.http, "--proxy-addr", "off",
                    "--cluster", self.nats_url, "--cluster-name", name, *extra])
        wait(what, lambda: ready(f"http://{r.http}"))
        return r

    def stop(self):
        for p in reversed(self.procs):
            p.terminate()
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        self.procs = []
        shutil.rmtree(self.store, ignore_errors=True)
