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
import subprocess
import sys

from kvcluster import Cluster


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
    with Cluster() as c:
        c.start_nats("nats-server")
        apis, events = [], []
        for i in range(a.replicas):
            r = c.start_replica(a.kvroute, a.cores, "replicas", a.serve_arg,
                                what=f"replica {i} /readyz")
            apis.append(r.api)
            events.append(r.events)
        sub = {"{api}": ",".join(apis), "{events}": ",".join(events)}
        argv = [sub.get(x, x) for x in cmd]
        sys.exit(subprocess.call(argv))


if __name__ == "__main__":
    main()
