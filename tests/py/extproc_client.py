"""An ext_proc client that talks to an endpoint picker the way a gateway does.

It plays Envoy's side of `envoy.service.ext_proc.v3.ExternalProcessor/Process` with
the messages of the `xds-protos` package (Envoy's own protos) over grpcio, for the
Rust tests: each request of a JSON script (stdin) is one ext_proc stream, sent in a
body mode as Envoy sends it, and what the picker answered is printed as one JSON line
per request (stdout).

Body modes, as Envoy's ext_proc filter behaves in them:
- "full_duplex" (FULL_DUPLEX_STREAMED, the inference gateways' mode): headers and
  body chunks go out without waiting; the headers answer (the pick) comes after the
  last chunk, then the body handed back; the response body is streamed the same way.
- "buffered": headers, wait for their answer; the whole body in one message; the pick
  rides on the body's answer.
- "streamed": STREAMED with send_body_without_waiting_for_header_response.
- "none": no request body is sent (request_body_mode NONE).

A request script: {"mode", "method", "path", "headers": {..}, "body": str,
"chunk": int, "trailers": bool, "subset": [..] | str | null, "protocol_config": bool,
"cut": null | "after_pick" | "after_response_headers", "hold": seconds to wait
after the pick (before the cut or the response), "response": null |
{"status", "content_type", "chunks": [str], "trailers": bool, "served": str}}.
Special scripts: {"op": "garbage"} sends bytes that are not protobuf;
{"op": "health", "service": name} asks grpc.health.v1.

Every wait is bounded (the stream deadline, 20 s by default); a server that never
answers fails the script rather than hanging the test.
"""

import json
import queue
import sys
import time

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ep_grpc
from google.protobuf import struct_pb2

MODES = {
    "none": processing_mode_pb2.ProcessingMode.NONE,
    "streamed": processing_mode_pb2.ProcessingMode.STREAMED,
    "buffered": processing_mode_pb2.ProcessingMode.BUFFERED,
    "full_duplex": processing_mode_pb2.ProcessingMode.FULL_DUPLEX_STREAMED,
}
DEADLINE = 20.0


def header_map(pairs):
    m = base_pb2.HeaderMap()
    for k, v in pairs:
        m.headers.append(base_pb2.HeaderValue(key=k.lower(), raw_value=v.encode()))
    return m


def subset_metadata(subset):
    md = base_pb2.Metadata()
    if subset is None:
        return md
    s = struct_pb2.Struct()
    if isinstance(subset, str):
        s.update({"x-gateway-destination-endpoint-subset": subset})
    else:
        s.update({"x-gateway-destination-endpoint-subset": list(subset)})
    md.filter_metadata["envoy.lb.subset_hint"].CopyFrom(s)
    return md


def served_metadata(served):
    md = base_pb2.Metadata()
    if served:
        s = struct_pb2.Struct()
        s.update({"x-gateway-destination-endpoint-served": served})
        md.filter_metadata["envoy.lb"].CopyFrom(s)
    return md


class Stream:
    """One bidirectional Process call: `send` queues a message, `recv` waits for one."""

    def __init__(self, stub):
        self.q = queue.Queue()
        self.call = stub.Process(iter(self.q.get, None), timeout=DEADLINE)

    def send(self, msg):
        self.q.put(msg)

    def recv(self):
        return next(self.call)

    def close(self):
        self.q.put(None)

    def cut(self):
        self.call.cancel()


def summarize(resp, out):
    """Records what one ProcessingResponse said."""
    kind = resp.WhichOneof("response")
    out.setdefault("kinds", []).append(kind)
    if kind == "immediate_response":
        ir = resp.immediate_response
        out["immediate"] = {
            "status": ir.status.code,
            "body": json.loads(ir.body.decode() or "null"),
            "headers": {
                h.header.key: h.header.raw_value.decode() for h in ir.headers.set_headers
            },
        }
        return
    common = getattr(resp, kind).response if kind != "request_trailers" and kind != "response_trailers" else None
    if common is None:
        return
    for h in common.header_mutation.set_headers:
        out.setdefault("set_headers", {})[h.header.key] = h.header.raw_value.decode()
    if common.clear_route_cache:
        out["clear_route_cache"] = True
    if resp.HasField("dynamic_metadata"):
        lb = resp.dynamic_metadata.fields.get("envoy.lb")
        if lb is not None:
            v = lb.struct_value.fields.get("x-gateway-destination-endpoint")
            if v is not None:
                out["destination_metadata"] = v.string_value
    if common.HasField("body_mutation"):
        bm = common.body_mutation
        if bm.WhichOneof("mutation") == "streamed_response":
            side = "request_body_back" if kind == "request_body" else "response_body_back"
            out[side] = out.get(side, "") + bm.streamed_response.body.decode()
            if bm.streamed_response.end_of_stream:
                out[side + "_eos"] = True


def chunks_of(body, size):
    b = body.encode()
    if size <= 0 or not b:
        return [b]
    return [b[i : i + size] for i in range(0, len(b), size)]


def request_phase(s, spec, out):
    """Sends the request side; returns False when the exchange ended (refused)."""
    mode = spec.get("mode", "full_duplex")
    pairs = [(":method", spec.get("method", "POST")), (":path", spec.get("path", "/v1/chat/completions"))]
    pairs += list(spec.get("headers", {"content-type": "application/json"}).items())
    body = spec.get("body")
    has_body = body is not None and mode != "none"
    first = ep.ProcessingRequest(
        # The HTTP request's own end (a body exists even when the mode sends none).
        request_headers=ep.HttpHeaders(headers=header_map(pairs), end_of_stream=body is None),
        metadata_context=subset_metadata(spec.get("subset")),
    )
    if spec.get("protocol_config", True):
        first.protocol_config.CopyFrom(
            ep.ProtocolConfiguration(
                request_body_mode=MODES[mode],
                response_body_mode=MODES[mode],
                send_body_without_waiting_for_header_response=(mode == "streamed"),
            )
        )
    s.send(first)
    if not has_body:
        summarize(s.recv(), out)
        return "immediate" not in out
    parts = chunks_of(body, spec.get("chunk", 0)) if mode != "buffered" else [body.encode()]
    trailers = spec.get("trailers", False)
    if mode == "buffered":
        summarize(s.recv(), out)  # the headers' answer comes first
        if "immediate" in out:
            return False
    for i, p in enumerate(parts):
        last = i == len(parts) - 1
        s.send(ep.ProcessingRequest(request_body=ep.HttpBody(body=p, end_of_stream=last and not trailers)))
    if trailers:
        s.send(ep.ProcessingRequest(request_trailers=ep.HttpTrailers(trailers=header_map([]))))
    # Answers: (headers) + one per chunk or the body handed back, + trailers.
    while True:
        resp = s.recv()
        summarize(resp, out)
        kind = resp.WhichOneof("response")
        if kind == "immediate_response":
            return False
        if mode == "buffered" and kind == "request_body":
            return True
        if mode == "full_duplex" and out.get("request_body_back_eos") and not trailers:
            return True
        if mode == "streamed" and out["kinds"].count("request_body") == len(parts) and not trailers:
            return True
        if kind == "request_trailers":
            return True


def response_phase(s, spec, out):
    r = spec["response"]
    mode = spec.get("mode", "full_duplex")
    pairs = [(":status", str(r.get("status", 200))), ("content-type", r.get("content_type", "text/event-stream"))]
    chunks = r.get("chunks", [])
    s.send(
        ep.ProcessingRequest(
            response_headers=ep.HttpHeaders(headers=header_map(pairs), end_of_stream=not chunks),
            metadata_context=served_metadata(r.get("served")),
        )
    )
    summarize(s.recv(), out)
    if spec.get("cut") == "after_response_headers":
        s.cut()
        out["cut"] = True
        return
    trailers = r.get("trailers", False)
    for i, c in enumerate(chunks):
        last = i == len(chunks) - 1
        s.send(ep.ProcessingRequest(response_body=ep.HttpBody(body=c.encode(), end_of_stream=last and not trailers)))
        if mode != "full_duplex":
            summarize(s.recv(), out)
    if mode == "full_duplex" and chunks:
        while not out.get("response_body_back_eos") and len(out.get("response_body_back", "")) < len("".join(chunks)):
            summarize(s.recv(), out)
        if not trailers:
            while not out.get("response_body_back_eos"):
                summarize(s.recv(), out)
    if trailers:
        s.send(ep.ProcessingRequest(response_trailers=ep.HttpTrailers(trailers=header_map([]))))
        summarize(s.recv(), out)


def run_request(stub, spec):
    out = {}
    s = Stream(stub)
    try:
        picked = request_phase(s, spec, out)
        if picked and spec.get("hold"):
            # The upstream thinking: the stream stays open, nothing sent.
            time.sleep(spec["hold"])
        if picked and spec.get("cut") == "after_pick":
            s.cut()
            out["cut"] = True
        elif "immediate" not in out and spec.get("response") is not None:
            response_phase(s, spec, out)
        if not out.get("cut"):
            s.close()
            # The server ends its side once the gateway does.
            for resp in s.call:
                summarize(resp, out)
    except grpc.RpcError as e:
        if e.code() != grpc.StatusCode.CANCELLED or not out.get("cut"):
            out["grpc_error"] = {"code": e.code().name, "details": e.details()}
    hm = out.get("set_headers", {})
    if "x-gateway-destination-endpoint" in hm:
        out["destination_header"] = hm["x-gateway-destination-endpoint"]
    return out


def garbage(channel):
    call = channel.stream_stream(
        "/envoy.service.ext_proc.v3.ExternalProcessor/Process",
        request_serializer=lambda b: b,
        response_deserializer=lambda b: b,
    )
    try:
        list(call(iter([b"\xff\xff\xff\xff not protobuf"]), timeout=DEADLINE))
        return {"grpc_error": None}
    except grpc.RpcError as e:
        return {"grpc_error": {"code": e.code().name, "details": e.details()}}


def health(channel, service):
    """grpc.health.v1.Health/Check, its two one-field messages encoded by hand (the
    health protos are not in xds-protos): request `string service = 1`, answer
    `ServingStatus status = 1`."""
    name = service.encode()
    req = b"\x0a" + bytes([len(name)]) + name if name else b""
    call = channel.unary_unary(
        "/grpc.health.v1.Health/Check",
        request_serializer=lambda b: b,
        response_deserializer=lambda b: b,
    )
    try:
        r = call(req, timeout=DEADLINE)
        code = r[1] if len(r) >= 2 and r[0] == 0x08 else 0
        names = {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}
        return {"status": names.get(code, str(code))}
    except grpc.RpcError as e:
        return {"grpc_error": {"code": e.code().name, "details": e.details()}}


def main():
    addr = sys.argv[1]
    scripts = json.load(sys.stdin)
    with grpc.insecure_channel(addr) as channel:
        stub = ep_grpc.ExternalProcessorStub(channel)
        for spec in scripts:
            op = spec.get("op", "request")
            if op == "garbage":
                out = garbage(channel)
            elif op == "health":
                out = health(channel, spec.get("service", ""))
            else:
                out = run_request(stub, spec)
            print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
