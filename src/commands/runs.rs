//! Run commands: run, resume, replay --check, rejudge, fork (of runs), runs
//! rm. The engine does the work; this file opens the ledger and renders
//! progress; `summary.rs` prints the summary, `status.rs` and `dataset.rs`
//! hold `mass status` and `mass export dataset`.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use engine::context::Progress;
use engine::driver::{drive, RunRequest};
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use ledger::{Id, Ledger};
use replay::{Mode, SourceRun, MAIN};

use super::summary::print_summary;
use super::{engine_error, open, resolve, CliError};

/// Progress bars: one per stage, under an overall spinner.
struct Bars {
    multi: MultiProgress,
    bars: Mutex<BTreeMap<String, ProgressBar>>,
}

/// How a run reports progress: bars on a terminal, plain lines (stage
/// started, stage done with its count and time) when stderr is a file or a
/// pipe, nothing with `--quiet`.
pub(crate) fn progress(quiet: bool) -> Box<dyn Progress> {
    use std::io::IsTerminal;
    if quiet {
        Box::new(engine::context::NoProgress)
    } else if std::io::stderr().is_terminal() {
        Box::new(Bars::new())
    } else {
        Box::new(Lines::default())
    }
}

impl Bars {
    fn new() -> Bars {
        Bars {
            multi: MultiProgress::with_draw_target(ProgressDrawTarget::stderr()),
            bars: Mutex::new(BTreeMap::new()),
        }
    }
}

/// Progress as plain lines on stderr, for logs and CI.
#[derive(Default)]
struct Lines {
    stages: Mutex<BTreeMap<String, (u64, u64, Instant)>>,
}

impl Progress for Lines {
    fn stage(&self, name: &str, total: u64) {
        if let Ok(mut s) = self.stages.lock() {
            s.insert(name.to_string(), (0, total, Instant::now()));
        }
        eprintln!("{name}: {total} unit(s)");
    }
    fn tick(&self, name: &str) {
        if let Ok(mut s) = self.stages.lock() {
            if let Some(e) = s.get_mut(name) {
                e.0 += 1;
            }
        }
    }
    fn done(&self, name: &str) {
        if let Some((n, total, t)) = self.stages.lock().ok().and_then(|mut s| s.remove(name)) {
            eprintln!(
                "{name}: done, {n}/{total} in {:.1}s",
                t.elapsed().as_secs_f64()
            );
        }
    }
}

impl Progress for Bars {
    fn stage(&self, name: &str, total: u64) {
        let bar = self.multi.add(ProgressBar::new(total));
        let style =
            ProgressStyle::with_template("{spinner} {msg:<40} [{bar:30}] {pos}/{len} {elapsed}")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> ");
        bar.set_style(style);
        bar.set_message(name.to_string());
        if let Ok(mut b) = self.bars.lock() {
            b.insert(name.to_string(), bar);
        }
    }
    fn tick(&self, name: &str) {
        if let Some(b) = self.bars.lock().ok().and_then(|b| b.get(name).cloned()) {
            b.inc(1);
        }
    }
    fn done(&self, name: &str) {
        if let Some(b) = self.bars.lock().ok().and_then(|mut b| b.remove(name)) {
            b.finish();
        }
    }
}

fn open_arc(dir: &Path) -> Result<Arc<Ledger>> {
    if !dir.join("FORMAT").exists() {
        Ledger::init(dir)
            .with_context(|| format!("cannot create a ledger in {}", dir.display()))?;
    }
    Ok(Arc::new(open(dir)?))
}

/// What `mass run` was asked.
pub struct RunOptions<'a> {
    pub experiment: &'a Path,
    pub name: Option<&'a str>,
    /// `--set KEY=VALUE` overrides of the experiment.
    pub set: &'a [String],
    pub quiet: bool,
    pub workers: &'a crate::cli::WorkersArgs,
}

pub fn run(dir: &Path, o: &RunOptions<'_>) -> Result<ExitCode> {
    // Read, overridden and checked before the ledger is opened (or made):
    // a bad --set writes nothing.
    let given = super::run_file::given(o.experiment, o.set)?;
    let run = o.name.map(str::to_string).unwrap_or(given.exp.name.clone());
    // Only a new run's name is checked, before a ledger is made for it: a
    // run an earlier version made under such a name stays resumable.
    let from = if o.name.is_some() {
        "--ref"
    } else {
        "the experiment's name"
    };
    if !dir.join("FORMAT").exists() {
        new_run_name(from, &run)?;
    }
    let ledger = open_arc(dir)?;
    if ledger.head(&run)?.is_none() {
        new_run_name(from, &run)?;
    }
    if let Some(head) = ledger.head(&run)? {
        let first = ledger.chain(head).last().transpose()?;
        let Some(first) = first.filter(|e| e.kind == "run.started") else {
            bail!("ref {run} exists and is not a run; choose another name with --ref");
        };
        if let Some(old) = engine::driver::start_failed(&ledger, &run)? {
            // Nothing but the recorded definition: the start failed (or was
            // cut short) before any work. Replace it with this file.
            let r = replay::remove_run(&ledger, &run, "replaced: start failed")
                .map_err(ledger_cause)
                .with_context(|| format!("cannot replace run {run}"))?;
            eprintln!(
                "run {run} never started (its only event is run.started {old}, nothing after it): replaced it with {}; the old start stays readable by id, and the replacement is recorded as {} in `mass log {}`",
                o.experiment.display(),
                r.event.short(12),
                replay::REMOVALS
            );
        } else {
            super::run_file::check_resume(
                &ledger,
                &run,
                &first,
                &given.exp,
                (o.experiment, o.set),
            )?;
        }
    }
    go_with(
        dir,
        o.workers,
        ledger,
        RunRequest {
            run,
            experiment: Some((given.text, given.origin)),
            mode: Mode::Live,
            source: None,
            progress: progress(o.quiet).as_ref(),
        },
    )
}

pub fn resume(
    dir: &Path,
    run: &str,
    quiet: bool,
    workers: &crate::cli::WorkersArgs,
) -> Result<ExitCode> {
    let ledger = Arc::new(open(dir)?);
    if ledger.head(run)?.is_none() {
        bail!(CliError::NotFound(format!(
            "no run named {run:?} (`mass status` lists runs)"
        )));
    }
    go_with(
        dir,
        workers,
        ledger,
        RunRequest {
            run: run.to_string(),
            experiment: None,
            mode: Mode::Live,
            source: None,
            progress: progress(quiet).as_ref(),
        },
    )
}

pub fn replay_check(dir: &Path, run: &str, check: bool) -> Result<ExitCode> {
    if !check {
        bail!("`mass replay` needs --check (re-run the driver and compare every event id); to continue a run use `mass resume`");
    }
    let ledger = Arc::new(open(dir)?);
    let head = ledger.head(run)?.ok_or_else(|| {
        CliError::NotFound(format!("no run named {run:?} (`mass status` lists runs)"))
    })?;
    let start = Instant::now();
    let s = drive(
        ledger.clone(),
        RunRequest {
            run: run.to_string(),
            experiment: None,
            mode: Mode::Check,
            source: None,
            progress: &engine::context::NoProgress,
        },
    )
    .map_err(|e| anyhow::anyhow!("{e}"))
    .context("replay check failed")?;
    let served: u64 = s.counts.values().sum();
    if s.head != Some(head) {
        bail!(
            "replay ended at {} but the run's head is {}",
            s.head.map(|h| h.to_hex()).unwrap_or_default(),
            head
        );
    }
    let unreached = unreached_streams(&ledger, run, &s.visited)?;
    if !unreached.is_empty() {
        bail!(
            "replay check failed: the replay reproduced the main head, but not every stream of {run}:\n  {}",
            unreached.join("\n  ")
        );
    }
    let streams = replay::run_refs(&ledger, run)?.len();
    crate::output::outln!("replay check passed: every event id of {run}'s {streams} streams reproduced ({served} effects served from the ledger, none run) in {:.1}s", start.elapsed().as_secs_f64())?;
    Ok(ExitCode::SUCCESS)
}

/// The streams of `run` a replay check did not reproduce to their end: a
/// stream the driver opened must have been replayed through every recorded
/// event (`visited`: reached, recorded); one it never opened (a proxy's
/// wire stream, written outside the driver) must be named, by its head, in
/// an event of a stream the replay reproduced, which pins every byte of it.
fn unreached_streams(
    ledger: &Ledger,
    run: &str,
    visited: &std::collections::BTreeMap<String, (u64, u64)>,
) -> Result<Vec<String>> {
    let prefix = format!("{run}/");
    let mut out = Vec::new();
    for (name, head) in replay::run_refs(ledger, run)? {
        let rel = if name == run {
            replay::MAIN.to_string()
        } else {
            name.strip_prefix(&prefix).unwrap_or(&name).to_string()
        };
        // Which worker executed each item: beside the steps, no step
        // depends on it, and a replay executes nothing.
        if rel == workers::WORKERS_STREAM {
            continue;
        }
        match visited.get(&rel) {
            Some((reached, recorded)) if reached < recorded => out.push(format!(
                "stream {rel}: {reached} of its {recorded} recorded events reproduced"
            )),
            Some(_) => {}
            None if !pinned_by_visited(ledger, run, &head, visited)? => out.push(format!(
                "stream {rel} (head {}): never reached by the replay, and no reproduced event names it",
                head.short(12)
            )),
            None => {}
        }
    }
    Ok(out)
}

/// Whether an event of a stream the replay reproduced links to `id`.
fn pinned_by_visited(
    ledger: &Ledger,
    run: &str,
    id: &ledger::Id,
    visited: &std::collections::BTreeMap<String, (u64, u64)>,
) -> Result<bool> {
    for r in ledger.referrers(id)? {
        let ev = ledger.get_event(&r)?;
        if !visited.contains_key(&ev.stream) {
            continue;
        }
        let Some(head) = ledger.head(&replay::ref_name(run, &ev.stream))? else {
            continue;
        };
        for e in ledger.chain(head) {
            if e?.id == r {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

/// A re-judge serves the source's recorded tool, check and harness results
/// wherever a stream is still the source's prefix, and their requests do
/// not name the limits, sandbox or harness settings they ran under; an
/// override of those would be recorded and not honoured for what is
/// served. Refused (exit 2) with what to do instead.
fn refuse_execution_overrides(overrides: &[(String, String)]) -> Result<()> {
    for (k, _) in overrides {
        let top = k.trim().split('.').next().unwrap_or("");
        if matches!(top, "limits" | "sandbox" | "harness") {
            return Err(CliError::Usage(format!(
                "--set {k}: a re-judge reuses the source's recorded tool results, which ran under the source's [{top}]; to change [{top}], fork instead (`mass fork RUN --set {k}=...` runs everything after the fork point live); nothing was written"
            ))
            .into());
        }
    }
    Ok(())
}

/// Refuses a new run's name holding `/` (exit 2): the refs under `RUN/`
/// are run RUN's streams, so a run named `a/b` would be listed, removed
/// (`mass runs rm a`) and pushed as part of run `a`. `given` says where the
/// name came from (`--name`, `--ref`, the experiment's `name`).
fn new_run_name(given: &str, name: &str) -> Result<()> {
    if name.contains('/') {
        return Err(CliError::Usage(format!(
            "{given} {name:?}: a run name may not hold '/' (names under RUN/ are its streams); nothing was written"
        ))
        .into());
    }
    Ok(())
}

/// What to re-judge (`mass rejudge`).
pub struct RejudgeOptions {
    pub cycle: Option<u32>,
    pub judge: Option<String>,
    pub through_training: bool,
    pub set: Vec<String>,
}

pub fn rejudge(
    dir: &Path,
    source: &str,
    name: &str,
    opts: &RejudgeOptions,
    quiet: bool,
) -> Result<ExitCode> {
    new_run_name("--name", name)?;
    let ledger = Arc::new(open(dir)?);
    let head = ledger.head(source)?.ok_or_else(|| {
        CliError::NotFound(format!(
            "no run named {source:?} (`mass status` lists runs)"
        ))
    })?;
    let main: Vec<ledger::Event> = {
        let mut v = ledger.chain(head).collect::<ledger::Result<Vec<_>>>()?;
        v.reverse();
        v
    };
    let start = main.first().context("empty run")?.clone();
    if engine::rejudge_imported::is_imported(&start) {
        return super::rejudge::imported(&ledger, source, name, opts, quiet);
    }
    if ledger.head(name)?.is_some() {
        return Err(CliError::Conflict(format!(
            "run {name} exists already (a re-judge that was interrupted or failed?): continue it with `mass resume {name}`, or remove it with `mass runs rm {name}` and re-judge again"
        ))
        .into());
    }
    engine::driver::check_run_start(source, &start).map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut overrides = parse_sets(&opts.set)?;
    refuse_execution_overrides(&overrides)?;
    if let Some(j) = &opts.judge {
        let judge = engine::driver::judge_overrides(&ledger, source, &start, j)
            .map_err(|e| CliError::Usage(format!("--judge {j}: {e}; nothing was written")))?;
        overrides.extend(judge);
    }
    // The fork point: the run's start, or, for one cycle, the step that
    // closes its collect stage: the search and the collected runs are kept
    // as recorded, and the judge, rank, select and dataset stages run again.
    let at = match opts.cycle {
        None => start.id,
        Some(0) => return Err(CliError::Usage("cycles are numbered from 1".into()).into()),
        Some(c) => engine::milestone::last_step(&main, c, engine::milestone::Stage::Collect)
            .ok_or_else(|| {
                CliError::Usage(format!(
                    "run {source} has not collected runs in cycle {c}: nothing to re-judge there"
                ))
            })?,
    };
    // By default a one-cycle re-judge stops at that cycle's dataset: the
    // selections and data are what moved; training on them is the user's
    // choice (--through-training trains and goes on through later cycles).
    if let (Some(c), false) = (opts.cycle, opts.through_training) {
        overrides.push(("cycles".into(), c.to_string()));
        overrides.push(("outer.train".into(), "false".into()));
    }
    engine::driver::check_overrides(&ledger, source, &start, &overrides)
        .map_err(|e| CliError::Usage(format!("{e}; nothing was written")))?;
    // The source by id: the heads its streams have now.
    let src = SourceRun::pinned(&ledger, source, ["judge".to_string()].into_iter().collect())
        .map_err(ledger_cause)?;
    let forked = replay::fork_run(&ledger, source, at, name, &overrides).map_err(ledger_cause)?;
    // Recorded, so `mass resume NAME` after an interruption re-judges in the
    // same mixed mode, against the same source records, instead of running
    // everything live.
    let mixed = schemas::RunMixed {
        source_run: src.run.clone(),
        live_kinds: src.live_kinds.iter().cloned().collect(),
        heads: src
            .heads
            .iter()
            .flatten()
            .map(|(stream, head)| schemas::StreamHead {
                stream: stream.clone(),
                head: schemas::Hash32(head.0),
            })
            .collect(),
    };
    ledger.append(name, Some(forked), schemas::to_event(&mixed)?)?;
    let code = go(
        ledger.clone(),
        RunRequest {
            run: name.to_string(),
            experiment: None,
            mode: Mode::Live,
            source: Some(src),
            progress: progress(quiet).as_ref(),
        },
    )?;
    let from = opts.cycle.unwrap_or(1);
    let mut out = crate::output::stdout();
    for line in what_moved(&ledger, source, name, from)? {
        writeln!(out, "{line}")?;
    }
    Ok(code)
}

/// A run's recorded selections, by (cycle, task).
type Selections = BTreeMap<(u32, String), schemas::Selection>;
/// A run's recorded rankings, by (cycle, task).
type Rankings = BTreeMap<(u32, String), schemas::Ranking>;

/// Per re-judged cycle: runs entering and leaving the training set, rank
/// changes, and how often the two judges agreed on the pairs both judged.
pub(crate) fn what_moved(
    l: &Ledger,
    source: &str,
    rejudged: &str,
    from: u32,
) -> Result<Vec<String>> {
    let (src_sel, src_rk) = recorded_choices(l, source)?;
    let (new_sel, new_rk) = recorded_choices(l, rejudged)?;
    let mut out = Vec::new();
    for ((cycle, task), new) in new_sel.iter().filter(|((c, _), _)| *c >= from) {
        let Some(old) = src_sel.get(&(*cycle, task.clone())) else {
            out.push(format!(
                "cycle {cycle} {task}: not in {source} (nothing to compare)"
            ));
            continue;
        };
        out.push(training_set_moves(*cycle, task, old, new));
        if let (Some(a), Some(b)) = (
            src_rk.get(&(*cycle, task.clone())),
            new_rk.get(&(*cycle, task.clone())),
        ) {
            ranking_moves(l, source, a, b, &mut out)?;
        }
    }
    Ok(out)
}

/// The selections and rankings recorded on run `run`'s main stream (none
/// when there is no such run).
fn recorded_choices(l: &Ledger, run: &str) -> Result<(Selections, Rankings)> {
    let (mut sel, mut rk) = (Selections::new(), Rankings::new());
    if let Some(h) = l.head(run)? {
        for e in l.chain(h) {
            let e = e?;
            match e.kind.as_str() {
                "mass.selection" => {
                    if let Some(x) = schemas::Selection::read(&e) {
                        let x = x?;
                        sel.insert((x.cycle, x.task.clone()), x);
                    }
                }
                "mass.ranking" => {
                    let x: schemas::Ranking = schemas::decode_event(&e)?;
                    rk.insert((x.cycle, x.task.clone()), x);
                }
                _ => {}
            }
        }
    }
    Ok((sel, rk))
}

/// The line of a cycle and task saying which runs entered and left the
/// training set between the `old` and `new` selections.
fn training_set_moves(
    cycle: u32,
    task: &str,
    old: &schemas::Selection,
    new: &schemas::Selection,
) -> String {
    let entering: Vec<&schemas::Hash32> = new
        .train
        .iter()
        .filter(|x| !old.train.contains(x))
        .collect();
    let leaving: Vec<&schemas::Hash32> = old
        .train
        .iter()
        .filter(|x| !new.train.contains(x))
        .collect();
    format!(
        "cycle {cycle} {task}: training set {} entering, {} leaving",
        short_ids(entering),
        short_ids(leaving)
    )
}

/// A count and the first six ids, shortened.
fn short_ids(v: Vec<&schemas::Hash32>) -> String {
    let mut s: Vec<String> = v
        .iter()
        .take(6)
        .map(|x| x.to_string()[..12].to_string())
        .collect();
    if v.len() > 6 {
        s.push(format!("and {} more", v.len() - 6));
    }
    format!("{} [{}]", v.len(), s.join(" "))
}

/// Adds to `out` the rank changes from ranking `a` (the source's) to `b`
/// (the re-judge's) and the judges' agreement on the pairs both judged,
/// or one line saying the two rankings share no run.
fn ranking_moves(
    l: &Ledger,
    source: &str,
    a: &schemas::Ranking,
    b: &schemas::Ranking,
    out: &mut Vec<String>,
) -> Result<()> {
    let moved: Vec<String> = b
        .runs
        .iter()
        .filter_map(|r| {
            let was = a.runs.iter().find(|x| x.rollout == r.rollout)?;
            (was.rank != r.rank)
                .then(|| format!("{} {}->{}", &r.rollout.to_string()[..12], was.rank, r.rank))
        })
        .collect();
    let shared = b
        .runs
        .iter()
        .filter(|r| a.runs.iter().any(|x| x.rollout == r.rollout))
        .count();
    if shared == 0 {
        out.push("  no run in common: the new judging picked another champion in the inner loop, so other runs were collected and ranked".into());
        return Ok(());
    }
    let listed = if moved.len() > 8 {
        format!("{}, and {} more", moved[..8].join(", "), moved.len() - 8)
    } else if moved.is_empty() {
        "none".into()
    } else {
        moved.join(", ")
    };
    out.push(format!("  rank changes: {listed}"));
    let (va, vb) = (verdicts(l, a)?, verdicts(l, b)?);
    let both: Vec<_> = vb.keys().filter(|k| va.contains_key(k)).collect();
    let agree = both.iter().filter(|k| va[**k] == vb[**k]).count();
    out.push(format!(
        "  verdict agreement with {source}'s judge: {agree}/{} pairs judged by both",
        both.len()
    ));
    Ok(())
}

/// Each judgment of ranking `r`: its winner by (a, b, swapped).
fn verdicts(
    l: &Ledger,
    r: &schemas::Ranking,
) -> Result<BTreeMap<(ledger::Id, ledger::Id, bool), String>> {
    let mut m = BTreeMap::new();
    for j in &r.judgments {
        let j: schemas::Judgment = schemas::decode_event(&l.get_event(&ledger::Id(j.0))?)?;
        m.insert((ledger::Id(j.a.0), ledger::Id(j.b.0), j.swapped), j.winner);
    }
    Ok(m)
}

/// Parses `--set KEY=VALUE` items for a fork of a run, refusing keys a fork
/// cannot honour before the fork is created (the driver checks again).
fn parse_sets(set: &[String]) -> Result<Vec<(String, String)>> {
    let sets = super::run_file::split_sets(set)?;
    for (k, _) in &sets {
        engine::context::check_fork_override(k)
            .map_err(|e| CliError::Usage(format!("{e}; nothing was written")))?;
    }
    Ok(sets)
}

/// Forks run `run` right before stage `stage` of cycle `cycle`
/// (`engine::milestone::fork_point`): that stage and everything after it
/// run again, with the overrides, on `mass resume NAME`.
pub fn fork_at_stage(
    l: &Ledger,
    run: &str,
    cycle: u32,
    stage: &str,
    name: &str,
    set: &[String],
) -> Result<ExitCode> {
    use engine::milestone::{fork_point, Stage};
    let Some(st) = Stage::named(stage) else {
        return Err(CliError::Usage(format!(
            "--stage {stage:?} names no stage; the stages are {}",
            Stage::names()
        ))
        .into());
    };
    if cycle == 0 {
        return Err(CliError::Usage("cycles are numbered from 1".into()).into());
    }
    let head = l.head(run)?.ok_or_else(|| {
        CliError::NotFound(format!("no run named {run:?} (`mass status` lists runs)"))
    })?;
    let mut main = l.chain(head).collect::<ledger::Result<Vec<_>>>()?;
    main.reverse();
    let at = fork_point(&main, cycle, st).ok_or_else(|| {
        CliError::Usage(format!(
            "run {run} recorded no step of cycle {cycle}: nothing to fork there (`mass log {run}` lists its steps); nothing was written"
        ))
    })?;
    // A fork point before this run's own fork (or re-judge) record would
    // leave that record's settings behind while naming this run as the
    // parent.
    let after = main.iter().skip_while(|e| e.id != at).skip(1);
    if let Some(own) = after
        .filter(|e| e.kind == "run.forked" || e.kind == "run.mixed")
        .last()
    {
        return Err(CliError::Usage(format!(
            "stage {st} of cycle {cycle} of run {run} comes before {run} was forked or re-judged (its {} record {}): a fork there would drop {run}'s own settings; fork the run {run} came from instead, giving {run}'s settings again with --set (`mass status {run}` names it); nothing was written",
            own.kind,
            own.id.short(12)
        ))
        .into());
    }
    fork(l, &at.to_hex(), name, set, Some(run))
}

/// Forks a run at a main-stream step (with overrides), or any ref at an event.
/// The run forked (recorded as the fork's parent) is `from`, or the only run
/// whose main stream holds the event, or the run `at` names; when several
/// runs hold it (a run and its forks) and neither says which, the fork is
/// refused (exit 2) naming them.
pub fn fork(
    l: &Ledger,
    at: &str,
    name: &str,
    set: &[String],
    from: Option<&str>,
) -> Result<ExitCode> {
    let id = resolve(l, at)?;
    let ev = l
        .get_event(&id)
        .with_context(|| format!("{at} is not an event"))?;
    let candidates = if ev.stream == MAIN {
        runs_containing(l, id)?
    } else {
        runs_with_stream_event(l, &ev.stream, id)?
    };
    let source = match from {
        Some(run) => {
            if l.head(run)?.is_none() {
                return Err(CliError::NotFound(format!(
                    "no run named {run:?} (`mass status` lists runs)"
                ))
                .into());
            }
            if !candidates.iter().any(|c| c == run) {
                return Err(CliError::Usage(format!(
                    "{} is not a step of run {run}'s main stream{}",
                    id.short(12),
                    if candidates.is_empty() {
                        String::new()
                    } else {
                        format!(" (it is a step of {})", candidates.join(", "))
                    }
                ))
                .into());
            }
            Some(run.to_string())
        }
        // `mass fork RUN`: the run named is the one forked, also when its
        // head is a step of its forks too.
        None if candidates.iter().any(|c| c == at) => Some(at.to_string()),
        None if candidates.len() > 1 => {
            return Err(CliError::Usage(format!(
                "{} is a step of several runs ({}); say which one the fork is taken from with --from RUN",
                id.short(12),
                candidates.join(", ")
            ))
            .into());
        }
        None => candidates.into_iter().next(),
    };
    // A ref at a main-stream step is a run (`runs`), also when no run holds
    // that step any more (its run removed), so it is named as a run is.
    if source.is_some() || ev.stream == MAIN {
        new_run_name("--name", name)?;
    }
    if let Some(run) = source {
        let run_head = l.head(&run)?.context("the run vanished")?;
        let first = l.chain(run_head).last().transpose()?.context("empty run")?;
        engine::driver::check_run_start(&run, &first).map_err(|e| anyhow::anyhow!("{e}"))?;
        let overrides = parse_sets(set)?;
        if ev.stream != MAIN && !overrides.is_empty() {
            // The unit keeps the settings it started with, and a changed seed
            // would not reproduce its recorded prefix: an override here would
            // be recorded and then ignored, or diverge on resume.
            return Err(CliError::Usage(format!(
                "{} is inside a unit of work (stream {}): a fork there cannot change settings (--set), since the unit goes on with those it started with; fork at a step of the run's main stream (`mass log {run}`) to change them; nothing was written",
                id.short(12),
                ev.stream
            ))
            .into());
        }
        engine::driver::check_overrides(l, &run, &first, &overrides)
            .map_err(|e| CliError::Usage(format!("{e}; nothing was written")))?;
        let f = replay::fork_run(l, &run, id, name, &overrides).map_err(ledger_cause)?;
        crate::output::outln!("forked run {run} at {} as {name} (fork event {}); continue it with `mass resume {name}`", id.short(12), f.short(12))?;
        return Ok(ExitCode::SUCCESS);
    }
    if !set.is_empty() {
        bail!("--set needs a fork point on a run (a step listed by `mass log RUN`, or an event of one of its streams); {} is in stream {:?} of no run", id.short(12), ev.stream);
    }
    l.fork(name, id)
        .with_context(|| format!("cannot create ref {name:?} at {}", id.short(12)))?;
    crate::output::outln!("{name} -> {id}")?;
    Ok(ExitCode::SUCCESS)
}

/// Runs are refs whose head is on a main stream that starts with `run.started`.
pub(super) fn runs(l: &Ledger) -> Result<Vec<(String, Id)>> {
    let mut out = Vec::new();
    for (name, head) in l.refs()? {
        if let Ok(ev) = l.get_event(&head) {
            if ev.stream == MAIN {
                out.push((name, head));
            }
        }
    }
    Ok(out)
}

/// Every run whose main stream holds event `id`, sorted by name.
/// Runs whose stream `stream` holds event `id` (a fork point inside a unit
/// of work).
fn runs_with_stream_event(l: &Ledger, stream: &str, id: Id) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for (name, _) in runs(l)? {
        if let Some(h) = l.head(&format!("{name}/{stream}"))? {
            for ev in l.chain(h) {
                if ev?.id == id {
                    out.push(name);
                    break;
                }
            }
        }
    }
    Ok(out)
}

fn runs_containing(l: &Ledger, id: Id) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for (name, head) in runs(l)? {
        for ev in l.chain(head) {
            if ev?.id == id {
                out.push(name);
                break;
            }
        }
    }
    Ok(out)
}

/// Keeps a ledger error typed (so it maps to its exit code: 5 for a ref
/// that moved, 6 for a locked ledger).
fn ledger_cause(e: replay::ReplayError) -> anyhow::Error {
    match e {
        replay::ReplayError::Ledger(l) => l.into(),
        other => other.into(),
    }
}

/// `mass runs rm RUN`: deletes the run's refs, records the removal.
pub fn remove(l: &Ledger, run: &str) -> Result<ExitCode> {
    if run == replay::REMOVALS {
        return Err(CliError::Usage(format!(
            "{run} is the record of removed runs, not a run; it is never removed"
        ))
        .into());
    }
    if l.head(run)?.is_none() {
        return Err(
            CliError::NotFound(format!("no run named {run:?} (`mass status` lists runs)")).into(),
        );
    }
    let r = replay::remove_run(l, run, "removed")
        .map_err(ledger_cause)
        .with_context(|| format!("cannot remove run {run}"))?;
    if let Err(e) = audit::report::forget_facts(l, run) {
        // Derived data: a leftover file costs disk space, nothing else.
        eprintln!(
            "note: the run's kept report facts under {} could not be removed ({e}); they are derived data that no other run reads",
            l.dir().join("cache").join("report").display()
        );
    }
    writeln!(
        crate::output::stdout(),
        "removed run {run}: {} ref(s) deleted (main head {}); no object was deleted, every id stays readable; recorded as {} in `mass log {}` (`mass show {}` lists each ref's old head)",
        r.refs.len(),
        r.main_head.map(|h| h.to_hex()).unwrap_or_default(),
        r.event.short(12),
        replay::REMOVALS,
        r.event.short(12),
    )?;
    Ok(ExitCode::SUCCESS)
}

/// [`go`], with the items executed by workers when `--workers` names a store.
fn go_with(
    dir: &Path,
    workers: &crate::cli::WorkersArgs,
    ledger: Arc<Ledger>,
    req: RunRequest<'_>,
) -> Result<ExitCode> {
    let Some(settings) = crate::commands::work::settings(dir, workers)? else {
        return go(ledger, req);
    };
    crate::interrupt::say_on_sigint(format!(
        "\ninterrupted: run {run} stops here; everything it recorded is kept. `mass resume {run} --workers URL` continues it\n",
        run = req.run
    ));
    let start = Instant::now();
    let run = req.run.clone();
    let s =
        engine::driver::drive_with(ledger.clone(), req, Some(&settings)).map_err(engine_error)?;
    print_summary(&s, start.elapsed().as_secs_f64());
    keep_report_facts(&ledger, &run);
    Ok(ExitCode::SUCCESS)
}

fn go(ledger: Arc<Ledger>, req: RunRequest<'_>) -> Result<ExitCode> {
    crate::interrupt::say_on_sigint(format!(
        "\ninterrupted: run {run} stops here; everything it recorded is kept. `mass resume {run}` continues it\n",
        run = req.run
    ));
    let start = Instant::now();
    let run = req.run.clone();
    let s = drive(ledger.clone(), req).map_err(engine_error)?;
    print_summary(&s, start.elapsed().as_secs_f64());
    keep_report_facts(&ledger, &run);
    Ok(ExitCode::SUCCESS)
}

/// Folds a run's report facts as it ends and keeps them (the report
/// projection, `audit/src/facts.rs`), so its first `mass report` reads
/// them instead of every stream (at 1M events: 4.0 s folding on two cores, 1.6 s
/// reading). Only a shortcut: a fold that fails here is not this
/// command's failure, and `mass report` says what is wrong.
pub(crate) fn keep_report_facts(ledger: &Ledger, run: &str) {
    let _ = audit::report::keep_facts(ledger, run);
}
