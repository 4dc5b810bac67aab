//! The evaluate stage: bare-task runs (no workflow) of the new model, the
//! base model and the model the cycle started from, paired on the same task
//! and index and judged `outer.external_judgments` times by every evaluating
//! judge, each judgment's presentation order drawn at random (from the
//! run's seed, per pair, the same for every judge). It
//! measures what the MASS articles report: the held-out win rate against the
//! base model and against the previous cycle's model, the training-task win
//! rate, how often each judge's verdict followed the presentation position,
//! how often the self-judge agreed with each external judge on the same
//! pairs, and how often bare runs delegated. One `mass.evaluation` record per
//! comparison and judge; the cycle record carries agreement and delegation.
//!
//! The headline figure is the articles' W/(W+L) over judgments, ties
//! excluded (`judgment_wins`, `judgment_losses` of `mass.evaluation` v3).
//! Beside it, a pair's outcome is the majority of its verdicts (equal
//! counts: a tie): the unit of the Wilson and bootstrap intervals is the
//! pair, whose runs are independent of every other pair's, where the
//! judgments of one pair are not.
//!
//! Runs recorded by `mass-engine/8` and earlier (`exp.method.legacy()`)
//! keep what they were recorded with: judgment k shown swapped when k is
//! odd, and `mass.evaluation` v2 records (pair figures only).
//!
//! Runs are kept in [`EvalRuns`] for the whole run: a model's runs on a task
//! are made once and reused by later cycles (the base model's, and the new
//! model's as the next cycle's "previous"), keyed by everything that makes a
//! run what it is (backends, models, sampling, rules), so a fork that
//! changes one of those runs them again.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use ledger::Id;
use schemas::{Agreement, Delegation, Evaluation, Hash32};

use super::train::Trained;
use crate::config::Experiment;
use crate::context::{reassign_roles, step, sync_backends, Ctx, Models};
use crate::error::Result;
use crate::exec;
use crate::harness::{RunRules, RunSpec};
use crate::judge::RunRef;
use crate::status::EvaluationFigure;
use crate::task::Task;
use crate::workflow::Workflow;

/// Evaluation runs made so far in this run, by team, task and index.
#[derive(Default)]
pub struct EvalRuns {
    runs: HashMap<String, BTreeMap<(String, u32), RunRef>>,
    /// Judges (backend and model) that have judged an evaluation: the
    /// cycle's own judge is added to the roster until it has.
    judges: BTreeSet<(String, String)>,
}

/// What a cycle's evaluation measured.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Outcome {
    /// Every comparison by every judge, with its event id.
    pub evaluations: Vec<(Id, EvaluationFigure)>,
    pub agreement: Vec<Agreement>,
    pub delegation: Vec<Delegation>,
}

/// One evaluating judge.
struct EvalJudge {
    backend: String,
    model: String,
    self_judge: bool,
    /// Names its judgment streams.
    tag: String,
}

/// Which runs to pair: `model` against `baseline` on `tasks`, `runs` each.
struct Comparison<'t> {
    split: &'static str,
    against: &'static str,
    model: &'t Models,
    baseline: &'t Models,
    tasks: &'t [Task],
    runs: u32,
}

/// A pair to judge: the comparison it belongs to, task, index, and the two runs.
type Pair = (usize, Task, u32, RunRef, RunRef);

/// What the evaluate stage leaves: the model after training as it stands
/// after the training step, the roles it plays, and the
/// evaluation (none when the model did not change or there are no held-out
/// tasks).
pub(crate) struct Evaluated {
    pub(crate) next: Models,
    pub(crate) roles: crate::config::Roles,
    pub(crate) outcome: Option<Outcome>,
}

/// Runs the evaluate stage of cycle `cycle`: the new model against the base
/// model and the model it was trained from, under the settings as they
/// stand after training: a fork at the training step may have changed or
/// added a backend (built now) or moved a role (played from here with its
/// new backend's model).
pub(crate) fn run(
    ctx: &Ctx<'_>,
    main: &mut replay::Stream,
    exp: &mut Experiment,
    cycle: u32,
    trained: Trained,
    memory: &mut EvalRuns,
) -> Result<Evaluated> {
    let settings = exp.clone();
    let Trained {
        mut from,
        mut next,
        roles,
    } = trained;
    for models in [&mut from, &mut next] {
        sync_backends(ctx.backends, &settings, models)?;
        reassign_roles(ctx.backends, &roles, &settings.roles, models)?;
    }
    let mut outcome = None;
    if !ctx.heldout.is_empty() && next.orchestrator != from.orchestrator {
        outcome = Some(evaluate(
            &ctx.at(&settings),
            main,
            exp,
            cycle,
            &from,
            &next,
            memory,
        )?);
    }
    Ok(Evaluated {
        next,
        roles: settings.roles,
        outcome,
    })
}

/// Runs and judges cycle `cycle`'s evaluation of `new` (trained from
/// `current`) against the base model and against `current`.
fn evaluate(
    ctx: &Ctx<'_>,
    main: &mut replay::Stream,
    exp: &mut Experiment,
    cycle: u32,
    current: &Models,
    new: &Models,
    memory: &mut EvalRuns,
) -> Result<Outcome> {
    let base = crate::context::base_models(ctx)?;
    let o = &ctx.exp.outer;
    let mut comparisons = vec![Comparison {
        split: "heldout",
        against: "base",
        model: new,
        baseline: &base,
        tasks: ctx.heldout,
        runs: o.eval_runs,
    }];
    if current.orchestrator != base.orchestrator {
        comparisons.push(Comparison {
            split: "heldout",
            against: "previous",
            model: new,
            baseline: current,
            tasks: ctx.heldout,
            runs: o.eval_runs,
        });
    }
    if o.eval_train_runs > 0 && !ctx.train.is_empty() {
        comparisons.push(Comparison {
            split: "train",
            against: "base",
            model: new,
            baseline: &base,
            tasks: ctx.train,
            runs: o.eval_train_runs,
        });
    }
    make_runs(ctx, cycle, &comparisons, new, &base, memory)?;
    let pairs = pairs(ctx, &comparisons, memory)?;
    let judges = roster(ctx, current, new, memory)?;
    let orders = orders(main, ctx.exp, cycle, &comparisons, &pairs);
    let verdicts = judge_all(ctx, cycle, &comparisons, &pairs, &orders, &judges)?;
    let mut out = Outcome::default();
    for (ji, j) in judges.iter().enumerate() {
        for (ci, c) in comparisons.iter().enumerate() {
            let rec = tally(cycle, c, j, ci, &pairs, &verdicts[ji]);
            let parents: Vec<Id> = rec.judgments.iter().map(|h| Id(h.0)).collect();
            // A run of an older driver records what it recorded then.
            let (event, figure) = if ctx.exp.method.legacy() {
                let v2 = rec.v2();
                (schemas::to_event(&v2)?, EvaluationFigure::of_v2(&v2))
            } else {
                (schemas::to_event(&rec)?, EvaluationFigure::of(&rec))
            };
            let id = step(main, exp, event.with_parents(parents))?;
            out.evaluations.push((id, figure));
        }
        memory.judges.insert((j.backend.clone(), j.model.clone()));
    }
    out.agreement = agreement(&judges, &verdicts);
    out.delegation = delegation(ctx, &comparisons, memory);
    Ok(out)
}

/// Identifies what makes a bare run what it is, so runs are reused only
/// for the same team under the same rules.
fn team_key(ctx: &Ctx<'_>, m: &Models) -> String {
    let r = &ctx.exp.roles;
    format!(
        "{}|{}|{}|{}|{:?}|{:?}",
        r.orchestrator,
        m.orchestrator,
        r.subagent_backend(),
        m.subagent,
        ctx.exp.sampling.team,
        RunRules::of(ctx.exp)
    )
}

/// Makes every run the comparisons need that no earlier cycle made.
fn make_runs(
    ctx: &Ctx<'_>,
    cycle: u32,
    comparisons: &[Comparison<'_>],
    new: &Models,
    base: &Models,
    memory: &mut EvalRuns,
) -> Result<()> {
    let tag = |m: &Models| {
        if m == new {
            "new"
        } else if m == base {
            "base"
        } else {
            "previous"
        }
    };
    let mut needed: BTreeMap<(String, String, u32), (&'static str, &Models, &Task)> =
        BTreeMap::new();
    for c in comparisons {
        for m in [c.model, c.baseline] {
            let key = team_key(ctx, m);
            for task in c.tasks {
                for i in 0..c.runs {
                    let have = memory
                        .runs
                        .get(&key)
                        .is_some_and(|r| r.contains_key(&(task.id.clone(), i)));
                    if !have {
                        needed.insert((key.clone(), task.id.clone(), i), (tag(m), m, task));
                    }
                }
            }
        }
    }
    let mut keys = Vec::new();
    let mut items = Vec::new();
    for ((key, _, i), (who, m, task)) in needed {
        items.push(ctx.team_spec(m).item(&RunSpec {
            task,
            workflow: &Workflow::bare(),
            stream: format!("c{cycle}/eval/{}/{who}/{i:02}", task.id),
            purpose: "eval",
            cycle,
            index: i,
        }));
        keys.push((key, task.id.clone(), i));
    }
    let stage = format!("cycle {cycle}: evaluation runs");
    ctx.progress.stage(&stage, items.len() as u64);
    let runs = exec::all(
        ctx.threads(),
        items,
        |item| ctx.executor.rollout(item),
        || ctx.progress.tick(&stage),
    )?;
    let made = keys
        .into_iter()
        .zip(runs)
        .map(|((key, task, i), run)| (key, task, i, run));
    ctx.progress.done(&stage);
    for (key, task, i, run) in made {
        memory.runs.entry(key).or_default().insert((task, i), run);
    }
    Ok(())
}

/// Every pair of every comparison, in a fixed order.
fn pairs(ctx: &Ctx<'_>, comparisons: &[Comparison<'_>], memory: &EvalRuns) -> Result<Vec<Pair>> {
    let mut out = Vec::new();
    for (ci, c) in comparisons.iter().enumerate() {
        let (mk, bk) = (team_key(ctx, c.model), team_key(ctx, c.baseline));
        for task in c.tasks {
            for i in 0..c.runs {
                let find = |k: &str| {
                    memory
                        .runs
                        .get(k)
                        .and_then(|r| r.get(&(task.id.clone(), i)))
                        .cloned()
                };
                let (Some(a), Some(b)) = (find(&mk), find(&bk)) else {
                    return Err(crate::error::EngineError::Invalid(format!(
                        "evaluation run {} #{i} is missing after the evaluation runs were made",
                        task.id
                    )));
                };
                out.push((ci, task.clone(), i, a, b));
            }
        }
    }
    Ok(out)
}

/// The external judges (their base models), the run's own judge as the new
/// model, and the model that judged this cycle if it never judged an
/// evaluation (so cycle 1 measures the base model as a judge too).
fn roster(
    ctx: &Ctx<'_>,
    current: &Models,
    new: &Models,
    memory: &EvalRuns,
) -> Result<Vec<EvalJudge>> {
    let r = &ctx.exp.roles;
    let mut out: Vec<EvalJudge> = Vec::new();
    for name in &r.external_judges {
        out.push(EvalJudge {
            backend: name.clone(),
            model: ctx.backends.get(name)?.base_model(),
            self_judge: false,
            tag: format!("ext-{name}"),
        });
    }
    out.push(EvalJudge {
        backend: r.judge.clone(),
        model: new.judge.clone(),
        self_judge: true,
        tag: "self-new".into(),
    });
    let seen = memory
        .judges
        .contains(&(r.judge.clone(), current.judge.clone()));
    if !seen && current.judge != new.judge {
        out.push(EvalJudge {
            backend: r.judge.clone(),
            model: current.judge.clone(),
            self_judge: true,
            tag: "self-current".into(),
        });
    }
    Ok(out)
}

/// One judgment of a pair: its event id, the winner (`a` = the
/// comparison's model, `b` = its baseline, `tie`, `invalid`) and whether
/// the baseline was shown first.
#[derive(Debug, Clone, PartialEq)]
struct Verdict {
    id: Id,
    winner: String,
    swapped: bool,
}

/// Every judge's verdicts on every pair: `verdicts[judge][pair][k]` is the
/// k-th judgment.
type Verdicts = Vec<Vec<Vec<Verdict>>>;

/// The presentation order of every judgment of every pair
/// (`orders[pair][k]`: the baseline shown first), `outer.external_judgments`
/// per pair. Each pair's orders are drawn from a seed derived from the
/// run's seed and the pair (cycle, comparison, task, index), so every judge
/// sees a pair's judgments in the same orders and a replay draws them
/// again. A legacy run alternates: judgment k is swapped when k is odd.
fn orders(
    main: &replay::Stream,
    exp: &Experiment,
    cycle: u32,
    comparisons: &[Comparison<'_>],
    pairs: &[Pair],
) -> Vec<Vec<bool>> {
    let per_pair = exp.outer.external_judgments.max(1);
    pairs
        .iter()
        .map(|(ci, task, i, _, _)| {
            if exp.method.legacy() {
                return (0..per_pair).map(|k| k % 2 == 1).collect();
            }
            let c = &comparisons[*ci];
            let purpose = format!(
                "eval-order/{cycle}/{}-{}/{}/{i}",
                c.split, c.against, task.id
            );
            draw_orders(main.derive_seed(&purpose), per_pair)
        })
        .collect()
}

/// `n` fair coin flips from `seed`: true = the baseline shown first.
pub(crate) fn draw_orders(seed: u64, n: u32) -> Vec<bool> {
    let mut rng = rank::schedule::SplitMix64::new(seed);
    (0..n).map(|_| rng.next_u64() >> 63 == 1).collect()
}

fn judge_all(
    ctx: &Ctx<'_>,
    cycle: u32,
    comparisons: &[Comparison<'_>],
    pairs: &[Pair],
    orders: &[Vec<bool>],
    judges: &[EvalJudge],
) -> Result<Verdicts> {
    let mut jobs = Vec::new();
    for (ji, _) in judges.iter().enumerate() {
        for (pi, order) in orders.iter().enumerate() {
            for (k, &swapped) in order.iter().enumerate() {
                jobs.push((ji, pi, k, swapped));
            }
        }
    }
    let stage = format!("cycle {cycle}: evaluation judging");
    ctx.progress.stage(&stage, jobs.len() as u64);
    let items: Vec<_> = jobs
        .iter()
        .map(|&(ji, pi, k, swapped)| {
            let j = &judges[ji];
            let (ci, task, i, a, b) = &pairs[pi];
            let c = &comparisons[*ci];
            let rel = format!(
                "c{cycle}/eval/{}-{}/{}/judge-{}/{i:02}-{k}",
                c.split, c.against, task.id, j.tag
            );
            ctx.judge_spec(
                &j.backend,
                &j.model,
                ctx.exp.outer.max_verdict_retries,
                &ctx.exp.sampling.judge,
            )
            .item(&task.id, rel, a, b, swapped)
        })
        .collect();
    let verdicts = exec::all(
        ctx.threads(),
        items,
        |item| ctx.executor.judgment(item),
        || ctx.progress.tick(&stage),
    )?;
    let done = jobs
        .into_iter()
        .zip(verdicts)
        .map(|((ji, pi, _, swapped), (id, v))| {
            let winner = v.winner;
            (
                ji,
                pi,
                Verdict {
                    id,
                    winner,
                    swapped,
                },
            )
        });
    ctx.progress.done(&stage);
    let mut out: Verdicts = vec![vec![Vec::new(); pairs.len()]; judges.len()];
    // `exec::all` returns results in job order, so k ascends within a pair.
    for (ji, pi, v) in done {
        out[ji][pi].push(v);
    }
    Ok(out)
}

/// One judge's figures on one comparison.
fn tally(
    cycle: u32,
    c: &Comparison<'_>,
    j: &EvalJudge,
    ci: usize,
    pairs: &[Pair],
    verdicts: &[Vec<Verdict>],
) -> Evaluation {
    let mut e = Evaluation {
        cycle,
        split: c.split.into(),
        against: c.against.into(),
        model: c.model.orchestrator.clone(),
        baseline: c.baseline.orchestrator.clone(),
        judge: j.backend.clone(),
        judge_model: j.model.clone(),
        self_judge: j.self_judge,
        pairs: 0,
        wins: 0,
        losses: 0,
        ties: 0,
        verdicts: 0,
        swapped: 0,
        same_position: 0,
        judgments: Vec::new(),
        judgment_wins: 0,
        judgment_losses: 0,
        judgment_ties: 0,
        model_first: 0,
    };
    for (pi, _) in pairs.iter().enumerate().filter(|(_, p)| p.0 == ci) {
        let vs = &verdicts[pi];
        e.pairs += 1;
        let count = |w: &str| vs.iter().filter(|v| v.winner == w).count() as u32;
        let (a, b, tie) = (count("a"), count("b"), count("tie"));
        e.verdicts += a + b + tie;
        (e.judgment_wins, e.judgment_losses) = (e.judgment_wins + a, e.judgment_losses + b);
        e.judgment_ties += tie;
        e.model_first += vs.iter().filter(|v| !v.swapped).count() as u32;
        match a.cmp(&b) {
            std::cmp::Ordering::Greater => e.wins += 1,
            std::cmp::Ordering::Less => e.losses += 1,
            std::cmp::Ordering::Equal => e.ties += 1,
        }
        // The i-th judgment shown model-first beside the i-th shown
        // baseline-first (in a legacy run: judgments 2k and 2k+1): the
        // same position twice means the winner changed with the order.
        let model_first = vs.iter().filter(|v| !v.swapped);
        for (x, y) in model_first.zip(vs.iter().filter(|v| v.swapped)) {
            let decided = |w: &str| w == "a" || w == "b";
            if decided(&x.winner) && decided(&y.winner) {
                e.swapped += 1;
                e.same_position += (x.winner != y.winner) as u32;
            }
        }
        e.judgments.extend(vs.iter().map(|v| Hash32(v.id.0)));
    }
    e
}

/// Agreement of every pair of judges over the verdicts both gave (same
/// pair, same order), invalid verdicts left out.
fn agreement(judges: &[EvalJudge], verdicts: &Verdicts) -> Vec<Agreement> {
    let mut out = Vec::new();
    for (x, jx) in judges.iter().enumerate() {
        for (y, jy) in judges.iter().enumerate().skip(x + 1) {
            let (mut compared, mut agreed) = (0, 0);
            for (px, py) in verdicts[x].iter().zip(&verdicts[y]) {
                for (vx, vy) in px.iter().zip(py).map(|(x, y)| (&x.winner, &y.winner)) {
                    if vx == "invalid" || vy == "invalid" {
                        continue;
                    }
                    compared += 1;
                    agreed += (vx == vy) as u32;
                }
            }
            out.push(Agreement {
                judge: jx.backend.clone(),
                judge_model: jx.model.clone(),
                other: jy.backend.clone(),
                other_model: jy.model.clone(),
                compared,
                agreed,
            });
        }
    }
    out
}

/// How often each evaluated model's bare runs in this evaluation delegated.
fn delegation(ctx: &Ctx<'_>, comparisons: &[Comparison<'_>], memory: &EvalRuns) -> Vec<Delegation> {
    let mut per_model: BTreeMap<String, BTreeSet<Id>> = BTreeMap::new();
    let mut delegated: BTreeSet<Id> = BTreeSet::new();
    let mut order: Vec<String> = Vec::new();
    for c in comparisons {
        for m in [c.baseline, c.model] {
            let key = team_key(ctx, m);
            if !order.contains(&m.orchestrator) {
                order.push(m.orchestrator.clone());
            }
            let runs = per_model.entry(m.orchestrator.clone()).or_default();
            for task in c.tasks {
                for i in 0..c.runs {
                    if let Some(r) = memory
                        .runs
                        .get(&key)
                        .and_then(|r| r.get(&(task.id.clone(), i)))
                    {
                        runs.insert(r.event);
                        if r.record.delegations > 0 {
                            delegated.insert(r.event);
                        }
                    }
                }
            }
        }
    }
    order
        .into_iter()
        .map(|model| {
            let runs = &per_model[&model];
            Delegation {
                runs: runs.len() as u32,
                delegated: runs.iter().filter(|r| delegated.contains(r)).count() as u32,
                model,
            }
        })
        .collect()
}
