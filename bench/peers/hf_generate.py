#!/usr/bin/env python3
"""transformers' side of bench/gpu_check.sh's generation steps, on a decoder
checkpoint as bench/mkllm writes it (config.json, model.safetensors).

check: greedy tokens of transformers' AutoModelForCausalLM.generate
(do_sample=False, float32, TF32 off) for the prompt token ids that
bench/gpucheck wrote with brokerd's tokens, compared per prompt: identical,
or where they first differ, the reference's top-1 minus top-2 logit there
(a near tie, below --tie, is a rounding difference; a wide gap is a bug).
Exit 0 when every prompt is identical or differs first at a near tie, 1
otherwise, 77 when neither transformers nor torch is installed. Without
transformers but with torch, the reference is bench/peers/llm_torch.py
(float64 eager, on the CPU).

    python3 bench/peers/hf_generate.py check DIR --brokerd brokerd.json --out cmp.json [--device cuda]

bench: generate tokens/s of transformers at each batch size: random prompts
of --prompt-tokens ids, exactly --new-tokens greedy tokens each (end of
sequence ignored), repeated for --seconds after one warm-up. One JSON line
per batch size.

    python3 bench/peers/hf_generate.py bench DIR --batches 1,16,64 --prompt-tokens 32 --new-tokens 64
"""
import argparse
import json
import os
import sys
import time

SKIP = 77

# Hugging Face model types of the architectures bench/modelkit writes.
MODEL_TYPES = {"Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3", "LlamaForCausalLM": "llama"}


def versions():
    out = {"python": sys.version.split()[0]}
    for name in ("torch", "transformers"):
        try:
            out[name] = __import__(name).__version__
        except Exception as e:  # noqa: BLE001 - any import failure is a fact to report
            out[name] = f"absent ({type(e).__name__}: {e})"
    return out


def load_hf(d, device, dtype):
    """The checkpoint through AutoModelForCausalLM, with what loading
    reported and the config fields that decide the numbers."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    raw = json.load(open(os.path.join(d, "config.json")))
    notes = []
    if "model_type" in raw:
        cfg = AutoConfig.from_pretrained(d)
    else:
        # bench/modelkit writes no model_type; AutoConfig needs one.
        arch = (raw.get("architectures") or ["?"])[0]
        mt = MODEL_TYPES.get(arch)
        if mt is None:
            raise SystemExit(f"config.json has no model_type and architecture {arch} is not one of {sorted(MODEL_TYPES)}")
        notes.append(f"config.json has no model_type: {mt}, from architectures {arch}")
        cfg = AutoConfig.for_model(mt, **raw)
    # transformers 5 keeps RoPE settings in rope_parameters; make sure the
    # checkpoint's rope_theta arrived there (or in the legacy attribute).
    rp = getattr(cfg, "rope_parameters", None)
    theta = raw.get("rope_theta")
    if isinstance(rp, dict) and theta is not None and rp.get("rope_theta") != theta:
        notes.append(f"rope_parameters {rp} lacks the checkpoint's rope_theta {theta}: set")
        rp["rope_theta"] = theta
    elif getattr(cfg, "rope_theta", theta) != theta:
        notes.append(f"rope_theta {cfg.rope_theta} != checkpoint's {theta}: set")
        cfg.rope_theta = theta
    kw = dict(config=cfg, output_loading_info=True)
    try:
        model, info = AutoModelForCausalLM.from_pretrained(d, dtype=dtype, **kw)
    except TypeError:  # transformers 4.x spells it torch_dtype
        model, info = AutoModelForCausalLM.from_pretrained(d, torch_dtype=dtype, **kw)
    info = {k: list(v) if isinstance(v, (set, list, tuple)) else str(v) for k, v in info.items()}
    if info.get("missing_keys") or info.get("unexpected_keys") or info.get("mismatched_keys"):
        notes.append(f"loading info: {info}")
    facts = {
        "class": type(model).__name__,
        "architectures": raw.get("architectures"),
        "dtype": str(next(model.parameters()).dtype),
        "tie_word_embeddings": getattr(cfg, "tie_word_embeddings", None),
        "lm_head_is_embedding": model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr(),
        "rope": getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_theta", None),
        "attn_implementation": getattr(cfg, "_attn_implementation", None),
        "sliding_window": getattr(cfg, "use_sliding_window", None),
        "notes": notes,
    }
    return model.eval().to(device), facts


def tf32_off(torch):
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")


def hf_greedy(model, torch, prompts, n, device):
    """generate(do_sample=False) per prompt (batch 1: no padding), past any
    end-of-sequence token, with each step's logits."""
    model.generation_config.eos_token_id = None
    toks, logits = [], []
    for p in prompts:
        ids = torch.tensor([p], device=device)
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n,
                             min_new_tokens=0, eos_token_id=None, pad_token_id=0, temperature=None, top_p=None,
                             top_k=None, output_logits=True, return_dict_in_generate=True)
        toks.append(out.sequences[0, len(p):].tolist())
        logits.append([step[0].float().cpu() for step in out.logits])
    return toks, logits


def torch64_greedy(d, prompts, n):
    """bench/peers/llm_torch.py's float64 decoder, when transformers is absent."""
    import torch

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import llm_torch

    torch.set_grad_enabled(False)
    m = llm_torch.Decoder(d)
    toks, logits = [], []
    for p in prompts:
        cache = [None] * m.cfg["num_hidden_layers"]
        out, steps, ids = [], [], p
        for _ in range(n):
            lg = m.forward(ids, cache)
            t = int(lg.argmax())
            out.append(t)
            steps.append(lg)
            ids = [t]
        toks.append(out)
        logits.append(steps)
    return toks, logits


def check(a):
    import_ok = True
    try:
        import torch
    except Exception as e:  # noqa: BLE001
        print(f"SKIP: no torch ({e})")
        return SKIP
    try:
        import transformers  # noqa: F401
    except Exception as e:  # noqa: BLE001
        import_ok = False
        print(f"transformers is absent ({e}): the reference is llm_torch.py (float64, CPU)")
    b = json.load(open(a.brokerd))
    prompts = [p["ids"] for p in b["prompts"]]
    n = b["max_tokens"]
    print("versions:", json.dumps(versions()))
    t0 = time.perf_counter()
    if import_ok:
        if a.device == "cuda" and not torch.cuda.is_available():
            print("FAIL: torch.cuda.is_available() is False")
            return 1
        tf32_off(torch)
        with torch.inference_mode():
            model, facts = load_hf(a.model_dir, a.device, torch.float32)
            print("model:", json.dumps(facts, default=str))
            ref, logits = hf_greedy(model, torch, prompts, n, a.device)
        reference = f"transformers {transformers.__version__} generate(do_sample=False), float32 on {a.device}"
    else:
        ref, logits = torch64_greedy(a.model_dir, prompts, n)
        reference = "llm_torch.py float64 on the CPU"
    elapsed = time.perf_counter() - t0
    rows, same, ties, bad = [], 0, 0, 0
    for i, p in enumerate(b["prompts"]):
        got, want = b["tokens"][i], ref[i]
        k = 0
        while k < len(got) and k < len(want) and got[k] == want[k]:
            k += 1
        row = {"prompt": i, "prompt_tokens": len(p["ids"]), "brokerd": got, "reference": want, "same_prefix": k}
        if k == len(want) == len(got):
            same += 1
            row["verdict"] = "identical"
        elif k < len(want) and k < len(logits[i]):
            lg = logits[i][k]
            top = lg.topk(2)
            gap = float(top.values[0] - top.values[1])
            row["ref_gap"] = gap
            if k < len(got) and 0 <= got[k] < lg.shape[0]:
                row["ref_logit_deficit_of_brokerd_token"] = float(top.values[0] - lg[got[k]])
            bg = b.get("gaps") or []
            if i < len(bg) and k < len(bg[i]):
                row["brokerd_gap"] = bg[i][k]
            if gap < a.tie:
                ties += 1
                row["verdict"] = f"first {k} same, then a near tie (reference gap {gap:.3g})"
            else:
                bad += 1
                row["verdict"] = f"first {k} same, then DIFFERENT (reference gap {gap:.3g}: not a tie)"
        else:
            bad += 1
            row["verdict"] = f"lengths differ: brokerd {len(got)}, reference {len(want)}"
        print(f"prompt {i} ({len(p['ids'])} tokens): {row['verdict']}")
        if row["verdict"] != "identical":
            print(f"  brokerd   {got}\n  reference {want}")
        rows.append(row)
    summary = {"reference": reference, "device_id": b.get("device_id"), "prompts": len(rows), "identical": same,
               "near_ties": ties, "different": bad, "tokens_per_prompt": n, "reference_seconds": elapsed, "rows": rows}
    if a.out:
        json.dump(summary, open(a.out, "w"), indent=1)
    key = f"{same}/{len(rows)} prompts identical over {n} tokens"
    if ties:
        key += f", {ties} first differ at a near tie"
    if bad:
        key += f", {bad} DIFFER"
    print(("PASS: " if bad == 0 else "FAIL: ") + key + f" (brokerd on {b.get('device_id')} vs {reference})")
    return 0 if bad == 0 else 1


def bench(a):
    try:
        import torch
        import transformers  # noqa: F401
    except Exception as e:  # noqa: BLE001
        print(f"SKIP: needs torch and transformers ({e})")
        return SKIP
    print("versions:", json.dumps(versions()))
    tf32_off(torch)
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    with torch.inference_mode():
        model, facts = load_hf(a.model_dir, a.device, dtype)
        print("model:", json.dumps(facts, default=str), flush=True)
        model.generation_config.eos_token_id = None
        vocab = model.config.vocab_size
        gen = torch.Generator().manual_seed(1)
        for bs in [int(x) for x in a.batches.split(",")]:
            ids = torch.randint(0, vocab, (bs, a.prompt_tokens), generator=gen).to(a.device)
            mask = torch.ones_like(ids)

            def once():
                out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=a.new_tokens,
                                     min_new_tokens=a.new_tokens, eos_token_id=None, pad_token_id=0,
                                     temperature=None, top_p=None, top_k=None)
                if a.device == "cuda":
                    torch.cuda.synchronize()
                assert out.shape == (bs, a.prompt_tokens + a.new_tokens), out.shape

            once()
            runs, t0 = 0, time.perf_counter()
            while runs == 0 or time.perf_counter() - t0 < a.seconds:
                once()
                runs += 1
            el = time.perf_counter() - t0
            print(json.dumps({"batch": bs, "dtype": a.dtype, "prompt_tokens": a.prompt_tokens, "new_tokens": a.new_tokens,
                              "runs": runs, "seconds": el, "tokens_per_second": runs * bs * a.new_tokens / el}), flush=True)
    return 0


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check")
    c.add_argument("model_dir")
    c.add_argument("--brokerd", required=True, help="bench/gpucheck's JSON")
    c.add_argument("--out", default="")
    c.add_argument("--device", default="cuda")
    c.add_argument("--tie", type=float, default=0.01, help="a reference gap below this is a near tie")
    bp = sub.add_parser("bench")
    bp.add_argument("model_dir")
    bp.add_argument("--batches", default="1,16,64")
    bp.add_argument("--prompt-tokens", type=int, default=32)
    bp.add_argument("--new-tokens", type=int, default=64)
    bp.add_argument("--seconds", type=float, default=5.0)
    bp.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    bp.add_argument("--device", default="cuda")
    a = p.parse_args()
    sys.exit(check(a) if a.cmd == "check" else bench(a))


if __name__ == "__main__":
    main()
