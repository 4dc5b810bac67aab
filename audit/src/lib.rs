//! `audit`: the read side of mass. `mass runs RUN` (a run's rollouts, `rollouts.rs`),
//! `mass why` (here and `data.rs`: models, datasets and dataset lines),
//! `mass diff` (`diff.rs`), `mass report` (`report.rs`, and `html.rs` for
//! the self-contained HTML page). It only reads a ledger: it depends on the
//! engine's read-side projections (status folds, transcripts, workflows)
//! and its error type, never on the loops that write runs.
//!
//! Audit: why a rollout is where it is, answered by walking the ledger's
//! links backwards through its referrers index (`Ledger::referrers`), never
//! by scanning. From a rollout: its guard findings (a parent), the workflow
//! it ran and the inner-loop step that made that workflow champion (events
//! that name the workflow blob), every judgment that names the rollout, the
//! Bradley-Terry fit that ranked it, the selection that read that ranking,
//! the dataset lines it became (the dataset's provenance sidecar), and the
//! training step that consumed the dataset. Each link carries its event id,
//! so every statement can be checked with `mass show`.
//!
//! Content-addressed blobs are shared: the same workflow text may appear in
//! other runs. Lineage therefore picks, among the inner-loop runs of the
//! rollout's task that ran the workflow before the rollout (in log order),
//! the last one an accepted promotion names as its candidate.

use ledger::{Event, Id, Ledger};
use schemas::{
    Dataset, Decodable, GuardCheck, Judgment, Promotion, ProposalRecord, Ranking, Rollout,
    Selection, Training,
};
use serde::Serialize;
use serde_json::Value;

use engine::error::{EngineError, Result};

pub mod data;
pub mod diff;
mod facts;
pub mod html;
pub mod report;
mod rollouts;

pub use rollouts::{rollouts, rollouts_in, run_streams, RolloutRow};
use rollouts::{rollouts_of, selections_of, stream_ref};

/// The evidence chain of one rollout.
#[derive(Debug, Clone, Serialize)]
pub struct Why {
    pub rollout: RolloutFacts,
    pub guard: Option<GuardFacts>,
    pub workflow: WorkflowFacts,
    pub agents: Vec<AgentFacts>,
    pub judgments: Vec<JudgmentFacts>,
    pub ranking: Option<RankingFacts>,
    pub selection: Option<SelectionFacts>,
    pub dataset_lines: Vec<DatasetLine>,
    pub training: Option<TrainingFacts>,
}

#[derive(Debug, Clone, Serialize)]
pub struct RolloutFacts {
    pub event: String,
    pub stream: String,
    pub task: String,
    /// `reference`, `inner`, `collect` or `eval`.
    pub purpose: String,
    pub cycle: u32,
    pub index: u32,
    pub status: String,
    pub detail: String,
    /// `None`: not recorded (`ledger::NOT_RECORDED`: an imported run, whose
    /// source ran no checks).
    pub checks_passed: Option<u32>,
    pub checks_total: Option<u32>,
    pub delegations: u32,
    pub turns: u32,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub orchestrator_model: String,
    pub subagent_model: String,
    /// Final workspace tree (`mass checkout` it) and the checks' output blob.
    pub tree: String,
    /// Where a stand-in `tree` came from (`ledger::TREE_FROM`: an imported
    /// run's workspace is its run folder's at import, not proven to be the
    /// workspace at the episode's end); `None` (left out of the JSON) for a
    /// tree the run recorded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tree_from: Option<String>,
    /// The tree's paths whose bytes were scrubbed of a credential
    /// (`ledger::TREE_SCRUBBED`); left out of the JSON when none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tree_scrubbed: Vec<String>,
    pub validation: String,
    pub report: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct GuardFacts {
    pub event: String,
    pub violations: Vec<String>,
    pub action: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct WorkflowFacts {
    /// Blob of the workflow JSON (the empty workflow: the bare task).
    pub blob: String,
    pub bare: bool,
    /// The proposal that produced it (inner-loop iteration), if any.
    pub proposal: Option<Link>,
    /// The promotion that made it champion, with its reason and judgments.
    pub promotion: Option<PromotionFacts>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Link {
    pub event: String,
    pub summary: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct PromotionFacts {
    pub event: String,
    /// The inner-loop run of the workflow that won the promotion.
    pub candidate_run: String,
    pub iteration: u32,
    pub reason: String,
    pub beat_reference: bool,
    pub judgments: Vec<String>,
}

/// One agent of the rollout: its stream head and the tool calls it made.
#[derive(Debug, Clone, Serialize)]
pub struct AgentFacts {
    pub conversation: String,
    pub stream_head: String,
    pub tool_calls: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct JudgmentFacts {
    pub event: String,
    pub stream: String,
    pub opponent: String,
    /// The rollout was shown as Workspace A (first) or B.
    pub shown_first: bool,
    /// `won`, `lost`, `tie` or `invalid`, for this rollout.
    pub outcome: String,
    pub judge_model: String,
    pub rationale: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct RankingFacts {
    pub event: String,
    pub score: f64,
    pub rank: u32,
    pub of: u32,
    pub wins: u32,
    pub losses: u32,
    pub ties: u32,
    pub prior: f64,
    pub iterations: u32,
    pub converged: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct SelectionFacts {
    pub event: String,
    /// `train`, `validation`, `excluded` or `not selected`.
    pub decision: String,
    pub why: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct DatasetLine {
    pub dataset: String,
    pub cycle: u32,
    /// `train` or `validation` (the file; `mass export dataset` writes them).
    pub file: String,
    pub line: u64,
    pub conversation: String,
    pub agent: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct TrainingFacts {
    pub event: String,
    pub base_model: String,
    pub new_model: String,
    pub checkpoint: String,
    pub validation_loss: f64,
    /// `None`: not recorded (`ledger::NOT_RECORDED`, an imported run).
    pub exit_status: Option<i32>,
}

/// A record's field, or `None` when its event's metadata lists it as not
/// recorded (`ledger::NOT_RECORDED`: the value is a placeholder).
fn recorded<T>(meta: &ledger::Meta, field: &str, value: T) -> Option<T> {
    (!meta.not_recorded(field)).then_some(value)
}

fn hex(id: &Id) -> String {
    id.to_hex()
}

fn id_of(h: schemas::Hash32) -> Id {
    Id(h.0)
}

fn decode<T: Decodable>(ev: &Event) -> Result<T> {
    T::from_event(ev).map_err(|e| EngineError::recording(T::KIND, e))
}

/// Referrers of `id` of one kind (current version), decoded, in log order.
fn referrers_of<T: Decodable>(l: &Ledger, id: &Id) -> Result<Vec<(Event, T)>> {
    let mut out = Vec::new();
    for r in l.referrers(id)? {
        let ev = l.get_event(&r)?;
        if ev.kind == T::KIND && ev.version == T::VERSION {
            let t = decode::<T>(&ev)?;
            out.push((ev, t));
        }
    }
    Ok(out)
}

/// Every run a selection left out, with its reason: a v2 record's
/// exclusions by id; a v1 record's lines, each tied to its run where the
/// line names one (`run <id prefix>: ...`, or `rank N: ...` through the
/// ranking the selection read). `None`: a line that names no run.
pub fn selection_exclusions(l: &Ledger, sel: &Selection) -> Result<Vec<(Option<Id>, String)>> {
    let mut out: Vec<(Option<Id>, String)> = sel
        .exclusions
        .iter()
        .map(|x| (Some(id_of(x.rollout)), x.reason.clone()))
        .collect();
    let mut ranking: Option<Ranking> = None;
    for line in &sel.excluded {
        let (head, reason) = line.split_once(": ").unwrap_or(("", line.as_str()));
        let run = if let Some(prefix) = head.strip_prefix("run ") {
            l.resolve(prefix).ok()
        } else if let Some(rank) = head
            .strip_prefix("rank ")
            .and_then(|n| n.parse::<u32>().ok())
        {
            if ranking.is_none() {
                ranking = Some(decode(&l.get_event(&id_of(sel.ranking))?)?);
            }
            ranking
                .as_ref()
                .and_then(|rk| rk.runs.iter().find(|r| r.rank == rank))
                .map(|r| id_of(r.rollout))
        } else {
            None
        };
        out.push((run, reason.to_string()));
    }
    Ok(out)
}

/// Training steps (of any recorded version) that name `id`, in log order.
fn trainings_of(l: &Ledger, id: &Id) -> Result<Vec<(Event, Training)>> {
    let mut out = Vec::new();
    for r in l.referrers(id)? {
        let ev = l.get_event(&r)?;
        if let Some(t) = Training::read(&ev) {
            let t = t.map_err(|e| EngineError::recording("mass.training", e))?;
            out.push((ev, t));
        }
    }
    Ok(out)
}

/// Turns what the user typed into a rollout event: a rollout id (or a
/// unique prefix), a conversation id `<rollout prefix>#<n>`, or the head
/// of one of a rollout's agent streams.
pub fn find_rollout(l: &Ledger, what: &str) -> Result<Id> {
    let prefix = what.split_once('#').map_or(what, |(p, _)| p);
    let id = l.resolve(prefix)?;
    let ev = l.get_event(&id)?;
    if ev.kind == Rollout::KIND {
        return Ok(id);
    }
    for r in l.referrers(&id)? {
        if l.get_event(&r)?.kind == Rollout::KIND {
            return Ok(r);
        }
    }
    Err(EngineError::Invalid(format!(
        "{what} is a {} event, not a rollout, a conversation of one (<rollout>#<n>) or an agent stream's head; \
         `mass runs RUN` lists a run's rollouts",
        ev.kind
    )))
}

/// Whether event `ev` is on one of run `run`'s streams: the stream's ref
/// under the run (`RUN` for the main stream, `RUN/<stream>` otherwise)
/// reaches it walking back from its head.
fn in_run(l: &Ledger, run: &str, ev: &Event) -> Result<bool> {
    let name = stream_ref(run, &ev.stream);
    let Some(head) = l.head(&name)? else {
        return Ok(false);
    };
    for e in l.chain(head) {
        let e = e?;
        if e.id == ev.id {
            return Ok(true);
        }
        if e.seq <= ev.seq {
            return Ok(false);
        }
    }
    Ok(false)
}

/// The evidence chain of rollout `id`, over every run that shares it.
pub fn why(l: &Ledger, id: Id) -> Result<Why> {
    why_in(l, id, None)
}

/// The evidence chain of rollout `id`; with `run`, only the judgments and
/// decisions recorded on that run's streams (a fork or a re-judge shares
/// the rollout with its source and judges it again).
pub fn why_in(l: &Ledger, id: Id, run: Option<&str>) -> Result<Why> {
    let mine = |ev: &Event| -> Result<bool> {
        match run {
            Some(run) => in_run(l, run, ev),
            None => Ok(true),
        }
    };
    let ev = l.get_event(&id)?;
    let r: Rollout = decode(&ev)?;
    let order =
        |e: &Id| -> Result<u64> { Ok(l.locate(e)?.map(|loc| loc.ordinal).unwrap_or(u64::MAX)) };
    let own_order = order(&id)?;
    let guard = guard_facts(l, &ev)?;
    let workflow = workflow_facts(l, &r, own_order, &order)?;
    let agents = agent_facts(l, &id, &r)?;
    let judgments = judgment_facts(l, &id, &mine)?;
    // Runs share events: a fork or a re-judge ranks the same rollout again
    // and takes its own decisions. Each ranking that names the rollout
    // starts a chain (selection, dataset, training); the chain shown is the
    // last one that reached training, or else the last one, and the dataset
    // lines of every chain are listed (each names its dataset).
    let mut chains = Vec::new();
    for (rev, rk) in referrers_of::<Ranking>(l, &id)? {
        if mine(&rev)? {
            chains.push(decision_chain(l, &id, &rev, &rk)?);
        }
    }
    let dataset_lines: Vec<DatasetLine> = chains
        .iter()
        .flat_map(|c| c.dataset_lines.iter().cloned())
        .collect();
    let chosen = match chains.iter().rposition(|c| c.training.is_some()) {
        Some(i) => Some(chains.swap_remove(i)),
        None => chains.pop(),
    };
    let (ranking, selection, training) = match chosen {
        Some(c) => (c.ranking, c.selection, c.training),
        // Not ranked: a selection (v2) may name the run as left out.
        None => {
            let mut selection = None;
            for (sev, sel) in selections_of(l, &id)? {
                if mine(&sev)? {
                    selection = Some(selection_facts(&sev, &sel, &id, None, None));
                }
            }
            (None, selection, None)
        }
    };
    Ok(Why {
        rollout: rollout_facts(&id, &ev, &r, &l.get_meta(&id)?),
        guard,
        workflow,
        agents,
        judgments,
        ranking,
        selection,
        dataset_lines,
        training,
    })
}

/// The rollout's own record, as shown.
fn rollout_facts(id: &Id, ev: &Event, r: &Rollout, meta: &ledger::Meta) -> RolloutFacts {
    RolloutFacts {
        event: hex(id),
        stream: ev.stream.clone(),
        task: r.task.clone(),
        purpose: r.purpose.clone(),
        cycle: r.cycle,
        index: r.index,
        status: r.status.clone(),
        detail: r.detail.clone(),
        checks_passed: recorded(meta, "score_passed", r.score_passed),
        checks_total: recorded(meta, "score_total", r.score_total),
        delegations: r.delegations,
        turns: r.turns,
        prompt_tokens: r.prompt_tokens,
        completion_tokens: r.completion_tokens,
        orchestrator_model: r.orchestrator_model.clone(),
        subagent_model: r.subagent_model.clone(),
        tree: hex(&id_of(r.tree)),
        tree_from: meta.tree_from().map(str::to_string),
        tree_scrubbed: meta.tree_scrubbed(),
        validation: hex(&id_of(r.validation)),
        report: r.report.clone(),
    }
}

/// The guard check among the rollout's parents, if it has one.
fn guard_facts(l: &Ledger, ev: &Event) -> Result<Option<GuardFacts>> {
    ev.parents
        .iter()
        .map(|p| l.get_event(p))
        .collect::<std::result::Result<Vec<_>, _>>()?
        .into_iter()
        .find(|p| p.kind == GuardCheck::KIND)
        .map(|g| -> Result<GuardFacts> {
            let c: GuardCheck = decode(&g)?;
            Ok(GuardFacts {
                event: hex(&g.id),
                violations: c.violations,
                action: c.action,
            })
        })
        .transpose()
}

/// Every judgment that names the rollout (on the run's streams, by
/// `mine`), from the rollout's side, sorted by stream.
fn judgment_facts(
    l: &Ledger,
    id: &Id,
    mine: &dyn Fn(&Event) -> Result<bool>,
) -> Result<Vec<JudgmentFacts>> {
    let mut judgments = Vec::new();
    for (jev, j) in referrers_of::<Judgment>(l, id)? {
        if !mine(&jev)? {
            continue;
        }
        let mine_a = id_of(j.a) == *id;
        let opponent = if mine_a { j.b } else { j.a };
        let outcome = match (j.winner.as_str(), mine_a) {
            ("tie", _) => "tie",
            ("a", true) | ("b", false) => "won",
            ("a", false) | ("b", true) => "lost",
            _ => "invalid",
        };
        judgments.push(JudgmentFacts {
            event: hex(&jev.id),
            stream: jev.stream.clone(),
            opponent: hex(&id_of(opponent)),
            shown_first: mine_a != j.swapped,
            outcome: outcome.into(),
            judge_model: j.judge_model,
            rationale: j.rationale,
        });
    }
    // By stream (the pair's name), not by log order: duels run concurrently,
    // so their order in the log depends on timing, and `why` must print the
    // same for the same run.
    judgments.sort_by(|a, b| (&a.stream, &a.event).cmp(&(&b.stream, &b.event)));
    Ok(judgments)
}

/// What one ranking of a rollout led to.
struct DecisionChain {
    ranking: Option<RankingFacts>,
    selection: Option<SelectionFacts>,
    dataset_lines: Vec<DatasetLine>,
    training: Option<TrainingFacts>,
}

fn decision_chain(l: &Ledger, id: &Id, rev: &Event, rk: &Ranking) -> Result<DecisionChain> {
    let ranking = rk
        .runs
        .iter()
        .find(|x| id_of(x.rollout) == *id)
        .map(|me| RankingFacts {
            event: hex(&rev.id),
            score: me.score,
            rank: me.rank,
            of: rk.runs.len() as u32,
            wins: me.wins,
            losses: me.losses,
            ties: me.ties,
            prior: rk.prior,
            iterations: rk.iterations,
            converged: rk.converged,
        });
    let mut chain = DecisionChain {
        ranking,
        selection: None,
        dataset_lines: Vec::new(),
        training: None,
    };
    let Some((sev, sel)) = selections_of(l, &rev.id)?.into_iter().last() else {
        return Ok(chain);
    };
    let rank = chain.ranking.as_ref().map(|r| r.rank);
    chain.selection = Some(selection_facts(
        &sev,
        &sel,
        id,
        rank,
        chain.ranking.as_ref(),
    ));
    for (dev, ds) in referrers_of::<Dataset>(l, &sev.id)? {
        chain
            .dataset_lines
            .extend(dataset_lines_of(l, &dev, &ds, id)?);
        if let Some((tev, t)) = trainings_of(l, &dev.id)?.into_iter().last() {
            let meta = l.get_meta(&tev.id)?;
            chain.training = Some(TrainingFacts {
                event: hex(&tev.id),
                base_model: t.base_model,
                new_model: t.new_model,
                checkpoint: t.checkpoint,
                validation_loss: t.validation_loss,
                exit_status: (!meta.not_recorded("exit_status")).then_some(t.exit_status),
            });
        }
    }
    Ok(chain)
}

fn workflow_facts(
    l: &Ledger,
    r: &Rollout,
    own_order: u64,
    order: &dyn Fn(&Id) -> Result<u64>,
) -> Result<WorkflowFacts> {
    let blob = id_of(r.workflow);
    let text = l.get_blob(&blob)?;
    let bare = serde_json::from_slice::<engine::workflow::Workflow>(&text)
        .map(|w| w == engine::workflow::Workflow::bare())
        .unwrap_or(false);
    let mut proposal = None;
    let mut promotion = None;
    if !bare {
        for (pev, p) in referrers_of::<ProposalRecord>(l, &blob)? {
            if p.task == r.task && p.valid && order(&pev.id)? < own_order {
                proposal = Some(Link {
                    event: hex(&pev.id),
                    summary: format!("proposed at inner-loop iteration {}", p.iteration),
                });
            }
        }
        // The inner-loop run that tried this workflow, and the promotion
        // that accepted that run as champion.
        for (cev, c) in referrers_of::<Rollout>(l, &blob)? {
            if c.task != r.task || c.purpose != "inner" || order(&cev.id)? >= own_order {
                continue;
            }
            for (mev, m) in referrers_of::<Promotion>(l, &cev.id)? {
                if m.accepted && id_of(m.candidate) == cev.id {
                    promotion = Some(PromotionFacts {
                        event: hex(&mev.id),
                        candidate_run: hex(&cev.id),
                        iteration: m.iteration,
                        reason: m.reason,
                        beat_reference: m.beat_reference,
                        judgments: m.judgments.iter().map(|j| hex(&id_of(*j))).collect(),
                    });
                }
            }
        }
    }
    Ok(WorkflowFacts {
        blob: hex(&blob),
        bare,
        proposal,
        promotion,
    })
}

fn agent_facts(l: &Ledger, id: &Id, r: &Rollout) -> Result<Vec<AgentFacts>> {
    let heads = std::iter::once(r.orchestrator).chain(r.subagents.iter().copied());
    let mut out = Vec::new();
    for (n, head) in heads.enumerate() {
        let head = id_of(head);
        let mut calls = Vec::new();
        if let Some(t) = engine::transcript::stream_conversation(l, head)? {
            for m in &t.messages {
                for c in &m.tool_calls {
                    let mut args = c.function.arguments.clone();
                    if args.len() > 120 {
                        let cut = (0..=120)
                            .rev()
                            .find(|i| args.is_char_boundary(*i))
                            .unwrap_or(0);
                        args.truncate(cut);
                        args.push_str("...");
                    }
                    calls.push(format!("{}({args})", c.function.name));
                }
            }
        }
        out.push(AgentFacts {
            conversation: format!("{}#{n}", id.short(16)),
            stream_head: hex(&head),
            tool_calls: calls,
        });
    }
    Ok(out)
}

fn selection_facts(
    sev: &Event,
    sel: &Selection,
    id: &Id,
    rank: Option<u32>,
    ranking: Option<&RankingFacts>,
) -> SelectionFacts {
    let me = schemas::Hash32(id.0);
    let short = |text: &str| {
        if sel.shortfall.is_empty() {
            text.to_string()
        } else {
            format!("{text}; the selection is short: {}", sel.shortfall)
        }
    };
    // A v1 line names a ranked run by its rank, an unranked one by an id
    // prefix; `rank` is this run's in the ranking the selection read.
    let v1_line = |line: &str| {
        line.contains(&id.short(12))
            || rank.is_some_and(|r| line.starts_with(&format!("rank {r}: ")))
    };
    let (decision, why) = if sel.train.contains(&me) {
        (
            "train",
            short(&format!(
                "ranked {} of the task's runs: within the training ranks",
                rank_text(ranking)
            )),
        )
    } else if sel.validation.contains(&me) {
        (
            "validation",
            short(&format!(
                "ranked {}: the rank after the training ranks validates",
                rank_text(ranking)
            )),
        )
    } else if let Some(x) = sel.exclusions.iter().find(|x| x.rollout == me) {
        ("excluded", x.reason.clone())
    } else if let Some(line) = sel.excluded.iter().find(|l| v1_line(l)) {
        ("excluded", line.clone())
    } else {
        (
            "not selected",
            format!(
                "ranked {}; the selection took {} training and {} validation runs from higher ranks",
                rank_text(ranking),
                sel.train.len(),
                sel.validation.len()
            ),
        )
    };
    SelectionFacts {
        event: hex(&sev.id),
        decision: decision.into(),
        why,
    }
}

fn rank_text(r: Option<&RankingFacts>) -> String {
    r.map_or("(not ranked)".into(), |r| format!("{} of {}", r.rank, r.of))
}

fn dataset_lines_of(l: &Ledger, dev: &Event, ds: &Dataset, id: &Id) -> Result<Vec<DatasetLine>> {
    let text = l.get_blob(&id_of(ds.provenance))?;
    let me = id.to_hex();
    let mut out = Vec::new();
    for line in String::from_utf8_lossy(&text).lines() {
        let v: Value =
            serde_json::from_str(line).map_err(|e| EngineError::recording("provenance", e))?;
        if v["rollout"].as_str() == Some(me.as_str()) {
            out.push(DatasetLine {
                dataset: hex(&dev.id),
                cycle: ds.cycle,
                file: v["file"].as_str().unwrap_or_default().to_string(),
                line: v["line"].as_u64().unwrap_or(0),
                conversation: v["conversation"].as_str().unwrap_or_default().to_string(),
                agent: v["agent"].as_str().unwrap_or_default().to_string(),
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::rollouts::RunMembers;
    use super::*;

    fn note(text: String) -> ledger::NewEvent {
        schemas::to_event(&schemas::Note { text })
            .expect("note")
            .in_stream("main")
    }

    /// `RunMembers` (one walk per stream, kept) answers as `in_run` (a walk
    /// per question) for every event of a run, its fork (which shares the
    /// run's first events) and an unrelated run, asked in scrambled orders
    /// so that later questions reach back past earlier ones and the reverse.
    #[test]
    fn run_members_answer_as_in_run_does() {
        let d = tempfile::tempdir().expect("tempdir");
        let l = Ledger::init(&d.path().join("l")).expect("init");
        let mut all = Vec::new();
        let mut head = None;
        for i in 0..12 {
            let id = l.append("r", head, note(format!("r {i}"))).expect("append");
            all.push(id);
            head = Some(id);
        }
        l.fork("f", all[5]).expect("fork");
        let mut fh = Some(all[5]);
        for i in 0..4 {
            let id = l.append("f", fh, note(format!("f {i}"))).expect("append");
            all.push(id);
            fh = Some(id);
        }
        all.push(l.append("x", None, note("x".into())).expect("append"));
        // A chain whose sequence numbers rise somewhere, as a migrated
        // ledger may hold one (pull and import refuse such chains):
        // H(9) -> A(1) -> B(4) -> C(0) on ref `r/odd`. `in_run` stops at A
        // for B; asked about C first, a walk passes B and must not say yes.
        let mut prev: Option<Id> = None;
        let mut odd = Vec::new();
        for (i, seq) in [0u64, 4, 1, 9].into_iter().enumerate() {
            let env = ledger::EventEnvelope {
                kind: "note".into(),
                version: 1,
                stream: "odd".into(),
                seq,
                prev: prev.map(|p| p.0),
                parents: vec![],
                refs: vec![],
                payload: schemas::to_event(&schemas::Note {
                    text: format!("odd {i}"),
                })
                .expect("note")
                .payload,
            };
            let mut b = l.batch();
            b.keep_chains_as_recorded();
            let id = b
                .put_raw(
                    ledger::ObjectKind::Event,
                    env.to_bytes().expect("bytes"),
                    vec![],
                )
                .expect("put");
            b.commit().expect("commit");
            odd.push(id);
            prev = Some(id);
        }
        l.set_ref("r/odd", None, prev.expect("head")).expect("ref");
        all.extend(odd.iter().rev());
        let events: Vec<Event> = all
            .iter()
            .map(|id| l.get_event(id).expect("event"))
            .collect();
        for seed in 0..16u64 {
            for run in ["r", "f", "x", "none"] {
                let mut members = RunMembers::new(&l, run);
                let mut order: Vec<usize> = (0..events.len()).collect();
                // A seeded shuffle (xorshift), a different order per seed.
                let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
                for i in (1..order.len()).rev() {
                    s ^= s << 13;
                    s ^= s >> 7;
                    s ^= s << 17;
                    order.swap(i, (s % (i as u64 + 1)) as usize);
                }
                for &k in &order {
                    let ev = &events[k];
                    assert_eq!(
                        members.holds(ev).expect("holds"),
                        in_run(&l, run, ev).expect("in_run"),
                        "seed {seed}, run {run}, event {k}"
                    );
                }
            }
        }
    }
}
