"""Shared by the tests: the MLP's weights read from the test repository, to
compute its expected outputs."""

import json
import os
import struct
import urllib.request

import numpy as np


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack_from("<Q", raw, 0)
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "F32", info
        start, end = info["data_offsets"]
        out[name] = np.frombuffer(raw[8 + n + start:8 + n + end], dtype="<f4").reshape(info["shape"])
    return out


def mlp_reference(x):
    w = read_safetensors(os.path.join(os.environ["BROKERD_TEST_REPO"], "mlp", "1", "model.safetensors"))
    h = np.maximum(x.astype(np.float64) @ w["fc1.weight"].T.astype(np.float64) + w["fc1.bias"], 0)
    return h @ w["fc2.weight"].T.astype(np.float64) + w["fc2.bias"]


def running_sequences():
    """brokerd_generation_running_sequences summed over replicas, read from
    brokerd's /metrics."""
    with urllib.request.urlopen(os.environ["BROKERD_TEST_METRICS"], timeout=10) as r:
        body = r.read().decode()
    total, seen = 0.0, False
    for line in body.splitlines():
        if line.startswith("brokerd_generation_running_sequences"):
            total += float(line.rsplit(" ", 1)[1])
            seen = True
    assert seen, "no brokerd_generation_running_sequences in /metrics"
    return total
