//! Records of what a MASS cycle produced: training steps and the models
//! they made, the trainer's metrics, held-out evaluations, and the cycle's
//! end with its figures. Floating-point values are stored as IEEE-754 bits
//! (f64), deterministic.

use crate::{Hash32, Record};

/// `mass.training` v1 (read only; v2 replaced it): a training step and the
/// model it produced.
#[derive(
    rkyv::Archive, rkyv::Serialize, rkyv::Deserialize, serde::Serialize, Debug, Clone, PartialEq,
)]
pub struct TrainingV1 {
    pub cycle: u32,
    pub dataset: Hash32,
    pub base_model: String,
    pub new_model: String,
    /// The trainer command line (placeholders filled) or `builtin:sim`.
    pub command: String,
    pub exit_status: i32,
    /// Tree of the trainer's output directory; blob of its log.
    pub output: Hash32,
    pub log: Hash32,
    pub checkpoint: String,
    pub validation_loss: f64,
    /// The trainer effect that ran it.
    pub effect: Hash32,
}

record!(
    TrainingV1,
    "mass.training",
    1,
    |s| vec![s.dataset, s.output, s.log, s.effect],
    TrainingV1 {
        cycle: 1,
        dataset: Hash32([1; 32]),
        base_model: "sim/base".into(),
        new_model: "sim/c1-abcd".into(),
        command: "builtin:sim".into(),
        exit_status: 0,
        output: Hash32([2; 32]),
        log: Hash32([3; 32]),
        checkpoint: "checkpoint-2".into(),
        validation_loss: 0.8125,
        effect: Hash32([4; 32]),
    }
);

/// `mass.training` v2 (read only; v3 replaced it): a training step and
/// the model it produced, with
/// what the trainer was given and why its checkpoint was chosen. The
/// trainer's per-step metrics precede it as `mass.train_step` events on the
/// cycle's `train` stream.
#[derive(
    rkyv::Archive, rkyv::Serialize, rkyv::Deserialize, serde::Serialize, Debug, Clone, PartialEq,
)]
pub struct TrainingV2 {
    pub cycle: u32,
    pub dataset: Hash32,
    pub base_model: String,
    pub new_model: String,
    /// The trainer command template (placeholders unexpanded) or
    /// `builtin:sim`.
    pub command: String,
    pub exit_status: i32,
    /// Tree of the trainer's output directory; blob of its log.
    pub output: Hash32,
    pub log: Hash32,
    pub checkpoint: String,
    pub validation_loss: f64,
    /// The trainer effect that ran it.
    pub effect: Hash32,
    /// Blob: the hyperparameters handed to the trainer (a JSON object;
    /// `{}` when the experiment sets none).
    pub hyperparameters: Hash32,
    /// Why the checkpoint was chosen (e.g. the lowest validation loss of
    /// how many checkpoints).
    pub checkpoint_reason: String,
    /// Tree of the chosen checkpoint's directory (the adapter files); the
    /// empty tree when the trainer wrote none.
    pub adapter: Hash32,
    /// The trainer's own account of its code, from `trainer.json` in its
    /// output (`name`, `version`, `script_sha256`), or empty.
    pub trainer_version: String,
    /// How many `mass.train_step` events were recorded for it.
    pub steps: u32,
}

record!(
    TrainingV2,
    "mass.training",
    2,
    |s| vec![
        s.dataset,
        s.output,
        s.log,
        s.effect,
        s.hyperparameters,
        s.adapter
    ],
    TrainingV2 {
        cycle: 1,
        dataset: Hash32([1; 32]),
        base_model: "sim/base".into(),
        new_model: "sim/c1-abcd".into(),
        command: "builtin:sim".into(),
        exit_status: 0,
        output: Hash32([2; 32]),
        log: Hash32([3; 32]),
        checkpoint: "checkpoint-2".into(),
        validation_loss: 0.8125,
        effect: Hash32([4; 32]),
        hyperparameters: Hash32([5; 32]),
        checkpoint_reason: "lowest validation loss of 3 checkpoints".into(),
        adapter: Hash32([6; 32]),
        trainer_version: "lora_sft 1 sha256:ab12".into(),
        steps: 12,
    }
);

/// `mass.training` v3: a training step and the model it produced, with
/// what the trainer was given, why its checkpoint was chosen, and the
/// validation loss of the model it started from. The
/// trainer's per-step metrics precede it as `mass.train_step` events on the
/// cycle's `train` stream.
#[derive(
    rkyv::Archive, rkyv::Serialize, rkyv::Deserialize, serde::Serialize, Debug, Clone, PartialEq,
)]
pub struct Training {
    pub cycle: u32,
    pub dataset: Hash32,
    pub base_model: String,
    pub new_model: String,
    /// The trainer command template (placeholders unexpanded) or
    /// `builtin:sim`.
    pub command: String,
    pub exit_status: i32,
    /// Tree of the trainer's output directory; blob of its log.
    pub output: Hash32,
    pub log: Hash32,
    pub checkpoint: String,
    /// The chosen checkpoint's loss on the held-out validation lines.
    pub validation_loss: f64,
    /// The base model's loss on the same lines, when the trainer measured
    /// it: its metrics line with `base_model_validation_loss` (the base
    /// model with the adapter switched off, when training went on from
    /// one), else with `base_validation_loss` (before the first step). Runs
    /// recorded before trainers/lora_sft.py measured the base model under a
    /// continued adapter carry the starting adapter's loss there.
    pub base_validation_loss: Option<f64>,
    /// The trainer effect that ran it.
    pub effect: Hash32,
    /// Blob: the hyperparameters handed to the trainer (a JSON object;
    /// `{}` when the experiment sets none).
    pub hyperparameters: Hash32,
    /// Why the checkpoint was chosen (e.g. the lowest validation loss of
    /// how many checkpoints).
    pub checkpoint_reason: String,
    /// Tree of the chosen checkpoint's directory (the adapter files); the
    /// empty tree when the trainer wrote none.
    pub adapter: Hash32,
    /// The trainer's own account of its code, from `trainer.json` in its
    /// output (`name`, `version`, `script_sha256`), or empty.
    pub trainer_version: String,
    /// How many `mass.train_step` events were recorded for it.
    pub steps: u32,
}

record!(
    Training,
    "mass.training",
    3,
    |s| vec![
        s.dataset,
        s.output,
        s.log,
        s.effect,
        s.hyperparameters,
        s.adapter
    ],
    Training {
        cycle: 1,
        dataset: Hash32([1; 32]),
        base_model: "sim/base".into(),
        new_model: "sim/c1-abcd".into(),
        command: "builtin:sim".into(),
        exit_status: 0,
        output: Hash32([2; 32]),
        log: Hash32([3; 32]),
        checkpoint: "checkpoint-2".into(),
        validation_loss: 0.8125,
        base_validation_loss: Some(1.0625),
        effect: Hash32([4; 32]),
        hyperparameters: Hash32([5; 32]),
        checkpoint_reason: "lowest validation loss of 3 checkpoints".into(),
        adapter: Hash32([6; 32]),
        trainer_version: "lora_sft 1 sha256:ab12".into(),
        steps: 12,
    }
);

impl From<TrainingV1> for TrainingV2 {
    /// A v1 record read as v2: what v1 did not record is empty (the
    /// hyperparameters and adapter links point at the output tree, which
    /// held them if anything did).
    fn from(t: TrainingV1) -> Self {
        TrainingV2 {
            cycle: t.cycle,
            dataset: t.dataset,
            base_model: t.base_model,
            new_model: t.new_model,
            command: t.command,
            exit_status: t.exit_status,
            output: t.output,
            log: t.log,
            checkpoint: t.checkpoint,
            validation_loss: t.validation_loss,
            effect: t.effect,
            hyperparameters: t.output,
            checkpoint_reason: String::new(),
            adapter: t.output,
            trainer_version: String::new(),
            steps: 0,
        }
    }
}

impl From<TrainingV2> for Training {
    /// A v2 record read as v3: v2 did not record the base model's loss.
    fn from(t: TrainingV2) -> Self {
        Training {
            cycle: t.cycle,
            dataset: t.dataset,
            base_model: t.base_model,
            new_model: t.new_model,
            command: t.command,
            exit_status: t.exit_status,
            output: t.output,
            log: t.log,
            checkpoint: t.checkpoint,
            validation_loss: t.validation_loss,
            base_validation_loss: None,
            effect: t.effect,
            hyperparameters: t.hyperparameters,
            checkpoint_reason: t.checkpoint_reason,
            adapter: t.adapter,
            trainer_version: t.trainer_version,
            steps: t.steps,
        }
    }
}

impl From<Training> for TrainingV2 {
    /// A v3 record as a run of an older driver writes it (v2: without the
    /// base model's loss), so replays of such runs stay exact.
    fn from(t: Training) -> Self {
        TrainingV2 {
            cycle: t.cycle,
            dataset: t.dataset,
            base_model: t.base_model,
            new_model: t.new_model,
            command: t.command,
            exit_status: t.exit_status,
            output: t.output,
            log: t.log,
            checkpoint: t.checkpoint,
            validation_loss: t.validation_loss,
            effect: t.effect,
            hyperparameters: t.hyperparameters,
            checkpoint_reason: t.checkpoint_reason,
            adapter: t.adapter,
            trainer_version: t.trainer_version,
            steps: t.steps,
        }
    }
}

/// `mass.train_step` v1: one line of the trainer's metrics file, as
/// recorded on the cycle's `train` stream (a step's training loss, or a
/// checkpoint's validation loss). Fields the trainer did not write are
/// absent; `line` keeps the line as written.
#[derive(
    rkyv::Archive, rkyv::Serialize, rkyv::Deserialize, serde::Serialize, Debug, Clone, PartialEq,
)]
pub struct TrainStep {
    pub cycle: u32,
    pub step: u64,
    pub epoch: Option<f64>,
    pub train_loss: Option<f64>,
    pub validation_loss: Option<f64>,
    pub learning_rate: Option<f64>,
    pub tokens: Option<u64>,
    /// The checkpoint this line evaluated, or empty.
    pub checkpoint: String,
    pub line: String,
}

record!(
    TrainStep,
    "mass.train_step",
    1,
    |_s| vec![],
    TrainStep {
        cycle: 1,
        step: 4,
        epoch: Some(0.5),
        train_loss: Some(1.75),
        validation_loss: None,
        learning_rate: Some(0.0002),
        tokens: Some(4096),
        checkpoint: String::new(),
        line: r#"{"step":4,"train_loss":1.75}"#.into(),
    }
);

/// `mass.evaluation` v1 (read only; v2 replaced it): held-out win rate of
/// one model against another, verdicts counted one by one.
#[derive(
    rkyv::Archive, rkyv::Serialize, rkyv::Deserialize, serde::Serialize, Debug, Clone, PartialEq,
)]
pub struct EvaluationV1 {
    pub cycle: u32,
    /// `heldout` or `train`.
    pub split: String,
    pub model: String,
    pub baseline: String,
    pub judge: String,
    pub wins: u32,
    pub losses: u32,
    pub ties: u32,
    pub judgments: Vec<Hash32>,
}

record!(
    EvaluationV1,
    "mass.evaluation",
    1,
    |s| s.judgments.clone(),
    EvaluationV1 {
        cycle: 1,
        split: "heldout".into(),
        model: "sim/c1".into(),
        baseline: "sim/base".into(),
        judge: "external/base".into(),
        wins: 10,
        losses: 6,
        ties: 2,
        judgments: vec![Hash32([1; 32])],
    }
);

/// `mass.evaluation` v2 (written by runs of `mass-engine/8` and earlier,
/// which still write it when driven; v3 replaced it): one judge's verdicts
/// on one comparison of a cycle's evaluation: `model`'s bare-task runs
/// paired with `baseline`'s on the `split`'s tasks, each pair judged
/// `verdicts / pairs` times with the presentation order alternating. A
/// pair's outcome is the majority of its verdicts (equal counts: a tie), so
/// the unit of the win rate is the pair.
#[derive(
    rkyv::Archive, rkyv::Serialize, rkyv::Deserialize, serde::Serialize, Debug, Clone, PartialEq,
)]
pub struct EvaluationV2 {
    pub cycle: u32,
    /// `heldout` or `train`.
    pub split: String,
    /// `base` (the run's base model) or `previous` (the model the cycle
    /// started from).
    pub against: String,
    pub model: String,
    pub baseline: String,
    /// The judge's backend name and the model it ran.
    pub judge: String,
    pub judge_model: String,
    /// The judge is the model being trained (the run's own judge role), not
    /// an independent one.
    pub self_judge: bool,
    pub pairs: u32,
    /// Pair outcomes for `model`, for `baseline`, and ties.
    pub wins: u32,
    pub losses: u32,
    pub ties: u32,
    pub verdicts: u32,
    /// Pairs judged in both orders (verdicts 2k and 2k+1), and of those the
    /// ones where the judge picked the same position both times.
    pub swapped: u32,
    pub same_position: u32,
    pub judgments: Vec<Hash32>,
}

record!(
    EvaluationV2,
    "mass.evaluation",
    2,
    |s| s.judgments.clone(),
    EvaluationV2 {
        cycle: 1,
        split: "heldout".into(),
        against: "base".into(),
        model: "sim/c1".into(),
        baseline: "sim/base".into(),
        judge: "external".into(),
        judge_model: "external/base".into(),
        self_judge: false,
        pairs: 18,
        wins: 10,
        losses: 6,
        ties: 2,
        verdicts: 36,
        swapped: 18,
        same_position: 3,
        judgments: vec![Hash32([1; 32])],
    }
);

/// `mass.evaluation` v3: as v2, with each pair's presentation order drawn
/// at random for every judgment (from the run's seed) and the counts of
/// the judgments themselves, the unit the MASS articles report: W/(W+L)
/// over judgments, ties excluded. The pair figures (majority of a pair's
/// verdicts) stay beside them.
#[derive(
    rkyv::Archive, rkyv::Serialize, rkyv::Deserialize, serde::Serialize, Debug, Clone, PartialEq,
)]
pub struct Evaluation {
    pub cycle: u32,
    /// `heldout` or `train`.
    pub split: String,
    /// `base` (the run's base model) or `previous` (the model the cycle
    /// started from).
    pub against: String,
    pub model: String,
    pub baseline: String,
    /// The judge's backend name and the model it ran.
    pub judge: String,
    pub judge_model: String,
    /// The judge is the model being trained (the run's own judge role), not
    /// an independent one.
    pub self_judge: bool,
    pub pairs: u32,
    /// Pair outcomes for `model`, for `baseline`, and ties.
    pub wins: u32,
    pub losses: u32,
    pub ties: u32,
    /// Valid verdicts (`judgment_wins + judgment_losses + judgment_ties`).
    pub verdicts: u32,
    /// Pairs of judgments of one pair in opposite orders (the i-th shown
    /// model-first with the i-th shown baseline-first) both decided, and of
    /// those the ones where the judge picked the same position both times.
    pub swapped: u32,
    pub same_position: u32,
    pub judgments: Vec<Hash32>,
    /// Judgments won by `model`, by `baseline`, and tied (invalid verdicts
    /// in none of them).
    pub judgment_wins: u32,
    pub judgment_losses: u32,
    pub judgment_ties: u32,
    /// Judgments that showed `model` as Workspace A (the others showed
    /// `baseline` first).
    pub model_first: u32,
}

impl Evaluation {
    /// The v2 record of the same figures (what a run of `mass-engine/8`
    /// and earlier writes).
    pub fn v2(&self) -> EvaluationV2 {
        EvaluationV2 {
            cycle: self.cycle,
            split: self.split.clone(),
            against: self.against.clone(),
            model: self.model.clone(),
            baseline: self.baseline.clone(),
            judge: self.judge.clone(),
            judge_model: self.judge_model.clone(),
            self_judge: self.self_judge,
            pairs: self.pairs,
            wins: self.wins,
            losses: self.losses,
            ties: self.ties,
            verdicts: self.verdicts,
            swapped: self.swapped,
            same_position: self.same_position,
            judgments: self.judgments.clone(),
        }
    }
}

record!(
    Evaluation,
    "mass.evaluation",
    3,
    |s| s.judgments.clone(),
    Evaluation {
        cycle: 1,
        split: "heldout".into(),
        against: "base".into(),
        model: "sim/c1".into(),
        baseline: "sim/base".into(),
        judge: "external".into(),
        judge_model: "external/base".into(),
        self_judge: false,
        pairs: 8,
        wins: 5,
        losses: 2,
        ties: 1,
        verdicts: 46,
        swapped: 20,
        same_position: 3,
        judgments: vec![Hash32([1; 32])],
        judgment_wins: 26,
        judgment_losses: 15,
        judgment_ties: 5,
        model_first: 25,
    }
);

/// `mass.cycle` v1 (read only; v2 replaced it): the end of a cycle.
#[derive(
    rkyv::Archive, rkyv::Serialize, rkyv::Deserialize, serde::Serialize, Debug, Clone, PartialEq,
)]
pub struct CycleV1 {
    pub cycle: u32,
    pub model: String,
    pub next_model: String,
    pub inner_wins: u32,
    pub inner_iterations: u32,
    pub selected_runs: u32,
    pub supervised_tokens: u64,
    pub delegation_rate: f64,
    pub evaluation: Option<Hash32>,
}

record!(
    CycleV1,
    "mass.cycle",
    1,
    |s| s.evaluation.iter().copied().collect(),
    CycleV1 {
        cycle: 1,
        model: "sim/base".into(),
        next_model: "sim/c1".into(),
        inner_wins: 7,
        inner_iterations: 36,
        selected_runs: 128,
        supervised_tokens: 90000,
        delegation_rate: 0.25,
        evaluation: Some(Hash32([1; 32])),
    }
);

/// How often one model's bare-task evaluation runs delegated.
#[derive(
    rkyv::Archive, rkyv::Serialize, rkyv::Deserialize, serde::Serialize, Debug, Clone, PartialEq,
)]
pub struct Delegation {
    pub model: String,
    pub runs: u32,
    pub delegated: u32,
}

/// How often two judges gave the same verdict (same winner, or both a tie)
/// on the same pair in the same order.
#[derive(
    rkyv::Archive, rkyv::Serialize, rkyv::Deserialize, serde::Serialize, Debug, Clone, PartialEq,
)]
pub struct Agreement {
    /// Backend name and model of each judge.
    pub judge: String,
    pub judge_model: String,
    pub other: String,
    pub other_model: String,
    pub compared: u32,
    pub agreed: u32,
}

/// `mass.cycle` v2: the end of a cycle, with the figures the summary shows
/// and links to the cycle's `mass.evaluation` records.
#[derive(
    rkyv::Archive, rkyv::Serialize, rkyv::Deserialize, serde::Serialize, Debug, Clone, PartialEq,
)]
pub struct Cycle {
    pub cycle: u32,
    pub model: String,
    pub next_model: String,
    pub inner_wins: u32,
    pub inner_iterations: u32,
    /// Collected runs selected as training or validation examples.
    pub selected_runs: u32,
    pub supervised_tokens: u64,
    /// Collected runs (with the champion workflow), those whose orchestrator
    /// delegated, and those that tampered (recorded tool calls that write a
    /// protected file or claim passing checks in the report, or protected
    /// files changed in the final workspace).
    pub collected_runs: u32,
    pub delegating_runs: u32,
    pub tampered_runs: u32,
    /// Training examples from runs that tampered.
    pub tampered_in_training: u32,
    /// Delegation in bare-task evaluation runs, per model evaluated.
    pub bare_delegation: Vec<Delegation>,
    pub agreement: Vec<Agreement>,
    pub evaluations: Vec<Hash32>,
}

record!(
    Cycle,
    "mass.cycle",
    2,
    |s| s.evaluations.clone(),
    Cycle {
        cycle: 1,
        model: "sim/base".into(),
        next_model: "sim/c1".into(),
        inner_wins: 7,
        inner_iterations: 36,
        selected_runs: 128,
        supervised_tokens: 90000,
        collected_runs: 162,
        delegating_runs: 40,
        tampered_runs: 3,
        tampered_in_training: 1,
        bare_delegation: vec![Delegation {
            model: "sim/base".into(),
            runs: 36,
            delegated: 2,
        }],
        agreement: vec![Agreement {
            judge: "sim".into(),
            judge_model: "sim/c1".into(),
            other: "external".into(),
            other_model: "external/base".into(),
            compared: 72,
            agreed: 55,
        }],
        evaluations: vec![Hash32([1; 32]), Hash32([2; 32])],
    }
);
