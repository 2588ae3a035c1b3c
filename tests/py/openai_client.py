#!/usr/bin/env python3
"""Drives kvroute's proxy with the official `openai` client (tests/proxy.rs):
chat and completions, streamed and not. Prints one JSON object of what came back.
Usage: openai_client.py BASE_URL API_KEY MODEL"""
import json
import sys

import openai

base, key, model = sys.argv[1:4]
c = openai.OpenAI(base_url=base, api_key=key, max_retries=0, timeout=60)
out = {}
r = c.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}],
                              max_tokens=3)
out["chat"] = r.choices[0].message.content
s = c.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}],
                              max_tokens=3, stream=True)
out["chat_stream"] = "".join((ch.choices[0].delta.content or "") for ch in s if ch.choices)
r = c.completions.create(model=model, prompt=[1, 2, 3], max_tokens=2)
out["completion"] = r.choices[0].text
text, usage = "", None
for ch in c.completions.create(model=model, prompt=[1, 2, 3], max_tokens=2, stream=True,
                               stream_options={"include_usage": True}):
    if ch.choices:
        text += ch.choices[0].text
    if ch.usage:
        usage = ch.usage.completion_tokens
out["completion_stream"] = text
out["usage_stream"] = usage
print(json.dumps(out))
