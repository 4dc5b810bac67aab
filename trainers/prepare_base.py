#!/usr/bin/env python3
"""Prepares the base model directory that trainers/lora_sft.py trains from.

Run once by scripts/train-env.sh with the training venv's python:

    python prepare_base.py --gguf SmolLM2-135M-Instruct.Q4_1.gguf --out DIR

It writes DIR/ (a Hugging Face model directory, no hub access needed):

- model.safetensors, config.json, generation_config.json: the GGUF's weights
  dequantized to fp32 (transformers' GGUF loader with GgufConfig(dequantize=True);
  without it the model is marked quantized and can be neither saved nor trained);
- tokenizer.json, tokenizer_config.json: the GGUF's tokenizer with SmolLM2's
  digit-splitting pre-tokenizer restored (transformers' GGUF conversion keeps only
  the byte-level step, so "2024" becomes one token where llama.cpp makes four;
  nothing warns). Checked here on a few strings;
- chat_template.jinja: trainers/chatml_tools.jinja (ChatML with Hermes-style
  <tool_call> blocks and {% generation %} markers for the assistant mask), and
  chat_template.serve.jinja: the same without the markers, for renderers that
  do not know them;
- mass-base.json: what this directory was made from (the GGUF's sha256, the
  sha256 of this script and of the template, library versions). train-env.sh
  rebuilds the directory when one of them changes.
"""

import argparse
import hashlib
import json
import os
import sys
import time


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def serve_template(template):
    """The template without transformers' {% generation %} extension."""
    import re

    return re.sub(r"\{%-?\s*(end)?generation\s*-?%\}", "", template)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gguf", required=True, help="the base model GGUF file")
    p.add_argument("--out", required=True, help="directory to write (created)")
    p.add_argument(
        "--template",
        default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "chatml_tools.jinja"),
    )
    a = p.parse_args()

    t0 = time.time()
    import torch
    import transformers
    from tokenizers import pre_tokenizers
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    gguf_dir, gguf_name = os.path.split(os.path.abspath(a.gguf))
    template = open(a.template, encoding="utf-8").read()

    tok = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_name)
    # SmolLM2's tokenizer.json: Digits(individual_digits) then ByteLevel. The GGUF
    # (tokenizer.ggml.pre = "smollm") says the same to llama.cpp.
    tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
        ]
    )
    for text, want in (("2024", 4), ("x=3.14159", None)):
        ids = tok(text, add_special_tokens=False)["input_ids"]
        digits = sum(c.isdigit() for c in text)
        pieces = [tok.decode([i]) for i in ids]
        if want is not None and len(ids) != want or sum(p.isdigit() and len(p) == 1 for p in pieces) != digits:
            sys.exit(f"prepare_base: digits are not split one per token in {text!r}: {pieces}")
    if tok("hi", add_special_tokens=True)["input_ids"] != tok("hi", add_special_tokens=False)["input_ids"]:
        sys.exit("prepare_base: the tokenizer adds special tokens; llama.cpp's GGUF says add_bos_token = false")
    tok.chat_template = template

    model = AutoModelForCausalLM.from_pretrained(
        gguf_dir,
        gguf_file=gguf_name,
        quantization_config=GgufConfig(dequantize=True),
        dtype=torch.float32,
    )
    if getattr(model, "is_quantized", False) or hasattr(model.config, "quantization_config"):
        sys.exit("prepare_base: the loaded model is still marked quantized (GgufConfig(dequantize=True) ignored?)")

    os.makedirs(a.out, exist_ok=True)
    model.save_pretrained(a.out, safe_serialization=True)
    tok.save_pretrained(a.out)
    with open(os.path.join(a.out, "chat_template.jinja"), "w", encoding="utf-8") as f:
        f.write(template)
    with open(os.path.join(a.out, "chat_template.serve.jinja"), "w", encoding="utf-8") as f:
        f.write(serve_template(template))

    import peft
    import trl

    stamp = {
        "made_by": "trainers/prepare_base.py (scripts/train-env.sh)",
        "gguf": os.path.abspath(a.gguf),
        "gguf_sha256": sha256_file(a.gguf),
        "prepare_base_sha256": sha256_file(os.path.abspath(__file__)),
        "template_sha256": hashlib.sha256(template.encode("utf-8")).hexdigest(),
        "dtype": "float32",
        "pre_tokenizer": "Sequence[Digits(individual_digits=True), ByteLevel(add_prefix_space=False)]",
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "peft": peft.__version__,
            "trl": trl.__version__,
        },
        "seconds": round(time.time() - t0, 1),
    }
    with open(os.path.join(a.out, "mass-base.json"), "w", encoding="utf-8") as f:
        json.dump(stamp, f, indent=2, sort_keys=True)
        f.write("\n")
    print(f"prepare_base: wrote {a.out} in {time.time() - t0:.0f}s", file=sys.stderr)


if __name__ == "__main__":
    main()
