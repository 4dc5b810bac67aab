//! The tables' columns: name, type and meaning of each, in file order.
//! `SCHEMAS.md` ("Tables") documents the same columns; a test reads that
//! file and fails when the two disagree, so a column cannot change without
//! its documentation. Ids are 64 hex digits, so a row leads back to
//! `mass show ID` (events), `mass cat ID` (blobs) or `mass why ID`.

/// A column's type in Arrow terms: UTF-8 strings, signed 64-bit integers,
/// 64-bit floats, booleans. Every column is nullable; null means the
/// record does not say (never "zero").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Type {
    Str,
    Int,
    Float,
    Bool,
}

impl Type {
    /// The type as SCHEMAS.md names it.
    pub fn name(self) -> &'static str {
        match self {
            Type::Str => "string",
            Type::Int => "int64",
            Type::Float => "float64",
            Type::Bool => "bool",
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub struct Column {
    pub name: &'static str,
    pub ty: Type,
    pub doc: &'static str,
}

#[derive(Debug)]
pub struct TableDef {
    pub name: &'static str,
    pub doc: &'static str,
    pub columns: &'static [Column],
}

const fn s(name: &'static str, doc: &'static str) -> Column {
    Column {
        name,
        ty: Type::Str,
        doc,
    }
}
const fn i(name: &'static str, doc: &'static str) -> Column {
    Column {
        name,
        ty: Type::Int,
        doc,
    }
}
const fn f(name: &'static str, doc: &'static str) -> Column {
    Column {
        name,
        ty: Type::Float,
        doc,
    }
}
const fn b(name: &'static str, doc: &'static str) -> Column {
    Column {
        name,
        ty: Type::Bool,
        doc,
    }
}

const RUN: Column = s("run", "the run's name");
const EVENT: Column = s("event", "the record's event id");
const STREAM: Column = s("stream", "the stream it is on, relative to the run");
const CYCLE: Column = i("cycle", "the cycle (from 1)");

pub const RUNS: TableDef = TableDef {
    name: "runs",
    doc: "One row per exported run.",
    columns: &[
        RUN,
        s("head", "the main stream's head event"),
        s("started", "the `run.started` event"),
        s(
            "driver",
            "the engine version that recorded it, e.g. `mass-engine/10`",
        ),
        s(
            "experiment",
            "the experiment's name (null: its definition cannot be read)",
        ),
        s(
            "seed",
            "root of all derived seeds, in decimal (it may pass int64; null: not recorded, an imported run)",
        ),
        s("config", "blob of the experiment's definition"),
        s(
            "tasks",
            "tree of the task suite (null for `mass-engine/1` runs and imported runs)",
        ),
        i(
            "cycles_planned",
            "cycles the experiment asks for (a fork's `cycles` override counted)",
        ),
        i("cycles_done", "cycles with a `mass.cycle` record"),
        b("finished", "the run recorded its end"),
        s(
            "forked_from",
            "`SOURCE at EVENT [with overrides]` for a fork",
        ),
        i(
            "started_ms",
            "wall clock of `run.started`, ms since the Unix epoch (null: a stand-in time, such as an import's file mtime)",
        ),
        i(
            "streams",
            "streams of the run (its refs), the main stream included",
        ),
        i("events", "events on those streams"),
    ],
};

pub const CYCLES: TableDef = TableDef {
    name: "cycles",
    doc: "One row per finished cycle, from its `mass.cycle` record (the figures `mass status --json` shows).",
    columns: &[
        RUN,
        EVENT,
        CYCLE,
        s("model", "the model the cycle ran"),
        s("next_model", "the model it trained (its own model when nothing was trained)"),
        i("inner_wins", "inner-loop candidates promoted"),
        i("inner_iterations", "inner-loop iterations"),
        i("selected_runs", "collected runs selected for training"),
        i(
            "supervised_tokens",
            "supervised tokens in the training data (null: not recorded, an imported run)",
        ),
        i("collected_runs", "collected runs (null for `mass.cycle` v1)"),
        f("delegation_rate", "share of collected runs that delegated"),
        i(
            "tampered_in_training",
            "training examples from runs that tampered (null: not recorded, an imported run)",
        ),
        f(
            "tampering_rate",
            "runs that tampered over collected runs (null: not recorded, an imported run)",
        ),
    ],
};

pub const STAGES: TableDef = TableDef {
    name: "stages",
    doc: "One row per finished cycle (one with a `mass.cycle` record) and stage (search, collect, judge, rank, select, dataset, train, evaluate), as `mass report` counts them.",
    columns: &[
        RUN,
        CYCLE,
        s("stage", "the MASS stage"),
        f("wall_seconds", "time between the main-stream steps that closed the stage (null: a step's time is a stand-in, or no step closed the stage: the run ended before it, as a re-judge that stops at the dataset does, or an imported run's folder lacks the stage's files)"),
        i("model_calls", "successful model calls on the stage's streams"),
        i("prompt_tokens", "their prompt tokens, as the backend reported"),
        i("completion_tokens", "their completion tokens"),
    ],
};

pub const ROLLOUTS: TableDef = TableDef {
    name: "rollouts",
    doc: "One row per team run (`mass.rollout`).",
    columns: &[
        RUN,
        EVENT,
        STREAM,
        s("task", "task id"),
        s("purpose", "`reference`, `inner`, `collect` or `eval`"),
        CYCLE,
        i(
            "index",
            "the run's index among its task's runs of that purpose",
        ),
        s("workflow", "blob of the workflow it ran (JSON)"),
        s("orchestrator_model", "the orchestrator's model"),
        s("subagent_model", "the subagents' model"),
        s("outcome", "`finished`, `halted` or `failed`"),
        s("detail", "why it halted or failed"),
        s(
            "guard_violations",
            "the guards that flagged it, `; `-separated (empty: none; null: no guard record)",
        ),
        s(
            "guard_action",
            "`exclude`, `no-train` or `record` (null: no guard record)",
        ),
        i(
            "checks_passed",
            "hidden checks passed (the external verifier) (null: not recorded, an imported run)",
        ),
        i(
            "checks_total",
            "hidden checks run (null: not recorded, an imported run)",
        ),
        f(
            "score",
            "its Bradley-Terry score in this run's ranking (null: not ranked)",
        ),
        i("rank", "its rank (1 = best) in that ranking"),
        s(
            "selection",
            "`train`, `validation`, `excluded`, `not selected`, or null (not a collected run)",
        ),
        i("delegations", "subagent delegations"),
        i("turns", "orchestrator turns"),
        i("prompt_tokens", "prompt tokens over all its model calls"),
        i(
            "completion_tokens",
            "completion tokens over all its model calls",
        ),
        s("tree", "the final workspace (`mass checkout TREE DIR`); of an imported run, its run folder's at import (`tree_from` in the rollout's metadata), not proven to be the workspace at the episode's end; null: not recorded"),
        s("tree_from", "where a stand-in `tree` came from (`run folder at import`: an imported run); null: the workspace the run ended with, as the engine snapshots it"),
        s("validation", "blob of the checks' output"),
        s("orchestrator", "the orchestrator stream's head"),
        i("subagents", "subagent streams"),
    ],
};

pub const MODEL_CALLS: TableDef = TableDef {
    name: "model_calls",
    doc: "One row per finished model-call attempt (effects `model`, `judge`, `optimizer`; a retried call has a row per attempt).",
    columns: &[
        RUN,
        EVENT,
        STREAM,
        i("cycle", "the cycle whose stream it is on (null: none)"),
        s("stage", "the stage it counts toward (null: none)"),
        s("role", "`orchestrator`, `subagent`, `judge`, `optimizer`, or the stream's last part"),
        s("effect", "the effect kind"),
        s("model", "the model or adapter asked"),
        s("status", "`ok`, `failed` (final) or `retriable` (transient)"),
        i("attempt", "1, or one more than the failed attempt at the same request it retries"),
        i("prompt_tokens", "as the backend reported (null: failed)"),
        i("completion_tokens", "as the backend reported (null: failed)"),
        s("finish_reason", "`stop`, `tool_calls`, `length`, ..."),
        f(
            "latency_ms",
            "from the call's start to its result, as first recorded (null: not recorded)",
        ),
        i(
            "wall_ms",
            "wall clock when the record was first written (or the time the imported source logged), ms since the Unix epoch (null: a stand-in time)",
        ),
        s("request", "blob of the canonical request"),
        s("output", "blob of the output (null: failed)"),
        s("error", "the failure (null: ok)"),
    ],
};

pub const TOOL_CALLS: TableDef = TableDef {
    name: "tool_calls",
    doc: "One row per finished tool-call attempt (effect `tool`).",
    columns: &[
        RUN,
        EVENT,
        STREAM,
        i("cycle", "the cycle whose stream it is on (null: none)"),
        s("stage", "the stage it counts toward (null: none)"),
        s("tool", "the tool's name"),
        s("status", "`ok`, `failed` or `retriable`"),
        i("attempt", "as in `model_calls`"),
        f("latency_ms", "as in `model_calls`"),
        i("wall_ms", "as in `model_calls`"),
        s("request", "blob of `{\"tool\", \"args\"}`"),
        s("output", "blob of `{\"text\", \"tree\"}` (null: failed)"),
        s(
            "tree",
            "the workspace tree the output names (tools that can change it: `bash`, `write_file`...; null otherwise)",
        ),
        s("error", "the failure (null: ok)"),
    ],
};

pub const JUDGMENTS: TableDef = TableDef {
    name: "judgments",
    doc: "One row per judgment (`mass.judgment`): outer-loop pairs, inner-loop promotions and evaluations.",
    columns: &[
        RUN,
        EVENT,
        STREAM,
        i("cycle", "the cycle whose stream it is on"),
        s("stage", "`judge` (ranking pairs), `search` (inner loop) or `evaluate`"),
        s("task", "task id"),
        s("a", "rollout event of run A of the record (null: another run folder's, in an imported run)"),
        s("b", "rollout event of run B (null: as for `a`)"),
        b("swapped", "B was shown as Workspace A"),
        s("shown_first", "the rollout shown as Workspace A"),
        s("judge_model", "the judge's model"),
        s("winner", "`a`, `b`, `tie` or `invalid`"),
        s("winner_rollout", "the winning rollout event (null: tie or invalid)"),
        i("invalid_attempts", "replies that gave no verdict before this one"),
        s("rationale", "the judge's reasons"),
        s("conversation", "the judge stream's head"),
        s("evaluation", "the `mass.evaluation` that counts it (null: none)"),
        s("ranking", "the `mass.ranking` that fitted it (null: none)"),
    ],
};

pub const RANKINGS: TableDef = TableDef {
    name: "rankings",
    doc: "One row per ranked run of each Bradley-Terry fit (`mass.ranking`).",
    columns: &[
        RUN,
        EVENT,
        CYCLE,
        s("task", "task id"),
        s("rollout", "the ranked rollout"),
        f("score", "its Bradley-Terry score"),
        i("rank", "1 = best"),
        i("wins", "judgments it won"),
        i("losses", "judgments it lost"),
        i("ties", "judgments tied"),
        f("prior", "virtual wins and losses against an average player"),
        i("iterations", "iterations of the fit"),
        b("converged", "the fit converged"),
    ],
};

pub const SELECTIONS: TableDef = TableDef {
    name: "selections",
    doc: "One row per run a selection (`mass.selection`) took or left out.",
    columns: &[
        RUN,
        EVENT,
        CYCLE,
        s("task", "task id"),
        s("ranking", "the ranking it read"),
        s(
            "rollout",
            "the run (null for a v1 exclusion line naming none)",
        ),
        s("decision", "`train`, `validation` or `excluded`"),
        s("reason", "why it was left out (null: taken)"),
        i(
            "wanted_train",
            "training runs the experiment wanted (0 for v1)",
        ),
        i("wanted_validation", "validation runs wanted (0 for v1)"),
        s(
            "shortfall",
            "why fewer runs were taken than wanted (empty: none)",
        ),
    ],
};

pub const DATASET_LINES: TableDef = TableDef {
    name: "dataset_lines",
    doc: "One row per training example, from a `mass.dataset` v2 provenance sidecar (v1 datasets have none).",
    columns: &[
        RUN,
        s("dataset", "the `mass.dataset` event"),
        CYCLE,
        s("file", "`train` or `validation`"),
        i("line", "line in that file, from 1"),
        s("rollout", "the rollout whose conversation it is"),
        s("conversation", "`<rollout short id>#<n>`: 0 the orchestrator, then the subagents"),
        s("agent", "the agent's role"),
        s("stream_head", "the agent stream's head"),
        s("selection", "the `mass.selection` that took the rollout"),
        s("ranking", "the `mass.ranking` it read"),
    ],
};

pub const TRAININGS: TableDef = TableDef {
    name: "trainings",
    doc: "One row per training step of a cycle (`mass.training`).",
    columns: &[
        RUN,
        EVENT,
        CYCLE,
        s("dataset", "the `mass.dataset` it trained on"),
        s("base_model", "the model training started from"),
        s("new_model", "the model it made"),
        s(
            "command",
            "the trainer command as recorded, or `builtin:sim`",
        ),
        i(
            "exit_status",
            "the trainer's exit status (null: not recorded, an imported run)",
        ),
        s("checkpoint", "the chosen checkpoint"),
        s("checkpoint_reason", "why it was chosen"),
        f(
            "validation_loss",
            "the chosen checkpoint's loss on the validation lines",
        ),
        f(
            "base_validation_loss",
            "the base model's loss on the same lines (null: not measured)",
        ),
        i("steps", "`mass.train_step` records before it"),
        s("adapter", "tree of the chosen checkpoint's directory"),
        s("trainer_version", "from the trainer's `trainer.json`"),
    ],
};

pub const TRAINING_STEPS: TableDef = TableDef {
    name: "training_steps",
    doc: "One row per trainer metrics line with a step (`mass.train_step`).",
    columns: &[
        RUN,
        EVENT,
        CYCLE,
        i("step", "the trainer's step"),
        f("epoch", "epoch"),
        f("train_loss", "training loss"),
        f(
            "validation_loss",
            "validation loss of the checkpoint the line evaluated",
        ),
        f(
            "base_validation_loss",
            "the base model's validation loss, on the line that measured it",
        ),
        f("learning_rate", "learning rate"),
        i("tokens", "tokens seen"),
        s(
            "checkpoint",
            "the checkpoint the line evaluated (empty: none)",
        ),
        s("line", "the metrics line as written"),
    ],
};

pub const EVALUATIONS: TableDef = TableDef {
    name: "evaluations",
    doc: "One row per comparison and judge (`mass.evaluation`), with the figures `mass report --json` shows.",
    columns: &[
        RUN,
        EVENT,
        CYCLE,
        s("cycle_record", "the `mass.cycle` that counts it (null: none yet, or superseded)"),
        s("split", "`heldout` or `train`"),
        s("against", "`base` or `previous` (`other-run` in an imported run: another run folder's runs)"),
        s("model", "the model evaluated"),
        s("baseline", "the model it was compared with"),
        s("judge", "the judge backend"),
        s("judge_model", "the judge's model"),
        b("self_judge", "the judge is the model being trained"),
        s("order", "`random` (v3) or `alternating` (v2)"),
        i("judgments", "judgment records"),
        i("verdicts", "valid verdicts among them"),
        i("judgment_wins", "judgments won by the model (null for v2)"),
        i("judgment_losses", "judgments won by the baseline"),
        i("judgment_ties", "judgments tied"),
        f("judgment_win_rate", "the headline: wins / (wins + losses), ties excluded"),
        i("model_first", "judgments that showed the model first"),
        i("pairs", "pairs of runs compared"),
        i("wins", "pairs whose majority the model won"),
        i("losses", "pairs the baseline won"),
        i("ties", "pairs tied"),
        f("win_rate", "pair majority: wins / (wins + losses)"),
        f("win_rate_low", "its 95% Wilson interval, low end"),
        f("win_rate_high", "its high end"),
        i("swapped", "pairs judged in opposite orders, both decided"),
        i("same_position", "of those, pairs where the judge picked the same position"),
    ],
};

/// Every table, in the order `mass export tables` writes them.
pub const TABLES: [&TableDef; 13] = [
    &RUNS,
    &CYCLES,
    &STAGES,
    &ROLLOUTS,
    &MODEL_CALLS,
    &TOOL_CALLS,
    &JUDGMENTS,
    &RANKINGS,
    &SELECTIONS,
    &DATASET_LINES,
    &TRAININGS,
    &TRAINING_STEPS,
    &EVALUATIONS,
];

/// The tables as `SCHEMAS.md` documents them (between its
/// `<!-- tables:begin -->` and `<!-- tables:end -->` markers; a test keeps
/// the two equal).
pub fn markdown() -> String {
    let mut out = String::new();
    for t in TABLES {
        out.push_str(&format!("### `{}`\n{}\n\n", t.name, t.doc));
        out.push_str("| column | type | meaning |\n|---|---|---|\n");
        for c in t.columns {
            out.push_str(&format!("| {} | {} | {} |\n", c.name, c.ty.name(), c.doc));
        }
        out.push('\n');
    }
    out
}
