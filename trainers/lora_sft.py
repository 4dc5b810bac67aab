#!/usr/bin/env python3
"""LoRA SFT on a MASS dataset export: the real trainer of `[trainer] kind = "command"`.

The engine runs it with the cycle's exported training and validation sets (TRL
format, `mass export dataset --format trl`: one JSON object per line with
"messages" in the OpenAI chat shape, assistant "tool_calls" whose "arguments" are
an object or a JSON string, an assistant turn's "reasoning_content" when the model
returned reasoning, "tool" messages with "tool_call_id", and "tools"):

    python trainers/lora_sft.py --train {train} --validation {validation} \\
        --base-model {base_model} --output-dir {output_dir} [hyperparameters]

with the train venv's python (scripts/train-env.sh prints it and prepares the base
model directory, the converter and the venv). What it does:

- renders every example with trainers/chatml_tools.jinja (ChatML, tools in the
  system turn, Hermes <tool_call> blocks) and tokenizes it with the prepared
  tokenizer (llama.cpp's tokenization, digits split); labels are the assistant
  turns only (what follows "<|im_start|>assistant\\n", up to and including
  <|im_end|>: the reasoning as <think>\\n...\\n</think>\\n\\n, the content and
  the tool calls), from the template's {% generation %} marks;
- truncates examples longer than --max-length (--truncation keep_start, the
  default, keeps the beginning; keep_end keeps the end) and drops, with a warning
  naming FILE:LINE, those left without an assistant token;
- trains a LoRA adapter (all linear layers of the fp32 base, TRL's SFTTrainer,
  CPU, deterministic for a given --seed), logging every optimizer step;
- evaluates the validation loss before training (the starting model; with
  --init-adapter also the base model, the adapter switched off) and at every
  checkpoint (every --eval-every steps and at the last step), saves the checkpoint
  as a PEFT adapter and converts it to a llama.cpp LoRA GGUF
  (convert_lora_to_gguf.py from the llama-cpp-python release that serves it) so
  `python -m llama_cpp.server --model BASE.gguf --lora_path adapter.gguf` loads it.

Output (OUTPUT_DIR):

    metrics.jsonl         one JSON object per line, in this order:
      {"kind": "dataset", "split": "train"|"validation", "examples", "truncated",
       "dropped_without_assistant_tokens", "tokens", "supervised_tokens", "max_length",
       "truncation"}
      {"kind": "base_model", "base_model_validation_loss"}          (with --init-adapter, unless
                                                                   --no-eval-base: the base model,
                                                                   the adapter switched off)
      {"kind": "base", "step": 0, "base_validation_loss"}           (unless --no-eval-base: the
                                                                   starting model, before step 1)
      {"kind": "step", "step", "train_loss", "learning_rate", "tokens", "tokens_total",
       "epoch", "grad_norm", "mean_token_accuracy", "seconds"}      one per optimizer step
      {"kind": "checkpoint", "step", "checkpoint": "checkpoint-N", "validation_loss",
       "epoch"}                                                     one per checkpoint, written
                                                                   once its files are complete
    checkpoint-N/         adapter_config.json, adapter_model.safetensors (PEFT),
                          adapter.gguf (llama.cpp LoRA), trainer_state.json
    trainer.json          resolved hyperparameters, library versions, sha256 of this
                          script and of the template, the data summary, every
                          checkpoint and the chosen one with the reason

"train_loss" is the mean loss per supervised token of that step's batch;
"validation_loss" is the mean, over validation examples, of each example's mean loss
per supervised (assistant) token (transformers' eval_loss with batch size 1). The
chosen checkpoint is the first with the lowest validation loss: the rule the engine
applies to the checkpoint lines. Non-finite losses are written as null (JSON has no
NaN), so the engine never picks them. Exit status 1 with a message on stderr on bad
input (FILE:LINE named), an empty set, a set with no assistant token left, a missing
base directory ("run scripts/train-env.sh"), or a failed conversion.
"""

import argparse
import hashlib
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CACHE = os.environ.get("MASS_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "mass")
LLAMACPP_VERSION = "0.3.36"
KEEP_IN_CHECKPOINT = {"adapter_config.json", "adapter_model.safetensors", "adapter.gguf", "trainer_state.json"}


class Failure(Exception):
    """An error the user can act on: printed without a traceback, exit 1."""


def fail(msg):
    raise Failure(msg)


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def finite_or_none(x):
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


# ---------------------------------------------------------------- arguments


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        prog="lora_sft.py",
        description=__doc__.splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    io = p.add_argument_group("engine contract")
    io.add_argument("--train", required=True, help="training set, TRL-format JSONL")
    io.add_argument("--validation", required=True, help="validation set, TRL-format JSONL")
    io.add_argument("--base-model", required=True, help="the base model's name (recorded)")
    io.add_argument("--output-dir", required=True, help="where metrics.jsonl, trainer.json and checkpoints go")
    io.add_argument(
        "--config",
        help="JSON object of hyperparameters (keys are the flags below, with - or _); "
        "flags given on the command line win",
    )
    h = p.add_argument_group("hyperparameters")
    h.add_argument("--rank", type=int, default=16, help="LoRA rank r")
    h.add_argument("--alpha", type=float, default=32, help="LoRA alpha (scale alpha/r)")
    h.add_argument("--dropout", type=float, default=0.05, help="LoRA dropout")
    h.add_argument("--learning-rate", type=float, default=2e-4, help="peak learning rate (AdamW)")
    h.add_argument("--lr-scheduler", default="linear", help="transformers scheduler name (linear, cosine, constant, ...)")
    h.add_argument("--warmup-steps", type=int, default=0, help="linear warm-up steps")
    h.add_argument(
        "--min-lr-ratio",
        type=float,
        default=0.0,
        help="cosine only: the floor the learning rate decays to, as a fraction of the peak (MASS: 0.1)",
    )
    h.add_argument("--adam-beta1", type=float, default=0.9, help="AdamW beta1")
    h.add_argument("--adam-beta2", type=float, default=0.999, help="AdamW beta2 (MASS: 0.95)")
    h.add_argument("--weight-decay", type=float, default=0.0, help="AdamW weight decay")
    h.add_argument("--epochs", type=float, default=2.0, help="passes over the training set")
    h.add_argument("--max-steps", type=int, default=-1, help="optimizer steps; > 0 overrides --epochs")
    h.add_argument("--batch-size", type=int, default=1, help="examples per micro-batch")
    h.add_argument("--grad-accum", type=int, default=1, help="micro-batches per optimizer step")
    h.add_argument("--max-length", type=int, default=4096, help="tokens per example, longer ones are truncated")
    h.add_argument(
        "--truncation", choices=["keep_start", "keep_end"], default="keep_start", help="which end of a long example to keep"
    )
    h.add_argument(
        "--eval-every", type=int, default=10, help="steps between checkpoints (each evaluated); 0: only the last step"
    )
    h.add_argument("--seed", type=int, default=42, help="LoRA init, data order, dropout")
    h.add_argument("--precision", choices=["fp32", "bf16"], default="fp32", help="bf16: CPU autocast (faster, less exact)")
    h.add_argument(
        "--gradient-checkpointing",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="recompute activations in the backward pass (4096 tokens: ~10.6 GiB with, ~18 GiB without)",
    )
    h.add_argument("--eval-base", action=argparse.BooleanOptionalAction, default=True, help="validation loss before training")
    h.add_argument("--gguf-outtype", choices=["f32", "f16", "bf16", "q8_0"], default="f16", help="adapter.gguf tensor type")
    h.add_argument(
        "--keep-checkpoints",
        choices=["all", "best"],
        default="all",
        help="best: at the end, delete the weights (not the metrics lines) of every checkpoint but the chosen one",
    )
    h.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch CPU threads")
    e = p.add_argument_group("environment (scripts/train-env.sh prepares these)")
    e.add_argument("--base-dir", default=os.path.join(CACHE, "smollm2-135m-hf"), help="fp32 HF model + tokenizer")
    e.add_argument(
        "--convert-script",
        default=os.path.join(CACHE, f"llama.cpp-{LLAMACPP_VERSION}", "convert_lora_to_gguf.py"),
        help="llama.cpp's convert_lora_to_gguf.py",
    )
    h.add_argument(
        "--init-adapter",
        help="a PEFT adapter directory to continue training (its rank/alpha/targets win); default: a new adapter",
    )
    e.add_argument("--chat-template", default=os.path.join(HERE, "chatml_tools.jinja"), help="Jinja chat template with {%% generation %%} marks")

    argv = sys.argv[1:] if argv is None else argv
    first, _ = p.parse_known_args(argv)
    if first.config:
        try:
            with open(first.config, encoding="utf-8") as f:
                cfg = json.load(f)
        except (OSError, ValueError) as err:
            p.error(f"--config {first.config}: {err}")
        if not isinstance(cfg, dict):
            p.error(f"--config {first.config}: not a JSON object")
        # The file's settings become flags placed before the command line's, so
        # they are checked like flags and the command line wins.
        actions = {x.dest: x for x in p._actions}
        contract = {"help", "config", "train", "validation", "base_model", "output_dir"}
        pre = []
        for k, v in cfg.items():
            dest = k.lstrip("-").replace("-", "_")
            if dest not in actions or dest in contract:
                p.error(f"--config {first.config}: unknown key {k!r}")
            flag = "--" + dest.replace("_", "-")
            if isinstance(actions[dest], argparse.BooleanOptionalAction):
                if not isinstance(v, bool):
                    p.error(f"--config {first.config}: {k!r} must be true or false")
                pre.append(flag if v else "--no-" + flag[2:])
            elif v is not None:
                if isinstance(v, (bool, dict, list)):
                    p.error(f"--config {first.config}: {k!r} must be a number or a string")
                pre += [flag, str(v)]
        argv = pre + list(argv)
    a = p.parse_args(argv)
    for name in ("rank", "max_length", "batch_size", "grad_accum", "threads"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if a.eval_every < 0:
        p.error("--eval-every must be 0 or more")
    if a.max_steps <= 0 and a.epochs <= 0:
        p.error("give --epochs > 0 or --max-steps > 0")
    if a.warmup_steps < 0:
        p.error("--warmup-steps must be 0 or more")
    for name in ("adam_beta1", "adam_beta2"):
        if not 0.0 <= getattr(a, name) < 1.0:
            p.error(f"--{name.replace('_', '-')} must be in [0, 1)")
    if not 0.0 <= a.min_lr_ratio < 1.0:
        p.error("--min-lr-ratio must be in [0, 1)")
    if a.min_lr_ratio > 0 and a.lr_scheduler not in ("cosine", "cosine_with_min_lr"):
        p.error(f"--min-lr-ratio applies to --lr-scheduler cosine only, not {a.lr_scheduler!r}")
    return a


def schedule_settings(a):
    """The optimizer and schedule settings of the training arguments: AdamW with
    --adam-beta1/--adam-beta2, and a cosine decay with a floor of --min-lr-ratio
    times the peak (transformers' cosine_with_min_lr) when one is given."""
    kw = {
        "learning_rate": a.learning_rate,
        "lr_scheduler_type": a.lr_scheduler,
        "warmup_steps": a.warmup_steps,
        "weight_decay": a.weight_decay,
        "adam_beta1": a.adam_beta1,
        "adam_beta2": a.adam_beta2,
    }
    if a.min_lr_ratio > 0:
        kw["lr_scheduler_type"] = "cosine_with_min_lr"
        kw["lr_scheduler_kwargs"] = {"min_lr_rate": a.min_lr_ratio}
    return kw


# ---------------------------------------------------------------- data


ROLES = {"system", "user", "assistant", "tool"}


def text_of(content, where):
    """Message content as a string: a string, null, or OpenAI text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            else:
                fail(f"{where}: content part without text: {json.dumps(part)[:80]}")
        return "".join(parts)
    fail(f"{where}: content is neither a string nor a list of text parts")


def read_jsonl(path):
    """The examples of a TRL-format JSONL file as (line number, messages, tools)."""
    try:
        f = open(path, encoding="utf-8")
    except OSError as err:
        fail(f"{path}: cannot read: {err}")
    examples = []
    with f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{n}"
            try:
                rec = json.loads(line)
            except ValueError as err:
                fail(f"{where}: not JSON: {err}")
            if not isinstance(rec, dict):
                fail(f"{where}: not a JSON object")
            msgs = rec.get("messages")
            if not isinstance(msgs, list) or not msgs:
                fail(f'{where}: no "messages" list')
            clean = []
            for i, m in enumerate(msgs):
                w = f"{where}: message {i}"
                if not isinstance(m, dict) or m.get("role") not in ROLES:
                    fail(f"{w}: not a message with a role in {sorted(ROLES)}")
                c = dict(m)
                c["content"] = text_of(m.get("content"), w)
                # What the model thought before an assistant turn: rendered
                # as <think>...</think> by the template and trained on.
                reasoning = m.get("reasoning_content")
                if reasoning is not None:
                    if not isinstance(reasoning, str):
                        fail(f"{w}: reasoning_content must be a string or null")
                    if m["role"] != "assistant":
                        fail(f"{w}: reasoning_content on a {m['role']} message; only assistant turns have it")
                calls = m.get("tool_calls")
                if calls is not None:
                    if m["role"] != "assistant" or not isinstance(calls, list):
                        fail(f"{w}: tool_calls must be a list on an assistant message")
                    for j, call in enumerate(calls):
                        fn = call.get("function") if isinstance(call, dict) else None
                        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                            fail(f"{w}: tool call {j} has no function name")
                        args = fn.get("arguments", {})
                        if not isinstance(args, (dict, str)):
                            fail(f"{w}: tool call {j}: arguments must be an object or a JSON string")
                clean.append(c)
            if not any(m["role"] == "assistant" for m in clean):
                fail(f"{where}: no assistant message, nothing to train on")
            tools = rec.get("tools")
            if tools is not None and not isinstance(tools, list):
                fail(f'{where}: "tools" is not a list')
            examples.append((n, clean, tools or None))
    if not examples:
        fail(f"{path}: empty dataset (no examples)")
    return examples


def tokenize_set(path, examples, tok, template, max_length, truncation, split):
    """input_ids/labels per example, truncated, plus the summary for metrics."""
    rows = {"input_ids": [], "labels": []}
    truncated = dropped = tokens = supervised = 0
    first_positions = []
    for n, msgs, tools in examples:
        where = f"{path}:{n}"
        try:
            out = tok.apply_chat_template(
                msgs,
                tools=tools,
                chat_template=template,
                tokenize=True,
                return_dict=True,
                return_assistant_tokens_mask=True,
            )
        except Exception as err:  # jinja errors name the template, not the line
            fail(f"{where}: cannot render with the chat template: {err}")
        ids = list(out["input_ids"])
        mask = list(out["assistant_masks"])
        if 1 not in mask:
            fail(f"{where}: the template marked no assistant token ({{% generation %}} missing?)")
        first_positions.append(mask.index(1))
        if len(ids) > max_length:
            truncated += 1
            sl = slice(None, max_length) if truncation == "keep_start" else slice(-max_length, None)
            ids, mask = ids[sl], mask[sl]
        if 1 not in mask:
            dropped += 1
            print(
                f"lora_sft: warning: {where}: no assistant token within {truncation} {max_length} tokens "
                f"(first at {first_positions[-1]}); example dropped",
                file=sys.stderr,
            )
            continue
        rows["input_ids"].append(ids)
        rows["labels"].append([t if k else -100 for t, k in zip(ids, mask)])
        tokens += len(ids)
        supervised += sum(mask)
    summary = {
        "kind": "dataset",
        "split": split,
        "examples": len(rows["input_ids"]),
        "truncated": truncated,
        "dropped_without_assistant_tokens": dropped,
        "tokens": tokens,
        "supervised_tokens": supervised,
        "max_length": max_length,
        "truncation": truncation,
    }
    if not rows["input_ids"]:
        fail(
            f"{path}: no example has an assistant token within --max-length {max_length} "
            f"(--truncation {truncation}; first assistant tokens at positions {sorted(set(first_positions))[:5]}): "
            f"raise --max-length or use --truncation keep_end"
        )
    return rows, summary


# ---------------------------------------------------------------- environment


def check_environment(a):
    base = a.base_dir
    for f in ("config.json", "model.safetensors", "tokenizer.json", "mass-base.json"):
        if not os.path.isfile(os.path.join(base, f)):
            fail(f"base model directory {base} is missing {f}: run scripts/train-env.sh (it prepares it once)")
    if not os.path.isfile(a.convert_script):
        fail(f"{a.convert_script} not found: run scripts/train-env.sh (it fetches llama.cpp's converter)")
    if not os.path.isfile(a.chat_template):
        fail(f"chat template {a.chat_template} not found")
    if a.init_adapter:
        for f in ("adapter_config.json", "adapter_model.safetensors"):
            if not os.path.isfile(os.path.join(a.init_adapter, f)):
                fail(f"--init-adapter {a.init_adapter} has no {f}")


def convert_to_gguf(a, ckpt_dir):
    """adapter.gguf next to the PEFT adapter, with llama.cpp's converter."""
    out = os.path.join(ckpt_dir, "adapter.gguf")
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TQDM_DISABLE="1")
    cmd = [sys.executable, a.convert_script, "--base", a.base_dir, "--outtype", a.gguf_outtype, "--outfile", out, ckpt_dir]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0 or not os.path.isfile(out):
        tail = "\n".join((r.stdout + r.stderr).strip().splitlines()[-15:])
        fail(f"convert_lora_to_gguf.py failed on {ckpt_dir} (exit {r.returncode}):\n{tail}")
    return out


# ---------------------------------------------------------------- training


def training_arguments(a, SFTConfig):
    """TRL's SFTConfig (transformers' TrainingArguments) from the resolved flags."""
    eval_steps = a.eval_every if a.eval_every > 0 else 10**9
    return SFTConfig(
        output_dir=a.output_dir,
        per_device_train_batch_size=a.batch_size,
        per_device_eval_batch_size=1,
        gradient_accumulation_steps=a.grad_accum,
        **schedule_settings(a),
        num_train_epochs=a.epochs,
        max_steps=a.max_steps if a.max_steps > 0 else -1,
        logging_strategy="steps",
        logging_steps=1,
        logging_first_step=True,
        eval_strategy="steps",
        eval_steps=eval_steps,
        eval_on_start=a.eval_base,
        save_strategy="steps",
        save_steps=eval_steps,
        save_only_model=True,
        seed=a.seed,
        data_seed=a.seed,
        use_cpu=True,
        bf16=a.precision == "bf16",
        activation_checkpointing=a.gradient_checkpointing,
        activation_checkpointing_kwargs={"use_reentrant": False} if a.gradient_checkpointing else None,
        max_length=None,  # truncated above, where it is counted
        packing=False,
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )


def main(argv=None):
    a = parse_args(argv)
    t_start = time.time()
    check_environment(a)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    train_examples = read_jsonl(a.train)
    val_examples = read_jsonl(a.validation)

    import warnings

    warnings.filterwarnings("ignore", category=FutureWarning)  # deprecation notices of the pinned versions
    import datasets
    import peft
    import torch
    import transformers
    import trl
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback, TrainerCallback
    from trl import SFTConfig, SFTTrainer

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    datasets.utils.logging.disable_progress_bar()
    torch.set_num_threads(a.threads)
    transformers.set_seed(a.seed)

    template = open(a.chat_template, encoding="utf-8").read()
    tok = AutoTokenizer.from_pretrained(a.base_dir)
    digits = tok("2024", add_special_tokens=False)["input_ids"]
    if len(digits) != 4:
        fail(
            f"the tokenizer in {a.base_dir} does not split digits (2024 -> {len(digits)} tokens; llama.cpp makes 4): "
            "run scripts/train-env.sh to prepare it again"
        )
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token

    train_rows, train_summary = tokenize_set(
        a.train, train_examples, tok, template, a.max_length, a.truncation, "train"
    )
    val_rows, val_summary = tokenize_set(
        a.validation, val_examples, tok, template, a.max_length, a.truncation, "validation"
    )

    os.makedirs(a.output_dir, exist_ok=True)
    for stale in ("metrics.jsonl", "trainer.json"):
        if os.path.exists(os.path.join(a.output_dir, stale)):
            os.remove(os.path.join(a.output_dir, stale))
    for d in os.listdir(a.output_dir):
        if d.startswith("checkpoint-"):
            fail(f"{a.output_dir} already holds {d}: give an empty --output-dir")
    metrics_path = os.path.join(a.output_dir, "metrics.jsonl")
    metrics = open(metrics_path, "w", encoding="utf-8")

    def emit(obj):
        metrics.write(json.dumps(obj, sort_keys=True) + "\n")
        metrics.flush()

    emit(train_summary)
    emit(val_summary)
    for s in (train_summary, val_summary):
        print(
            f"lora_sft: {s['split']}: {s['examples']} examples, {s['tokens']} tokens "
            f"({s['supervised_tokens']} supervised), {s['truncated']} truncated to {a.max_length}, "
            f"{s['dropped_without_assistant_tokens']} dropped without assistant tokens",
            file=sys.stderr,
        )

    train_ds = datasets.Dataset.from_dict(train_rows)
    val_ds = datasets.Dataset.from_dict(val_rows)

    model = AutoModelForCausalLM.from_pretrained(a.base_dir, dtype=torch.float32)
    model.config.use_cache = False

    if a.init_adapter:
        # Continue training an adapter (e.g. the previous cycle's chosen checkpoint):
        # its rank, alpha and target modules, not the flags', apply.
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, a.init_adapter, is_trainable=True)
        lora = None
        pc = model.peft_config["default"]
        a.rank, a.alpha = pc.r, pc.lora_alpha
    else:
        lora = LoraConfig(
            r=a.rank,
            lora_alpha=a.alpha,
            lora_dropout=a.dropout,
            target_modules="all-linear",
            bias="none",
            task_type="CAUSAL_LM",
        )
    cfg = training_arguments(a, SFTConfig)

    checkpoints = []  # {"checkpoint", "step", "validation_loss", "epoch"}
    state = {
        "eval": None, "tokens_total": 0, "t_step": time.time(), "base": None, "train_runtime": None,
        "base_model": None, "measuring_base_model": False,
    }

    class Recorder(TrainerCallback):
        def on_train_begin(self, args, st, control, **kw):
            state["t_step"] = time.time()

        def on_log(self, args, st, control, logs=None, **kw):
            logs = logs or {}
            if "eval_loss" in logs and state["measuring_base_model"]:
                loss = finite_or_none(logs["eval_loss"])
                state["base_model"] = loss
                emit({"kind": "base_model", "base_model_validation_loss": loss})
                print(f"lora_sft: base model (adapter off) validation loss {loss}", file=sys.stderr)
            elif "eval_loss" in logs:
                loss = finite_or_none(logs["eval_loss"])
                state["eval"] = (st.global_step, loss)
                if st.global_step == 0:
                    state["base"] = loss
                    emit({"kind": "base", "step": 0, "base_validation_loss": loss})
                    print(f"lora_sft: starting model validation loss {loss}", file=sys.stderr)
                    state["t_step"] = time.time()
            elif "loss" in logs:
                now = time.time()
                total = int(logs.get("num_tokens", state["tokens_total"]))
                line = {
                    "kind": "step",
                    "step": st.global_step,
                    "train_loss": finite_or_none(logs["loss"]),
                    "learning_rate": finite_or_none(logs.get("learning_rate")),
                    "tokens": total - state["tokens_total"],
                    "tokens_total": total,
                    "epoch": finite_or_none(logs.get("epoch")),
                    "grad_norm": finite_or_none(logs.get("grad_norm")),
                    "mean_token_accuracy": finite_or_none(logs.get("mean_token_accuracy")),
                    "seconds": round(now - state["t_step"], 3),
                }
                state["tokens_total"] = total
                state["t_step"] = now
                emit(line)
                print(
                    f"lora_sft: step {line['step']}/{st.max_steps} loss {line['train_loss']:.4f} "
                    f"lr {line['learning_rate']:.3g} {line['tokens']} tokens {line['seconds']:.1f}s",
                    file=sys.stderr,
                )
            elif "train_runtime" in logs:
                state["train_runtime"] = logs["train_runtime"]

        def on_save(self, args, st, control, **kw):
            name = f"checkpoint-{st.global_step}"
            d = os.path.join(args.output_dir, name)
            for f in os.listdir(d):
                if f not in KEEP_IN_CHECKPOINT:
                    p = os.path.join(d, f)
                    shutil.rmtree(p) if os.path.isdir(p) else os.remove(p)
            cfg_path = os.path.join(d, "adapter_config.json")
            with open(cfg_path, encoding="utf-8") as f:
                adapter_cfg = json.load(f)
            if isinstance(adapter_cfg.get("target_modules"), list):  # a set in PEFT: hash order
                adapter_cfg["target_modules"] = sorted(adapter_cfg["target_modules"])
            with open(cfg_path, "w", encoding="utf-8") as f:
                json.dump(adapter_cfg, f, indent=2, sort_keys=True)
                f.write("\n")
            convert_to_gguf(a, d)
            ev = state["eval"]
            loss = ev[1] if ev is not None and ev[0] == st.global_step else None
            line = {
                "kind": "checkpoint",
                "step": st.global_step,
                "checkpoint": name,
                "validation_loss": loss,
                "epoch": finite_or_none(st.epoch),
            }
            checkpoints.append(line)
            emit(line)
            print(f"lora_sft: {name}: validation loss {loss}, adapter.gguf written", file=sys.stderr)
            state["t_step"] = time.time()

    class Trainer(SFTTrainer):
        def create_model_card(self, *args, **kwargs):  # no README.md in the output tree
            return None

    trainer = Trainer(
        model=model,
        args=cfg,
        train_dataset=train_ds,
        eval_dataset=val_ds,
        processing_class=tok,
        peft_config=lora,
        callbacks=[Recorder()],
    )
    trainer.remove_callback(PrinterCallback)  # our own lines on stderr instead of log dicts on stdout
    if a.init_adapter and a.eval_base:
        # Trained on from an adapter: the base model itself (the adapter
        # switched off) on the same validation lines, so that learning is
        # measured against the base model in every cycle, not only the first.
        state["measuring_base_model"] = True
        with trainer.model.disable_adapter():
            trainer.evaluate()
        state["measuring_base_model"] = False
    trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    print(
        f"lora_sft: training {trainable} LoRA parameters (r={a.rank}, alpha={a.alpha}, all linear layers) "
        f"on {len(train_ds)} examples, {a.threads} threads, {a.precision}",
        file=sys.stderr,
    )
    trainer.train()
    metrics.close()

    valid = [c for c in checkpoints if c["validation_loss"] is not None]
    if not valid:
        fail("no checkpoint has a finite validation loss")
    best = None
    for c in valid:  # the first lowest, as the engine picks
        if best is None or c["validation_loss"] < best["validation_loss"]:
            best = c
    reason = (
        f"lowest validation loss ({best['validation_loss']:.6g} at step {best['step']}) "
        f"of {len(valid)} checkpoint(s)"
    )
    if state["base_model"] is not None:
        reason += f"; the base model: {state['base_model']:.6g}"
    if state["base"] is not None:
        reason += f"; {'the initial adapter' if a.init_adapter else 'the base model'}: {state['base']:.6g}"
    if a.keep_checkpoints == "best":
        for c in checkpoints:
            if c is not best:
                d = os.path.join(a.output_dir, c["checkpoint"])
                for f in ("adapter_model.safetensors", "adapter.gguf"):
                    if os.path.exists(os.path.join(d, f)):
                        os.remove(os.path.join(d, f))

    hyper = {
        k: getattr(a, k)
        for k in (
            "rank", "alpha", "dropout", "learning_rate", "lr_scheduler", "warmup_steps", "min_lr_ratio",
            "adam_beta1", "adam_beta2", "weight_decay",
            "epochs", "max_steps", "batch_size", "grad_accum", "max_length", "truncation", "eval_every",
            "seed", "precision", "gradient_checkpointing", "eval_base", "gguf_outtype", "keep_checkpoints",
            "threads",
        )
    }
    hyper["target_modules"] = "all-linear"
    hyper["init_adapter"] = None
    if a.init_adapter:
        hyper["init_adapter"] = {
            "dir": os.path.abspath(a.init_adapter),
            "adapter_model_sha256": sha256_file(os.path.join(a.init_adapter, "adapter_model.safetensors")),
        }
    hyper["steps"] = trainer.state.global_step
    try:
        base_stamp = json.load(open(os.path.join(a.base_dir, "mass-base.json"), encoding="utf-8"))
    except (OSError, ValueError):
        base_stamp = None
    record = {
        "trainer": "trainers/lora_sft.py",
        "script_sha256": sha256_file(os.path.abspath(__file__)),
        "chat_template": os.path.basename(a.chat_template),
        "chat_template_sha256": hashlib.sha256(template.encode("utf-8")).hexdigest(),
        "base_model": a.base_model,
        "base_dir": os.path.abspath(a.base_dir),
        "base": base_stamp,
        "convert_script": os.path.abspath(a.convert_script),
        "convert_script_sha256": sha256_file(a.convert_script),
        "hyperparameters": hyper,
        "versions": {
            "python": sys.version.split()[0],
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "peft": peft.__version__,
            "trl": trl.__version__,
            "datasets": datasets.__version__,
            "llama_cpp_converter": LLAMACPP_VERSION,
        },
        "data": {
            "train": dict(train_summary, file=os.path.abspath(a.train), sha256=sha256_file(a.train)),
            "validation": dict(val_summary, file=os.path.abspath(a.validation), sha256=sha256_file(a.validation)),
        },
        "base_validation_loss": state["base"],
        "base_model_validation_loss": state["base_model"] if a.init_adapter else state["base"],
        "checkpoints": checkpoints,
        "chosen": {
            "checkpoint": best["checkpoint"],
            "step": best["step"],
            "validation_loss": best["validation_loss"],
            "reason": reason,
        },
        "validation_loss_definition": "mean over validation examples of the mean loss per assistant token",
        "seconds": round(time.time() - t_start, 1),
        "train_runtime_seconds": state["train_runtime"],
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }
    with open(os.path.join(a.output_dir, "trainer.json"), "w", encoding="utf-8") as f:
        json.dump(record, f, indent=2, sort_keys=True)
        f.write("\n")
    print(f"lora_sft: chose {best['checkpoint']}: {reason}", file=sys.stderr)
    print(f"chose {best['checkpoint']} ({reason})")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Failure as err:
        print(f"lora_sft: error: {err}", file=sys.stderr)
        sys.exit(1)
