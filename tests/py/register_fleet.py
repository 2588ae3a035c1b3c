"""Times registering N workers with maximum-size specs over HTTP (linear, not quadratic).

Not a test (speed is never asserted): a timed tool run. With a router running,

    python3 tests/py/register_fleet.py HTTP_PORT [N=4096]

prints the total time and the time of each 256 registrations; flat per-256 figures
mean registration is linear. Spec sizes are the documented maxima: id 128 bytes,
model and topology 256, 64 taints of 128 bytes. Standard library only.
"""
import http.client
import json
import sys
import time


def main():
    port = int(sys.argv[1])
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 4096
    c = http.client.HTTPConnection("127.0.0.1", port)
    t0 = last = time.perf_counter()
    per = []
    for i in range(n):
        spec = {
            "id": ("w%05d" % i).ljust(128, "x"),
            "model": "m" * 256,
            "topology": "t" * 256,
            "taints": [("%02d" % k).ljust(128, "z") for k in range(64)],
            "capacity_blocks": 1000,
        }
        c.request("POST", "/v1/workers", body=json.dumps(spec),
                  headers={"content-type": "application/json"})
        r = c.getresponse()
        r.read()
        if r.status not in (200, 201):
            sys.exit("worker %d: HTTP %d" % (i, r.status))
        if (i + 1) % 256 == 0:
            now = time.perf_counter()
            per.append("%.2f" % (now - last))
            last = now
    print("total %.2fs; per 256: %s" % (time.perf_counter() - t0, " ".join(per)))


if __name__ == "__main__":
    main()
