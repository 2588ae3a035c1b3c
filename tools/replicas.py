#!/usr/bin/env python3
"""Runs one command against N router replicas (`kvroute serve --cluster`) on loopback.

Starts a nats-server with JetStream (temporary store, free loopback port) and N
replicas of the given kvroute binary (`--cores 1` each unless --cores, free ports, one
`--cluster-name`), waits until every replica's /readyz answers 200, then runs the
command after `--` with `{api}` and `{events}` replaced by the replicas' request and
event ports, comma-separated in the same order (what `kvroute-sim run --router-api /
--router-events` and `kvroute-bench --api / --events` take). Everything it started is
stopped afterwards, also on failure or Ctrl-C. Extra `serve` flags: --serve-arg.

    python3 tools/replicas.py target/release/kvroute --replicas 4 -- \\
        target/release/kvroute-sim run --trace TRACE --workers 8 \\
        --router-api {api} --router-events {events}
"""
import argparse
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


def ready(url):
    try:
        with urllib.request.urlopen(url + "/readyz", timeout=5) as r:
            return r.status == 200
    except OSError:
        return False


def wait(what, f, secs=60):
    end = time.time() + secs
    while time.time() < end:
        if f():
            return
        time.sleep(0.05)
    sys.exit(f"timed out waiting for {what}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("kvroute")
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--cores", type=int, default=1)
    ap.add_argument("--serve-arg", action="append", default=[])
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    a = ap.parse_args(argv[:cut])
    cmd = argv[cut + 1:]
    if not cmd or a.replicas < 1:
        sys.exit("usage: replicas.py KVROUTE [--replicas N] -- COMMAND ({api} {events})")
    procs = []
    store = tempfile.mkdtemp()
    try:
        np = free_port()
        procs.append(subprocess.Popen(["nats-server", "-js", "-a", "127.0.0.1", "-p", str(np),
                                       "-sd", store], stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL))

        def nats_up():
            try:
                socket.create_connection(("127.0.0.1", np), 1).close()
                return True
            except OSError:
                return False

        wait("nats-server", nats_up)
        apis, events = [], []
        for _ in range(a.replicas):
            ev, api, http = (f"127.0.0.1:{free_port()}" for _ in range(3))
            procs.append(subprocess.Popen(
                [a.kvroute, "serve", "--cores", str(a.cores), "--events-addr", ev,
                 "--api-addr", api, "--http-addr", http, "--proxy-addr", "off",
                 "--cluster", f"nats://127.0.0.1:{np}", "--cluster-name", "replicas",
                 *a.serve_arg],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            wait(f"replica {len(apis)} /readyz", lambda: ready(f"http://{http}"))
            apis.append(api)
            events.append(ev)
        sub = {"{api}": ",".join(apis), "{events}": ",".join(events)}
        argv = [sub.get(x, x) for x in cmd]
        sys.exit(subprocess.call(argv))
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(store, ignore_errors=True)


if __name__ == "__main__":
    main()
