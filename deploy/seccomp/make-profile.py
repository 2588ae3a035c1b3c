#!/usr/bin/env python3
"""Writes kvroute's seccomp profile: a container runtime's default profile plus exactly
the three io_uring system calls glommio's executors make, nothing else widened.

Usage: make-profile.py [DEFAULT_PROFILE] > deploy/seccomp/kvroute.json
DEFAULT_PROFILE defaults to podman's / CRI-O's (containers-common), the one the shipped
profile was made from: /usr/share/containers/seccomp.json (containers-common 0.50.1).
--check PROFILE DEFAULT_PROFILE exits 1 unless PROFILE allows exactly the io_uring
calls more than DEFAULT_PROFILE does (compared rule by rule, conditions included)."""
import json
import sys

IO_URING = ["io_uring_enter", "io_uring_register", "io_uring_setup"]
COMMENT = "kvroute: glommio's io_uring executors (the default profile blocks io_uring)"


def rules(profile):
    """Every (name, action, args, includes, excludes) the profile states."""
    out = set()
    for r in profile["syscalls"]:
        cond = json.dumps([r.get("args") or [], r.get("includes") or {},
                           r.get("excludes") or {}], sort_keys=True)
        for n in r.get("names", []):
            out.add((n, r["action"], cond))
    return out


def make(default):
    p = json.loads(json.dumps(default))
    if any(n in IO_URING for n, a, _ in rules(p) if a == "SCMP_ACT_ALLOW"):
        sys.exit("the default profile already allows io_uring")
    p["syscalls"].append({"names": IO_URING, "action": "SCMP_ACT_ALLOW", "args": [],
                          "comment": COMMENT, "includes": {}, "excludes": {}})
    return p


def check(profile, default):
    if profile.get("defaultAction") != default.get("defaultAction"):
        return "defaultAction differs"
    wider = rules(profile) - rules(default)
    allowed = {(n, a) for n, a, _ in wider}
    want = {(n, "SCMP_ACT_ALLOW") for n in IO_URING}
    if allowed != want:
        return f"rules beyond the default: {sorted(allowed ^ want)}"
    return None


def main():
    args = sys.argv[1:]
    if args[:1] == ["--check"]:
        with open(args[1]) as f, open(args[2]) as g:
            err = check(json.load(f), json.load(g))
        if err:
            sys.exit(f"{args[1]}: {err}")
        print(f"{args[1]}: the default profile {args[2]} plus {', '.join(IO_URING)}")
        return
    path = args[0] if args else "/usr/share/containers/seccomp.json"
    with open(path) as f:
        json.dump(make(json.load(f)), sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
