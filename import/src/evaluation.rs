//! The reference's held-out evaluation: `evaluation/external.jsonl`, the
//! external judges' verdicts on pairs of two generations' evaluation runs,
//! recorded as the evaluate stage records its own: one `mass.judgment` per
//! line on a stream under `c{C}/eval/`, and one `mass.evaluation` v3 per
//! comparison and judge (its judgments as parents), which the cycle's
//! `mass.cycle` links.
//!
//! The format, derived from SakanaAI/mass (none of its code copied): at
//! 4106e7a6ce008b5ffadc7263971e8a3a20976f87, `mass/pipeline.py` (`report`
//! appends one JSON object per judgment: `pair_id`, `pair`, then the
//! judge's row) and `mass/judging.py` (`external_judgments`: `provider`,
//! `model`, `seed`, `swapped`, `winner`, `rationale`, `metrics`); at
//! bc75a25f0279b418f6dab817f4b8a8636edf23e9, `tools/pair_rollouts.py` and
//! `docs/running.md` (`pair` is `{"task", "a", "b"}`, `a` and `b` the
//! workspaces `RUN_DIR/evaluation/workspaces/query{Q}_r{I}` of two
//! generations' runs on one task and replicate, each run's logs in its own
//! folder's `evaluation/logs/query{Q}_r{I}`) and
//! `evaluation_claudecodex/pairwise_schema.py` (`winner` is `A`, `B` or
//! `tie`). `winner` names the pair's `a` or `b` whatever the judge was
//! shown: with `swapped` the judge saw `b` as Workspace A and its verdict
//! was turned back. The reference's own figure is W/(W+L) of `a` over every
//! line, ties excluded.
//!
//! A side of a pair is this folder's when its run folder is the config's
//! `run_dir` (the same path, or ending in it by whole components when
//! `run_dir` is relative: the reference resolves it against its checkout,
//! which the folder does not record); its episode must be one of the
//! folder's evaluation runs. The other side is another run folder's runs,
//! not in this folder: its rollout is absent (the zero id) and that folder,
//! as the line names it, stands for its model. A line with neither or both
//! sides in this folder, naming a run the folder lacks, a task in none of
//! the config's task lists, an unknown verdict, a missing field, or a pair
//! judged again by the same provider with the same seed (which would count
//! twice) is refused with its file and line.

use std::collections::{BTreeSet, HashMap, HashSet};

use ledger::Id;
use schemas::{Evaluation, Hash32, Judgment};
use serde_json::Value;

use crate::error::{ImportError, Result};
use crate::objects::{id32, Objects, When, ABSENT, MAIN};
use crate::plan::{is_number, Episode, Plan};
use crate::reference::{Reader, Row};

/// The file, relative to the run folder.
pub const FILE: &str = "evaluation/external.jsonl";

/// `against` of an imported evaluation: the baseline is another run
/// folder's runs, not known to be the base model or the previous cycle's.
pub const AGAINST: &str = "other-run";

/// One side of a judged pair.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Side {
    /// One of this folder's evaluation runs: its episode (`query{Q}_r{I}`).
    Here(String),
    /// A run of another run folder: that folder, as the line names it.
    Other(String),
}

/// One line of the file, checked.
#[derive(Debug, Clone)]
pub struct Verdict {
    pub row: Row,
    /// `query{Q}`.
    pub task: String,
    /// `heldout` (a task of the config's `test` list) or `train`.
    pub split: &'static str,
    /// The pair's workspaces as the line names them (the pair's identity).
    pub paths: (String, String),
    pub a: Side,
    pub b: Side,
    /// The replicate index of this folder's run.
    pub index: u32,
    pub provider: String,
    pub model: String,
    pub swapped: bool,
    /// `a`, `b` or `tie`.
    pub winner: &'static str,
}

/// The file's lines, checked, and when it was written.
#[derive(Debug, Clone)]
pub struct External {
    pub verdicts: Vec<Verdict>,
    pub mtime_ms: u64,
}

/// Reads and checks `evaluation/external.jsonl` against the folder's
/// evaluation runs (`episodes`) and its config; `None` when absent.
pub fn read(r: &mut Reader, config: &Value, episodes: &[Episode]) -> Result<Option<External>> {
    let Some((rows, mtime_ms)) = r.jsonl(FILE)? else {
        return Ok(None);
    };
    let here: BTreeSet<&str> = episodes
        .iter()
        .filter(|e| e.purpose == "eval")
        .map(|e| e.name.as_str())
        .collect();
    let run_dir = config.get("run_dir").and_then(Value::as_str);
    let splits = Splits::of(config);
    // The reference appends a judgment once per (pair, provider, seed):
    // a second would count twice.
    let mut seen: HashMap<(String, String, String, String, i64), usize> = HashMap::new();
    let mut verdicts = Vec::with_capacity(rows.len());
    for row in rows {
        let (v, seed) = verdict(row, &splits, run_dir, &here)?;
        let key = (
            v.task.clone(),
            v.paths.0.clone(),
            v.paths.1.clone(),
            v.provider.clone(),
            seed,
        );
        if let Some(first) = seen.insert(key, v.row.line) {
            return Err(ImportError::invalid(
                &v.row.file,
                v.row.line,
                format!("the pair of line {first} is judged again by the same provider with the same seed (refused: it would count twice)"),
            ));
        }
        verdicts.push(v);
    }
    Ok(Some(External { verdicts, mtime_ms }))
}

/// A task id as the reference writes it (a number, or a string of digits).
fn task_number(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::Number(n) => n.as_u64().map(|n| n.to_string()),
        Value::String(s) => Some(s.clone()),
        _ => None,
    }
    .filter(|t| is_number(t))
}

/// The config's tasks by split: `heldout` for its `test` list, `train`
/// for its training tasks (read once, not per line).
struct Splits {
    test: HashSet<String>,
    train: HashSet<String>,
}

impl Splits {
    fn of(config: &Value) -> Splits {
        let list = |name: &str| -> HashSet<String> {
            config
                .get("tasks")
                .and_then(|t| t.get(name))
                .and_then(Value::as_array)
                .map(|l| l.iter().filter_map(|x| task_number(Some(x))).collect())
                .unwrap_or_default()
        };
        let mut train = list("train");
        train.extend(list("train_candidates"));
        Splits {
            test: list("test"),
            train,
        }
    }

    fn of_task(&self, q: &str) -> Option<&'static str> {
        if self.test.contains(q) {
            Some("heldout")
        } else if self.train.contains(q) {
            Some("train")
        } else {
            None
        }
    }
}

/// What a line's `pair` names: task, split, the workspaces as written,
/// the two sides, and the replicate index of this folder's run.
struct Pair {
    q: String,
    split: &'static str,
    paths: (String, String),
    a: Side,
    b: Side,
    index: u32,
}

/// A line's `pair`, checked against the config and the folder's runs.
fn pair(row: &Row, splits: &Splits, run_dir: Option<&str>, here: &BTreeSet<&str>) -> Result<Pair> {
    let bad = |why: String| ImportError::invalid(&row.file, row.line, why);
    let pair = row.value.get("pair").filter(|p| p.is_object()).ok_or_else(|| {
        bad("no \"pair\" object (the pair's task and workspaces, as tools/pair_rollouts.py writes them)".into())
    })?;
    let q = task_number(pair.get("task")).ok_or_else(|| {
        bad("pair has no task id (a number, or a string of 1 to 18 digits)".into())
    })?;
    let split = splits.of_task(&q).ok_or_else(|| {
        bad(format!(
            "pair's task {q} is in none of config.json's task lists (\"test\", \"train\", \"train_candidates\")"
        ))
    })?;
    let path = |key: &str| {
        let p = pair
            .get(key)
            .and_then(Value::as_str)
            .ok_or_else(|| bad(format!("pair has no string field {key:?}")))?;
        let s = side(p, &q, run_dir).map_err(|why| bad(format!("pair.{key} {why}")))?;
        Ok::<_, ImportError>((p.to_string(), s))
    };
    let ((pa, a), (pb, b)) = (path("a")?, path("b")?);
    let name = match (&a, &b) {
        (Side::Here(n), Side::Other(_)) | (Side::Other(_), Side::Here(n)) => n.clone(),
        (Side::Here(_), Side::Here(_)) => return Err(bad("both runs of the pair are this folder's (config.json's run_dir): a generation compared with itself, where the reference pairs two generations' runs".into())),
        (Side::Other(_), Side::Other(_)) => return Err(bad("neither run of the pair is this folder's (config.json's run_dir names neither workspace's folder): nothing to link the verdict to".into())),
    };
    if !here.contains(name.as_str()) {
        return Err(bad(format!(
            "names episode evaluation/logs/{name}, which the folder does not hold (a missing episode)"
        )));
    }
    // `side` checked the name is `query{Q}_r{I}`, I of at most 18 digits.
    let index = name
        .rsplit_once("_r")
        .and_then(|(_, i)| i.parse().ok())
        .ok_or_else(|| bad(format!("episode {name:?}: replicate index past 2^32")))?;
    Ok(Pair {
        q,
        split,
        paths: (pa, pb),
        a,
        b,
        index,
    })
}

/// One line checked: the verdict and its seed.
fn verdict(
    row: Row,
    splits: &Splits,
    run_dir: Option<&str>,
    here: &BTreeSet<&str>,
) -> Result<(Verdict, i64)> {
    let p = pair(&row, splits, run_dir, here)?;
    let bad = |why: &str| ImportError::invalid(&row.file, row.line, why);
    let v = &row.value;
    let text = |key: &str| {
        v.get(key)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .ok_or_else(|| bad(&format!("no string field {key:?}")))
    };
    let (provider, model) = (text("provider")?, text("model")?);
    let seed = v
        .get("seed")
        .and_then(Value::as_i64)
        .ok_or_else(|| bad("no integer \"seed\""))?;
    let swapped = v
        .get("swapped")
        .and_then(Value::as_bool)
        .ok_or_else(|| bad("no boolean \"swapped\""))?;
    let winner = match v.get("winner").and_then(Value::as_str) {
        Some("A") => "a",
        Some("B") => "b",
        Some("tie") => "tie",
        _ => return Err(bad("winner is not \"A\", \"B\" or \"tie\"")),
    };
    let verdict = Verdict {
        task: format!("query{}", p.q),
        split: p.split,
        paths: p.paths,
        a: p.a,
        b: p.b,
        index: p.index,
        provider,
        model,
        swapped,
        winner,
        row,
    };
    Ok((verdict, seed))
}

/// A path's components, without empty and `.` ones.
fn components(p: &str) -> Vec<&str> {
    p.split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .collect()
}

/// Whether run folder `folder` (from a workspace path) is `run_dir`.
fn same_folder(folder: &str, run_dir: &str) -> bool {
    let (f, d) = (components(folder), components(run_dir));
    if d.is_empty() {
        return false;
    }
    if run_dir.starts_with('/') {
        return folder.starts_with('/') && f == d;
    }
    f.ends_with(&d)
}

/// The side a workspace path names: `RUN_DIR/evaluation/workspaces/
/// query{Q}_r{I}` of task `q`, this folder's when `RUN_DIR` is `run_dir`.
fn side(path: &str, q: &str, run_dir: Option<&str>) -> std::result::Result<Side, String> {
    let shape = "is not an evaluation workspace (RUN_DIR/evaluation/workspaces/query{Q}_r{I})";
    let parts: Vec<&str> = path.trim_end_matches('/').split('/').collect();
    let [folder @ .., "evaluation", "workspaces", name] = parts.as_slice() else {
        return Err(shape.into());
    };
    let Some((tq, i)) = name.strip_prefix("query").and_then(|s| s.split_once("_r")) else {
        return Err(shape.into());
    };
    if !is_number(tq) || !is_number(i) {
        return Err(shape.into());
    }
    if tq != q {
        return Err(format!("names a run of task {tq}, in a pair of task {q}"));
    }
    let folder = folder.join("/");
    if run_dir.is_some_and(|d| same_folder(&folder, d)) {
        Ok(Side::Here((*name).to_string()))
    } else {
        Ok(Side::Other(folder))
    }
}

/// The note closing cycle's evaluation runs (`n` of them): judged by the
/// file's judges, or not judged here.
pub fn runs_note(plan: &Plan, n: usize) -> String {
    let how = match plan.external {
        Some(_) => "judged by the external judges of evaluation/external.jsonl",
        None => "not judged here",
    };
    format!(
        "cycle {}: evaluation runs imported ({n} run(s), {how})",
        plan.cycle
    )
}

/// One comparison and judge: its figures as they accumulate.
struct Group {
    split: &'static str,
    a: Side,
    b: Side,
    judge: usize,
    /// Each pair's verdicts (winner, swapped), in file order, pairs in
    /// order of their first line, and where each pair (its workspaces) is.
    pairs: Vec<Vec<(&'static str, bool)>>,
    at: HashMap<(String, String), usize>,
    judgments: Vec<Id>,
}

/// The position of `key` in `at`, added last when new (a map, not a
/// scan: a file may hold millions of lines).
fn slot<K: std::hash::Hash + Eq>(at: &mut HashMap<K, usize>, key: K) -> (usize, bool) {
    let n = at.len();
    let i = *at.entry(key).or_insert(n);
    (i, i == n)
}

/// Every line as a `mass.judgment`, then one `mass.evaluation` per
/// comparison and judge on the main stream; the evaluations' ids, for
/// the cycle record. `model` is the config's (scrubbed) model. Called
/// once every episode is built: this folder's run of a pair is its
/// rollout, the head of its stream (`episodes.rs`).
pub fn build(o: &mut Objects, plan: &Plan, model: &str) -> Result<Vec<Hash32>> {
    let Some(ext) = &plan.external else {
        return Ok(Vec::new());
    };
    let s = &plan.scrub;
    let c = plan.cycle;
    let mut judges: HashMap<(&str, &str), usize> = HashMap::new();
    let mut names: Vec<(&str, &str)> = Vec::new();
    let mut at: HashMap<(&str, Side, Side, usize), usize> = HashMap::new();
    let mut groups: Vec<Group> = Vec::new();
    for v in &ext.verdicts {
        let (judge, new) = slot(&mut judges, (v.provider.as_str(), v.model.as_str()));
        if new {
            names.push((&v.provider, &v.model));
        }
        let stream = format!("c{c}/{}/eval/{:02}/orch", v.task, v.index);
        let rollout = |x: &Side| match (x, o.head(&stream)) {
            (Side::Here(_), Some(id)) => id32(id),
            _ => ABSENT,
        };
        let rationale = v.row.value.get("rationale").and_then(Value::as_str);
        let j = Judgment {
            task: v.task.clone(),
            a: rollout(&v.a),
            b: rollout(&v.b),
            swapped: v.swapped,
            judge_model: s.text(&v.model),
            winner: v.winner.into(),
            rationale: s.text(rationale.unwrap_or("")),
            // The reference stops on a reply that is no verdict: a line
            // is always the first valid one.
            invalid_attempts: 0,
            conversation: ABSENT,
        };
        let rel = format!(
            "c{c}/eval/{}-{AGAINST}/{}/judge-external-{}/{:02}",
            v.split,
            v.task,
            judge + 1,
            v.index
        );
        let id = o.record(&rel, &j, Vec::new(), When::Mtime(ext.mtime_ms))?;
        let (a, b) = (folder_of(&v.a), folder_of(&v.b));
        let (g, new) = slot(&mut at, (v.split, a.clone(), b.clone(), judge));
        if new {
            groups.push(Group {
                split: v.split,
                a,
                b,
                judge,
                pairs: Vec::new(),
                at: HashMap::new(),
                judgments: Vec::new(),
            });
        }
        groups[g].add(&v.paths, v.winner, v.swapped, id);
    }
    let label = |x: &Side| match x {
        Side::Here(_) => model.to_string(),
        Side::Other(f) => s.text(f),
    };
    let mut out = Vec::new();
    for g in groups {
        let (provider, judge_model) = names[g.judge];
        let mut e = g.tally(c);
        (e.model, e.baseline) = (label(&g.a), label(&g.b));
        (e.judge, e.judge_model) = (s.text(provider), s.text(judge_model));
        out.push(id32(o.record(
            MAIN,
            &e,
            g.judgments,
            When::Mtime(ext.mtime_ms),
        )?));
    }
    Ok(out)
}

/// A side as a comparison knows it: this folder's runs (any of them) or
/// another folder's.
fn folder_of(x: &Side) -> Side {
    match x {
        Side::Here(_) => Side::Here(String::new()),
        other => other.clone(),
    }
}

impl Group {
    fn add(&mut self, pair: &(String, String), winner: &'static str, swapped: bool, id: Id) {
        let (p, new) = slot(&mut self.at, pair.clone());
        if new {
            self.pairs.push(Vec::new());
        }
        self.pairs[p].push((winner, swapped));
        self.judgments.push(id);
    }

    /// The comparison's figures, as the evaluate stage counts them: per
    /// judgment (W/(W+L), ties excluded), per pair (the majority of its
    /// verdicts), and the i-th judgment shown model-first beside the i-th
    /// shown baseline-first (position bias). Names are filled by the caller.
    fn tally(&self, cycle: u32) -> Evaluation {
        let mut e = Evaluation {
            cycle,
            split: self.split.into(),
            against: AGAINST.into(),
            model: String::new(),
            baseline: String::new(),
            judge: String::new(),
            judge_model: String::new(),
            self_judge: false,
            pairs: self.pairs.len() as u32,
            wins: 0,
            losses: 0,
            ties: 0,
            verdicts: 0,
            swapped: 0,
            same_position: 0,
            judgments: self.judgments.iter().copied().map(id32).collect(),
            judgment_wins: 0,
            judgment_losses: 0,
            judgment_ties: 0,
            model_first: 0,
        };
        for vs in &self.pairs {
            let count = |w: &str| vs.iter().filter(|v| v.0 == w).count() as u32;
            let (a, b, tie) = (count("a"), count("b"), count("tie"));
            e.verdicts += a + b + tie;
            e.judgment_wins += a;
            e.judgment_losses += b;
            e.judgment_ties += tie;
            e.model_first += vs.iter().filter(|v| !v.1).count() as u32;
            match a.cmp(&b) {
                std::cmp::Ordering::Greater => e.wins += 1,
                std::cmp::Ordering::Less => e.losses += 1,
                std::cmp::Ordering::Equal => e.ties += 1,
            }
            let first = vs.iter().filter(|v| !v.1);
            for (x, y) in first.zip(vs.iter().filter(|v| v.1)) {
                if x.0 != "tie" && y.0 != "tie" {
                    e.swapped += 1;
                    e.same_position += u32::from(x.0 != y.0);
                }
            }
        }
        e
    }
}
