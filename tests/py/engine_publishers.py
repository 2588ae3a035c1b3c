#!/usr/bin/env python3
"""The real KV-event publishers of vLLM 0.33.0 and SGLang 0.5.23, driven from stdin.

Loads each engine's own `kv_events.py` source (extracted from its PyPI wheel by
.ci/run into $KVROUTE_ENGINE_SOURCES, default ~/.cache/kvroute/engines) with stub
modules standing in for its package-internal imports (logger, network helpers, config
classes), so the event classes, the media constants/enums, the hash namespacing and
the ZmqEventPublisher (PUB + ROUTER replay) are the engines' own code, unchanged.

Commands, one JSON object per line, each answered by one JSON line:
  {"op": "start", "name": "e0", "engine": "vllm"|"sglang", "dp_rank": 0,
   "replay": true, "port": P?, "replay_port": R?}   -> {"pub": P, "replay": R|null}
  {"op": "publish", "name": "e0", "events": [EVENT, ...], "lost": false}
                                                            -> {"ok": true}
  {"op": "stop", "name": "e0"}                              -> {"ok": true}
  {"op": "quit"}
EVENT: {"type": "BlockStored"|"BlockRemoved"|"AllBlocksCleared", field: value, ...},
the engine's own field names. A string value "$NAME" or "$Enum.MEMBER" is that
attribute of the engine's module (e.g. "$MEDIUM_STORAGE", "$StorageMedium.CPU"). With
"namespace_salt": S (SGLang), block and parent hashes go through the module's own
`namespaced_block_hash(h, kv_event_namespace_seed(extra_key=None, cache_salt=S))`. A
hash given as "0x<hex>" is those bytes (vLLM's default sha256 digests). "lost": true
lets the publisher buffer the batch for replay but drops its PUB send (a gap).
"""

import importlib.util
import json
import logging
import os
import socket
import sys
import time
import types

SOURCES = os.environ.get("KVROUTE_ENGINE_SOURCES") or os.path.expanduser(
    "~/.cache/kvroute/engines"
)
VERSIONS = {"vllm": "vllm-0.33.0", "sglang": "sglang-0.5.23"}
FILES = {
    "vllm": "vllm/distributed/kv_events.py",
    "sglang": "sglang/srt/disaggregation/kv_events.py",
}


def stub(name, **attrs):
    parts = name.split(".")
    for i in range(1, len(parts)):
        parent = ".".join(parts[:i])
        if parent not in sys.modules:
            pkg = types.ModuleType(parent)
            pkg.__path__ = []
            sys.modules[parent] = pkg
    m = types.ModuleType(name)
    m.__dict__.update(attrs)
    sys.modules[name] = m


class KVEventsConfig:
    """Stand-in for vllm.config.kv_events.KVEventsConfig (a config dataclass)."""

    def __init__(self, **kw):
        self.__dict__.update(kw)


class NetworkAddress:
    """Stand-in for sglang.srt.utils.network.NetworkAddress (host:port parsing)."""

    def __init__(self, host, port):
        self.host, self.port = host, port
        self.is_ipv6 = ":" in host

    @classmethod
    def parse(cls, s):
        host, _, port = s.rpartition(":")
        return cls(host.strip("[]"), int(port))

    def to_tcp(self):
        return f"tcp://{self.host}:{self.port}"


class Parallel:
    pp_rank = attn_tp_rank = attn_cp_rank = attn_dp_rank = 0
    attn_dp_size = 1
    dp_rank = 0


def split_zmq_path(path):
    scheme, _, rest = path.partition("://")
    host, _, port = rest.rpartition(":")
    return scheme, host, port


stub("vllm.config.kv_events", KVEventsConfig=KVEventsConfig)
stub("vllm.logger", init_logger=logging.getLogger)
stub(
    "vllm.utils.network_utils",
    get_ip=lambda: "127.0.0.1",
    get_tcp_uri=lambda ip, port: f"tcp://{ip}:{port}",
    is_valid_ipv6_address=lambda ip: False,
    split_zmq_path=split_zmq_path,
)
stub("vllm.v1.core.kv_cache_utils", ExternalBlockHash=bytes | int)
stub("sglang.srt.runtime_context", get_parallel=lambda: Parallel())
stub("sglang.srt.utils.network", NetworkAddress=NetworkAddress)


def load(engine):
    path = os.path.join(SOURCES, VERSIONS[engine], FILES[engine])
    name = FILES[engine][:-3].replace("/", ".")
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


MODULES = {}
PUBLISHERS = {}


def module(engine):
    if engine not in MODULES:
        MODULES[engine] = load(engine)
    return MODULES[engine]


def resolve(mod, v):
    if isinstance(v, str) and v.startswith("$"):
        obj = mod
        for part in v[1:].split("."):
            obj = getattr(obj, part)
        return obj
    return v


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_of(endpoint):
    return int(endpoint.rsplit(":", 1)[1]) if endpoint else None


def start(c):
    # A restart on the same ports: the stopped engine's sockets close asynchronously
    # (ZeroMQ's I/O thread), so binding may fail for a moment. Bounded: 5 s.
    deadline = time.time() + 5
    while True:
        try:
            return start_once(c)
        except Exception as e:
            if "Address already in use" not in str(e) or time.time() > deadline:
                raise
            time.sleep(0.05)


def start_once(c):
    engine, rank = c["engine"], c.get("dp_rank", 0)
    mod = module(engine)
    port, replay_port = c.get("port"), c.get("replay_port")
    if engine == "vllm":
        # "tcp://*:0" binds this node's IP (get_ip(): loopback here) on a free port.
        ep = f"tcp://*:{port}" if port else "tcp://*:0"
        rep = (f"tcp://*:{replay_port}" if replay_port else "tcp://*:0") if c.get("replay") else None
        if port:
            # A fixed port (a restarted engine) binds loopback, as get_ip() would.
            ep = f"tcp://127.0.0.1:{port}"
            mod.ZmqEventPublisher._is_bind_endpoint = staticmethod(lambda e: True)
        if replay_port:
            rep = f"tcp://127.0.0.1:{replay_port}"
        p = mod.ZmqEventPublisher(data_parallel_rank=rank, endpoint=ep, replay_endpoint=rep)
        PUBLISHERS[c["name"]] = (mod, p)
        return {"pub": port_of(p._endpoint), "replay": port_of(p._replay_endpoint)}
    # SGLang: rank r binds the base port + r, so the base is chosen to land on `port`
    # (a free one for a rank above 0: port 0 + r is no free port).
    if rank and not port:
        port = free_port()
    if rank and c.get("replay") and not replay_port:
        replay_port = free_port()
    base = (port - rank) if port else 0
    ep = f"tcp://127.0.0.1:{base}"
    rep = None
    if c.get("replay"):
        rep = f"tcp://127.0.0.1:{(replay_port - rank) if replay_port else 0}"
    p = mod.ZmqEventPublisher(attn_dp_rank=rank, endpoint=ep, replay_endpoint=rep, bind=True)
    PUBLISHERS[c["name"]] = (mod, p)
    return {
        "pub": port_of(p._local_pub_endpoint),
        "replay": port_of(p._local_replay_endpoint),
    }


def hash_value(h):
    if isinstance(h, str) and h.startswith("0x"):
        return bytes.fromhex(h[2:])
    return h


class DropNextSend:
    """Wraps the PUB socket: the next send_multipart is dropped (an injected gap)."""

    def __init__(self, publisher):
        self.publisher, self.sock = publisher, publisher._pub

    def send_multipart(self, frames):
        self.publisher._pub = self.sock


def event(mod, e):
    e = {k: resolve(mod, v) for k, v in e.items()}
    if "block_hashes" in e:
        e["block_hashes"] = [hash_value(h) for h in e["block_hashes"]]
    if e.get("parent_block_hash") is not None:
        e["parent_block_hash"] = hash_value(e["parent_block_hash"])
    kind = e.pop("type")
    salt = e.pop("namespace_salt", None)
    if salt is not None:
        seed = mod.kv_event_namespace_seed(extra_key=None, cache_salt=salt)
        e["block_hashes"] = [
            mod.namespaced_block_hash(h, namespace_seed=seed) for h in e["block_hashes"]
        ]
        if e.get("parent_block_hash") is not None:
            e["parent_block_hash"] = mod.namespaced_block_hash(
                e["parent_block_hash"], namespace_seed=seed
            )
    cls = getattr(mod, kind)
    if kind == "BlockStored":
        e.setdefault("parent_block_hash", None)
        e.setdefault("lora_id", None)
        e.setdefault("medium", None)
        e.setdefault("lora_name", None)
    if kind == "BlockRemoved":
        e.setdefault("medium", None)
    return cls(**e)


def publish(c):
    mod, p = PUBLISHERS[c["name"]]
    batch = mod.KVEventBatch(ts=time.time(), events=[event(mod, e) for e in c["events"]])
    if c.get("lost"):
        p._pub = DropNextSend(p)
    p.publish(batch)
    # The publisher thread sends it; wait (bounded) until it did.
    deadline = time.time() + 5
    while p._event_queue.unfinished_tasks and time.time() < deadline:
        time.sleep(0.002)
    return {"ok": True}


def stop(c):
    _, p = PUBLISHERS.pop(c["name"])
    p.shutdown()
    return {"ok": True}


def main():
    logging.basicConfig(level=logging.WARNING)
    for line in sys.stdin:
        c = json.loads(line)
        if c["op"] == "quit":
            break
        try:
            out = {"start": start, "publish": publish, "stop": stop}[c["op"]](c)
        except Exception as e:  # reported to the test, which fails with it
            out = {"error": f"{type(e).__name__}: {e}"}
        print(json.dumps(out), flush=True)
    for _, p in PUBLISHERS.values():
        p.shutdown()


if __name__ == "__main__":
    main()
