#!/usr/bin/env python3
"""A RECORD-ONLY trainer fixture: it trains nothing.

It stands in for a real trainer (e.g. a LoRA fine-tune) in
`examples/llamacpp.toml`, so a whole MASS cycle against a real model server
exercises the trainer step of the protocol: the engine hands it the cycle's
exported training and validation sets and the base model name, runs it as a
journaled effect and records its command template, exit status, log, output
directory and chosen checkpoint in the ledger (`mass.training`).

What it does, and nothing more:

- checks that every line of both files is a JSON object with a non-empty
  `messages` list (the OpenAI/TRL chat format the engine exports) and exits
  1 naming the first bad line otherwise;
- copies both files unchanged into OUTPUT_DIR/received/ and writes
  OUTPUT_DIR/received/summary.json (example counts, SHA-256 of each file,
  the base model name, how many assistant messages carry tool calls), so
  the recorded output tree proves exactly what a trainer would have seen;
- writes OUTPUT_DIR/metrics.jsonl with one checkpoint, "record-only", whose
  "validation_loss" is 0.0. That number is a PLACEHOLDER (the engine needs a
  finite loss to choose a checkpoint); no loss was computed. The line says
  so ("trained": false).

It writes no adapter (no `record-only/adapter.json`), so the engine names the
"trained" model `BASE+cN` (e.g. `smollm2-135m+c1`). llama-cpp-python serving a
single model answers a request for any model name with that model, so the
held-out evaluation that follows compares the base model with itself: it
proves the evaluation protocol runs, not that anything improved.

Usage (the engine fills the placeholders):

    python3 record_only.py --train {train} --validation {validation} \
        --base-model {base_model} --output-dir {output_dir}
"""

import argparse
import hashlib
import json
import os
import shutil
import sys


def check(path):
    """Counts the examples of a JSONL file and the tool calls in them."""
    examples = 0
    tool_calls = 0
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as e:
                sys.exit(f"{path}:{n}: not JSON: {e}")
            messages = record.get("messages") if isinstance(record, dict) else None
            if not isinstance(messages, list) or not messages:
                sys.exit(f"{path}:{n}: no \"messages\" list")
            for m in messages:
                if m.get("role") == "assistant":
                    tool_calls += len(m.get("tool_calls") or [])
            examples += 1
    return examples, tool_calls


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--train", required=True)
    p.add_argument("--validation", required=True)
    p.add_argument("--base-model", required=True)
    p.add_argument("--output-dir", required=True)
    a = p.parse_args()

    train_n, train_calls = check(a.train)
    val_n, val_calls = check(a.validation)
    received = os.path.join(a.output_dir, "received")
    os.makedirs(received, exist_ok=True)
    shutil.copyfile(a.train, os.path.join(received, "train.jsonl"))
    shutil.copyfile(a.validation, os.path.join(received, "validation.jsonl"))
    summary = {
        "trainer": "record-only (nothing trained)",
        "base_model": a.base_model,
        "train_examples": train_n,
        "train_tool_calls": train_calls,
        "train_sha256": sha256(a.train),
        "validation_examples": val_n,
        "validation_tool_calls": val_calls,
        "validation_sha256": sha256(a.validation),
    }
    with open(os.path.join(received, "summary.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2, sort_keys=True)
        f.write("\n")
    with open(os.path.join(a.output_dir, "metrics.jsonl"), "w", encoding="utf-8") as f:
        line = {
            "checkpoint": "record-only",
            "validation_loss": 0.0,
            "trained": False,
            "note": "placeholder loss: a record-only trainer computes none",
        }
        f.write(json.dumps(line, sort_keys=True) + "\n")
    print(
        f"record-only trainer: received {train_n} training and {val_n} validation "
        f"examples for {a.base_model} ({train_calls} + {val_calls} tool calls); nothing trained"
    )


if __name__ == "__main__":
    main()
