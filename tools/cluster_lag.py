#!/usr/bin/env python3
"""Event propagation lag between router replicas (`kvroute serve --cluster`).

Starts a nats-server with JetStream (temporary store, free loopback port) and two
replicas of the given kvroute binary, registers a probe worker on replica A, then
repeatedly posts one Stored event (one new block) to A — A answers once the event is
applied there — and times until replica B reports the block (GET /v1/workers). Prints
p50/p99/max of that lag in ms. Optional background ingest: `--bench BIN --rate N`
runs kvroute-bench's event load against A at N block events/s meanwhile.

    python3 tools/cluster_lag.py target/release/kvroute --samples 500 \
        [--bench target/release/kvroute-bench --rate 1000000]
"""
import argparse
import json
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


def http(method, url, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.status, r.read()


def wait(what, f, secs=60):
    end = time.time() + secs
    while time.time() < end:
        try:
            if f():
                return
        except OSError:
            pass
        time.sleep(0.05)
    sys.exit(f"timed out waiting for {what}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("kvroute")
    ap.add_argument("--samples", type=int, default=500)
    ap.add_argument("--cores", type=int, default=1)
    ap.add_argument("--bench")
    ap.add_argument("--rate", type=int, default=0)
    ap.add_argument("--secs", type=int, default=30)
    a = ap.parse_args()
    procs = []
    store = tempfile.mkdtemp()
    try:
        np = free_port()
        procs.append(subprocess.Popen(["nats-server", "-js", "-a", "127.0.0.1", "-p", str(np),
                                       "-sd", store], stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL))
        wait("nats", lambda: socket.create_connection(("127.0.0.1", np), 1).close() or True)
        reps = []
        for _ in range(2):
            ports = [free_port() for _ in range(3)]
            addrs = [f"127.0.0.1:{p}" for p in ports]
            procs.append(subprocess.Popen(
                [a.kvroute, "serve", "--cores", str(a.cores), "--events-addr", addrs[0],
                 "--api-addr", addrs[1], "--http-addr", addrs[2], "--proxy-addr", "off",
                 "--cluster", f"nats://127.0.0.1:{np}", "--cluster-name", "lag"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            reps.append(addrs)
            url = f"http://{addrs[2]}"
            wait("readyz", lambda: http("GET", url + "/readyz")[0] == 200)
        A, B = (f"http://{r[2]}" for r in reps)
        http("POST", A + "/v1/workers", {"id": "probe", "role": "aggregated", "device": "gpu",
                                         "model": "m", "capacity_blocks": 10_000_000})
        wait("B sees the probe", lambda: b"probe" in http("GET", B + "/v1/workers")[1])
        if a.bench:
            procs.append(subprocess.Popen(
                [a.bench, "--events", reps[0][0], "--api", reps[0][1],
                 "--http", reps[0][2], "--event-rate", str(a.rate), "--rate", "1",
                 "--clients", "1", "--duration", str(a.secs)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            time.sleep(3)

        def cached():
            ws = json.loads(http("GET", B + "/v1/workers")[1])
            return next(w["cached_blocks"] for w in ws if w["id"] == "probe")

        def events(url):
            # KV events applied by that replica (its own ingest and the log's records).
            text = http("GET", url + "/metrics")[1].decode()
            return sum(float(l.split()[-1]) for l in text.splitlines()
                       if l.startswith("kvroute_events_total{"))

        ev0, t_start = (events(A), events(B)), time.perf_counter()
        lags = []
        base = cached()
        for i in range(a.samples):
            h = (0x9E3779B97F4A7C15 * (i + 1)) & ((1 << 63) - 1)
            http("POST", A + "/v1/workers/probe/events",
                 {"events": [{"type": "stored", "tier": "device", "parent": None,
                              "block_hashes": [h]}]})
            t0 = time.perf_counter()
            while cached() < base + i + 1:
                if time.perf_counter() - t0 > 30:
                    sys.exit("a probe block never reached B")
            lags.append((time.perf_counter() - t0) * 1000)
        took = time.perf_counter() - t_start
        rates = [round((events(u) - e) / took) for u, e in zip((A, B), ev0)]
        lags.sort()
        q = lambda p: lags[min(len(lags) - 1, int(p * len(lags)))]
        print(json.dumps({"samples": len(lags), "p50_ms": round(q(0.5), 2),
                          "p99_ms": round(q(0.99), 2), "max_ms": round(lags[-1], 2),
                          "background_block_events_per_s": a.rate if a.bench else 0,
                          "applied_events_per_s_a_b": rates}))
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
