#!/usr/bin/env python3
"""Makes the Hugging Face BertModel fixture that runtime/models/repo's
TestHuggingFaceFixture compares brokerd against: a tiny random BERT saved
the way transformers saves one (config.json, model.safetensors, tokenizer
files) under repo/tiny-hf-bert/1/, and transformers' BertModel outputs for a
few texts and a text pair in expected.json: token ids, token type ids, the
masked mean of the last hidden state and its [CLS] row. Runs on the CPU in
float32 and needs torch and transformers (the GPU hosts have both):

  python3 runtime/models/repo/testdata/hf-bert/make_fixture.py

then commit runtime/models/repo/testdata/hf-bert/.
"""
import json
import pathlib

import torch
import transformers
from transformers import BertConfig, BertModel, BertTokenizerFast

HERE = pathlib.Path(__file__).resolve().parent
OUT = HERE / "repo" / "tiny-hf-bert" / "1"

WORDS = """the a an of and to in is was for on that with as by it at from this be are or not
cat sat mat dog ran park memory record records broker brokers batch batches request requests
accelerator accelerators question answer about device devices fast slow small large model
models vector vectors text texts encode encoder happy word words""".split()
PIECES = ["##s", "##es", "##ed", "##ing", "##ly", "##er", "##ness", "##smith"]
LETTERS = [chr(c) for c in range(ord("a"), ord("z") + 1)]
VOCAB = (["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + sorted(set(WORDS)) + PIECES
         + LETTERS + ["##" + c for c in LETTERS] + list(".,!?'-"))

CASES = [
    {"text": "The cat sat on the mat.", "pair": ""},
    {"text": "Brokers batch requests for accelerators!", "pair": ""},
    {"text": "unseen wordsmithing, happily", "pair": ""},
    {"text": "A question about memory?", "pair": "An answer with records."},
]


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    vocab = OUT / "vocab.txt"
    vocab.write_text("\n".join(VOCAB) + "\n")
    tok = BertTokenizerFast(vocab_file=str(vocab), do_lower_case=True)

    torch.manual_seed(20261124)
    cfg = BertConfig(vocab_size=len(VOCAB), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=128, max_position_embeddings=64, type_vocab_size=2, hidden_act="gelu",
                     layer_norm_eps=1e-12, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = BertModel(cfg, add_pooling_layer=False).eval()
    # Larger-than-init random values, so every weight (biases and layer
    # norms included) moves the outputs.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("LayerNorm.weight"):
                p.copy_(1 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(0.1 * torch.randn_like(p))
    model.save_pretrained(OUT, safe_serialization=True)
    tok.save_pretrained(OUT)

    cases = []
    with torch.no_grad():
        for c in CASES:
            enc = tok(c["text"], c["pair"] or None, return_tensors="pt")
            h = model(**enc).last_hidden_state[0]  # [S, H]
            mask = enc["attention_mask"][0].unsqueeze(-1).float()
            mean = (h * mask).sum(0) / mask.sum()
            cases.append(dict(c, input_ids=enc["input_ids"][0].tolist(),
                              token_type_ids=enc["token_type_ids"][0].tolist(),
                              mean=mean.tolist(), cls=h[0].tolist()))
    expected = {"transformers": transformers.__version__, "torch": torch.__version__, "cases": cases}
    (HERE / "expected.json").write_text(json.dumps(expected, indent=1) + "\n")
    print(f"wrote {OUT} and {HERE / 'expected.json'} ({len(cases)} cases)")


if __name__ == "__main__":
    main()
