//! One MASS cycle: the inner loop (workflow search per training task), then
//! the outer loop (collect runs of each champion, judge a seeded pairing
//! schedule, rank with Bradley-Terry, select, export the dataset, train,
//! evaluate on held-out tasks, promote the trained model to every role).
//!
//! Units of work run in parallel; the main stream records a step after each
//! stage, naming the work's heads as parents, so a run forks cleanly at any
//! step boundary.

use std::collections::{BTreeMap, BTreeSet};

use ledger::Id;
use replay::{EffectOutput, EffectRequest, Session, Stream};
use schemas::{Hash32, Note, Promotion, RankedRun, Ranking, Selection};

use crate::backend::Backends;
use crate::config::{Acceptance, Collect, Experiment, GuardAction};
use crate::dataset::{self, AgentKind, Example, ExampleSplit as DataSplit, Format};
use crate::error::{EngineError, Result};
use crate::exec;
use crate::harness::{run_team, RunRules, RunSpec, Team};
use crate::judge::{judge_pair, Judge, RunRef};
use crate::optimizer::{propose, Optimizer};
use crate::task::{Split, Task};
use crate::workflow::Workflow;

/// Progress reporting, implemented by the CLI (progress bars) or ignored.
pub trait Progress: Send + Sync {
    fn stage(&self, _name: &str, _total: u64) {}
    fn tick(&self, _name: &str) {}
    fn done(&self, _name: &str) {}
}

pub struct NoProgress;
impl Progress for NoProgress {}

/// Model names per role for one cycle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Models {
    pub orchestrator: String,
    pub subagent: String,
    pub judge: String,
    pub optimizer: String,
}

/// Everything a cycle needs.
pub struct Ctx<'a> {
    pub session: &'a Session,
    pub exp: &'a Experiment,
    pub backends: &'a Backends,
    pub train: &'a [Task],
    pub heldout: &'a [Task],
    pub progress: &'a dyn Progress,
}

/// The figures of one cycle, for the summary table.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CycleResult {
    pub cycle: u32,
    pub model: String,
    pub next_model: String,
    pub inner_wins: u32,
    pub inner_iterations: u32,
    pub tasks_with_data: u32,
    pub selected_runs: u32,
    pub supervised_tokens: u64,
    /// The evaluation of the trained model (none when the model did not
    /// change).
    pub evaluation: Option<crate::evaluation::Outcome>,
    /// Training examples from runs that tampered, as the record shows it:
    /// tool calls that write a protected file or claim passing checks in
    /// the report (`guards::tampering_in`), or a final workspace whose
    /// protected files changed (the guard's finding on the snapshots).
    /// What guards exist to keep at zero.
    pub tampered_in_training: u32,
    /// The cycle's figures as recorded (`mass.cycle` and its evaluations),
    /// exactly what `mass status --json` shows for it.
    pub figures: crate::status::CycleFigures,
    /// Collected runs (with the champion workflow), those whose
    /// orchestrator delegated and those that tampered (as above), whatever
    /// the guards then did with them.
    pub collected_runs: u32,
    pub delegating_runs: u32,
    pub tampered_runs: u32,
}

impl CycleResult {
    /// Share of the collected runs whose orchestrator delegated.
    pub fn delegation_rate(&self) -> f64 {
        share(self.delegating_runs, self.collected_runs)
    }

    /// Share of the collected runs that tampered.
    pub fn tamper_rate(&self) -> f64 {
        share(self.tampered_runs, self.collected_runs)
    }
}

fn share(part: u32, whole: u32) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

/// Whether the run these conversations come from tampered, by its
/// recorded tool calls (every agent's).
fn tampered(task: &Task, convs: &[dataset::Example]) -> bool {
    let calls: Vec<(String, serde_json::Value)> = convs
        .iter()
        .flat_map(|c| c.messages.iter())
        .flat_map(|m| m.tool_calls.iter())
        .map(|c| {
            let args = serde_json::from_str(&c.function.arguments).unwrap_or_default();
            (c.function.name.clone(), args)
        })
        .collect();
    crate::guards::tampering_in(task, &calls).is_some()
}

/// The cycle's settings and models as they stand now. A fork taken at any
/// main-stream step of the cycle applies its overrides right after that
/// step (`step`), so every stage reads the experiment afresh: `exp` as it
/// stands, with the models the cycle started with (`m`, played by the roles
/// of `ctx.exp`, the experiment at the cycle's start) carried over where a
/// role kept its backend, rebuilt where the fork changed that backend, and
/// the new backend's base model where it handed the role to another one.
pub(crate) struct Now {
    pub exp: Experiment,
    pub models: Models,
}

impl Now {
    pub(crate) fn of(ctx: &Ctx<'_>, exp: &Experiment, m: &Models) -> Result<Now> {
        let mut models = m.clone();
        crate::driver::sync_backends(ctx.backends, exp, &mut models)?;
        crate::driver::reassign_roles(ctx.backends, &ctx.exp.roles, &exp.roles, &mut models)?;
        Ok(Now {
            exp: exp.clone(),
            models,
        })
    }
}

impl<'a> Ctx<'a> {
    /// This context reading `exp` instead: the experiment as it stands at a
    /// later step of the cycle (see [`Now`]).
    pub(crate) fn at<'b>(&self, exp: &'b Experiment) -> Ctx<'b>
    where
        'a: 'b,
    {
        Ctx {
            session: self.session,
            exp,
            backends: self.backends,
            train: self.train,
            heldout: self.heldout,
            progress: self.progress,
        }
    }
}

impl Ctx<'_> {
    pub(crate) fn threads(&self) -> usize {
        self.exp.concurrency.max(1) as usize
    }

    pub(crate) fn team(&self, m: &Models) -> Result<Team> {
        Ok(Team {
            orchestrator: self.backends.get(&self.exp.roles.orchestrator)?.clone(),
            orchestrator_model: m.orchestrator.clone(),
            subagent: self
                .backends
                .get(self.exp.roles.subagent_backend())?
                .clone(),
            subagent_model: m.subagent.clone(),
            sampling: self.exp.sampling.team.clone(),
        })
    }

    fn judge(
        &self,
        backend: &str,
        model: &str,
        retries: u32,
        sampling: &crate::config::SamplingConfig,
    ) -> Result<Judge> {
        Ok(Judge {
            backend: self.backends.get(backend)?.clone(),
            model: model.to_string(),
            max_retries: retries,
            sampling: sampling.clone(),
        })
    }

    /// Held-out tasks never reach training data, validation or checkpoint
    /// selection: every path that feeds those calls this first.
    fn assert_trainable(&self, task: &Task, what: &str) -> Result<()> {
        if task.split == Split::Heldout || self.heldout.iter().any(|h| h.id == task.id) {
            return Err(EngineError::Invalid(format!(
                "held-out task {} must never reach {what}",
                task.id
            )));
        }
        Ok(())
    }
}

fn note(text: String) -> Result<ledger::NewEvent> {
    Ok(schemas::to_event(&Note { text })?)
}

/// Emits a step on the main stream, applying the fork overrides recorded
/// before and right after it.
pub fn step(main: &mut Stream, exp: &mut Experiment, ev: ledger::NewEvent) -> Result<Id> {
    apply_forks(main, exp)?;
    let id = main.emit(ev)?;
    // A fork taken at this step applies from right after it, before the
    // work that follows (e.g. the judging after a collection step).
    apply_forks(main, exp)?;
    Ok(id)
}

/// Consumes `run.forked` events at the cursor and applies their overrides.
pub fn apply_forks(main: &mut Stream, exp: &mut Experiment) -> Result<()> {
    // A re-judge's mixed-mode record follows its fork event; the session was
    // set up from it before the run began (see `driver::recorded_source`).
    while main.take_recorded("run.mixed").is_some() {}
    while let Some(f) = main.take_recorded("run.forked") {
        let rf: schemas::RunForked = schemas::decode_event(&f)?;
        // A key a fork recorded twice (older builds allowed it) keeps the
        // value given last, as it did then.
        let mut set: Vec<(String, String)> = Vec::new();
        for o in &rf.overrides {
            set.retain(|(k, _)| k.trim() != o.key.trim());
            set.push((o.key.clone(), o.value.clone()));
        }
        for (k, _) in &set {
            check_fork_override(k)?;
        }
        // One set, validated once: the order they were given in does not
        // matter.
        exp.apply_override_set(&set)?;
        // Seeds derive from the root seed: from here on, the new one.
        if set.iter().any(|(k, _)| k.trim() == "seed") {
            main.session().set_seed(exp.seed);
        }
        while main.take_recorded("run.mixed").is_some() {}
    }
    Ok(())
}

/// Refuses overrides a fork cannot honour. `tasks_dir`: a run's tasks are
/// recorded when it starts and every fork shares them (a fork may still pick
/// other recorded tasks with `train`/`heldout`); reading a folder from disk
/// instead would make the fork depend on the working directory again.
pub fn check_fork_override(key: &str) -> Result<()> {
    if key.trim() == "tasks_dir" {
        return Err(EngineError::Invalid(
            "tasks_dir cannot be overridden in a fork: a run's tasks are recorded when it starts and its forks use that recording; to run other tasks, start a new run with `mass run FILE --ref NEW`".into(),
        ));
    }
    Ok(())
}

struct InnerTask {
    task: Task,
    decisions: Stream,
    champion: Workflow,
    champion_run: RunRef,
    reference: RunRef,
    feedback: Vec<String>,
    wins: u32,
    beat_reference: bool,
    /// An optimizer stream this iteration left without a promotion (no valid
    /// proposal): linked from the iteration's step so forks keep it.
    unlinked: Option<Id>,
}

/// The reason an exclusion by the guards carries in `mass.selection`:
/// `guard: ` and the violations (what `mass status` counts).
fn guard_reason(violations: &[String]) -> String {
    format!("guard: {}", violations.join("; "))
}

fn run_ref(o: crate::harness::RunOutcome) -> RunRef {
    RunRef {
        event: o.event,
        record: o.record,
        violations: o.guard.violations,
    }
}

/// Judges `cand` against `other` once, or twice with A/B swapped (both
/// orders at once); returns (candidate wins, candidate losses, judgment ids,
/// last rationale).
async fn duel(
    session: &Session,
    rel: &str,
    task: &Task,
    cand: &RunRef,
    other: &RunRef,
    swap: bool,
    judge: &Judge,
) -> Result<(u32, u32, Vec<Id>, String)> {
    let straight = judge_pair(session, rel, task, cand, other, false, judge);
    let rel_swapped = format!("{rel}s");
    let verdicts = if swap {
        let swapped = judge_pair(session, &rel_swapped, task, cand, other, true, judge);
        let (a, b) = tokio::join!(straight, swapped);
        vec![a?, b?]
    } else {
        vec![straight.await?]
    };
    let (mut w, mut l) = (0, 0);
    let mut ids = Vec::new();
    let mut why = String::new();
    for (id, j) in verdicts {
        match j.winner.as_str() {
            "a" => w += 1,
            "b" => l += 1,
            _ => {}
        }
        why = j.rationale;
        ids.push(id);
    }
    Ok((w, l, ids, why))
}

/// What every inner-loop unit of one cycle shares.
#[derive(Clone)]
struct Search {
    session: Session,
    team: Team,
    judge: Judge,
    opt: Optimizer,
    rules: RunRules,
    cycle: u32,
    acceptance: Acceptance,
    swap: bool,
    guard_action: GuardAction,
}

impl Search {
    /// The search's team, judge, optimizer and rules under `c`'s settings.
    fn of(c: &Ctx<'_>, m: &Models, cycle: u32) -> Result<Search> {
        let e = c.exp;
        Ok(Search {
            session: c.session.clone(),
            team: c.team(m)?,
            judge: c.judge(
                &e.roles.judge,
                &m.judge,
                e.outer.max_verdict_retries,
                &e.sampling.judge,
            )?,
            opt: Optimizer {
                backend: c.backends.get(&e.roles.optimizer)?.clone(),
                model: m.optimizer.clone(),
                max_retries: e.inner.max_proposal_retries,
                sampling: e.sampling.optimizer.clone(),
            },
            rules: RunRules::of(e),
            cycle,
            acceptance: e.inner.acceptance,
            swap: e.inner.swap_positions,
            guard_action: e.guards.action,
        })
    }

    /// A duel of the candidate's run against `other` in stream `{base}/{vs}`.
    async fn duel(
        &self,
        base: &str,
        vs: &str,
        task: &Task,
        run: &RunRef,
        other: &RunRef,
    ) -> Result<(u32, u32, Vec<Id>, String)> {
        let rel = format!("{base}/{vs}");
        duel(
            &self.session,
            &rel,
            task,
            run,
            other,
            self.swap,
            &self.judge,
        )
        .await
    }
}

/// One inner-loop iteration `k` of one task: a proposal, a run of it, the
/// duel(s) that decide whether it becomes the champion, and the recorded
/// decision.
async fn search_step(s: &Search, t: &mut InnerTask, k: u32) -> Result<()> {
    let cycle = s.cycle;
    let base = format!("c{cycle}/{}/inner/{k:02}", t.task.id);
    let (proposal, optimizer_head) = propose(
        &s.session,
        &format!("{base}/optimizer"),
        &t.task,
        k,
        &t.champion,
        &t.feedback,
        &s.opt,
    )
    .await?;
    let Some(candidate) = proposal else {
        t.feedback.push(format!("iteration {k}: no valid proposal"));
        t.unlinked = Some(optimizer_head);
        return Ok(());
    };
    let run = run_ref(
        run_team(
            &s.session,
            &RunSpec {
                task: &t.task,
                workflow: &candidate,
                stream: format!("{base}/run"),
                purpose: "inner",
                cycle,
                index: k,
            },
            &s.team,
            &s.rules,
        )
        .await?,
    );
    let (mut judgments, accepted, beat_ref, reason);
    match s.acceptance {
        Acceptance::Champion => {
            let (w, l, ids, why) = s
                .duel(&base, "vs-champion", &t.task, &run, &t.champion_run)
                .await?;
            judgments = ids;
            accepted = w > l;
            beat_ref = accepted;
            reason = format!("{w} win(s), {l} loss(es) against the champion: {why}");
        }
        Acceptance::ReferenceThenChampion => {
            let (w, l, ids, why) = s
                .duel(&base, "vs-reference", &t.task, &run, &t.reference)
                .await?;
            judgments = ids;
            beat_ref = w > l;
            if beat_ref && t.champion_run.event != t.reference.event {
                let (w2, l2, ids2, why2) = s
                    .duel(&base, "vs-champion", &t.task, &run, &t.champion_run)
                    .await?;
                judgments.extend(ids2);
                accepted = w2 > l2;
                reason =
                    format!("beat the reference {w}-{l}; against the champion {w2}-{l2}: {why2}");
            } else {
                accepted = beat_ref;
                reason = format!("{w} win(s), {l} loss(es) against the bare-task reference: {why}");
            }
        }
    }
    // A workflow whose run the guards flagged never becomes champion
    // (unless the policy only records flags): it would carry the
    // tampering into collection.
    let (mut accepted, mut beat_ref, mut reason) = (accepted, beat_ref, reason);
    if !run.violations.is_empty() && s.guard_action != GuardAction::Record {
        accepted = false;
        beat_ref = false;
        reason = format!(
            "{reason}; rejected by the {}",
            guard_reason(&run.violations)
        );
    }
    let rec = Promotion {
        task: t.task.id.clone(),
        iteration: k,
        candidate: run.event.into(),
        champion: t.champion_run.event.into(),
        accepted,
        beat_reference: beat_ref,
        reason: reason.clone(),
        judgments: judgments.iter().map(|j| Hash32(j.0)).collect(),
    };
    // The optimizer's stream is a causal parent of the decision, so a
    // fork after this point keeps (and serves) its calls.
    let mut parents = judgments.clone();
    parents.push(optimizer_head);
    let ev = schemas::to_event(&rec)?.with_parents(parents);
    exec::ledger(|| t.decisions.emit(ev))?;
    t.feedback.push(format!(
        "iteration {k}: candidate {} — {reason}",
        if accepted { "accepted" } else { "rejected" }
    ));
    if accepted {
        t.champion = candidate;
        t.champion_run = run;
        t.wins += 1;
        t.beat_reference |= beat_ref;
    }
    Ok(())
}

/// The inner loop for all training tasks, iteration by iteration; within an
/// iteration every task's step runs at once.
fn inner_loop(
    ctx: &Ctx<'_>,
    main: &mut Stream,
    exp: &mut Experiment,
    cycle: u32,
    m: &Models,
) -> Result<Vec<InnerTask>> {
    let team = ctx.team(m)?;
    let stage = format!("cycle {cycle}: reference runs");
    ctx.progress.stage(&stage, ctx.train.len() as u64);
    let refs = exec::all(
        ctx.threads(),
        ctx.train.to_vec(),
        |task| {
            let (session, team, rules) = (ctx.session.clone(), team.clone(), RunRules::of(ctx.exp));
            async move {
                let spec = RunSpec {
                    task: &task,
                    workflow: &Workflow::bare(),
                    stream: format!("c{cycle}/{}/reference", task.id),
                    purpose: "reference",
                    cycle,
                    index: 0,
                };
                Ok(run_ref(run_team(&session, &spec, &team, &rules).await?))
            }
        },
        || ctx.progress.tick(&stage),
    )?;
    ctx.progress.done(&stage);
    let mut tasks = Vec::new();
    for (task, r) in ctx.train.iter().zip(refs) {
        tasks.push(InnerTask {
            task: task.clone(),
            decisions: ctx.session.stream(&format!("c{cycle}/{}/inner", task.id))?,
            champion: Workflow::bare(),
            champion_run: r.clone(),
            reference: r,
            feedback: Vec::new(),
            wins: 0,
            beat_reference: false,
            unlinked: None,
        });
    }
    step(
        main,
        exp,
        note(format!("cycle {cycle}: reference runs done"))?
            .with_parents(tasks.iter().map(|t| t.reference.event).collect()),
    )?;
    let iterations = exp.inner.iterations;
    let stage = format!("cycle {cycle}: inner loop");
    ctx.progress
        .stage(&stage, (iterations as usize * tasks.len()) as u64);
    for k in 1..=iterations {
        // Read each iteration: a fork at the previous step may change them.
        let now = Now::of(ctx, exp, m)?;
        let c = ctx.at(&now.exp);
        let search = Search::of(&c, &now.models, cycle)?;
        tasks = exec::all(
            c.threads(),
            std::mem::take(&mut tasks),
            |mut t| {
                let search = search.clone();
                async move {
                    search_step(&search, &mut t, k).await?;
                    Ok(t)
                }
            },
            || ctx.progress.tick(&stage),
        )?;
        let mut heads: Vec<Id> = tasks.iter().filter_map(|t| t.decisions.head()).collect();
        heads.extend(tasks.iter_mut().filter_map(|t| t.unlinked.take()));
        step(
            main,
            exp,
            note(format!("cycle {cycle}: inner iteration {k} done"))?.with_parents(heads),
        )?;
    }
    ctx.progress.done(&stage);
    Ok(tasks)
}

/// Runs one whole cycle; returns its figures, the next cycle's models and
/// the roles they play (a fork inside the cycle may have moved a role to
/// another backend).
pub fn run_cycle(
    ctx: &Ctx<'_>,
    main: &mut Stream,
    exp: &mut Experiment,
    cycle: u32,
    m: &Models,
    eval_runs: &mut crate::evaluation::EvalRuns,
) -> Result<(CycleResult, Models, crate::config::Roles)> {
    let inner = inner_loop(ctx, main, exp, cycle, m)?;
    let mut result = CycleResult {
        cycle,
        model: m.orchestrator.clone(),
        inner_wins: inner.iter().map(|t| t.wins).sum(),
        inner_iterations: exp.inner.iterations * inner.len() as u32,
        ..Default::default()
    };
    let with_data: Vec<&InnerTask> = inner
        .iter()
        .filter(|t| t.beat_reference || exp.outer.collect == Collect::Every)
        .collect();
    result.tasks_with_data = with_data.len() as u32;
    for t in &with_data {
        ctx.assert_trainable(&t.task, "collection")?;
    }

    // Collection: N runs of each champion, under the settings as they
    // stand after the inner loop's last step.
    let now = Now::of(ctx, exp, m)?;
    let c = ctx.at(&now.exp);
    let team = c.team(&now.models)?;
    let n = now.exp.outer.runs_per_task;
    let jobs: Vec<(Task, Workflow, u32)> = with_data
        .iter()
        .flat_map(|t| (0..n).map(move |i| (t.task.clone(), t.champion.clone(), i)))
        .collect();
    let stage = format!("cycle {cycle}: collection");
    ctx.progress.stage(&stage, jobs.len() as u64);
    let runs = exec::all(
        c.threads(),
        jobs,
        |(task, workflow, i)| {
            let (session, team, rules) = (c.session.clone(), team.clone(), RunRules::of(c.exp));
            async move {
                let spec = RunSpec {
                    task: &task,
                    workflow: &workflow,
                    stream: format!("c{cycle}/{}/collect/{i:02}", task.id),
                    purpose: "collect",
                    cycle,
                    index: i,
                };
                Ok(run_ref(run_team(&session, &spec, &team, &rules).await?))
            }
        },
        || ctx.progress.tick(&stage),
    )?;
    ctx.progress.done(&stage);
    let mut by_task: BTreeMap<String, Vec<RunRef>> = BTreeMap::new();
    // Runs the guards flagged, kept out of judging and ranking when the
    // policy says `exclude`; each one is named, with its reasons, in its
    // task's selection (nothing is dropped silently).
    let mut guard_excluded: BTreeMap<String, Vec<String>> = BTreeMap::new();
    // Collection figures count every collected run, flagged or not.
    let delegating = runs.iter().filter(|r| r.record.delegations > 0).count();
    let total_runs = runs.len();
    // Runs that tampered, by their guard findings or their recorded tool
    // calls: read once, for the collection figure here and the training
    // figure at selection.
    let mut tampering_runs: BTreeSet<Id> = BTreeSet::new();
    for r in &runs {
        if crate::guards::changed_protected(&r.violations) {
            tampering_runs.insert(r.event);
            continue;
        }
        if let Some(t) = with_data.iter().find(|t| t.task.id == r.record.task) {
            if tampered(
                &t.task,
                &run_conversations(ctx, &t.task, r, DataSplit::Train)?,
            ) {
                tampering_runs.insert(r.event);
            }
        }
    }
    result.collected_runs = total_runs as u32;
    result.delegating_runs = delegating as u32;
    result.tampered_runs = tampering_runs.len() as u32;
    // Every collected run is a parent of the step, the ones the guards
    // exclude too: a fork there keeps their streams instead of running them
    // again live.
    let collected: Vec<Id> = runs.iter().map(|r| r.event).collect();
    for r in runs {
        let task = r.record.task.clone();
        by_task.entry(task.clone()).or_default();
        if !r.violations.is_empty() && exp.guards.action == GuardAction::Exclude {
            guard_excluded.entry(task).or_default().push(format!(
                "run {}: {} (not ranked)",
                r.event.short(12),
                guard_reason(&r.violations)
            ));
            continue;
        }
        by_task.entry(task).or_default().push(r);
    }

    step(
        main,
        exp,
        note(format!(
            "cycle {cycle}: collection done ({total_runs} runs)"
        ))?
        .with_parents(collected),
    )?;

    // Pairwise judging on a seeded connected schedule. The judge is read
    // from the experiment as it stands now: a fork taken at the collection
    // step (`mass rejudge --cycle C --judge NAME`) hands judging to another
    // backend from here on, which plays it with its base model.
    // A backend the fork changed or added (`--judge FILE.toml`) is built now.
    let now = Now::of(ctx, exp, m)?;
    let c = ctx.at(&now.exp);
    let judge = c.judge(
        &now.exp.roles.judge,
        &now.models.judge,
        now.exp.outer.max_verdict_retries,
        &now.exp.sampling.judge,
    )?;
    let mut pair_jobs = Vec::new();
    for (task_id, runs) in &by_task {
        let seed = main.derive_seed(&format!("pairing/{cycle}/{task_id}"));
        if runs.is_empty() {
            continue;
        }
        let mut k = exp
            .outer
            .opponents_per_run
            .min(runs.len().saturating_sub(1) as u32);
        // Guards may leave an odd number of runs; a regular schedule needs
        // an even number of slots.
        if (runs.len() as u32 * k) % 2 == 1 {
            k -= 1;
        }
        let schedule = rank::schedule::pairing_schedule(runs.len(), k as usize, seed)
            .map_err(|e| EngineError::Invalid(format!("pairing schedule for {task_id}: {e}")))?;
        for (p, pair) in schedule.iter().enumerate() {
            pair_jobs.push((task_id.clone(), p, pair.a, pair.b, false));
            if exp.outer.swap_positions {
                pair_jobs.push((task_id.clone(), p, pair.a, pair.b, true));
            }
        }
    }
    let stage = format!("cycle {cycle}: judging");
    ctx.progress.stage(&stage, pair_jobs.len() as u64);
    let tasks_by_id: BTreeMap<&str, &Task> = ctx.train.iter().map(|t| (t.id.as_str(), t)).collect();
    let verdicts = exec::all(
        c.threads(),
        pair_jobs,
        |(task_id, p, a, b, swapped)| {
            let task = tasks_by_id.get(task_id.as_str()).map(|t| (*t).clone());
            let pair = by_task
                .get(&task_id)
                .and_then(|runs| Some((runs.get(a)?.clone(), runs.get(b)?.clone())));
            let (session, judge) = (ctx.session.clone(), judge.clone());
            async move {
                let (Some(task), Some((ra, rb))) = (task, pair) else {
                    return Err(EngineError::Invalid(format!(
                        "no runs {a} and {b} of task {task_id} to judge"
                    )));
                };
                let rel = format!(
                    "c{cycle}/{task_id}/pair/{p:03}{}",
                    if swapped { "s" } else { "" }
                );
                let (id, j) = judge_pair(&session, &rel, &task, &ra, &rb, swapped, &judge).await?;
                Ok((task_id, a, b, id, j.winner))
            }
        },
        || ctx.progress.tick(&stage),
    )?;
    ctx.progress.done(&stage);
    // A barrier: every comparison of every task is a causal parent of the
    // steps that follow, so a fork at any of them keeps all the judging.
    step(
        main,
        exp,
        note(format!(
            "cycle {cycle}: {} comparison(s) judged",
            verdicts.len()
        ))?
        .with_parents(verdicts.iter().map(|v| v.3).collect()),
    )?;

    // Bradley-Terry per task, selection, stripping, dataset.
    let mut conversations = Vec::new();
    // Where each conversation comes from: (rollout, selection, ranking).
    let mut origins: Vec<(&RunRef, Id, Id)> = Vec::new();
    let mut selections = Vec::new();
    for (task_id, runs) in &by_task {
        let task = tasks_by_id[task_id.as_str()];
        ctx.assert_trainable(task, "ranking and selection")?;
        let mine: Vec<&(String, usize, usize, Id, String)> =
            verdicts.iter().filter(|v| &v.0 == task_id).collect();
        let comparisons: Vec<rank::bt::Comparison> = mine
            .iter()
            .filter_map(|(_, a, b, _, w)| {
                let outcome = match w.as_str() {
                    "a" => rank::bt::Outcome::AWins,
                    "b" => rank::bt::Outcome::BWins,
                    "tie" => rank::bt::Outcome::Tie,
                    _ => return None,
                };
                Some(rank::bt::Comparison {
                    a: *a,
                    b: *b,
                    outcome,
                })
            })
            .collect();
        let prior = if exp.outer.prior > 0.0 {
            rank::bt::Prior::Virtual(exp.outer.prior)
        } else {
            rank::bt::Prior::None
        };
        let opts = rank::bt::FitOptions {
            prior,
            ..Default::default()
        };
        let fit = rank::bt::fit(runs.len(), &comparisons, &opts)
            .map_err(|e| EngineError::Invalid(format!("Bradley-Terry for {task_id}: {e}")))?;
        let ranked: Vec<RankedRun> = fit
            .by_rank()
            .iter()
            .map(|r| RankedRun {
                rollout: runs[r.item].event.into(),
                score: r.score,
                rank: r.rank as u32,
                wins: r.wins,
                losses: r.losses,
                ties: r.ties,
            })
            .collect();
        let ranking = Ranking {
            task: task_id.clone(),
            cycle,
            prior: exp.outer.prior,
            iterations: fit.iterations as u32,
            converged: fit.converged,
            runs: ranked.clone(),
            judgments: mine.iter().map(|v| Hash32(v.3 .0)).collect(),
        };
        let ranking_id = step(
            main,
            exp,
            schemas::to_event(&ranking)?.with_parents(mine.iter().map(|v| v.3).collect()),
        )?;
        let mut train = Vec::new();
        let mut validation = Vec::new();
        let mut excluded = guard_excluded.remove(task_id).unwrap_or_default();
        for r in &ranked {
            let run = runs
                .iter()
                .find(|x| Hash32::from(x.event) == r.rollout)
                .ok_or_else(|| EngineError::Invalid("ranked run vanished".into()))?;
            if !run.violations.is_empty() && exp.guards.action == GuardAction::NoTrain {
                excluded.push(format!(
                    "rank {}: {} (ranked, not trained on)",
                    r.rank,
                    guard_reason(&run.violations)
                ));
                continue;
            }
            if run.record.status != "finished" {
                excluded.push(format!(
                    "rank {}: {} ({})",
                    r.rank, run.record.status, run.record.detail
                ));
                continue;
            }
            if (train.len() as u32) < exp.outer.train_ranks {
                train.push(run);
            } else if (validation.len() as u32) < exp.outer.validation_ranks {
                validation.push(run);
            }
        }
        let sel = Selection {
            task: task_id.clone(),
            cycle,
            ranking: ranking_id.into(),
            train: train.iter().map(|r| r.event.into()).collect(),
            validation: validation.iter().map(|r| r.event.into()).collect(),
            excluded,
        };
        let selection_id = step(main, exp, schemas::to_event(&sel)?)?;
        selections.push(selection_id);
        for (split, list) in [
            (DataSplit::Train, &train),
            (DataSplit::Validation, &validation),
        ] {
            for run in list.iter() {
                let convs = run_conversations(ctx, task, run, split)?;
                if split == DataSplit::Train && tampering_runs.contains(&run.event) {
                    result.tampered_in_training += convs.len() as u32;
                }
                origins.extend(convs.iter().map(|_| (*run, selection_id, ranking_id)));
                conversations.extend(convs);
            }
        }
        result.selected_runs += (train.len() + validation.len()) as u32;
    }
    let (train_jsonl, val_jsonl, summary) = dataset::render_dataset(&conversations, Format::OpenAi)
        .map_err(|e| EngineError::Invalid(format!("dataset: {e}")))?;
    result.supervised_tokens =
        summary.train_supervised_tokens + summary.validation_supervised_tokens;
    let ledger = ctx.session.ledger();
    let (train_blob, val_blob) = (
        ledger.put_blob(train_jsonl.as_bytes())?,
        ledger.put_blob(val_jsonl.as_bytes())?,
    );
    let provenance = ledger.put_blob(provenance_jsonl(&conversations, &origins).as_bytes())?;
    let ds = schemas::Dataset {
        cycle,
        format: "openai".into(),
        train: train_blob.into(),
        validation: val_blob.into(),
        train_examples: summary.train_examples as u32,
        validation_examples: summary.validation_examples as u32,
        train_supervised_tokens: summary.train_supervised_tokens,
        validation_supervised_tokens: summary.validation_supervised_tokens,
        selections: selections.iter().map(|s| Hash32(s.0)).collect(),
        provenance: provenance.into(),
    };
    let dataset_id = step(main, exp, schemas::to_event(&ds)?)?;

    // Training, then promotion of the trained model to every role it plays,
    // with the roles and backends as they stand after the dataset step.
    let now = Now::of(ctx, exp, m)?;
    let from = now.models.clone();
    let next = if summary.train_examples == 0 {
        step(main, exp, note(format!("cycle {cycle}: no training data (no task's champion beat the reference); the model is unchanged"))?)?;
        from.clone()
    } else if !now.exp.outer.train {
        step(
            main,
            exp,
            note(format!(
                "cycle {cycle}: dataset recorded, not trained (outer.train = false); the model is unchanged"
            ))?,
        )?;
        from.clone()
    } else {
        crate::training::train(
            &ctx.at(&now.exp),
            main,
            exp,
            cycle,
            &from.orchestrator,
            dataset_id,
            &train_jsonl,
            &val_jsonl,
            &from,
        )?
    };
    // Evaluation of the new model against the base model and the model it
    // was trained from, under the settings as they stand after training: a
    // fork at the training step may have changed or added a backend (built
    // now) or moved a role (played from here with its new backend's model).
    let settings = exp.clone();
    let (mut from, mut next) = (from, next);
    for models in [&mut from, &mut next] {
        crate::driver::sync_backends(ctx.backends, &settings, models)?;
        crate::driver::reassign_roles(ctx.backends, &now.exp.roles, &settings.roles, models)?;
    }
    result.next_model = next.orchestrator.clone();
    if !ctx.heldout.is_empty() && next.orchestrator != from.orchestrator {
        result.evaluation = Some(crate::evaluation::evaluate(
            &ctx.at(&settings),
            main,
            exp,
            cycle,
            &from,
            &next,
            eval_runs,
        )?);
    }
    let ev = result.evaluation.clone().unwrap_or_default();
    let rec = schemas::Cycle {
        cycle,
        model: m.orchestrator.clone(),
        next_model: next.orchestrator.clone(),
        inner_wins: result.inner_wins,
        inner_iterations: result.inner_iterations,
        selected_runs: result.selected_runs,
        supervised_tokens: result.supervised_tokens,
        collected_runs: result.collected_runs,
        delegating_runs: result.delegating_runs,
        tampered_runs: result.tampered_runs,
        tampered_in_training: result.tampered_in_training,
        bare_delegation: ev.delegation,
        agreement: ev.agreement,
        evaluations: ev.evaluations.iter().map(|(id, _)| Hash32(id.0)).collect(),
    };
    let evaluations: Vec<schemas::Evaluation> =
        ev.evaluations.iter().map(|(_, e)| e.clone()).collect();
    result.figures = crate::status::CycleFigures::of(&rec, &evaluations);
    step(main, exp, schemas::to_event(&rec)?)?;
    Ok((result, next, settings.roles))
}

/// The dataset's provenance sidecar (`mass.dataset` v2): one JSON object
/// per example, in the order `dataset::render_dataset` writes the lines of
/// each file, naming the rollout, conversation, agent stream, selection and
/// ranking it came from.
fn provenance_jsonl(conversations: &[Example], origins: &[(&RunRef, Id, Id)]) -> String {
    let mut line = [0u32; 2];
    let mut out = String::new();
    for (conv, (run, selection, ranking)) in conversations.iter().zip(origins) {
        let (file, n) = match conv.split {
            DataSplit::Train => ("train", &mut line[0]),
            DataSplit::Validation => ("validation", &mut line[1]),
        };
        *n += 1;
        // `run_conversations` names conversation n after the n-th stream
        // head: the orchestrator's, then each subagent's.
        let index: usize = conv
            .id
            .rsplit_once('#')
            .and_then(|(_, n)| n.parse().ok())
            .unwrap_or(0);
        let head = std::iter::once(run.record.orchestrator)
            .chain(run.record.subagents.iter().copied())
            .nth(index);
        let v = serde_json::json!({
            "file": file,
            "line": *n,
            "rollout": run.event.to_hex(),
            "conversation": conv.id,
            "agent": conv.agent,
            "stream_head": head.map(|h| Id(h.0).to_hex()),
            "selection": selection.to_hex(),
            "ranking": ranking.to_hex(),
        });
        out.push_str(&v.to_string());
        out.push('\n');
    }
    out
}

/// The base model of each role.
pub fn base_models(ctx: &Ctx<'_>) -> Result<Models> {
    let r = &ctx.exp.roles;
    Ok(Models {
        orchestrator: ctx.backends.get(&r.orchestrator)?.base_model(),
        subagent: ctx.backends.get(r.subagent_backend())?.base_model(),
        judge: ctx.backends.get(&r.judge)?.base_model(),
        optimizer: ctx.backends.get(&r.optimizer)?.base_model(),
    })
}

/// The orchestrator and subagent conversations of a selected run, the
/// orchestrator's first prompt stripped to the bare task.
fn run_conversations(
    ctx: &Ctx<'_>,
    task: &Task,
    run: &RunRef,
    split: DataSplit,
) -> Result<Vec<Example>> {
    ctx.assert_trainable(task, "the dataset")?;
    let ledger = ctx.session.ledger();
    let directives = [
        crate::prompts::directive(&task.id, &task.deliverables),
        crate::prompts::external_directive(&task.id, &task.deliverables),
    ];
    let mut out = Vec::new();
    let heads = std::iter::once((AgentKind::Orchestrator, Id(run.record.orchestrator.0))).chain(
        run.record
            .subagents
            .iter()
            .map(|s| (AgentKind::Subagent, Id(s.0))),
    );
    for (n, (agent, head)) in heads.enumerate() {
        let Some(t) = crate::transcript::stream_conversation(ledger, head)? else {
            continue;
        };
        let mut conv = Example {
            id: format!("{}#{n}", run.event.short(16)),
            run: run.event.to_hex(),
            agent,
            messages: t.messages,
            tools: t.tools,
            split,
        };
        dataset::strip_orchestrator_workflow_within(&mut conv, &task.prompt, &directives);
        out.push(conv);
    }
    Ok(out)
}

/// Helper for effects whose output is JSON.
pub fn json_effect(
    st: &mut Stream,
    kind: &str,
    request: serde_json::Value,
    perform: impl FnOnce() -> std::result::Result<serde_json::Value, replay::EffectError>,
) -> Result<serde_json::Value> {
    let rec = st.effect_blocking(EffectRequest::json(kind, &request).journaled(), || {
        perform().map(|v| EffectOutput::json(&v))
    })?;
    let transient = rec.failure == Some(replay::FailureClass::Transient);
    let bytes = rec.output.map_err(|e| {
        if transient {
            EngineError::Infrastructure {
                what: kind.to_string(),
                detail: e,
            }
        } else {
            EngineError::Invalid(format!("{kind} failed: {e}"))
        }
    })?;
    serde_json::from_slice(&bytes).map_err(|e| EngineError::recording(kind, e))
}
