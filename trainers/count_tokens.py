#!/usr/bin/env python3
"""Counts served prompts the way trainers/lora_sft.py renders and tokenizes
training conversations: the `prompt_tokens_command` of a backend `mass`
serves (template parity, engine/src/backend/parity.rs).

Reads OpenAI chat-completions request bodies on standard input, one JSON
object per line, exactly as `mass` sent them to the server; renders each
request's `messages` and `tools` with the training template
(trainers/chatml_tools.jinja, with the generation prompt) and the trainer's
tokenizer (the base directory's, with SmolLM2's digit split restored by
prepare_base.py); and answers one line per request on standard output:

    {"prompt_tokens": N}        or        {"error": "why"}

A server that renders the same conversation with the same template and
tokenizer reports the same `usage.prompt_tokens`; `mass report` shows, per
served model, how many calls agreed.

    count_tokens.py [--base-dir DIR] [--chat-template FILE]
"""

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import lora_sft  # noqa: E402  (the trainer's own message handling)


def count(tok, template, request):
    """The prompt's length in tokens, as the trainer would render it."""
    if not isinstance(request, dict) or not isinstance(request.get("messages"), list):
        raise lora_sft.Failure('not a request body with a "messages" list')
    msgs = []
    for i, m in enumerate(request["messages"]):
        if not isinstance(m, dict) or m.get("role") not in lora_sft.ROLES:
            raise lora_sft.Failure(f"message {i} has no role in {sorted(lora_sft.ROLES)}")
        c = dict(m)
        c["content"] = lora_sft.text_of(m.get("content"), f"message {i}")
        msgs.append(c)
    tools = request.get("tools") or None
    out = tok.apply_chat_template(
        msgs,
        tools=tools,
        chat_template=template,
        tokenize=True,
        return_dict=True,
        add_generation_prompt=True,
    )
    return len(out["input_ids"])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cache = os.environ.get("MASS_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "mass")
    ap.add_argument("--base-dir", default=os.path.join(cache, "smollm2-135m-hf"))
    ap.add_argument("--chat-template", default=os.path.join(HERE, "chatml_tools.jinja"))
    a = ap.parse_args(argv)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(a.base_dir)
    with open(a.chat_template, encoding="utf-8") as f:
        template = f.read()
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            answer = {"prompt_tokens": count(tok, template, json.loads(line))}
        except lora_sft.Failure as err:
            answer = {"error": str(err)}
        except Exception as err:  # a template error names the template, not the request
            answer = {"error": f"{type(err).__name__}: {err}"}
        print(json.dumps(answer), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
