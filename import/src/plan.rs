//! The whole run folder read and checked before anything is written: which
//! episodes exist and what each stage file says about them. Every cross
//! reference is resolved here (a match, ranking or manifest row naming an
//! episode the folder does not hold is refused with its file and line), and
//! duplicates are refused rather than counted twice. Every name a stream
//! is made from (task ids, indices) is checked here to be what the
//! reference writes (ASCII digits), so building (`stages.rs`,
//! `episodes.rs`) makes only valid stream names; the run name and object
//! sizes are checked by `Prepared` before any ledger is opened.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;

use serde_json::Value;

use crate::error::{ImportError, Result};
use crate::fsread::{Caps, Root, Snapshot};
use crate::reference::{list_rows, str_field, EpisodeFiles, JsonFile, Reader, Row};
use crate::secrets::Scrubber;

/// One episode and the role it played.
#[derive(Debug, Clone)]
pub struct Episode {
    /// The name manifests use (`pool.json`'s `episode`), or the folder's.
    pub name: String,
    /// `reference`, `inner`, `collect` or `eval`.
    pub purpose: &'static str,
    /// The task id, `query{Q}`.
    pub task: String,
    pub index: u32,
    pub files: EpisodeFiles,
    /// Its workspace as the run folder holds it at import (`None`: the
    /// folder has none for it).
    pub workspace: Option<Workspace>,
}

/// An episode's workspace folder, read whole (`fsread::Root::snapshot`).
#[derive(Debug, Clone)]
pub struct Workspace {
    /// The folder, relative to the run folder.
    pub dir: String,
    pub snapshot: Snapshot,
}

/// One self-judged comparison (`task{Q}_matches.jsonl`).
#[derive(Debug, Clone)]
pub struct Match {
    pub row: Row,
    pub a: String,
    pub b: String,
    /// `a`, `b` or `tie`.
    pub winner: &'static str,
}

/// One ranked episode (`task{Q}_ranked.json`).
#[derive(Debug, Clone)]
pub struct Ranked {
    pub episode: String,
    pub score: f64,
    pub rank: u32,
}

/// What the stage files say about one training task.
#[derive(Debug, Clone, Default)]
pub struct TaskStage {
    pub task: String,
    pub matches: Vec<Match>,
    pub matches_mtime: u64,
    pub ranked: Vec<Ranked>,
    pub ranked_mtime: u64,
}

/// A run folder, read whole and checked.
#[derive(Debug)]
pub struct Plan {
    pub config: JsonFile,
    /// The cycle this run is (the config's `generation` plus one).
    pub cycle: u32,
    pub episodes: Vec<Episode>,
    pub stages: Vec<TaskStage>,
    pub train: Vec<String>,
    pub validation: Vec<String>,
    pub selection_mtime: u64,
    pub train_log: Option<(Vec<Row>, u64)>,
    pub selected: Option<JsonFile>,
    /// `evaluation/external.jsonl`, checked (`evaluation.rs`).
    pub external: Option<crate::evaluation::External>,
    /// Tasks whose retained workflow beat the reference
    /// (`search/query{Q}_ourTeam/retained_workflow.json`).
    pub inner_wins: u32,
    pub scrub: Scrubber,
    pub caps: Caps,
    /// Each task's collected episodes (positions in `episodes`) and
    /// manifest rows, in file order: what a task's selection reads, found
    /// without scanning the whole run once per task.
    pub by_task: HashMap<String, TaskEpisodes>,
}

/// A task's collected episodes and its manifest rows.
#[derive(Debug, Default)]
pub struct TaskEpisodes {
    pub collected: Vec<usize>,
    pub train: Vec<String>,
    pub validation: Vec<String>,
}

/// Reads and checks the run folder `dir`.
pub fn plan(dir: &Path, caps: Caps) -> Result<Plan> {
    let root = Root::open(dir, caps)?;
    let mut scrub = Scrubber::with_cap(caps.secrets);
    let mut r = Reader {
        root: &root,
        scrub: &mut scrub,
        episodes: 0,
    };
    let not_run = |reason: &str| ImportError::NotARun {
        dir: dir.to_path_buf(),
        reason: reason.to_string(),
    };
    let config = r.json("config.json")?.ok_or_else(|| {
        not_run("no config.json (the file every stage of the reference freezes first)")
    })?;
    if !config.value.get("tasks").is_some_and(Value::is_object) {
        return Err(not_run("config.json has no \"tasks\" object"));
    }
    // Checked: `generation + 1` of a hostile config would overflow.
    let cycle = match config.value.get("generation") {
        None | Some(Value::Null) => 1,
        Some(g) => g
            .as_u64()
            .and_then(|g| g.checked_add(1))
            .and_then(|c| u32::try_from(c).ok())
            .ok_or_else(|| {
                ImportError::invalid(
                    "config.json",
                    1,
                    "\"generation\" is not a whole number below 4294967295",
                )
            })?,
    };
    let mut episodes = search_episodes(&mut r)?;
    episodes.extend(collect_episodes(&mut r)?);
    episodes.extend(eval_episodes(&mut r)?);
    distinct(&episodes)?;
    for e in &mut episodes {
        e.workspace = workspace(&mut r, e)?;
    }
    if episodes.is_empty() {
        return Err(not_run(
            "no episode folders (logs/, pool/ or evaluation/logs/)",
        ));
    }
    let collected: Names = episodes
        .iter()
        .filter(|e| e.purpose == "collect")
        .map(|e| (e.name.clone(), e.task.clone()))
        .collect();
    let stages = task_stages(&mut r, &collected)?;
    // The reference selects from its rankings: a manifest row must name a
    // ranked episode, or its line would belong to no selection.
    let ranked: Names = stages
        .iter()
        .flat_map(|s| s.ranked.iter().map(|x| (x.episode.clone(), s.task.clone())))
        .collect();
    let (train, validation, selection_mtime) = manifests(&mut r, &ranked)?;
    let (train_log, selected) = training_files(&mut r)?;
    let external = crate::evaluation::read(&mut r, &config.value, &episodes)?;
    let mut inner_wins = 0;
    for name in r.subdirs("search")? {
        if let Some(f) = r.json(&format!("search/{name}/retained_workflow.json"))? {
            if f.value.get("beats_reference").and_then(Value::as_bool) == Some(true) {
                inner_wins += 1;
            }
        }
    }
    let by_task = by_task(&episodes, &train, &validation);
    Ok(Plan {
        caps,
        by_task,
        inner_wins,
        config,
        cycle,
        episodes,
        stages,
        train,
        validation,
        selection_mtime,
        train_log,
        selected,
        external,
        scrub,
    })
}

/// The training log's rows and when it was written.
type TrainLog = (Vec<Row>, u64);

/// `training/train_log.jsonl` (each step once) and
/// `selected_checkpoint.json` (a finite `val_loss`, and a log to have
/// selected it from).
fn training_files(r: &mut Reader) -> Result<(Option<TrainLog>, Option<JsonFile>)> {
    let train_log = r.jsonl("training/train_log.jsonl")?;
    if let Some((rows, _)) = &train_log {
        distinct_steps(rows)?;
    }
    let selected = r.json("selected_checkpoint.json")?;
    if let Some(f) = &selected {
        if !f
            .value
            .get("val_loss")
            .and_then(Value::as_f64)
            .is_some_and(f64::is_finite)
        {
            return Err(ImportError::invalid(&f.file, 1, "no finite \"val_loss\""));
        }
        if train_log.is_none() {
            return Err(ImportError::invalid(
                &f.file,
                1,
                "a checkpoint was selected but training/train_log.jsonl is missing",
            ));
        }
    }
    Ok((train_log, selected))
}

/// Each step of the training log once: a repeated step would be recorded
/// as two training steps.
fn distinct_steps(rows: &[Row]) -> Result<()> {
    let mut seen = BTreeSet::new();
    for row in rows {
        if let Some(step) = row.value.get("step").and_then(Value::as_u64) {
            if !seen.insert(step) {
                return Err(ImportError::invalid(
                    &row.file,
                    row.line,
                    format!("step {step} is logged twice (refused: it would count as two steps)"),
                ));
            }
        }
    }
    Ok(())
}

/// Where the reference leaves episode `e`'s workspace, relative to the
/// run folder (`mass/pipeline.py`: `search` and `collect`; the evaluation
/// runs' `evaluation/workspaces/`). Found by this layout, never by a
/// manifest's absolute path, which names the machine that ran it.
fn workspace_dir(e: &Episode) -> String {
    match e.purpose {
        "reference" => format!("reference/{}", e.name),
        "inner" => format!("workspaces/{}", e.name),
        "collect" => format!("pool/workspaces/{}", e.name),
        _ => format!("evaluation/workspaces/{}", e.name),
    }
}

/// Episode `e`'s workspace, read whole, every file's credentials learnt
/// (a key the agent wrote into a file is taken out wherever it appears);
/// `None` when the folder holds no workspace for it.
fn workspace(r: &mut Reader, e: &Episode) -> Result<Option<Workspace>> {
    let dir = workspace_dir(e);
    let scrub = &mut *r.scrub;
    let snap = r
        .root
        .snapshot(&dir, r.root.caps.workspace, |file, bytes| {
            scrub.learn_text(bytes);
            scrub.check(file)
        })?;
    Ok(snap.map(|snapshot| Workspace { dir, snapshot }))
}

/// Two folders of one (task, purpose, index) would be one stream
/// (`query1_r1` and `query1_r01`): refused, not merged.
fn distinct(episodes: &[Episode]) -> Result<()> {
    let mut slots = BTreeMap::new();
    for e in episodes {
        if let Some(other) = slots.insert((&e.task, e.purpose, e.index), &e.files.dir) {
            return Err(ImportError::io(
                &e.files.dir,
                format!(
                    "is the same {} episode of {} as {other} (index {}): refused, not merged",
                    e.purpose, e.task, e.index
                ),
            ));
        }
    }
    Ok(())
}

/// Each task's collected episodes and manifest rows.
fn by_task(
    episodes: &[Episode],
    train: &[String],
    validation: &[String],
) -> HashMap<String, TaskEpisodes> {
    let mut collected_at = HashMap::new();
    let mut by_task: HashMap<String, TaskEpisodes> = HashMap::new();
    for (i, e) in episodes.iter().enumerate() {
        if e.purpose == "collect" {
            collected_at.insert(e.name.clone(), i);
            by_task.entry(e.task.clone()).or_default().collected.push(i);
        }
    }
    for (names, train) in [(train, true), (validation, false)] {
        for n in names {
            // plan checked every manifest row names a collected episode.
            let Some(&i) = collected_at.get(n) else {
                continue;
            };
            let t = by_task.entry(episodes[i].task.clone()).or_default();
            if train {
                &mut t.train
            } else {
                &mut t.validation
            }
            .push(n.clone());
        }
    }
    by_task
}

/// A task id or index as the reference writes it: 1 to 18 ASCII digits
/// (no sign, no space: `str::parse` alone takes `+1`, and a task id
/// becomes part of a stream name).
pub(crate) fn is_number(s: &str) -> bool {
    (1..=18).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_digit())
}

fn numbered(name: &str, prefix: &str, suffix: &str) -> Option<(String, u32)> {
    let rest = name.strip_prefix(prefix)?;
    let (q, n) = match suffix {
        "" => (rest, "0"),
        s => rest.split_once(s)?,
    };
    if !is_number(q) || !is_number(n) {
        return None;
    }
    Some((q.to_string(), n.parse().ok()?))
}

/// Reference runs (`logs/reference/query{Q}`) and inner-loop runs
/// (`logs/search/v{K}/query{Q}_ourTeam`, index K).
fn search_episodes(r: &mut Reader) -> Result<Vec<Episode>> {
    let mut out = Vec::new();
    for name in r.subdirs("logs/reference")? {
        let Some((q, _)) = numbered(&name, "query", "") else {
            continue;
        };
        if let Some(files) = r.episode(&format!("logs/reference/{name}"))? {
            out.push(Episode {
                name: name.clone(),
                purpose: "reference",
                task: format!("query{q}"),
                index: 0,
                files,
                workspace: None,
            });
        }
    }
    let mut versions: Vec<(u32, String)> = r
        .subdirs("logs/search")?
        .into_iter()
        .filter_map(|v| {
            let k = v.strip_prefix('v').filter(|k| is_number(k))?;
            Some((k.parse().ok()?, v))
        })
        .collect();
    versions.sort();
    for (k, v) in versions {
        for name in r.subdirs(&format!("logs/search/{v}"))? {
            let Some(q) = name
                .strip_prefix("query")
                .and_then(|s| s.strip_suffix("_ourTeam"))
                .filter(|q| is_number(q))
            else {
                continue;
            };
            if let Some(files) = r.episode(&format!("logs/search/{v}/{name}"))? {
                out.push(Episode {
                    name: format!("{v}/{name}"),
                    purpose: "inner",
                    task: format!("query{q}"),
                    index: k,
                    files,
                    workspace: None,
                });
            }
        }
    }
    Ok(out)
}

/// Collection runs: every row of `pool.json`, whose folder must exist
/// (`pool/runlogs/{episode}`); index by seed order within the task.
fn collect_episodes(r: &mut Reader) -> Result<Vec<Episode>> {
    let Some(mut pool) = r.json("pool.json")? else {
        return Ok(Vec::new());
    };
    let mut seen = BTreeSet::new();
    let mut rows: Vec<(String, i64, String, usize)> = Vec::new();
    for row in list_rows(r.root, &mut pool)? {
        let name = str_field(&row, "episode")?.to_string();
        if name.is_empty() || name.contains('/') || name.starts_with('.') {
            return Err(ImportError::invalid(
                &row.file,
                row.line,
                "episode name is not a folder name",
            ));
        }
        // The task id becomes part of stream names (`c{C}/query{Q}/...`):
        // digits only, as the reference writes it.
        let task = match row.value.get("task") {
            Some(Value::Number(n)) => n.as_u64().map(|n| n.to_string()),
            Some(Value::String(s)) => Some(s.clone()),
            _ => None,
        }
        .filter(|t| is_number(t))
        .ok_or_else(|| {
            ImportError::invalid(
                &row.file,
                row.line,
                "no task id (a number, or a string of 1 to 18 digits)",
            )
        })?;
        if !seen.insert(name.clone()) {
            return Err(ImportError::invalid(
                &row.file,
                row.line,
                format!("episode {name:?} is listed twice"),
            ));
        }
        own_workspace(&row, &name)?;
        let seed = row.value.get("seed").and_then(Value::as_i64).unwrap_or(0);
        rows.push((task, seed, name, row.line));
    }
    rows.sort();
    let mut out: Vec<Episode> = Vec::new();
    // Each task's next index, kept as it goes (counting earlier episodes
    // of the task at each row would be quadratic in the pool).
    let mut next: BTreeMap<String, u32> = BTreeMap::new();
    for (task, _, name, line) in rows {
        let dir = format!("pool/runlogs/{name}");
        let files = r.episode(&dir)?.ok_or_else(|| {
            ImportError::invalid(
                "pool.json",
                line,
                format!("names episode {name:?}, but {dir} does not exist"),
            )
        })?;
        let task = format!("query{task}");
        let slot = next.entry(task.clone()).or_insert(0);
        let index = *slot;
        *slot += 1;
        out.push(Episode {
            name,
            purpose: "collect",
            task,
            index,
            files,
            workspace: None,
        });
    }
    Ok(out)
}

/// A `pool.json` row's `workspace`, when it has one, must be this
/// episode's folder in the reference's layout (`.../pool/workspaces/
/// {episode}`, by whole components; the rest is the machine that ran it).
/// The self-judge read the folder the row names: one naming another
/// episode's is refused, since the workspace recorded for this episode
/// would not be the one judged.
fn own_workspace(row: &Row, name: &str) -> Result<()> {
    let w = match row.value.get("workspace") {
        None | Some(Value::Null) => return Ok(()),
        Some(Value::String(w)) => w,
        Some(_) => {
            return Err(ImportError::invalid(
                &row.file,
                row.line,
                "workspace is not a path",
            ))
        }
    };
    let tail: Vec<&str> = w.trim_end_matches('/').rsplit('/').take(3).collect();
    if tail != [name, "workspaces", "pool"] {
        return Err(ImportError::invalid(
            &row.file,
            row.line,
            format!(
                "episode {name:?} names workspace {w:?}, not its own (pool/workspaces/{name}): \
                 refused, the workspace recorded would not be the one its judge read"
            ),
        ));
    }
    Ok(())
}

/// Evaluation runs (`evaluation/logs/query{Q}_r{I}`).
fn eval_episodes(r: &mut Reader) -> Result<Vec<Episode>> {
    let mut out = Vec::new();
    for name in r.subdirs("evaluation/logs")? {
        let Some((q, i)) = numbered(&name, "query", "_r") else {
            continue;
        };
        if let Some(files) = r.episode(&format!("evaluation/logs/{name}"))? {
            out.push(Episode {
                name,
                purpose: "eval",
                task: format!("query{q}"),
                index: i,
                files,
                workspace: None,
            });
        }
    }
    out.sort_by(|a, b| (&a.task, a.index).cmp(&(&b.task, b.index)));
    Ok(out)
}

/// Each training task's matches and ranking, checked against the
/// collected episodes.
/// Episode names and their tasks.
type Names = BTreeMap<String, String>;

fn task_stages(r: &mut Reader, collected: &Names) -> Result<Vec<TaskStage>> {
    let mut stages: BTreeMap<String, TaskStage> = BTreeMap::new();
    for (name, _) in r.root.list("selection")?.unwrap_or_default() {
        let Some(q) = name
            .strip_prefix("task")
            .and_then(|s| {
                s.strip_suffix("_matches.jsonl")
                    .or_else(|| s.strip_suffix("_ranked.json"))
            })
            .filter(|q| is_number(q))
        else {
            continue;
        };
        let st = stages.entry(q.to_string()).or_default();
        st.task = format!("query{q}");
        let rel = format!("selection/{name}");
        if name.ends_with("_matches.jsonl") {
            let Some((rows, mtime)) = r.jsonl(&rel)? else {
                continue;
            };
            st.matches = matches(rows, collected, &format!("query{q}"))?;
            st.matches_mtime = mtime;
        } else if let Some(mut f) = r.json(&rel)? {
            st.ranked_mtime = f.mtime_ms;
            st.ranked = ranked(r.root, &mut f, collected, &format!("query{q}"))?;
        }
    }
    Ok(stages.into_values().collect())
}

/// `name` must be in `names`, and of `task` when one is given.
fn known(row: &Row, names: &Names, name: &str, task: Option<&str>) -> Result<()> {
    match (names.get(name), task) {
        (Some(t), Some(want)) if t != want => Err(ImportError::invalid(
            &row.file,
            row.line,
            format!("names episode {name:?} of task {t}, in a file of task {want}"),
        )),
        (Some(_), _) => Ok(()),
        (None, Some(_)) => Err(ImportError::invalid(
            &row.file,
            row.line,
            format!("names episode {name:?}, which pool.json does not list (a missing episode)"),
        )),
        (None, None) => Err(ImportError::invalid(
            &row.file,
            row.line,
            format!("names episode {name:?}, which no selection/task*_ranked.json ranks"),
        )),
    }
}

fn matches(rows: Vec<Row>, collected: &Names, task: &str) -> Result<Vec<Match>> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for row in rows {
        let a = str_field(&row, "a")?.to_string();
        let b = str_field(&row, "b")?.to_string();
        known(&row, collected, &a, Some(task))?;
        known(&row, collected, &b, Some(task))?;
        if a == b {
            return Err(ImportError::invalid(
                &row.file,
                row.line,
                format!("episode {a:?} is judged against itself"),
            ));
        }
        let pair = if a <= b {
            (a.clone(), b.clone())
        } else {
            (b.clone(), a.clone())
        };
        if !seen.insert(pair) {
            return Err(ImportError::invalid(
                &row.file,
                row.line,
                format!("pair {a:?} / {b:?} is judged twice (refused: it would count twice)"),
            ));
        }
        let winner = match row.value.get("winner").and_then(Value::as_str) {
            Some(w) if w.eq_ignore_ascii_case("a") => "a",
            Some(w) if w.eq_ignore_ascii_case("b") => "b",
            Some(w) if w.eq_ignore_ascii_case("tie") => "tie",
            _ => {
                return Err(ImportError::invalid(
                    &row.file,
                    row.line,
                    "winner is not \"A\", \"B\" or \"tie\"",
                ))
            }
        };
        out.push(Match { row, a, b, winner });
    }
    Ok(out)
}

fn ranked(root: &Root, f: &mut JsonFile, collected: &Names, task: &str) -> Result<Vec<Ranked>> {
    let mut seen = BTreeSet::new();
    let mut ranks = BTreeSet::new();
    let mut out = Vec::new();
    for row in list_rows(root, f)? {
        let episode = str_field(&row, "episode")?.to_string();
        known(&row, collected, &episode, Some(task))?;
        if !seen.insert(episode.clone()) {
            return Err(ImportError::invalid(
                &row.file,
                row.line,
                format!("episode {episode:?} is ranked twice"),
            ));
        }
        let score = row.value.get("score").and_then(Value::as_f64);
        let rank = row
            .value
            .get("rank")
            .and_then(Value::as_u64)
            .and_then(|r| u32::try_from(r).ok());
        let (Some(score), Some(rank)) = (score, rank) else {
            return Err(ImportError::invalid(
                &row.file,
                row.line,
                "no numeric score and rank",
            ));
        };
        if !ranks.insert(rank) {
            return Err(ImportError::invalid(
                &row.file,
                row.line,
                format!("rank {rank} is given twice (refused: which run holds it is unclear)"),
            ));
        }
        out.push(Ranked {
            episode,
            score,
            rank,
        });
    }
    out.sort_by_key(|r| r.rank);
    Ok(out)
}

/// `selection/train.json` and `selection/val.json`: episodes, each once,
/// in neither twice, every one collected.
fn manifests(r: &mut Reader, ranked: &Names) -> Result<(Vec<String>, Vec<String>, u64)> {
    let mut seen = BTreeSet::new();
    let mut out = [Vec::new(), Vec::new()];
    let mut mtime = 0;
    for (i, rel) in ["selection/train.json", "selection/val.json"]
        .iter()
        .enumerate()
    {
        let Some(mut f) = r.json(rel)? else {
            continue;
        };
        mtime = mtime.max(f.mtime_ms);
        for row in list_rows(r.root, &mut f)? {
            let name = str_field(&row, "episode")?.to_string();
            known(&row, ranked, &name, None)?;
            if !seen.insert(name.clone()) {
                return Err(ImportError::invalid(&row.file, row.line, format!("episode {name:?} is selected twice (refused: it would be trained on twice)")));
            }
            out[i].push(name);
        }
    }
    let [train, validation] = out;
    Ok((train, validation, mtime))
}
