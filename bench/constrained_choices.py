#!/usr/bin/env python3
"""One OpenAI chat completion of N choices under an ambiguous regex (each
choice's grammar matcher builds as much parse state as the limits allow),
through a running brokerd with make models' qwen-tiny loaded.

    python3 bench/constrained_choices.py PORT N
"""
import json
import sys
import time
import urllib.request

port, n = sys.argv[1], int(sys.argv[2])
body = {"model": "qwen-tiny", "messages": [{"role": "user", "content": "hi"}], "n": n, "max_tokens": 64,
        "ignore_eos": True, "temperature": 1.0,
        "guided_regex": "(a|aa|aaa|aaaa|[a-z]|[a-z][a-z]|[a-z][a-z][a-z]){0,1000}"}
req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
t0 = time.time()
try:
    with urllib.request.urlopen(req, timeout=600) as r:
        out = json.loads(r.read())
        fins = {}
        for c in out["choices"]:
            fins[c["finish_reason"]] = fins.get(c["finish_reason"], 0) + 1
        print(f"n={n}: HTTP {r.status} in {time.time()-t0:.1f} s, finish {fins}")
except urllib.error.HTTPError as e:
    print(f"n={n}: HTTP {e.code} in {time.time()-t0:.1f} s: {e.read()[:300]}")
