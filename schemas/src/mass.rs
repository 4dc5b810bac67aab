//! Records of the MASS engine's decisions: rollouts, judgments, proposals,
//! promotions, rankings, selections, datasets, work results; `outcomes`
//! holds training steps, evaluations and cycle ends.
//! Floating-point values are stored as IEEE-754 bits (f64), deterministic.

use crate::{Hash32, Record};

macro_rules! record {
    ($t:ty, $kind:expr, $ver:expr, |$s:ident| $links:expr, $sample:expr) => {
        impl Record for $t {
            const KIND: &'static str = $kind;
            const VERSION: u32 = $ver;
            fn links(&self) -> Vec<Hash32> {
                let $s = self;
                $links
            }
            fn sample() -> Self {
                $sample
            }
        }
    };
}

// After `record!`, which it uses.
mod outcomes;
pub use outcomes::*;

/// `mass.rollout` v1: one team run of a task under a workflow, with its outcome.
#[derive(
    rkyv::Archive, rkyv::Serialize, rkyv::Deserialize, serde::Serialize, Debug, Clone, PartialEq,
)]
pub struct Rollout {
    pub task: String,
    /// `reference`, `inner`, `collect` or `eval`.
    pub purpose: String,
    pub cycle: u32,
    pub index: u32,
    /// Blob of the workflow JSON the team ran under (empty workflow = bare task).
    pub workflow: Hash32,
    pub orchestrator_model: String,
    pub subagent_model: String,
    /// `finished`, `halted` (turn or token limit) or `failed` (infrastructure).
    pub status: String,
    pub detail: String,
    /// Final workspace snapshot.
    pub tree: Hash32,
    /// Output of the task's checks on the final workspace.
    pub validation: Hash32,
    pub score_passed: u32,
    pub score_total: u32,
    /// Orchestrator stream head and each subagent stream's head.
    pub orchestrator: Hash32,
    pub subagents: Vec<Hash32>,
    pub delegations: u32,
    pub turns: u32,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub report: String,
}

record!(
    Rollout,
    "mass.rollout",
    1,
    |s| {
        let mut v = vec![s.workflow, s.tree, s.validation, s.orchestrator];
        v.extend(s.subagents.iter().copied());
        v
    },
    Rollout {
        task: "fin-momentum-backtest".into(),
        purpose: "collect".into(),
        cycle: 1,
        index: 3,
        workflow: Hash32([1; 32]),
        orchestrator_model: "sim/base".into(),
        subagent_model: "sim/base".into(),
        status: "finished".into(),
        detail: String::new(),
        tree: Hash32([2; 32]),
        validation: Hash32([3; 32]),
        score_passed: 5,
        score_total: 6,
        orchestrator: Hash32([4; 32]),
        subagents: vec![Hash32([5; 32])],
        delegations: 1,
        turns: 7,
        prompt_tokens: 9000,
        completion_tokens: 700,
        report: "done".into(),
    }
);

/// `mass.judgment` v1: a pairwise verdict on two rollouts.
#[derive(
    rkyv::Archive, rkyv::Serialize, rkyv::Deserialize, serde::Serialize, Debug, Clone, PartialEq,
)]
pub struct Judgment {
    pub task: String,
    /// The two rollout events, in the order the comparison names them.
    pub a: Hash32,
    pub b: Hash32,
    /// True when `b` was shown as Workspace A (swapped presentation).
    pub swapped: bool,
    pub judge_model: String,
    /// `a`, `b` or `tie` (in terms of `a`/`b`, not screen positions).
    pub winner: String,
    pub rationale: String,
    /// Invalid verdicts received before this one.
    pub invalid_attempts: u32,
    /// The judge's conversation head (its model effect).
    pub conversation: Hash32,
}

record!(
    Judgment,
    "mass.judgment",
    1,
    |s| vec![s.a, s.b, s.conversation],
    Judgment {
        task: "t".into(),
        a: Hash32([1; 32]),
        b: Hash32([2; 32]),
        swapped: true,
        judge_model: "sim/base".into(),
        winner: "a".into(),
        rationale: "A passes more checks".into(),
        invalid_attempts: 1,
        conversation: Hash32([3; 32]),
    }
);

/// `mass.proposal` v1: an optimizer proposal (valid or not).
#[derive(
    rkyv::Archive, rkyv::Serialize, rkyv::Deserialize, serde::Serialize, Debug, Clone, PartialEq,
)]
pub struct ProposalRecord {
    pub task: String,
    pub iteration: u32,
    pub attempt: u32,
    pub valid: bool,
    /// Parse or validation error when invalid.
    pub error: String,
    /// Blob of the proposal JSON (valid) or of the raw reply (invalid).
    pub body: Hash32,
    /// Blob of the proposed workflow JSON (valid only; zeros otherwise).
    pub workflow: Hash32,
    pub conversation: Hash32,
}

record!(
    ProposalRecord,
    "mass.proposal",
    1,
    |s| {
        let mut v = vec![s.body, s.conversation];
        if s.valid {
            v.push(s.workflow);
        }
        v
    },
    ProposalRecord {
        task: "t".into(),
        iteration: 2,
        attempt: 0,
        valid: true,
        error: String::new(),
        body: Hash32([1; 32]),
        workflow: Hash32([2; 32]),
        conversation: Hash32([3; 32]),
    }
);

/// `mass.promotion` v1: the inner loop's decision on a candidate workflow.
#[derive(
    rkyv::Archive, rkyv::Serialize, rkyv::Deserialize, serde::Serialize, Debug, Clone, PartialEq,
)]
pub struct Promotion {
    pub task: String,
    pub iteration: u32,
    /// The candidate's rollout.
    pub candidate: Hash32,
    /// The champion's rollout it was compared with.
    pub champion: Hash32,
    pub accepted: bool,
    /// Whether the candidate beat the bare-task reference (reference-then-champion rule).
    pub beat_reference: bool,
    pub reason: String,
    /// The judgments this decision rests on.
    pub judgments: Vec<Hash32>,
}

record!(
    Promotion,
    "mass.promotion",
    1,
    |s| {
        let mut v = vec![s.candidate, s.champion];
        v.extend(s.judgments.iter().copied());
        v
    },
    Promotion {
        task: "t".into(),
        iteration: 1,
        candidate: Hash32([1; 32]),
        champion: Hash32([2; 32]),
        accepted: true,
        beat_reference: true,
        reason: "won 2 of 2".into(),
        judgments: vec![Hash32([3; 32])],
    }
);

/// One ranked rollout.
#[derive(
    rkyv::Archive, rkyv::Serialize, rkyv::Deserialize, serde::Serialize, Debug, Clone, PartialEq,
)]
pub struct RankedRun {
    pub rollout: Hash32,
    pub score: f64,
    pub rank: u32,
    pub wins: u32,
    pub losses: u32,
    pub ties: u32,
}

/// `mass.ranking` v1: the Bradley-Terry fit over one task's collected runs.
#[derive(
    rkyv::Archive, rkyv::Serialize, rkyv::Deserialize, serde::Serialize, Debug, Clone, PartialEq,
)]
pub struct Ranking {
    pub task: String,
    pub cycle: u32,
    pub prior: f64,
    pub iterations: u32,
    pub converged: bool,
    pub runs: Vec<RankedRun>,
    pub judgments: Vec<Hash32>,
}

record!(
    Ranking,
    "mass.ranking",
    1,
    |s| {
        let mut v: Vec<Hash32> = s.runs.iter().map(|r| r.rollout).collect();
        v.extend(s.judgments.iter().copied());
        v
    },
    Ranking {
        task: "t".into(),
        cycle: 1,
        prior: 0.5,
        iterations: 40,
        converged: true,
        runs: vec![RankedRun {
            rollout: Hash32([1; 32]),
            score: 0.25,
            rank: 1,
            wins: 4,
            losses: 1,
            ties: 1
        }],
        judgments: vec![Hash32([2; 32])],
    }
);

/// `mass.selection` v1 (v2 replaced it; still written for runs of
/// `mass-engine/8` and earlier, which are driven as recorded): which ranked runs
/// become training and validation data. Written by `mass-engine/8` and
/// earlier, which ranked halted and failed runs and named them here by
/// rank (`rank 4: halted (...)`) or, for runs the guards kept out of
/// judging, by a 12-digit prefix of their id.
#[derive(
    rkyv::Archive, rkyv::Serialize, rkyv::Deserialize, serde::Serialize, Debug, Clone, PartialEq,
)]
pub struct SelectionV1 {
    pub task: String,
    pub cycle: u32,
    pub ranking: Hash32,
    pub train: Vec<Hash32>,
    pub validation: Vec<Hash32>,
    /// Why runs or the whole task were left out (empty when nothing was).
    pub excluded: Vec<String>,
}

record!(
    SelectionV1,
    "mass.selection",
    1,
    |s| {
        let mut v = vec![s.ranking];
        v.extend(s.train.iter().copied());
        v.extend(s.validation.iter().copied());
        v
    },
    SelectionV1 {
        task: "t".into(),
        cycle: 1,
        ranking: Hash32([1; 32]),
        train: vec![Hash32([2; 32])],
        validation: vec![Hash32([3; 32])],
        excluded: vec!["run 7: halted".into()],
    }
);

/// One run a selection left out: the run (its `mass.rollout` event) and why.
#[derive(
    rkyv::Archive, rkyv::Serialize, rkyv::Deserialize, serde::Serialize, Debug, Clone, PartialEq,
)]
pub struct Exclusion {
    pub rollout: Hash32,
    /// `halted: ...`, `failed: ...`, `guard: ...` (not ranked), or
    /// `guard: ... (ranked, not trained on)` under `no-train`.
    pub reason: String,
}

/// `mass.selection` v2: which ranked runs become training and validation
/// data, and every collected run of the task left out, by id and reason
/// (the rollouts are links, so a run's exclusion is found from the run).
#[derive(
    rkyv::Archive, rkyv::Serialize, rkyv::Deserialize, serde::Serialize, Debug, Clone, PartialEq,
)]
pub struct Selection {
    pub task: String,
    pub cycle: u32,
    pub ranking: Hash32,
    pub train: Vec<Hash32>,
    pub validation: Vec<Hash32>,
    /// Free-text lines: v1's exclusions as recorded (read from v1), empty
    /// in v2 records unless something other than a run was left out.
    pub excluded: Vec<String>,
    /// Each run left out, with its reason (empty in a v1 record read as v2).
    pub exclusions: Vec<Exclusion>,
    /// What the experiment asked for: training and validation runs.
    pub wanted_train: u32,
    pub wanted_validation: u32,
    /// Empty when the selection is full; otherwise why it holds fewer
    /// runs than wanted (too few finished runs), as shown by `mass report`.
    pub shortfall: String,
}

record!(
    Selection,
    "mass.selection",
    2,
    |s| {
        let mut v = vec![s.ranking];
        v.extend(s.train.iter().copied());
        v.extend(s.validation.iter().copied());
        v.extend(s.exclusions.iter().map(|e| e.rollout));
        v
    },
    Selection {
        task: "t".into(),
        cycle: 1,
        ranking: Hash32([1; 32]),
        train: vec![Hash32([2; 32])],
        validation: vec![],
        excluded: vec![],
        exclusions: vec![Exclusion {
            rollout: Hash32([4; 32]),
            reason: "halted: max_turns".into(),
        }],
        wanted_train: 2,
        wanted_validation: 1,
        shortfall: "1 finished run of 2 collected: 1 training run of 2 wanted, 0 validation runs of 1 wanted".into(),
    }
);

impl From<SelectionV1> for Selection {
    /// A v1 record read as v2: its exclusion lines kept as written, no
    /// structured exclusions, the wanted counts unknown (0) and no
    /// shortfall (v1 filled in from lower ranks).
    fn from(s: SelectionV1) -> Self {
        Selection {
            task: s.task,
            cycle: s.cycle,
            ranking: s.ranking,
            train: s.train,
            validation: s.validation,
            excluded: s.excluded,
            exclusions: Vec::new(),
            wanted_train: 0,
            wanted_validation: 0,
            shortfall: String::new(),
        }
    }
}

/// `mass.guard` v1: the tamper guards' findings on one run's final
/// workspace, recorded before its rollout (which links it as a parent).
#[derive(
    rkyv::Archive, rkyv::Serialize, rkyv::Deserialize, serde::Serialize, Debug, Clone, PartialEq,
)]
pub struct GuardCheck {
    pub task: String,
    /// The run's initial and final workspace trees.
    pub initial: Hash32,
    pub final_tree: Hash32,
    /// Protected paths whose content differs from the task's (changed,
    /// removed or replaced), in path order.
    pub protected_changed: Vec<String>,
    /// Files added, modified or removed outside the deliverables, and the
    /// bytes of the added and modified ones.
    pub changed_files: u32,
    pub changed_bytes: u64,
    /// One line per guard that flagged the run (empty: not flagged).
    pub violations: Vec<String>,
    /// What the experiment's policy does with a flagged run: `exclude`
    /// (kept out of ranking and training), `no-train` or `record`.
    pub action: String,
}

record!(
    GuardCheck,
    "mass.guard",
    1,
    |g| vec![g.initial, g.final_tree],
    GuardCheck {
        task: "t".into(),
        initial: Hash32([1; 32]),
        final_tree: Hash32([2; 32]),
        protected_changed: vec!["sim/push.py".into()],
        changed_files: 3,
        changed_bytes: 1024,
        violations: vec!["protected file changed: sim/push.py".into()],
        action: "exclude".into(),
    }
);

/// `mass.dataset` v1 (read only; v2 replaced it): a cycle's training data
/// without line provenance.
#[derive(
    rkyv::Archive, rkyv::Serialize, rkyv::Deserialize, serde::Serialize, Debug, Clone, PartialEq,
)]
pub struct DatasetV1 {
    pub cycle: u32,
    /// `openai` or `trl`.
    pub format: String,
    pub train: Hash32,
    pub validation: Hash32,
    pub train_examples: u32,
    pub validation_examples: u32,
    pub train_supervised_tokens: u64,
    pub validation_supervised_tokens: u64,
    pub selections: Vec<Hash32>,
}

record!(
    DatasetV1,
    "mass.dataset",
    1,
    |s| {
        let mut v = vec![s.train, s.validation];
        v.extend(s.selections.iter().copied());
        v
    },
    DatasetV1 {
        cycle: 1,
        format: "openai".into(),
        train: Hash32([1; 32]),
        validation: Hash32([2; 32]),
        train_examples: 120,
        validation_examples: 8,
        train_supervised_tokens: 90000,
        validation_supervised_tokens: 6000,
        selections: vec![Hash32([3; 32])],
    }
);

/// `mass.dataset` v2: the exported training data of a cycle, with the
/// provenance of every line: a JSONL blob, one object per example in file
/// order (`file` = `train` or `validation`, `line` from 1, `rollout`,
/// `conversation`, `agent`, `stream_head`, `selection`, `ranking`; ids in
/// hex), since the OpenAI format forbids extra keys in the examples.
#[derive(
    rkyv::Archive, rkyv::Serialize, rkyv::Deserialize, serde::Serialize, Debug, Clone, PartialEq,
)]
pub struct Dataset {
    pub cycle: u32,
    /// `openai` or `trl`.
    pub format: String,
    pub train: Hash32,
    pub validation: Hash32,
    pub train_examples: u32,
    pub validation_examples: u32,
    pub train_supervised_tokens: u64,
    pub validation_supervised_tokens: u64,
    pub selections: Vec<Hash32>,
    pub provenance: Hash32,
}

record!(
    Dataset,
    "mass.dataset",
    2,
    |s| {
        let mut v = vec![s.train, s.validation];
        v.extend(s.selections.iter().copied());
        v.push(s.provenance);
        v
    },
    Dataset {
        cycle: 1,
        format: "openai".into(),
        train: Hash32([1; 32]),
        validation: Hash32([2; 32]),
        train_examples: 120,
        validation_examples: 8,
        train_supervised_tokens: 90000,
        validation_supervised_tokens: 6000,
        selections: vec![Hash32([3; 32])],
        provenance: Hash32([4; 32]),
    }
);

/// `mass.work` v1: how one work item of a run executed with workers (`mass
/// run --workers`): the item's content address on the store, which worker's
/// result the coordinator took, on which attempt, and the record it landed
/// (a `mass.rollout` or `mass.judgment`). Appended to the run's `workers`
/// stream, beside the steps: no step depends on it, and the head is the
/// same whoever executed the item.
#[derive(
    rkyv::Archive, rkyv::Serialize, rkyv::Deserialize, serde::Serialize, Debug, Clone, PartialEq,
)]
pub struct WorkResult {
    /// The item's key on the store (BLAKE3 of its published envelope).
    pub item: Hash32,
    /// `rollout` or `judgment`.
    pub kind: String,
    /// The item's stream in the run.
    pub stream: String,
    /// The worker whose result was taken (`--name`, or host and process).
    pub worker: String,
    /// Which attempt produced it (from 1).
    pub attempt: u32,
    /// `done`, or `failed` (every attempt failed; the record is the
    /// coordinator's failed rollout or invalid verdict).
    pub outcome: String,
    /// One line per failed attempt, with its cause.
    pub attempts: Vec<String>,
    /// The record the item came to.
    pub result: Hash32,
}

record!(
    WorkResult,
    "mass.work",
    1,
    |w| vec![w.result],
    WorkResult {
        item: Hash32([1; 32]),
        kind: "rollout".into(),
        stream: "c1/t/collect/00".into(),
        worker: "node-1/4242".into(),
        attempt: 2,
        outcome: "done".into(),
        attempts: vec!["attempt 1 (node-2/77): lease expired".into()],
        result: Hash32([2; 32]),
    }
);
