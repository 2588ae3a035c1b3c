#!/usr/bin/env python3
"""A small fake OpenAI-compatible worker for the proxy tests (tests/proxy.rs).

stdlib only (http.server, threads). Serves POST /v1/completions and
/v1/chat/completions (stream true: SSE over chunked transfer encoding, one token per
chunk, `--delay-ms` between chunks, `max_tokens` honoured, a usage chunk when
`stream_options.include_usage`; stream false: one JSON answer), GET /health, and the
vLLM NIXL flow: a request whose `kv_transfer_params.do_remote_decode` is true answers
with `kv_transfer_params` naming this worker.

Per-request hooks in the body (the proxy forwards unknown members): `x_head_delay_ms`
(no response head for that long; a client that closes meanwhile is counted in
`aborted`, as vLLM aborts on disconnect), `x_stall_after` (a stream stops after that
many events and waits for the client to go away), `x_json_bytes` (a non-streamed
answer whose text is that many bytes of "abcdefghij" repeated, sent chunked in
64 KiB pieces, usage 7 tokens) with `x_hold` (the answer never ends: the worker
waits for the client to go away).

Test hooks: POST /_mode {"mode": ...} switches the mode (ok | fail | hang | die_mid | busy: 429 with retry-after 3),
GET /_stats says what it received ({"received": [...bodies and headers...],
"aborted": n, "completed": n, "active": n, "health_auth": [authorization of each
GET /health]}). `--mode` sets the starting mode.
Prints "PORT <n>" on stdout once listening (bind port 0).
"""
import argparse
import json
import select
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOCK = threading.Lock()
STATE = {"mode": "ok", "received": [], "aborted": 0, "completed": 0, "active": 0,
         "health_auth": []}
ARGS = None


def big_answer_parts(n):
    """The head, body pieces and tail of an `x_json_bytes` answer (tests rebuild it)."""
    head = b'{"id":"cmpl-big","object":"text_completion","model":"m","choices":[{"index":0,"text":"'
    tail = (b'","finish_reason":"length"}],'
            b'"usage":{"prompt_tokens":1,"completion_tokens":7,"total_tokens":8}}')
    return head, n, tail


def stats_snapshot():
    with LOCK:
        return {k: (list(v) if isinstance(v, list) else v) for k, v in STATE.items()}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def send_json(self, code, obj):
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()

    def do_GET(self):
        if self.path == "/health":
            with LOCK:
                STATE["health_auth"].append(self.headers.get("authorization"))
            mode = STATE["mode"]
            if mode in ("fail", "hang"):
                self.send_json(500, {"status": "unhealthy"})
            else:
                self.send_json(200, {"status": "ok"})
        elif self.path == "/_stats":
            self.send_json(200, stats_snapshot())
        else:
            self.send_json(404, {"error": "not found"})

    def read_body(self):
        n = int(self.headers.get("content-length") or 0)
        return self.rfile.read(n) if n else b""

    def do_POST(self):
        raw = self.read_body()
        if self.path == "/_mode":
            with LOCK:
                STATE["mode"] = json.loads(raw)["mode"]
            self.send_json(200, {"mode": STATE["mode"]})
            return
        if self.path not in ("/v1/completions", "/v1/chat/completions"):
            self.send_json(404, {"error": "not found"})
            return
        try:
            body = json.loads(raw)
        except Exception:
            self.send_json(400, {"error": {"message": "bad json"}})
            return
        with LOCK:
            STATE["received"].append({
                "path": self.path,
                "body": body,
                "raw": raw.decode("utf-8", "replace"),
                "x_request_id": self.headers.get("x-request-id"),
                "authorization": self.headers.get("authorization"),
                "traceparent": self.headers.get("traceparent"),
                "tracestate": self.headers.get("tracestate"),
            })
            mode = STATE["mode"]
            STATE["active"] += 1
        try:
            self.answer(body, mode)
        finally:
            with LOCK:
                STATE["active"] -= 1

    def client_gone(self, seconds):
        """Waits up to `seconds`; True as soon as the client closed its connection."""
        end = time.time() + seconds
        while time.time() < end:
            try:
                r, _, _ = select.select([self.connection], [], [], 0.05)
                if r and self.connection.recv(1, socket.MSG_PEEK) == b"":
                    return True
            except OSError:
                return True
        return False

    def count_abort(self):
        with LOCK:
            STATE["aborted"] += 1
        self.close_connection = True

    def big_json(self, body):
        n = int(body["x_json_bytes"])
        head, n, tail = big_answer_parts(n)
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        piece = b"abcdefghij" * 6554

        def chunk(b):
            self.wfile.write(b"%x\r\n%s\r\n" % (len(b), b))

        try:
            chunk(head)
            left = n
            while left > 0:
                b = piece[:min(left, 65530)]
                chunk(b)
                left -= len(b)
            self.wfile.flush()
            if body.get("x_hold"):
                self.client_gone(3600)
                self.count_abort()
                return
            chunk(tail)
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
            with LOCK:
                STATE["completed"] += 1
        except OSError:
            self.count_abort()

    def answer(self, body, mode):
        chat = self.path.endswith("chat/completions")
        delay = body.get("x_head_delay_ms")
        if delay and self.client_gone(delay / 1000.0):
            self.count_abort()
            return
        if body.get("x_json_bytes") and not body.get("stream"):
            self.big_json(body)
            return
        if mode == "fail":
            self.send_json(500, {"error": {"message": "injected failure"}})
            return
        if mode == "hang":
            time.sleep(3600)
            return
        if mode == "busy":
            # At its limit, as vLLM / the simulated fleet say it: 429 + retry-after.
            body = json.dumps({"error": {"message": "worker at its limit",
                                         "type": "rate_limit_exceeded"}}).encode()
            self.send_response(429)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.send_header("retry-after", "3")
            self.end_headers()
            self.wfile.write(body)
            self.wfile.flush()
            return
        n = int(body.get("max_tokens") or body.get("max_completion_tokens") or 4)
        n = max(1, min(n, 256))
        kvp = body.get("kv_transfer_params") or {}
        out_kvp = None
        if kvp.get("do_remote_decode"):
            out_kvp = {
                "do_remote_prefill": True,
                "do_remote_decode": False,
                "remote_engine_id": ARGS.id,
                "remote_block_ids": [1, 2, 3],
                "remote_host": "127.0.0.1",
                "remote_port": self.server.server_address[1],
            }
        rid = "cmpl-%s-%d" % (ARGS.id, int(time.time() * 1e6))
        model = body.get("model") or "m"
        if not body.get("stream"):
            text = "".join("t%d " % i for i in range(n))
            if chat:
                choice = {"index": 0, "message": {"role": "assistant", "content": text},
                          "finish_reason": "length"}
                obj = "chat.completion"
            else:
                choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}
                obj = "text_completion"
            ans = {"id": rid, "object": obj, "created": int(time.time()), "model": model,
                   "choices": [choice],
                   "usage": {"prompt_tokens": 1, "completion_tokens": n, "total_tokens": n + 1},
                   "served_by": ARGS.id}
            if out_kvp is not None:
                ans["kv_transfer_params"] = out_kvp
            self.send_json(200, ans)
            with LOCK:
                STATE["completed"] += 1
            return
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("transfer-encoding", "chunked")
        self.send_header("x-served-by", ARGS.id)
        self.end_headers()

        def chunk(data):
            b = data.encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(b), b))
            self.wfile.flush()

        def event(obj):
            chunk("data: " + json.dumps(obj) + "\n\n")

        def piece(i):
            if chat:
                delta = {"content": "t%d " % i}
                if i == 0:
                    delta["role"] = "assistant"
                return {"id": rid, "object": "chat.completion.chunk", "created": 0,
                        "model": model,
                        "choices": [{"index": 0, "delta": delta,
                                     "finish_reason": "length" if i == n - 1 else None}]}
            return {"id": rid, "object": "text_completion", "created": 0, "model": model,
                    "choices": [{"index": 0, "text": "t%d " % i, "logprobs": None,
                                 "finish_reason": "length" if i == n - 1 else None}]}

        try:
            for i in range(n):
                if i > 0 and ARGS.delay_ms:
                    time.sleep(ARGS.delay_ms / 1000.0)
                if body.get("x_stall_after") is not None and i == body["x_stall_after"]:
                    self.client_gone(3600)
                    raise BrokenPipeError("client gone")
                if mode == "die_mid" and i == 2:
                    # Drop the connection without the terminating chunk.
                    self.connection.shutdown(socket.SHUT_RDWR)
                    self.close_connection = True
                    return
                event(piece(i))
            if (body.get("stream_options") or {}).get("include_usage"):
                event({"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
                       "created": 0, "model": model, "choices": [],
                       "usage": {"prompt_tokens": 1, "completion_tokens": n,
                                 "total_tokens": n + 1}})
            chunk("data: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
            with LOCK:
                STATE["completed"] += 1
        except (BrokenPipeError, ConnectionResetError, OSError):
            with LOCK:
                STATE["aborted"] += 1
            self.close_connection = True


def main():
    global ARGS
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--id", default="w")
    p.add_argument("--mode", default="ok")
    p.add_argument("--delay-ms", type=int, default=0)
    ARGS = p.parse_args()
    STATE["mode"] = ARGS.mode
    # The default listen backlog (5) overflows when a test opens dozens of connections
    # at once on a loaded machine: the kernel then drops SYNs, and a connect can wait
    # past the proxy's connect timeout. A real engine's backlog is far larger.
    ThreadingHTTPServer.request_queue_size = 1024
    srv = ThreadingHTTPServer(("127.0.0.1", ARGS.port), Handler)
    srv.daemon_threads = True
    print("PORT %d" % srv.server_address[1], flush=True)
    srv.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
