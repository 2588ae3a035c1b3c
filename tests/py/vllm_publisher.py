#!/usr/bin/env python3
"""Fake vLLM KV-event publishers for kvroute's ZMQ ingest tests.

Mirrors vllm/distributed/kv_events.py: msgspec structs for KVEventBatch, a PUB socket
sending [topic, seq (8 bytes big-endian), msgpack payload], and an optional ROUTER
replay socket that answers a start sequence (8 bytes big-endian) with every buffered
[seq, payload] from there on, then [-1, b""]. The PUB side is an XPUB so the test can
wait until kvroute's subscription arrived (a PUB cannot tell); subscribers cannot see
the difference.

Usage: vllm_publisher.py ENCODING HASHES PUB_PORT[:REPLAY_PORT] ...
  ENCODING: positional (array_like=True, tag=True, omit_defaults=True: vLLM up to 2025)
            or map (type-tagged maps with named fields and an extra `locality` field,
            the 2026 encoding); HASHES: int (u64 beyond i64) or bytes (32-byte digests).
Commands, one JSON object per line on stdin, each answered by one line on stdout:
  {"op": "wait_sub", "engine": 0}
  {"op": "store", "engine": 0, "blocks": ["a", "b"], "parent": "x" | null,
   "tokens": [...], "block_size": 4, "medium": "GPU", "lora_name": null, "lost": false}
  {"op": "remove", "engine": 0, "blocks": ["a"], "medium": "GPU", "lost": false}
  {"op": "clear", "engine": 0}
  {"op": "quit"}
Block names are turned into engine hashes deterministically; "lost": true buffers the
batch for replay but does not publish it (an injected gap).
"""

import hashlib
import json
import sys
import time
from typing import Any, Optional, Union

import msgspec
import zmq

ExternalBlockHash = Union[bytes, int]


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: Optional[int] = None


class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    """Positional encoding: ["BlockStored", field, field, ...]."""


class BlockStored(KVCacheEvent):
    block_hashes: list[ExternalBlockHash]
    parent_block_hash: Optional[ExternalBlockHash]
    token_ids: list[int]
    block_size: int
    lora_id: Optional[int]
    medium: Optional[str] = None
    lora_name: Optional[str] = None
    extra_keys: Optional[list[Any]] = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[ExternalBlockHash]
    medium: Optional[str] = None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[Union[BlockStored, BlockRemoved, AllBlocksCleared]]


# The 2026 encoding: maps with a "type" tag, named fields, defaults omitted, new fields.
class MapEvent(msgspec.Struct, omit_defaults=True, gc=False, tag_field="type", tag=True):
    pass


class MapBlockStored(MapEvent, tag="BlockStored"):
    block_hashes: list[ExternalBlockHash]
    parent_block_hash: Optional[ExternalBlockHash]
    token_ids: list[int]
    block_size: int
    lora_id: Optional[int] = None
    medium: Optional[str] = None
    lora_name: Optional[str] = None
    locality: Optional[str] = "rack-1"


class MapBlockRemoved(MapEvent, tag="BlockRemoved"):
    block_hashes: list[ExternalBlockHash]
    medium: Optional[str] = None
    locality: Optional[str] = "rack-1"


class MapAllBlocksCleared(MapEvent, tag="AllBlocksCleared"):
    pass


class MapBatch(msgspec.Struct, omit_defaults=True, gc=False):
    ts: float
    events: list[Union[MapBlockStored, MapBlockRemoved, MapAllBlocksCleared]]
    data_parallel_rank: Optional[int] = None


END_SEQ = (-1).to_bytes(8, "big", signed=True)


def bind(sock, port):
    if port == 0:
        return sock.bind_to_random_port("tcp://127.0.0.1")
    sock.bind(f"tcp://127.0.0.1:{port}")
    return port


class Engine:
    def __init__(self, ctx, pub_port, replay_port):
        # Port 0: the OS picks a free port while the socket binds (no window in
        # which another process could take it); the ports go out on the ready line.
        self.pub = ctx.socket(zmq.XPUB)
        self.pub_port = bind(self.pub, pub_port)
        self.replay = None
        self.replay_port = None
        if replay_port is not None:
            self.replay = ctx.socket(zmq.ROUTER)
            self.replay_port = bind(self.replay, replay_port)
        self.seq = 0
        self.buffer = []
        self.subscribed = False

    def publish(self, payload, lost):
        seq = self.seq
        self.seq += 1
        self.buffer.append((seq, payload))
        if not lost:
            self.pub.send_multipart((b"", seq.to_bytes(8, "big"), payload))

    def service(self):
        """Answers pending replay requests and notes subscriptions."""
        while self.pub.poll(0):
            if self.pub.recv()[:1] == b"\x01":
                self.subscribed = True
        while self.replay is not None and self.replay.poll(0):
            frame = self.replay.recv_multipart()
            if len(frame) != 3:
                continue
            client, _, start = frame
            start = int.from_bytes(start, "big")
            for seq, payload in self.buffer:
                if seq >= start:
                    self.replay.send_multipart((client, b"", seq.to_bytes(8, "big"), payload))
            self.replay.send_multipart((client, b"", END_SEQ, b""))


def main():
    encoding, hashes = sys.argv[1], sys.argv[2]
    ctx = zmq.Context()
    engines = []
    for spec in sys.argv[3:]:
        pub, _, replay = spec.partition(":")
        engines.append(Engine(ctx, int(pub), int(replay) if replay != "" else None))
    enc = msgspec.msgpack.Encoder()

    def h(name):
        d = hashlib.sha256(f"{hashes}:{name}".encode()).digest()
        if hashes == "bytes":
            return d
        return int.from_bytes(d[:8], "big") | (1 << 63)  # beyond i64

    def batch(events):
        if encoding == "positional":
            return enc.encode(KVEventBatch(ts=time.time(), events=events))
        return enc.encode(MapBatch(ts=time.time(), events=events, data_parallel_rank=0))

    ports = " ".join(f"{e.pub_port}:{e.replay_port or ''}" for e in engines)
    print(f"ready {ports}", flush=True)
    # Serve replays while waiting for commands (bounded: the test ends within minutes).
    import selectors

    sel = selectors.DefaultSelector()
    sel.register(sys.stdin, selectors.EVENT_READ)
    deadline = time.time() + 300
    while time.time() < deadline:
        for e in engines:
            e.service()
        if not sel.select(timeout=0.01):
            continue
        line = sys.stdin.readline()
        if not line:
            break
        cmd = json.loads(line)
        op = cmd["op"]
        if op == "quit":
            print("ok", flush=True)
            break
        e = engines[cmd.get("engine", 0)]
        if op == "wait_sub":
            until = time.time() + 20
            while not e.subscribed and time.time() < until:
                e.service()
                time.sleep(0.01)
            print("ok" if e.subscribed else "timeout", flush=True)
            continue
        medium = cmd.get("medium")
        if op == "store":
            args = dict(
                block_hashes=[h(b) for b in cmd["blocks"]],
                parent_block_hash=h(cmd["parent"]) if cmd.get("parent") else None,
                token_ids=cmd["tokens"],
                block_size=cmd["block_size"],
                lora_id=1 if cmd.get("lora_name") else None,
                medium=medium,
                lora_name=cmd.get("lora_name"),
            )
            ev = BlockStored(**args) if encoding == "positional" else MapBlockStored(**args, locality="rack-7")
        elif op == "remove":
            blocks = [h(b) for b in cmd["blocks"]]
            if encoding == "positional":
                ev = BlockRemoved(block_hashes=blocks, medium=medium)
            else:
                ev = MapBlockRemoved(block_hashes=blocks, medium=medium)
        elif op == "clear":
            ev = AllBlocksCleared() if encoding == "positional" else MapAllBlocksCleared()
        else:
            print(f"unknown op {op}", flush=True)
            continue
        e.publish(batch([ev]), cmd.get("lost", False))
        print("ok", flush=True)
    for e in engines:
        e.pub.close(0)
        if e.replay is not None:
            e.replay.close(0)
    ctx.term()


if __name__ == "__main__":
    main()
