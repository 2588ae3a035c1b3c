#!/usr/bin/env python3
"""A real OTLP trace receiver for the tracing tests (tests/trace_otlp.rs): the
`opentelemetry-proto` messages behind a grpcio server (`grpc`), or behind an HTTP
server taking protobuf POSTs on /v1/traces (`http`); or a TCP port that accepts
connections and never answers (`stall`, a collector that hangs).

Prints `port N`, then one JSON line per received span (trace/span/parent ids in hex,
name, kind, attributes, the resource's service.name). Exits when stdin closes, or
after 300 s at most.

Usage: otlp_receiver.py grpc|http|stall"""
import json
import socket
import sys
import threading
from concurrent import futures
from http.server import BaseHTTPRequestHandler, HTTPServer

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

lock = threading.Lock()


def value(v):
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


def dump(req):
    with lock:
        for rs in req.resource_spans:
            service = next((value(a.value) for a in rs.resource.attributes
                            if a.key == "service.name"), None)
            # `scope_spans` (field 2) was `instrumentation_library_spans` in older
            # opentelemetry-proto releases: the same field on the wire.
            scopes = (rs.scope_spans if "scope_spans" in rs.DESCRIPTOR.fields_by_name
                      else rs.instrumentation_library_spans)
            for ss in scopes:
                for s in ss.spans:
                    print(json.dumps({
                        "trace_id": s.trace_id.hex(), "span_id": s.span_id.hex(),
                        "parent_span_id": s.parent_span_id.hex(), "name": s.name,
                        "kind": s.kind, "service": service,
                        "attributes": {a.key: value(a.value) for a in s.attributes},
                        "status": s.status.code,
                    }), flush=True)


class Traces(trace_service_pb2_grpc.TraceServiceServicer):
    def Export(self, request, context):
        dump(request)
        return trace_service_pb2.ExportTraceServiceResponse()


class Http(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        ok = self.path == "/v1/traces"
        if ok:
            dump(trace_service_pb2.ExportTraceServiceRequest.FromString(body))
        out = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
        self.send_response(200 if ok else 404)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *a):
        pass


mode = sys.argv[1]
if mode == "grpc":
    import grpc
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Traces(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
elif mode == "http":
    server = HTTPServer(("127.0.0.1", 0), Http)
    port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
else:
    stall = socket.socket()
    stall.bind(("127.0.0.1", 0))
    stall.listen(1024)
    port = stall.getsockname()[1]
print(f"port {port}", flush=True)
done = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
done.wait(300)
