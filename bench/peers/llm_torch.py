"""PyTorch's greedy tokens for brokerd's generation peer benchmark.

An eager Llama / Qwen2 / Qwen3 decoder in float64, written from the Hugging
Face modelling code, with a KV cache, reading a checkpoint as
bench/modelkit writes it (config.json and one model.safetensors). Debian's
python3-torch has no `transformers` and uses the reference BLAS, so this is
a check of brokerd's and llama.cpp's tokens, not a speed peer.

    python3 bench/peers/llm_torch.py DIR < {"prompts": [[ids...]...], "n": N}
    → {"tokens": [[ids...]...], "gaps": [[top-1 minus top-2 logit...]...]}
"""
import json
import sys

import numpy as np
import torch

import safetensors_np


def load_safetensors(path):
    return {name: torch.from_numpy(a.astype(np.float64)) for name, (a, _) in safetensors_np.read(path).items()}


class Decoder:
    def __init__(self, d):
        self.cfg = json.load(open(f"{d}/config.json"))
        self.w = load_safetensors(f"{d}/model.safetensors")
        c = self.cfg
        self.arch = c["architectures"][0]
        self.h, self.nh, self.nkv = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
        self.hd = c.get("head_dim") or self.h // self.nh
        self.eps = c["rms_norm_eps"]
        self.theta = c.get("rope_theta", 10000.0)
        self.lm_head = self.w.get("lm_head.weight", self.w["model.embed_tokens.weight"])

    def norm(self, x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * w

    def rope(self, x, pos):
        # x [T, H, D], rotate-half (Hugging Face) order.
        d = self.hd
        inv = 1.0 / (self.theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
        ang = pos[:, None].double() * inv[None, :]
        cos = torch.cat([ang.cos(), ang.cos()], -1)[:, None, :]
        sin = torch.cat([ang.sin(), ang.sin()], -1)[:, None, :]
        rot = torch.cat([-x[..., d // 2:], x[..., : d // 2]], -1)
        return x * cos + rot * sin

    def forward(self, ids, cache):
        w, T = self.w, len(ids)
        start = cache[0][0].shape[0] if cache[0] is not None else 0
        pos = torch.arange(start, start + T)
        x = w["model.embed_tokens.weight"][torch.tensor(ids)]
        for l in range(self.cfg["num_hidden_layers"]):
            p = f"model.layers.{l}."
            h = self.norm(x, w[p + "input_layernorm.weight"])
            proj = lambda n: h @ w[p + f"self_attn.{n}_proj.weight"].T + w.get(p + f"self_attn.{n}_proj.bias", 0)
            q = proj("q").view(T, self.nh, self.hd)
            k = proj("k").view(T, self.nkv, self.hd)
            v = proj("v").view(T, self.nkv, self.hd)
            if p + "self_attn.q_norm.weight" in w:
                q = self.norm(q, w[p + "self_attn.q_norm.weight"])
                k = self.norm(k, w[p + "self_attn.k_norm.weight"])
            q, k = self.rope(q, pos), self.rope(k, pos)
            if cache[l] is not None:
                k = torch.cat([cache[l][0], k])
                v = torch.cat([cache[l][1], v])
            cache[l] = (k, v)
            rep = self.nh // self.nkv
            kk, vv = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
            s = torch.einsum("thd,shd->hts", q, kk) / self.hd**0.5
            S = kk.shape[0]
            mask = torch.arange(S)[None, :] > (pos[:, None])
            s = s.masked_fill(mask[None], float("-inf")).softmax(-1)
            a = torch.einsum("hts,shd->thd", s, vv).reshape(T, self.nh * self.hd)
            x = x + a @ w[p + "self_attn.o_proj.weight"].T
            h = self.norm(x, w[p + "post_attention_layernorm.weight"])
            g = h @ w[p + "mlp.gate_proj.weight"].T
            u = h @ w[p + "mlp.up_proj.weight"].T
            x = x + (torch.nn.functional.silu(g) * u) @ w[p + "mlp.down_proj.weight"].T
        x = self.norm(x[-1], w["model.norm.weight"])
        return self.lm_head @ x

    def greedy(self, prompt, n):
        """The greedy tokens, and at each the gap between the best and the
        second-best logit (a small gap is a near tie that any rounding
        difference may flip)."""
        cache = [None] * self.cfg["num_hidden_layers"]
        out, gaps, ids = [], [], prompt
        for _ in range(n):
            top = self.forward(ids, cache).topk(2)
            t = int(top.indices[0])
            out.append(t)
            gaps.append(float(top.values[0] - top.values[1]))
            ids = [t]
        return out, gaps


def main():
    req = json.load(sys.stdin)
    torch.set_grad_enabled(False)
    m = Decoder(sys.argv[1])
    res = [m.greedy(p, req["n"]) for p in req["prompts"]]
    json.dump({"tokens": [r[0] for r in res], "gaps": [r[1] for r in res]}, sys.stdout)


if __name__ == "__main__":
    main()
