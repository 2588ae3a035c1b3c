"""Builds a small SentencePiece-style BPE tokenizer with the Python `tokenizers`
package, as Mistral's tokenizer.json exports are made: no normalizer, a Metaspace
pre-tokenizer ("▁" for spaces, prepend scheme "first", no split), a byte-fallback BPE
with an unknown token, a BOS TemplateProcessing post-processor.

Writes tokenizer.json into argv[1], then prints JSON on stdout: the ids python
computes for sample texts, with and without special tokens. tests/tokenize.rs
compares kvroute's results (by the lean walk) with these.
"""
import json
import sys

from tokenizers import Tokenizer, decoders, pre_tokenizers
from tokenizers.models import BPE
from tokenizers.processors import TemplateProcessing
from tokenizers.trainers import BpeTrainer

out = sys.argv[1]
SPECIALS = ["<unk>", "<s>", "</s>", "[INST]", "[/INST]"]
tok = Tokenizer(BPE(unk_token="<unk>", byte_fallback=True))
tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first", split=False)
corpus = [
    "The quick brown fox jumps over the lazy dog. It's 2026, isn't it?",
    "KV-cache aware routing sends a request where its prefix is cached.",
    "    indented code:\n\tfor i in range(10):\n        print(i)\n",
    "Zürich, naïve café — ünïcödé text and emoji too.",
    "[INST] You are a helpful assistant. [/INST] Sure.",
] * 20
byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
trainer = BpeTrainer(vocab_size=600, special_tokens=SPECIALS + byte_tokens, show_progress=False)
tok.train_from_iterator(corpus, trainer)
bos = tok.token_to_id("<s>")
tok.post_processor = TemplateProcessing(
    single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)])
tok.save(f"{out}/tokenizer.json")

texts = [
    "The quick brown fox jumps over the lazy dog.",
    "  leading spaces, trailing ones  ",
    "It's   spaced\n\n  out\ttabs and 12345 digits",
    "Zürich naïve café 🚀 — unicode outside the vocabulary",
    "[INST] special in text [/INST] and after</s>more",
    "<s>bos written[INST]x",
]
result = {"texts": []}
for t in texts:
    result["texts"].append({
        "text": t,
        "with_special": tok.encode(t, add_special_tokens=True).ids,
        "without_special": tok.encode(t, add_special_tokens=False).ids,
    })
print(json.dumps(result))
