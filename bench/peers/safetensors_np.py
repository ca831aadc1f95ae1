"""Reads a safetensors file as bench/modelkit writes it into numpy arrays,
for the PyTorch references (bert.py, llm_torch.py)."""
import json
import struct

import numpy as np


def read(path):
    """{name: (float32 array of the tensor's shape, its safetensors dtype)}
    for F32, F16 and BF16 tensors."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack_from("<Q", raw, 0)
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        b = raw[8 + n + start:8 + n + end]
        dt = info["dtype"]
        if dt == "F32":
            a = np.frombuffer(b, dtype="<f4")
        elif dt == "F16":
            a = np.frombuffer(b, dtype="<f2").astype(np.float32)
        elif dt == "BF16":
            a = (np.frombuffer(b, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            raise ValueError(f"{path}: {name} is {dt}")
        out[name] = (a.reshape(info["shape"]), dt)
    return out
