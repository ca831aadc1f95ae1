#!/usr/bin/env python3
"""One OpenAI chat completion of N choices under an ambiguous regex (each
choice's grammar matcher works as much as the limits allow), through a
running brokerd with make models' qwen-tiny loaded; and a plain 32-token
chat ("the victim") timed alone and started 2 s into it.

    python3 bench/constrained_choices.py PORT N
"""
import json
import sys
import threading
import time
import urllib.request

port, n = sys.argv[1], int(sys.argv[2])
def post(body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    t0 = time.time()
    with urllib.request.urlopen(req, timeout=900) as r:
        out = json.loads(r.read())
    return time.time() - t0, out
victim = {"model": "qwen-tiny", "messages": [{"role": "user", "content": "tell me"}], "max_tokens": 32, "ignore_eos": True, "temperature": 0}
alone, _ = post(victim)
amb = {"model": "qwen-tiny", "messages": [{"role": "user", "content": "hi"}], "n": n, "max_tokens": 64, "ignore_eos": True, "temperature": 1.0,
       "guided_regex": "(a|aa|aaa|aaaa|[a-z]|[a-z][a-z]|[a-z][a-z][a-z]){0,1000}"}
res = {}
def run():
    res["amb"] = post(amb)[0]
th = threading.Thread(target=run); th.start()
time.sleep(2)
during, _ = post(victim)
th.join()
print(f"n={n}: victim alone {alone:.2f} s, during {during:.2f} s; the ambiguous request {res['amb']:.1f} s")
