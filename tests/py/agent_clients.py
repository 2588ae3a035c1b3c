#!/usr/bin/env python3
"""Drives the Anthropic Messages and OpenAI Responses endpoints (and embeddings) with
the official `anthropic` and `openai` clients, streamed and not, the way agents call
them: a long conversation sent twice, a `previous_response_id` follow-up. Prints one
JSON object of what came back (tests/sim_agent_apis.rs).

Usage: agent_clients.py BASE_URL API_KEY MODEL PROMPT
BASE_URL without /v1; API_KEY sent as a bearer token (vLLM reads no x-api-key; the
anthropic client sends its api_key as a bearer token too)."""
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
m = a.messages.create(model=model, max_tokens=4, system="t1 t2", messages=convo, tools=tools)
out["messages"] = {"id": m.id, "text": "".join(b.text for b in m.content if b.type == "text"),
                   "stop_reason": m.stop_reason, "output_tokens": m.usage.output_tokens,
                   "input_tokens": m.usage.input_tokens}
events, text = [], ""
with a.messages.stream(model=model, max_tokens=3, system="t1 t2", messages=convo, tools=tools) as s:
    for ev in s:
        events.append(ev.type)
        if ev.type == "content_block_delta" and ev.delta.type == "text_delta":
            text += ev.delta.text
    final = s.get_final_message()
out["messages_stream"] = {"events": events, "text": text, "output_tokens": final.usage.output_tokens}
try:
    a.messages.create(model="nope", max_tokens=1, messages=[{"role": "user", "content": "x"}])
except anthropic.NotFoundError as e:
    out["messages_not_found"] = {"status": e.status_code, "type": e.body["error"]["type"] if isinstance(e.body, dict) else None}

o = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=60)
r = o.responses.create(model=model, instructions="t1 t2", input=prompt, max_output_tokens=4)
out["responses"] = {"id": r.id, "text": r.output_text, "output_tokens": r.usage.output_tokens,
                    "input_tokens": r.usage.input_tokens}
f = o.responses.create(model=model, previous_response_id=r.id, input="t9 t10", max_output_tokens=2)
out["follow_up"] = {"id": f.id, "text": f.output_text, "input_tokens": f.usage.input_tokens}
events, text, done = [], "", None
for ev in o.responses.create(model=model, input=prompt, max_output_tokens=3, stream=True):
    events.append(ev.type)
    if ev.type == "response.output_text.delta":
        text += ev.delta
    if ev.type == "response.completed":
        done = ev.response
out["responses_stream"] = {"events": events, "text": text, "id": done.id,
                           "output_tokens": done.usage.output_tokens}
try:
    o.responses.create(model=model, previous_response_id="resp_unknown", input="x")
except openai.NotFoundError as e:
    out["previous_not_found"] = {"status": e.status_code, "message": e.body.get("message") if isinstance(e.body, dict) else str(e.body)}
e = o.embeddings.create(model=model, input=["t1 t2", "t3"])
out["embeddings"] = {"n": len(e.data), "dims": len(e.data[0].embedding), "prompt_tokens": e.usage.prompt_tokens}
print(json.dumps(out))
