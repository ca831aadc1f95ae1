#!/usr/bin/env python3
"""Time /api/embed on long texts with and without spaces, through a running
brokerd's HTTP API (--http-listen, with a BERT encoder such as make models'
bert-mini loaded).

    python3 bench/embed_texts.py PORT [MODEL]

Each text is 64 KiB: prose (tokenised up to the model's 512 tokens), one
word, one run of punctuation, CJK ideographs.
"""
import json
import sys
import time
import urllib.request

port = sys.argv[1]
model = sys.argv[2] if len(sys.argv) > 2 else "bert-mini"
texts = [
    ("prose", ("the quick brown fox, jumped! " * 3000)[:65536]),
    ("one word", "a" * 65536),
    ("brackets", "[" * 65536),
    ("cjk", "中" * 21845),
]
for name, text in texts:
    body = json.dumps({"model": model, "input": text}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/api/embed", data=body,
                                 headers={"Content-Type": "application/json"})
    t0 = time.time()
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            code = r.status
            r.read()
    except urllib.error.HTTPError as e:
        code = e.code
    print(f"{name} ({len(text.encode())} bytes): HTTP {code} in {time.time() - t0:.2f} s", flush=True)
