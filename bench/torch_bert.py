#!/usr/bin/env python3
"""PyTorch eager throughput of a BERT encoder from a brokerd model directory
(bench/mkbert writes one: config.json and model.safetensors), computing what
brokerd's encoder computes: mean pooling over the tokens, then L2 normalise.
Each step copies a batch of --batch random sequences of --seq tokens to the
GPU and the vectors back, so host transfers count as they do for brokerd.
Prints items per second. fp32 runs without TF32, as brokerd's f32 matmuls.

  python3 bench/torch_bert.py --model-dir REPO/bert-4x256/1 --batch 128 --seq 128 --dtype bf16
"""
import argparse
import json
import os
import time

import torch
from safetensors.torch import load_file
from transformers import BertConfig, BertModel


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model-dir", required=True)
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--seconds", type=float, default=10.0)
    a = p.parse_args()

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    with open(os.path.join(a.model_dir, "config.json")) as f:
        cfg = BertConfig(**json.load(f))
    model = BertModel(cfg, add_pooling_layer=False)
    state = load_file(os.path.join(a.model_dir, "model.safetensors"))
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if not m.endswith("position_ids")]
    if missing or unexpected:
        raise SystemExit(f"weights do not match the model: missing {missing}, unexpected {unexpected}")
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    model = model.eval().to("cuda", dtype)

    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(5, cfg.vocab_size, (a.batch, a.seq), generator=gen).pin_memory()
    mask = torch.ones(a.batch, a.seq, dtype=torch.long).pin_memory()

    def step():
        i, m = ids.to("cuda", non_blocking=True), mask.to("cuda", non_blocking=True)
        h = model(input_ids=i, attention_mask=m).last_hidden_state.float()
        mf = m.unsqueeze(-1).float()
        v = torch.nn.functional.normalize((h * mf).sum(1) / mf.sum(1), dim=-1)
        return v.cpu()

    with torch.inference_mode():
        for _ in range(5):
            step()
        torch.cuda.synchronize()
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < a.seconds:
            step()
            n += 1
        torch.cuda.synchronize()
        elapsed = time.perf_counter() - t0
    print(f"{n * a.batch / elapsed:.1f}")


if __name__ == "__main__":
    main()
