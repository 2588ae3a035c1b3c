"""Builds a small byte-level BPE tokenizer with the Python `tokenizers` package (the
one HuggingFace uses to write tokenizer.json files), Llama-3 style: NFC normalizer, a
Split pre-tokenizer on the GPT-4 regex (look-ahead included, so the Rust side's
fancy-regex must handle it), ByteLevel, a BOS TemplateProcessing post-processor.

Writes tokenizer.json and a tokenizer_config.json with a Llama-3-like chat template
into argv[1], then prints JSON on stdout: the ids python computes for sample texts
(with and without special tokens) and, when jinja2 is importable, chat prompts
rendered as transformers renders them (trim_blocks, lstrip_blocks, loopcontrols, its
tojson) with their ids. tests/tokenize.rs compares kvroute's results with these.
"""
import json
import sys

from tokenizers import Tokenizer, normalizers, pre_tokenizers, decoders, Regex
from tokenizers.models import BPE
from tokenizers.processors import TemplateProcessing
from tokenizers.trainers import BpeTrainer

out = sys.argv[1]
PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
            "<|end_header_id|>", "<|eot_id|>"]

tok = Tokenizer(BPE())
tok.normalizer = normalizers.NFC()
tok.pre_tokenizer = pre_tokenizers.Sequence([
    pre_tokenizers.Split(Regex(PATTERN), behavior="isolated", invert=False),
    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
])
tok.decoder = decoders.ByteLevel()
corpus = [
    "The quick brown fox jumps over the lazy dog. It's 2026, isn't it?",
    "KV-cache aware routing sends a request where its prefix is cached.",
    "    indented code:\n\tfor i in range(10):\n        print(i)\n",
    "Zürich, naïve café — ünïcödé text and emoji 🚀 too.",
    "system user assistant tool You are a helpful assistant.",
] * 20
trainer = BpeTrainer(vocab_size=400, special_tokens=SPECIALS,
                     initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
tok.train_from_iterator(corpus, trainer)
bos = tok.token_to_id("<|begin_of_text|>")
tok.post_processor = TemplateProcessing(
    single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B",
    special_tokens=[("<|begin_of_text|>", bos)])
tok.save(f"{out}/tokenizer.json")

TEMPLATE = (
    "{{- bos_token }}"
    "{%- if tools is not none %}"
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\nTools:\\n' }}"
    "{%- for t in tools %}{{- t | tojson(indent=2) }}{{- '\\n' }}{%- endfor %}"
    "{{- '<|eot_id|>' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'bogus' %}{{- raise_exception('bogus role') }}{%- endif %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- endif %}"
)
config = {
    "bos_token": {"__type": "AddedToken", "content": "<|begin_of_text|>", "lstrip": False,
                  "normalized": False, "rstrip": False, "single_word": False},
    "eos_token": "<|eot_id|>",
    "chat_template": TEMPLATE,
    "tokenizer_class": "PreTrainedTokenizerFast",
}
with open(f"{out}/tokenizer_config.json", "w") as f:
    json.dump(config, f)

texts = [
    "The quick brown fox jumps over the lazy dog.",
    "It's   spaced\n\n  out\ttabs and 12345 digits",
    "Zürich naïve café 🚀 — unicode",
    "<|begin_of_text|>special in text<|eot_id|>",
]
result = {"texts": [], "chats": []}
for t in texts:
    result["texts"].append({
        "text": t,
        "with_special": tok.encode(t, add_special_tokens=True).ids,
        "without_special": tok.encode(t, add_special_tokens=False).ids,
    })

try:
    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError:
    jinja2 = None

if jinja2 is not None:
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                          separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    compiled = env.from_string(TEMPLATE)
    # Keys in the client's (unsorted) order: tojson must keep it.
    tool = {"type": "function",
            "function": {"name": "get_weather", "description": "Weather in a city",
                         "parameters": {"type": "object",
                                        "properties": {"city": {"type": "string"}},
                                        "required": ["city"]}}}
    bodies = [
        {"messages": [{"role": "user", "content": "  Hello there!  "}]},
        {"messages": [{"role": "system", "content": "You are a helpful assistant."},
                      {"role": "user", "content": "Zürich café?"},
                      {"role": "assistant", "content": "Yes."},
                      {"role": "user", "content": "And 🚀?"}]},
        {"messages": [{"role": "user", "content": "weather?"}], "tools": [tool]},
        {"messages": [{"role": "user", "content": "no prompt"}], "add_generation_prompt": False},
    ]
    for body in bodies:
        text = compiled.render(messages=body["messages"], tools=body.get("tools"),
                               documents=None,
                               add_generation_prompt=body.get("add_generation_prompt", True),
                               bos_token="<|begin_of_text|>", eos_token="<|eot_id|>")
        result["chats"].append({"body": body, "text": text,
                                "ids": tok.encode(text, add_special_tokens=False).ids})

print(json.dumps(result))
