#!/usr/bin/env python3
"""End-to-end self-test of trainers/lora_sft.py on the sample export in testdata/.

Run with the train venv's python (trainers/selftest.sh does: it prepares the
environment with scripts/train-env.sh first). Needs the llama-cpp-python venv
that scripts/llamacpp-server.sh builds ($MASS_CACHE/llamacpp-venv, or
MASS_LLAMACPP_PYTHON) for the tokenizer parity and serving checks.

What it checks, on testdata/train.jsonl (4 examples, ~6.3k tokens each) and
testdata/validation.jsonl (1 example), exported by `mass export dataset --format trl`:

- the command-line errors: a bad JSONL line is named FILE:LINE, an empty set, a
  missing base directory says "run scripts/train-env.sh", a --max-length that
  leaves no assistant token says so;
- the assistant mask: decoding the supervised tokens of every example gives
  exactly each assistant turn as the template should render it (reasoning as
  <think> blocks, content, <tool_call> blocks, <|im_end|>) and nothing of the
  system, user or tool turns, on testdata/ and on testdata/reasoning.jsonl (every
  turn's reasoning a target, none of it in the prompt part);
- reading: reasoning_content is refused on other roles and when not a string;
- tokenizer parity with llama.cpp (llama_cpp.Llama(vocab_only=True).tokenize in
  the server's venv) on texts with digits and on every rendered example;
- two trainings (seeds 1 and 2, the last 128 tokens of each example, all four in
  each optimizer step, 4 steps at a high learning rate so that the decrease is
  large and the adapter visibly changes greedy output): metrics.jsonl's shape,
  train loss at the last step below the first (same batch every step, no
  dropout), checkpoint files (PEFT adapter, llama.cpp LoRA GGUF), the chosen
  checkpoint is the one with the lowest validation loss;
- determinism: a 2-step run with seed 1 repeats the first two losses of the
  4-step run with seed 1;
- serving: llama-cpp-python's server with --lora_path adapter.gguf and without,
  same prompt, temperature 0, same seed: the greedy completions differ.

Prints figures (seconds per step, peak RSS, losses) and a closing
"selftest: N passed, M failed" line.
"""

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True  # no __pycache__ in the work tree
import lora_sft  # noqa: E402  (stdlib-only at import time)

CACHE = lora_sft.CACHE
TRAIN = os.path.join(HERE, "testdata", "train.jsonl")
VALID = os.path.join(HERE, "testdata", "validation.jsonl")
# A conversation with reasoning on every assistant turn (streamed and not, tool calls
# and text), as `mass` exports it: engine/tests/proxy.rs checks it is that export.
REASONING = os.path.join(HERE, "testdata", "reasoning.jsonl")
BASE_DIR = os.path.join(CACHE, "smollm2-135m-hf")
GGUF = os.path.join(CACHE, "SmolLM2-135M-Instruct.Q4_1.gguf")
LLAMACPP_PY = os.environ.get("MASS_LLAMACPP_PYTHON") or os.path.join(CACHE, "llamacpp-venv", "bin", "python")
# llama.cpp's own server, built by scripts/llama-server-env.sh.
LLAMA_SERVER = os.environ.get("MASS_LLAMA_SERVER") or os.path.join(CACHE, "llama-server-0.3.36", "bin", "llama-server")
SERVE_TEMPLATE = os.path.join(HERE, "chatml_tools.serve.jinja")
TEMPLATE = os.path.join(HERE, "chatml_tools.jinja")

# A short, fast and strong training: the last 128 tokens of each example (the
# assistant's last tool calls and the end of its big write_file call), all four
# examples in every optimizer step so that step losses are comparable, no
# dropout, a learning rate ten times the default.
MAX_LENGTH = 128
TRAIN_ARGS = [
    "--max-length", str(MAX_LENGTH), "--truncation", "keep_end", "--batch-size", "4",
    "--learning-rate", "2e-3", "--dropout", "0", "--no-gradient-checkpointing",
]
STEPS = 4
EVAL_EVERY = 2

WORK = None
RUNS = {}  # seed -> {"dir", "metrics", "trainer", "seconds", "peak_rss"}
FIGURES = []


def note(msg):
    FIGURES.append(msg)
    print(f"  {msg}", file=sys.stderr, flush=True)


def run_trainer(out_dir, *extra, check=True):
    cmd = [
        sys.executable, os.path.join(HERE, "lora_sft.py"),
        "--train", TRAIN, "--validation", VALID, "--base-model", "smollm2-135m",
        "--output-dir", out_dir, *extra,
    ]
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise AssertionError(f"trainer failed ({r.returncode}):\n{r.stderr[-3000:]}")
    return r, time.time() - t0


def read_metrics(out_dir):
    with open(os.path.join(out_dir, "metrics.jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def setUpModule():
    global WORK
    if not os.path.isfile(os.path.join(BASE_DIR, "mass-base.json")):
        raise RuntimeError(f"{BASE_DIR} is not prepared: run scripts/train-env.sh")
    WORK = tempfile.mkdtemp(prefix="lora-sft-test-")
    if not {"Training", "Serving"} & set(SELECTED):
        return
    for seed in (1, 2):
        out = os.path.join(WORK, f"seed{seed}")
        r, secs = run_trainer(
            out, *TRAIN_ARGS, "--seed", str(seed), "--max-steps", str(STEPS), "--eval-every", str(EVAL_EVERY)
        )
        with open(os.path.join(out, "trainer.json"), encoding="utf-8") as f:
            rec = json.load(f)
        RUNS[seed] = {"dir": out, "metrics": read_metrics(out), "trainer": rec, "seconds": secs, "log": r.stderr}
        steps = [m for m in RUNS[seed]["metrics"] if m["kind"] == "step"]
        note(
            f"seed {seed}: {secs:.0f}s for {STEPS} steps of {steps[0]['tokens']} tokens "
            f"(median {sorted(s['seconds'] for s in steps)[len(steps) // 2]:.1f}s a step), "
            f"peak RSS {rec['peak_rss_bytes'] / 2**30:.2f} GiB, train loss {steps[0]['train_loss']:.3f} -> "
            f"{steps[-1]['train_loss']:.3f}, validation loss {rec['base_validation_loss']:.3f} (base) -> "
            f"{rec['chosen']['validation_loss']:.3f} ({rec['chosen']['checkpoint']})"
        )


def tearDownModule():
    if WORK and not os.environ.get("KEEP_LORA_SFT_TEST"):
        shutil.rmtree(WORK, ignore_errors=True)


def preset(name):
    """The `[trainer.hyperparameters]` table of preset NAME in trainers/README.md."""
    import tomllib

    text = open(os.path.join(HERE, "README.md"), encoding="utf-8").read()
    m = re.search(r"```toml\n# preset: " + re.escape(name) + r"\n(.*?)```", text, re.S)
    if m is None:
        raise AssertionError(f"trainers/README.md has no preset {name!r}")
    return tomllib.loads(m.group(1))["trainer"]["hyperparameters"]


class Schedule(unittest.TestCase):
    """The MASS reference preset reaches the optimizer and the schedule: the
    training arguments lora_sft.py builds from it (through --config, as the
    engine hands it over) give AdamW with betas (0.9, 0.95) and a learning rate
    that warms up over 5 steps to 3e-5 and decays by a cosine to 10% of it."""

    STEPS = 40

    def built(self, hyper):
        import torch
        import transformers
        from trl import SFTConfig

        cfg_path = os.path.join(WORK, "reference.json")
        with open(cfg_path, "w", encoding="utf-8") as f:
            json.dump(hyper, f)
        a = lora_sft.parse_args(
            ["--train", TRAIN, "--validation", VALID, "--base-model", "m",
             "--output-dir", os.path.join(WORK, "schedule"), "--config", cfg_path]
        )
        args = lora_sft.training_arguments(a, SFTConfig)
        # A stand-in model and evaluation set: only the optimizer and schedule are built.
        trainer = transformers.Trainer(model=torch.nn.Linear(4, 4), args=args, eval_dataset=[0])
        trainer.create_optimizer_and_scheduler(num_training_steps=self.STEPS)
        lrs = []
        for _ in range(self.STEPS + 1):
            lrs.append(trainer.lr_scheduler.get_last_lr()[0])
            trainer.optimizer.step()
            trainer.lr_scheduler.step()
        return a, trainer.optimizer, lrs

    def test_reference_preset(self):
        hyper = preset("mass-reference")
        a, opt, lrs = self.built(hyper)
        self.assertEqual((a.rank, a.alpha, a.dropout), (64, 128, 0.05))
        self.assertIn("AdamW", type(opt).__name__)
        for group in opt.param_groups:
            self.assertEqual(tuple(group["betas"]), (0.9, 0.95))
        peak = 3e-5
        self.assertEqual(lrs[0], 0.0)
        for step in range(1, 6):  # linear warm-up over 5 steps
            self.assertAlmostEqual(lrs[step], peak * step / 5, delta=peak * 1e-9)
        decay = lrs[5:]
        self.assertTrue(all(x >= y for x, y in zip(decay, decay[1:])), decay)
        self.assertAlmostEqual(lrs[self.STEPS], 0.1 * peak, delta=peak * 1e-9)  # the floor
        self.assertGreater(min(lrs[5:]), 0.1 * peak - peak * 1e-9)
        # Half-way through the decay: half-way between the peak and the floor.
        mid = 5 + (self.STEPS - 5) / 2
        if mid == int(mid):
            self.assertAlmostEqual(lrs[int(mid)], 0.55 * peak, delta=peak * 1e-9)
        note(f"reference schedule: lr {lrs[1]:.3g} .. {max(lrs):.3g} .. {lrs[-1]:.3g} over {self.STEPS} steps")

    def test_defaults_keep_the_old_schedule(self):
        # No new key: the linear decay to 0 and torch's default betas, as before.
        _, opt, lrs = self.built({"learning-rate": 2e-4})
        self.assertEqual(tuple(opt.param_groups[0]["betas"]), (0.9, 0.999))
        self.assertEqual(lrs[self.STEPS], 0.0)

    def test_floor_needs_cosine(self):
        with self.assertRaises(SystemExit):
            self.built({"min-lr-ratio": 0.1})


class Errors(unittest.TestCase):
    """Bad input fails fast with a message naming the problem."""

    def trainer(self, *args):
        d = tempfile.mkdtemp(dir=WORK)
        cmd = [sys.executable, os.path.join(HERE, "lora_sft.py"), "--base-model", "m", "--output-dir", d, *args]
        return subprocess.run(cmd, capture_output=True, text=True)

    def test_bad_line_is_named(self):
        bad = os.path.join(WORK, "bad.jsonl")
        with open(TRAIN, encoding="utf-8") as f, open(bad, "w", encoding="utf-8") as g:
            g.write(f.readline())
            g.write("{not json\n")
        r = self.trainer("--train", bad, "--validation", VALID)
        self.assertEqual(r.returncode, 1)
        self.assertIn(f"{bad}:2: not JSON", r.stderr)

    def test_empty_set(self):
        empty = os.path.join(WORK, "empty.jsonl")
        open(empty, "w").close()
        r = self.trainer("--train", TRAIN, "--validation", empty)
        self.assertEqual(r.returncode, 1)
        self.assertIn("empty dataset", r.stderr)

    def test_missing_base_dir(self):
        r = self.trainer("--train", TRAIN, "--validation", VALID, "--base-dir", os.path.join(WORK, "nowhere"))
        self.assertEqual(r.returncode, 1)
        self.assertIn("run scripts/train-env.sh", r.stderr)

    def test_no_assistant_token_left(self):
        # The prompt (system turn with the tools, task) is ~2,070 tokens.
        r = self.trainer("--train", TRAIN, "--validation", VALID, "--max-length", "512")
        self.assertEqual(r.returncode, 1)
        self.assertIn("no assistant token within keep_start 512 tokens", r.stderr)
        self.assertIn(f"{TRAIN}:1", r.stderr)
        self.assertIn("no example has an assistant token", r.stderr)


def load_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(BASE_DIR)


def expected_generation(message):
    """What an assistant turn must produce, written out here independently of the template."""
    out = message.get("content") or ""
    for i, call in enumerate(message.get("tool_calls") or []):
        fn = call["function"]
        args = fn.get("arguments", {})
        args = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
        if out or i > 0:
            out += "\n"
        out += '<tool_call>\n{"name": "' + fn["name"] + '", "arguments": ' + args + "}\n</tool_call>"
    if message.get("reasoning_content"):
        out = "<think>\n" + message["reasoning_content"].strip("\n") + "\n</think>\n\n" + out
    return out + "<|im_end|>"


def supervised_and_rest(test, tok, template, path, n, msgs, tools):
    """The supervised spans of one example, decoded, and the decoded unsupervised rest."""
    rows, _ = lora_sft.tokenize_set(path, [(n, msgs, tools)], tok, template, 10**6, "keep_start", "t")
    ids, labels = rows["input_ids"][0], rows["labels"][0]
    spans, cur = [], []
    for t, lab in zip(ids, labels):
        if lab != -100:
            test.assertEqual(lab, t)
            cur.append(t)
        elif cur:
            spans.append(cur)
            cur = []
    if cur:
        spans.append(cur)
    got = [tok.decode(s, skip_special_tokens=False) for s in spans]
    rest = tok.decode([t for t, lab in zip(ids, labels) if lab == -100], skip_special_tokens=False)
    return got, rest


class Mask(unittest.TestCase):
    """Loss falls on assistant tokens, all of them, and on nothing else."""

    def test_supervised_tokens_are_the_assistant_turns(self):
        tok = load_tokenizer()
        template = open(TEMPLATE, encoding="utf-8").read()
        for path in (TRAIN, VALID, REASONING):
            examples = lora_sft.read_jsonl(path)
            for n, msgs, tools in examples:
                got, rest = supervised_and_rest(self, tok, template, path, n, msgs, tools)
                want = [expected_generation(m) for m in msgs if m["role"] == "assistant"]
                self.assertEqual(got, want, f"{path}:{n}")
                supervised = "".join(got)
                for m in msgs:
                    if m["role"] != "assistant" and m["content"]:
                        for piece in re.split(r"\n", m["content"]):
                            if len(piece) >= 24:
                                self.assertNotIn(piece, supervised, f"{path}:{n}: {m['role']} text supervised")
                for marker in ("<|im_start|>", "<tool_response>", "# Tools", "<tools>"):
                    self.assertNotIn(marker, supervised)
                # and the unsupervised rest holds every non-assistant turn
                for m in msgs:
                    if m["role"] != "assistant":
                        self.assertIn(m["content"], rest)

    def test_reasoning_is_a_target_in_every_assistant_turn(self):
        """Each assistant turn's reasoning is trained, inside <think></think> before what
        the turn says; none of it sits in the prompt part, and nothing else thinks."""
        tok = load_tokenizer()
        template = open(TEMPLATE, encoding="utf-8").read()
        examples = lora_sft.read_jsonl(REASONING)
        self.assertTrue(examples)
        for n, msgs, tools in examples:
            turns = [m for m in msgs if m["role"] == "assistant"]
            self.assertTrue(turns and all(m.get("reasoning_content") for m in turns), f"{REASONING}:{n}")
            self.assertTrue(any(m.get("tool_calls") for m in turns) and any(m["content"] for m in turns))
            got, rest = supervised_and_rest(self, tok, template, REASONING, n, msgs, tools)
            self.assertEqual(len(got), len(turns))
            for span, m in zip(got, turns):
                thought = m["reasoning_content"].strip("\n")
                self.assertTrue(span.startswith("<think>\n" + thought + "\n</think>\n\n"), span)
                for line in thought.split("\n"):
                    self.assertNotIn(line, rest)
            self.assertNotIn("<think>", rest)
            self.assertEqual("".join(got).count("<think>"), len(turns))


class Reading(unittest.TestCase):
    """reasoning_content is read as the assistant's, and refused anywhere else."""

    def read(self, messages):
        d = tempfile.mkdtemp()
        path = os.path.join(d, "x.jsonl")
        with open(path, "w", encoding="utf-8") as f:
            f.write(json.dumps({"messages": messages}) + "\n")
        try:
            return lora_sft.read_jsonl(path)
        finally:
            shutil.rmtree(d, ignore_errors=True)

    def test_reasoning_only_on_assistant_turns_and_only_text(self):
        user = {"role": "user", "content": "hi"}
        ok = self.read([user, {"role": "assistant", "content": "yo", "reasoning_content": "greet back"}])
        self.assertEqual(ok[0][1][1]["reasoning_content"], "greet back")
        with self.assertRaisesRegex(lora_sft.Failure, "only assistant turns"):
            self.read([dict(user, reasoning_content="x"), {"role": "assistant", "content": "yo"}])
        with self.assertRaisesRegex(lora_sft.Failure, "must be a string"):
            self.read([user, {"role": "assistant", "content": "yo", "reasoning_content": ["x"]}])


LLAMA_TOKENIZE = r"""
import json, sys
from llama_cpp import Llama
m = Llama(model_path=sys.argv[1], vocab_only=True, verbose=False)
print(json.dumps([m.tokenize(t.encode("utf-8"), add_bos=False, special=True) for t in json.load(sys.stdin)]))
"""


class Tokenizer(unittest.TestCase):
    """The prepared tokenizer tokenizes as llama.cpp does on the same GGUF."""

    def test_parity_with_llama_cpp(self):
        if not os.path.exists(LLAMACPP_PY):
            self.fail(f"{LLAMACPP_PY} missing: scripts/llamacpp-server.sh builds it")
        tok = load_tokenizer()
        template = open(TEMPLATE, encoding="utf-8").read()
        texts = [
            "The year 2024 had 366 days.",
            "x = 3.14159 * 10**-6; id=0x1F4A; 1,000,000",
            "EC50 0.001-30 uM, n=30 (3 x 10) -> ratio 12.5",
            " 12  345\n6789\t0 ",
            "<|im_start|>user\n1+1=2<|im_end|>\n",
        ]
        for path in (TRAIN, VALID):
            for _, msgs, tools in lora_sft.read_jsonl(path):
                texts.append(tok.apply_chat_template(msgs, tools=tools, chat_template=template, tokenize=False))
        r = subprocess.run(
            [LLAMACPP_PY, "-c", LLAMA_TOKENIZE, GGUF], input=json.dumps(texts), capture_output=True, text=True
        )
        self.assertEqual(r.returncode, 0, r.stderr[-2000:])
        theirs = json.loads(r.stdout)
        for text, ref in zip(texts, theirs):
            ours = tok(text, add_special_tokens=False)["input_ids"]
            self.assertEqual(ours, ref, f"tokenization differs from llama.cpp on {text[:60]!r}")
        self.assertEqual(len(tok("2024", add_special_tokens=False)["input_ids"]), 4)
        note(f"tokenizer parity with llama.cpp: {len(texts)} texts, {sum(map(len, theirs))} tokens, all equal")


class Training(unittest.TestCase):
    def test_metrics_shape(self):
        for seed, run in RUNS.items():
            ms = run["metrics"]
            kinds = [m["kind"] for m in ms]
            self.assertEqual(kinds[:3], ["dataset", "dataset", "base"])
            data = {m["split"]: m for m in ms if m["kind"] == "dataset"}
            self.assertEqual(data["train"]["examples"], 4)
            self.assertEqual(data["train"]["truncated"], 4)
            self.assertEqual(data["validation"]["examples"], 1)
            self.assertGreater(data["train"]["supervised_tokens"], 0)
            steps = [m for m in ms if m["kind"] == "step"]
            self.assertEqual([s["step"] for s in steps], list(range(1, STEPS + 1)))
            for s in steps:
                for k in ("step", "train_loss", "learning_rate", "tokens", "epoch"):
                    self.assertIn(k, s)
                self.assertIsInstance(s["train_loss"], float)
                self.assertEqual(s["tokens"], 4 * MAX_LENGTH)
                self.assertGreater(s["learning_rate"], 0)
            self.assertEqual(steps[-1]["tokens_total"], STEPS * 4 * MAX_LENGTH)
            ckpts = [m for m in ms if m["kind"] == "checkpoint"]
            self.assertEqual([c["checkpoint"] for c in ckpts], [f"checkpoint-{s}" for s in range(EVAL_EVERY, STEPS + 1, EVAL_EVERY)])
            for c in ckpts:
                self.assertIsInstance(c["validation_loss"], float)
                d = os.path.join(run["dir"], c["checkpoint"])
                self.assertEqual(
                    sorted(os.listdir(d)),
                    ["adapter.gguf", "adapter_config.json", "adapter_model.safetensors", "trainer_state.json"],
                )
                with open(os.path.join(d, "adapter.gguf"), "rb") as f:
                    self.assertEqual(f.read(4), b"GGUF")
                cfg = json.load(open(os.path.join(d, "adapter_config.json")))
                self.assertEqual((cfg["r"], cfg["lora_alpha"]), (16, 32))
                self.assertEqual(cfg["target_modules"], sorted(cfg["target_modules"]))
                self.assertEqual(len(cfg["target_modules"]), 7)  # q k v o gate up down
            # every line is strict JSON (no NaN)
            with open(os.path.join(run["dir"], "metrics.jsonl"), encoding="utf-8") as f:
                for line in f:
                    json.loads(line, parse_constant=lambda c: self.fail(f"non-JSON constant {c}"))

    def test_gguf_is_a_llama_cpp_lora(self):
        from gguf import GGUFReader

        d = os.path.join(RUNS[1]["dir"], RUNS[1]["trainer"]["chosen"]["checkpoint"])
        r = GGUFReader(os.path.join(d, "adapter.gguf"))
        self.assertEqual(r.fields["general.type"].contents(), "adapter")
        self.assertEqual(r.fields["adapter.type"].contents(), "lora")
        self.assertEqual(r.fields["adapter.lora.alpha"].contents(), 32.0)
        self.assertEqual(len(r.tensors), 30 * 7 * 2)

    def test_continued_training_measures_the_base_model_and_its_start(self):
        """Trained on from an adapter (as cycle 2 trains on from cycle 1's), the trainer measures
        the base model with the adapter switched off and the starting adapter, on the same lines.
        Oracles: the base model's loss is what seed 1 measured before its first step (same base
        model, same validation file), and the start is seed 1's chosen checkpoint's loss."""
        first = RUNS[1]
        init = os.path.join(first["dir"], first["trainer"]["chosen"]["checkpoint"])
        out = os.path.join(WORK, "continued")
        run_trainer(out, *TRAIN_ARGS, "--seed", "1", "--max-steps", "2", "--eval-every", "2", "--init-adapter", init)
        ms = read_metrics(out)
        base_model = [m for m in ms if m["kind"] == "base_model"]
        start = [m for m in ms if m["kind"] == "base"]
        self.assertEqual(len(base_model), 1, ms)
        self.assertEqual(len(start), 1, ms)
        self.assertAlmostEqual(base_model[0]["base_model_validation_loss"], first["trainer"]["base_validation_loss"], places=4)
        self.assertAlmostEqual(start[0]["base_validation_loss"], first["trainer"]["chosen"]["validation_loss"], places=4)
        with open(os.path.join(out, "trainer.json"), encoding="utf-8") as f:
            rec = json.load(f)
        self.assertEqual(rec["base_model_validation_loss"], base_model[0]["base_model_validation_loss"])
        self.assertIn("the base model: ", rec["chosen"]["reason"])
        self.assertIn("the initial adapter: ", rec["chosen"]["reason"])
        note(
            f"continued from seed 1's adapter: base model {base_model[0]['base_model_validation_loss']:.4f}, "
            f"start {start[0]['base_validation_loss']:.4f}, chosen {rec['chosen']['validation_loss']:.4f}"
        )

    def test_train_loss_decreases(self):
        for seed, run in RUNS.items():
            steps = [m for m in run["metrics"] if m["kind"] == "step"]
            first, last = steps[0]["train_loss"], steps[-1]["train_loss"]
            # a real decrease, not noise: the same four examples are every step's batch
            self.assertLess(last, 0.75 * first, f"seed {seed}: {first} -> {last}")

    def test_chosen_checkpoint_has_lowest_validation_loss(self):
        for seed, run in RUNS.items():
            ckpts = [m for m in run["metrics"] if m["kind"] == "checkpoint"]
            lowest = min(c["validation_loss"] for c in ckpts)
            first_lowest = next(c for c in ckpts if c["validation_loss"] == lowest)
            chosen = run["trainer"]["chosen"]
            self.assertEqual(chosen["checkpoint"], first_lowest["checkpoint"])
            self.assertEqual(chosen["validation_loss"], lowest)
            self.assertTrue(chosen["reason"].startswith("lowest validation loss"))
            # the engine's rule on the same file: lines with "checkpoint" and a finite loss, first lowest
            engine = None
            for m in run["metrics"]:
                if isinstance(m.get("checkpoint"), str) and isinstance(m.get("validation_loss"), float):
                    if engine is None or m["validation_loss"] < engine[1]:
                        engine = (m["checkpoint"], m["validation_loss"])
            self.assertEqual(engine[0], chosen["checkpoint"])
            self.assertLess(lowest, run["trainer"]["base_validation_loss"])

    def test_trainer_json_records_the_run(self):
        rec = RUNS[1]["trainer"]
        self.assertEqual(rec["hyperparameters"]["rank"], 16)
        self.assertEqual(rec["hyperparameters"]["seed"], 1)
        self.assertEqual(rec["hyperparameters"]["steps"], STEPS)
        self.assertEqual(rec["versions"]["trl"], "1.16.0")
        self.assertEqual(rec["script_sha256"], lora_sft.sha256_file(os.path.join(HERE, "lora_sft.py")))
        self.assertEqual(rec["data"]["train"]["examples"], 4)

    def test_seeds_differ_and_runs_repeat(self):
        l1 = [m["train_loss"] for m in RUNS[1]["metrics"] if m["kind"] == "step"]
        l2 = [m["train_loss"] for m in RUNS[2]["metrics"] if m["kind"] == "step"]
        self.assertNotEqual(l1[1:], l2[1:])  # the seed draws LoRA's A matrices
        out = os.path.join(WORK, "seed1-again")
        run_trainer(out, *TRAIN_ARGS, "--seed", "1", "--max-steps", "2", "--eval-every", "0", "--no-eval-base")
        again = [m["train_loss"] for m in read_metrics(out) if m["kind"] == "step"]
        # step 1 is the base model; step 2 follows one update at the same learning rate
        self.assertEqual(again, l1[:2])
        note(f"determinism: seed 1 repeated its first two losses exactly {again}")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A model server on 127.0.0.1 (llama-cpp-python's by default, or `cmd`), always stopped."""

    def __init__(self, lora=None, cmd=None):
        self.port = free_port()
        self.log = tempfile.NamedTemporaryFile(prefix="llamacpp-", suffix=".log", dir=WORK, delete=False)
        if cmd is None:
            cmd = [
                LLAMACPP_PY, "-m", "llama_cpp.server", "--model", GGUF, "--host", "127.0.0.1",
                "--port", str(self.port), "--n_threads", "2", "--n_ctx", "2048", "--seed", "1234",
            ]
            if lora:
                cmd += ["--lora_path", lora]
        else:
            cmd = [c.replace("{port}", str(self.port)) for c in cmd]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

    def __enter__(self):
        deadline = time.time() + 120
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited with {self.proc.returncode}: {self.tail()}")
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/v1/models", timeout=2).read()
                return self
            except OSError:
                time.sleep(0.5)
        raise AssertionError(f"server not ready in 120s: {self.tail()}")

    def __exit__(self, *exc):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()

    def tail(self):
        self.log.flush()
        with open(self.log.name, encoding="utf-8", errors="replace") as f:
            return f.read()[-2000:]

    def complete(self, prompt, max_tokens=32):
        body = json.dumps(
            {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "seed": 1234, "top_k": 1}
        ).encode()
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/v1/completions", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=300) as r:
            return json.load(r)["choices"][0]["text"]

    def get(self, path):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=60) as r:
            return json.load(r)

    def chat(self, messages, tools, extra=None):
        """A greedy chat completion's text and tool calls, as a comparable string."""
        body = {"model": "x", "messages": messages, "tools": tools, "max_tokens": 32, "temperature": 0,
                "seed": 1234, "top_k": 1}
        body.update(extra or {})
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/v1/chat/completions", data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=300) as r:
                m = json.load(r)["choices"][0]["message"]
        except urllib.error.HTTPError as e:
            raise AssertionError(f"HTTP {e.code}: {e.read()[:500]!r}") from None
        return json.dumps([m.get("content"), m.get("tool_calls")], sort_keys=True)


def llama_server(*extra, ctx=4096):
    """The command of a llama-server as the real loop runs it (examples/real-cpu.toml), with one
    slot of `ctx` tokens."""
    return [LLAMA_SERVER, "-m", GGUF, "--jinja", "--chat-template-file", SERVE_TEMPLATE, "--host", "127.0.0.1",
            "--port", "{port}", "-t", "2", "-c", str(ctx), "-np", "1", *extra]


class Serving(unittest.TestCase):
    def test_adapter_changes_greedy_output(self):
        if not os.path.exists(LLAMACPP_PY):
            self.fail(f"{LLAMACPP_PY} missing: scripts/llamacpp-server.sh builds it")
        tok = load_tokenizer()
        serve = open(os.path.join(BASE_DIR, "chat_template.serve.jinja"), encoding="utf-8").read()
        _, msgs, tools = lora_sft.read_jsonl(VALID)[0]
        last = max(i for i, m in enumerate(msgs) if m["role"] == "assistant")
        ids = tok.apply_chat_template(
            msgs[:last], tools=tools, chat_template=serve, add_generation_prompt=True, tokenize=True, return_dict=True
        )["input_ids"]
        prompt = tok.decode(ids[-400:], skip_special_tokens=False)  # fits n_ctx 2048 with room to answer
        adapter = os.path.join(RUNS[1]["dir"], RUNS[1]["trainer"]["chosen"]["checkpoint"], "adapter.gguf")
        with Server() as s:
            base = s.complete(prompt)
            base_again = s.complete(prompt)
        with Server(lora=adapter) as s:
            tuned = s.complete(prompt)
        self.assertEqual(base, base_again, "greedy decoding is not repeatable on the base model")
        self.assertNotEqual(tuned, base, "the LoRA adapter did not change the greedy completion")
        self.assertTrue(base.strip() or tuned.strip())
        note(f"served: base {base[:70]!r} | with adapter {tuned[:70]!r}")

    def test_one_llama_server_serves_the_base_model_and_the_adapter_per_request(self):
        """What `serve.adapter_api = "llama-cpp"` relies on, on the real server: started with
        `--lora-init-without-apply --lora FILE`, it lists the adapter with its id, and a request's
        `lora` scales make it answer exactly as a server with the adapter applied (scale 1) or a
        server without it (scale 0), on the served chat template and its tools."""
        if not os.path.exists(LLAMA_SERVER):
            self.fail(f"{LLAMA_SERVER} missing: scripts/llama-server-env.sh builds it")
        adapter = os.path.join(RUNS[1]["dir"], RUNS[1]["trainer"]["chosen"]["checkpoint"], "adapter.gguf")
        _, msgs, tools = lora_sft.read_jsonl(VALID)[0]
        first = next(i for i, m in enumerate(msgs) if m["role"] == "assistant")
        # The system prompt, the tools and the first user turn: ~2,000 tokens.
        prompt = msgs[:first]
        with Server(cmd=llama_server("--lora-init-without-apply", "--lora", adapter)) as shared:
            listed = shared.get("/lora-adapters")
            self.assertEqual([(a["id"], a["path"]) for a in listed], [(0, adapter)])
            on = shared.chat(prompt, tools, {"lora": [{"id": 0, "scale": 1.0}]})
            off = shared.chat(prompt, tools, {"lora": [{"id": 0, "scale": 0.0}]})
        with Server(cmd=llama_server("--lora", adapter)) as applied:
            tuned = applied.chat(prompt, tools)
        with Server(cmd=llama_server()) as plain:
            base = plain.chat(prompt, tools)
        self.assertNotEqual(tuned, base, "the adapter did not change the greedy answer: the test would prove nothing")
        self.assertEqual(on, tuned, "scale 1 on the shared server is not the adapter applied")
        self.assertEqual(off, base, "scale 0 on the shared server is not the base model")
        note(f"one llama-server, per-request adapter: base {base[:60]!r} | adapter {tuned[:60]!r}")

    def test_a_tool_call_comes_back_structured(self):
        """The served template and llama-server's parser turn the trained model's <tool_call> block
        into a structured `tool_calls` entry, as the real loop asks (`tool_choice` "required"): the
        conversation of a validation example up to its last assistant turn, which is a tool call."""
        if not os.path.exists(LLAMA_SERVER):
            self.fail(f"{LLAMA_SERVER} missing: scripts/llama-server-env.sh builds it")
        adapter = os.path.join(RUNS[1]["dir"], RUNS[1]["trainer"]["chosen"]["checkpoint"], "adapter.gguf")
        _, msgs, tools = lora_sft.read_jsonl(VALID)[0]
        last = max(i for i, m in enumerate(msgs) if m["role"] == "assistant")
        self.assertTrue(msgs[last].get("tool_calls"), "the example's last assistant turn is not a tool call")
        with Server(cmd=llama_server("--lora", adapter, ctx=8192)) as s:
            content, calls = json.loads(
                s.chat(msgs[:last], tools, {"tool_choice": "required", "max_tokens": 256})
            )
        names = {t["function"]["name"] for t in tools}
        self.assertTrue(calls, f"no structured tool call; content: {content!r}")
        self.assertNotIn("<tool_call>", content or "", "a tool call left in the text")
        for c in calls:
            self.assertIn(c["function"]["name"], names, c)
            json.loads(c["function"]["arguments"])  # arguments are a JSON object's text
        note(f"structured tool call from the trained model: {calls[0]['function']['name']}({calls[0]['function']['arguments'][:60]})")


CLASSES = (Schedule, Errors, Mask, Reading, Tokenizer, Training, Serving)
SELECTED = [c.__name__ for c in CLASSES]


def main():
    # `test_lora_sft.py Schedule Errors` runs those classes only (the two
    # trainings of setUpModule only when Training or Serving is among them).
    global SELECTED
    names = [c.__name__ for c in CLASSES]
    unknown = [n for n in sys.argv[1:] if n not in names]
    if unknown:
        print(f"unknown test class(es) {unknown}; known: {names}", file=sys.stderr)
        return 2
    SELECTED = sys.argv[1:] or names
    loader = unittest.TestLoader()
    suite = unittest.TestSuite(
        loader.loadTestsFromTestCase(c) for c in CLASSES if c.__name__ in SELECTED
    )
    t0 = time.time()
    result = unittest.TextTestRunner(stream=sys.stderr, verbosity=2).run(suite)
    failed = len(result.failures) + len(result.errors)
    print(f"figures ({time.time() - t0:.0f}s in all):", file=sys.stderr)
    for f in FIGURES:
        print(f"  {f}", file=sys.stderr)
    print(f"selftest: {result.testsRun - failed} passed, {failed} failed")
    return 0 if failed == 0 and result.testsRun > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
