#!/usr/bin/env python3
"""Drives kvroute's proxy with the official `anthropic` and `openai` clients, the way
agents call it: Messages and Responses, streamed and not, a `previous_response_id`
follow-up, embeddings, and the proxy's own errors in each API's shape. Prints one JSON
object of what came back, with the worker that answered each call (tests/proxy_agents.rs).

Usage: proxy_agent_clients.py PROXY_URL API_KEY MODEL PROMPT
Both clients send API_KEY as a bearer token (the anthropic SDK 2.x does); tests/proxy_agents.rs
sends `x-api-key` itself."""
import json
import sys

import anthropic
import openai

from agent_convo import TOOLS, conversation

base, key, model, prompt = sys.argv[1:5]
out = {}

a = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0, timeout=60)
convo = conversation(prompt)
tools = TOOLS
raw = a.messages.with_raw_response.create(model=model, max_tokens=4, system="t1 t2", messages=convo, tools=tools)
m = raw.parse()
out["messages"] = {"worker": raw.headers.get("x-kvroute-worker"), "stop_reason": m.stop_reason,
                   "output_tokens": m.usage.output_tokens,
                   "words": len("".join(b.text for b in m.content if b.type == "text").split())}
events = []
with a.messages.stream(model=model, max_tokens=3, system="t1 t2", messages=convo, tools=tools) as s:
    for ev in s:
        events.append(ev.type)
    final = s.get_final_message()
out["messages_stream"] = {"events": events, "output_tokens": final.usage.output_tokens}
try:
    a.messages.create(model=model, max_tokens=1, messages=[])
except anthropic.BadRequestError as e:
    out["messages_bad"] = {"status": e.status_code, "body": e.body}
try:
    anthropic.Anthropic(base_url=base, api_key="wrong", max_retries=0).messages.create(
        model=model, max_tokens=1, messages=[{"role": "user", "content": "t1"}])
except anthropic.AuthenticationError as e:
    out["messages_unauthorized"] = {"status": e.status_code, "body": e.body}

o = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=60)
raw = o.responses.with_raw_response.create(model=model, instructions="t1 t2", input=prompt, max_output_tokens=4)
r = raw.parse()
out["responses"] = {"id": r.id, "worker": raw.headers.get("x-kvroute-worker"),
                    "output_tokens": r.usage.output_tokens, "input_tokens": r.usage.input_tokens}
raw = o.responses.with_raw_response.create(model=model, previous_response_id=r.id, input="t9 t10", max_output_tokens=2)
f = raw.parse()
out["follow_up"] = {"id": f.id, "worker": raw.headers.get("x-kvroute-worker"), "input_tokens": f.usage.input_tokens}
events, done = [], None
for ev in o.responses.create(model=model, input=prompt, max_output_tokens=3, stream=True):
    events.append(ev.type)
    if ev.type == "response.completed":
        done = ev.response
out["responses_stream"] = {"events": events, "id": done.id, "output_tokens": done.usage.output_tokens}
raw = o.embeddings.with_raw_response.create(model=model, input=["t1 t2", "t3"])
e = raw.parse()
out["embeddings"] = {"n": len(e.data), "worker": raw.headers.get("x-kvroute-worker")}
print(json.dumps(out))
