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
import sys
import time
import urllib.request

from kvcluster import Cluster, wait


def http(method, url, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.status, r.read()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("kvroute")
    ap.add_argument("--samples", type=int, default=500)
    ap.add_argument("--cores", type=int, default=1)
    ap.add_argument("--bench")
    ap.add_argument("--rate", type=int, default=0)
    ap.add_argument("--secs", type=int, default=30)
    a = ap.parse_args()
    with Cluster() as c:
        c.start_nats("nats")
        reps = [c.start_replica(a.kvroute, a.cores, "lag") for _ in range(2)]
        A, B = (f"http://{r.http}" for r in reps)
        http("POST", A + "/v1/workers", {"id": "probe", "role": "aggregated", "device": "gpu",
                                         "model": "m", "capacity_blocks": 10_000_000})
        wait("B sees the probe", lambda: b"probe" in http("GET", B + "/v1/workers")[1])
        if a.bench:
            c.spawn([a.bench, "--events", reps[0].events, "--api", reps[0].api,
                     "--http", reps[0].http, "--event-rate", str(a.rate), "--rate", "1",
                     "--clients", "1", "--duration", str(a.secs)])
            time.sleep(3)

        def cached():
            ws = json.loads(http("GET", B + "/v1/workers")[1])
            return next(w["cached_blocks"] for w in ws if w["id"] == "probe")

        def counts(url):
            # (KV events this replica ingested itself, event-log records it applied from
            # other replicas): the second is what B does with A's ingest.
            text = http("GET", url + "/metrics")[1].decode()
            own = sum(float(l.split()[-1]) for l in text.splitlines()
                      if l.startswith("kvroute_events_total{"))
            logged = sum(float(l.split()[-1]) for l in text.splitlines()
                         if l.startswith('kvroute_cluster_records_total{outcome="applied"'))
            return own, logged

        ev0, t_start = (counts(A), counts(B)), time.perf_counter()
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
        now = (counts(A), counts(B))
        rates = [round((n[0] - e[0]) / took) for n, e in zip(now, ev0)]
        records = [round((n[1] - e[1]) / took) for n, e in zip(now, ev0)]
        lags.sort()
        q = lambda p: lags[min(len(lags) - 1, int(p * len(lags)))]
        print(json.dumps({"samples": len(lags), "p50_ms": round(q(0.5), 2),
                          "p99_ms": round(q(0.99), 2), "max_ms": round(lags[-1], 2),
                          "background_block_events_per_s": a.rate if a.bench else 0,
                          "applied_events_per_s_a_b": rates,
                          "log_records_applied_per_s_a_b": records}))


if __name__ == "__main__":
    main()
