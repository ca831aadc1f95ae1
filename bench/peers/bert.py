"""A BERT encoder written in PyTorch for the peer benchmark, independent of
brokerd's: it reads a Hugging Face BERT directory (config.json and
model.safetensors, as bench/modelkit writes them) and either exports the
encoder to ONNX or prints its outputs for given token ids.

The encoder is brokerd's "bert" kind with pooling mean and normalize: the
last hidden states averaged over the real tokens, then L2-normalised.

    python3 bench/peers/bert.py export DIR OUT.onnx
    python3 bench/peers/bert.py embed DIR < ids.json     # [[ids...], ...] -> [[floats...], ...] (float64)

Needs Debian's python3-torch (and python3-numpy).
"""

import json
import math
import sys

import torch
from torch import nn

import safetensors_np


def read_safetensors(path):
    out = {}
    for name, (a, dt) in safetensors_np.read(path).items():
        if dt != "F32":
            raise SystemExit(f"{path}: {name} is {dt}, this script reads F32")
        out[name.removeprefix("bert.")] = torch.from_numpy(a.copy())
    return out


class Encoder(nn.Module):
    def __init__(self, cfg, w):
        super().__init__()
        self.h, self.heads = cfg["hidden_size"], cfg["num_attention_heads"]
        self.eps = cfg.get("layer_norm_eps", 1e-12)
        self.layers = cfg["num_hidden_layers"]
        self.w = nn.ParameterDict({k.replace(".", "_"): nn.Parameter(v, requires_grad=False) for k, v in w.items()})

    def p(self, name):
        return self.w[name.replace(".", "_")]

    def ln(self, x, prefix):
        return nn.functional.layer_norm(x, (self.h,), self.p(prefix + ".weight"), self.p(prefix + ".bias"), self.eps)

    def lin(self, x, prefix):
        return nn.functional.linear(x, self.p(prefix + ".weight"), self.p(prefix + ".bias"))

    def forward(self, input_ids, attention_mask, token_type_ids):
        b, s = input_ids.shape
        d = self.h // self.heads
        pos = torch.arange(s, device=input_ids.device).unsqueeze(0)
        x = self.p("embeddings.word_embeddings.weight")[input_ids] \
            + self.p("embeddings.position_embeddings.weight")[pos] \
            + self.p("embeddings.token_type_embeddings.weight")[token_type_ids]
        x = self.ln(x, "embeddings.LayerNorm")
        mask = attention_mask.to(x.dtype)
        bias = (1.0 - mask)[:, None, None, :] * torch.finfo(x.dtype).min
        for l in range(self.layers):
            pre = f"encoder.layer.{l}."

            def heads(t):
                return t.view(b, s, self.heads, d).transpose(1, 2)

            q = heads(self.lin(x, pre + "attention.self.query"))
            k = heads(self.lin(x, pre + "attention.self.key"))
            v = heads(self.lin(x, pre + "attention.self.value"))
            scores = q @ k.transpose(-1, -2) / math.sqrt(d) + bias
            ctx = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, s, self.h)
            a = self.ln(self.lin(ctx, pre + "attention.output.dense") + x, pre + "attention.output.LayerNorm")
            inner = nn.functional.gelu(self.lin(a, pre + "intermediate.dense"))
            x = self.ln(self.lin(inner, pre + "output.dense") + a, pre + "output.LayerNorm")
        pooled = (x * mask[:, :, None]).sum(1) / mask.sum(1, keepdim=True)
        return pooled / pooled.norm(dim=-1, keepdim=True)


def load(d):
    with open(f"{d}/config.json") as f:
        cfg = json.load(f)
    return Encoder(cfg, read_safetensors(f"{d}/model.safetensors")).eval()


def main():
    if len(sys.argv) < 3 or sys.argv[1] not in ("export", "embed"):
        raise SystemExit(__doc__)
    m = load(sys.argv[2])
    if sys.argv[1] == "export":
        ids = torch.ones(2, 8, dtype=torch.int64)
        with torch.no_grad():
            torch.onnx.export(m, (ids, torch.ones_like(ids), torch.zeros_like(ids)), sys.argv[3],
                              input_names=["input_ids", "attention_mask", "token_type_ids"],
                              output_names=["embedding"], opset_version=14,
                              dynamic_axes={"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"},
                                            "token_type_ids": {0: "batch", 1: "seq"}, "embedding": {0: "batch"}})
        return
    batch = json.load(sys.stdin)
    m = m.double()
    out = []
    with torch.no_grad():
        for ids in batch:  # one at a time: no padding in the reference
            t = torch.tensor([ids], dtype=torch.int64)
            out.append(m(t, torch.ones_like(t), torch.zeros_like(t))[0].tolist())
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
