#!/usr/bin/env python3
"""One OpenAI chat completion of N choices under an ambiguous regex (each
choice's grammar matcher works as much as the limits allow), through a
running brokerd with make models' qwen-tiny loaded; and a plain 32-token
chat ("the victim") timed alone and started 2 s into it.

    python3 bench/constrained_choices.py PORT N [KEY KEY2] [--plain]

--plain sends the N choices without the grammar: the same steps' cost
without masks, to compare with.

With two API keys (brokerd --api-keys-file) the ambiguous request is one
client's and the victim another's, as two services would be; without, both
are the caller's address, one client, whose requests are admitted in order.
"""
import json
import sys
import threading
import time
import urllib.request

plain = "--plain" in sys.argv
args = [a for a in sys.argv[1:] if a != "--plain"]
port, n = args[0], int(args[1])
keys = args[2:4] if len(args) >= 4 else [None, None]
def post(body, key=None):
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = "Bearer " + key
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=json.dumps(body).encode(), headers=headers)
    t0 = time.time()
    with urllib.request.urlopen(req, timeout=900) as r:
        out = json.loads(r.read())
    return time.time() - t0, out
victim = {"model": "qwen-tiny", "messages": [{"role": "user", "content": "tell me"}], "max_tokens": 32, "ignore_eos": True, "temperature": 0}
alone, _ = post(victim, keys[1])
amb = {"model": "qwen-tiny", "messages": [{"role": "user", "content": "hi"}], "n": n, "max_tokens": 64, "ignore_eos": True, "temperature": 1.0,
       "guided_regex": "(a|aa|aaa|aaaa|[a-z]|[a-z][a-z]|[a-z][a-z][a-z]){0,1000}"}
if plain:
    del amb["guided_regex"]
res = {}
def run():
    res["amb"] = post(amb, keys[0])[0]
th = threading.Thread(target=run); th.start()
time.sleep(2)
during, _ = post(victim, keys[1])
th.join()
print(f"n={n}: victim alone {alone:.2f} s, during {during:.2f} s; the ambiguous request {res['amb']:.1f} s")
