//! The train stage: the cycle's training as a journaled effect, and
//! promotion of the trained model to the roles its backend plays. The effect runs the
//! trainer (built-in or a command, under a wall-clock limit, in its own
//! process group) on the exported dataset and the experiment's
//! hyperparameters, and records its output directory, log and metrics;
//! from that recorded output (so a replay derives the same) the cycle's
//! `train` stream gets one `mass.train_step` event per metrics line and
//! the main stream the `mass.training` record: the chosen checkpoint and
//! why, the adapter files as a tree, the trainer's own version line.

use std::path::Path;
use std::time::Duration;

use ledger::Id;
use replay::EffectError;
use schemas::{Hash32, TrainStep, Training};
use serde_json::{json, Value};

use super::dataset::Built;
use crate::backend::sim::SimParams;
use crate::config::{Backend as BackendCfg, Experiment, TrainerArgs, TrainerKind};
use crate::context::{json_effect, note, step, Ctx, Models, Now};
use crate::error::{EngineError, Result};
use crate::trainer::{best_checkpoint, sim_train, TrainOutput};

/// What the training stage did: the models before and after (the same when
/// nothing was trained), and the roles as they stood when it ran.
pub(crate) struct Trained {
    pub(crate) from: Models,
    pub(crate) next: Models,
    pub(crate) roles: crate::config::Roles,
}

/// Runs the train stage of cycle `cycle` on the recorded dataset, with the
/// roles and backends as they stand after the dataset step; the trained
/// model is promoted to every role its backend plays.
pub(crate) fn run(
    ctx: &Ctx<'_>,
    main: &mut replay::Stream,
    exp: &mut Experiment,
    cycle: u32,
    m: &Models,
    built: &Built,
) -> Result<Trained> {
    let now = Now::of(ctx, exp, m)?;
    let from = now.models.clone();
    let next = if built.train_examples == 0 {
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
        let job = Job::of(&ctx.at(&now.exp), exp, cycle, &from.orchestrator, built)?;
        train(&ctx.at(&now.exp), main, exp, &job, &from)?
    };
    Ok(Trained {
        from,
        next,
        roles: now.exp.roles,
    })
}

/// One training: the trainer, its inputs and where its model goes.
struct Job<'a> {
    cycle: u32,
    dataset: Id,
    base_model: &'a str,
    train_jsonl: &'a str,
    val_jsonl: &'a str,
    backend_name: String,
    backend: std::sync::Arc<dyn crate::backend::Backend>,
    kind: &'static str,
    command: String,
    learning_rate: f64,
    base_adapter: Option<std::path::PathBuf>,
    trainer: crate::config::TrainerConfig,
    hyperparameters: Vec<u8>,
}

impl<'a> Job<'a> {
    fn of(
        ctx: &Ctx<'_>,
        exp: &Experiment,
        cycle: u32,
        base_model: &'a str,
        built: &'a Built,
    ) -> Result<Job<'a>> {
        let backend_name = exp.roles.orchestrator.clone();
        let (kind, command) = match exp.trainer.kind {
            TrainerKind::Sim => ("sim", "builtin:sim".to_string()),
            TrainerKind::Command => ("command", exp.trainer.command.clone().unwrap_or_default()),
        };
        let learning_rate = match exp.backends.get(&backend_name) {
            Some(BackendCfg::Sim(p)) => p.learning_rate,
            _ => 0.5,
        };
        Ok(Job {
            cycle,
            dataset: built.id,
            base_model,
            train_jsonl: &built.train_jsonl,
            val_jsonl: &built.validation_jsonl,
            backend: ctx.backends.get(&backend_name)?.clone(),
            base_adapter: ctx.backends.adapter_dir(&backend_name, base_model),
            backend_name,
            kind,
            command,
            learning_rate,
            trainer: exp.trainer.clone(),
            hyperparameters: serde_json::to_vec_pretty(&exp.trainer.hyperparameters)
                .map_err(|e| EngineError::Invalid(format!("trainer.hyperparameters: {e}")))?,
        })
    }

    /// The effect's request. The data by content (the blob ids the dataset
    /// record names), not by the dataset event's id: that id depends on the
    /// main stream's history (a re-judge's `run.mixed` record), the data
    /// does not. The trained backend's definition is named too (the
    /// simulated trainer's learning rate, a served model's command): a
    /// re-judge serves a recorded training only for the same data, base
    /// model, trainer and backend.
    fn request(&self, exp: &Experiment) -> Result<Value> {
        let backend_def = serde_json::to_value(
            exp.backends
                .get(&self.backend_name)
                .map(|b| b.named(exp.backends_as_written)),
        )
        .map_err(|e| EngineError::Invalid(format!("backends.{}: {e}", self.backend_name)))?;
        let data = json!({
            "train": Id::of(ledger::ObjectKind::Blob, self.train_jsonl.as_bytes()).to_hex(),
            "validation": Id::of(ledger::ObjectKind::Blob, self.val_jsonl.as_bytes()).to_hex(),
        });
        Ok(
            json!({"cycle": self.cycle, "data": data, "backend": backend_def, "base_model": self.base_model, "trainer": self.kind, "command": self.command, "hyperparameters": exp.trainer.hyperparameters, "timeout_secs": exp.trainer.timeout_secs}),
        )
    }
}

/// What a trainer left: (recorded command, exit status, chosen checkpoint,
/// its validation loss, log, the built-in trainer's parameters).
type Ran = (String, i32, String, f64, String, Option<Vec<u8>>);

/// Trains `job` as a journaled effect on the cycle's `train` stream and
/// records the result; returns the models after promotion.
fn train(
    ctx: &Ctx<'_>,
    main: &mut replay::Stream,
    exp: &mut Experiment,
    job: &Job<'_>,
    m: &Models,
) -> Result<Models> {
    let ledger = ctx.session.ledger().clone();
    let mut st = ctx.session.stream(&format!("c{}/train", job.cycle))?;
    let out = json_effect(&mut st, "trainer", job.request(exp)?, || {
        perform(job, &ledger)
    })?;
    let o: TrainOutput =
        serde_json::from_value(out).map_err(|e| EngineError::recording("trainer output", e))?;
    if o.exit_status != 0 {
        return Err(EngineError::Invalid(format!(
            "trainer exited with status {}: {}",
            o.exit_status, o.command
        )));
    }
    let new_model = register_model(ctx, job, &o)?;
    let steps = record_steps(
        &mut st,
        job.cycle,
        &ledger.get_blob(&parse_id(&o.metrics)?)?,
    )?;
    let effect = st
        .head()
        .ok_or_else(|| EngineError::Invalid("training effect left no event".into()))?;
    let rec = training_record(&ledger, job, &o, &new_model, effect, steps)?;
    // Runs recorded before `mass-engine/10` wrote v2: their replays must too.
    let ev = if exp.method.records_base_loss() {
        schemas::to_event(&rec)?
    } else {
        schemas::to_event(&schemas::TrainingV2::from(rec))?
    };
    step(main, exp, ev.with_parents(vec![effect]))?;
    // The trained model plays every role its backend played.
    let promote = |role_backend: &str, current: &str| {
        if role_backend == job.backend_name {
            new_model.clone()
        } else {
            current.to_string()
        }
    };
    Ok(Models {
        orchestrator: new_model.clone(),
        subagent: promote(exp.roles.subagent_backend(), &m.subagent),
        judge: promote(&exp.roles.judge, &m.judge),
        optimizer: promote(&exp.roles.optimizer, &m.optimizer),
    })
}

fn parse_id(h: &str) -> Result<Id> {
    h.parse::<Id>()
        .map_err(|e| EngineError::recording("trainer output id", e))
}

/// The effect itself: the trainer run in a fresh directory, its output
/// stored in the ledger.
fn perform(job: &Job<'_>, ledger: &ledger::Ledger) -> Result<Value, EffectError> {
    let tmp = std::env::temp_dir().join(format!(
        "mass-train-{}-{}",
        std::process::id(),
        job.dataset.short(12)
    ));
    let _ = std::fs::remove_dir_all(&tmp);
    let out_dir = tmp.join("output");
    let io = |e: std::io::Error| EffectError::transient(format!("{}: {e}", tmp.display()));
    std::fs::create_dir_all(&out_dir).map_err(io)?;
    let (train_path, val_path) = (tmp.join("train.jsonl"), tmp.join("validation.jsonl"));
    let hp_path = tmp.join("hyperparameters.json");
    std::fs::write(&train_path, job.train_jsonl).map_err(io)?;
    std::fs::write(&val_path, job.val_jsonl).map_err(io)?;
    std::fs::write(&hp_path, &job.hyperparameters).map_err(io)?;
    let ran = match job.kind {
        "sim" => run_sim(job, &out_dir)?,
        _ => {
            let args = TrainerArgs {
                train: &train_path,
                validation: &val_path,
                base_model: job.base_model,
                output_dir: &out_dir,
                hyperparameters: &hp_path,
                base_adapter: job.base_adapter.as_deref(),
            };
            run_command(job, &args, &tmp, &out_dir)?
        }
    };
    let o = output(job, ledger, &out_dir, ran)?;
    let _ = std::fs::remove_dir_all(&tmp);
    serde_json::to_value(&o).map_err(|e| EffectError::final_(e.to_string()))
}

/// The built-in trainer on the simulated model.
fn run_sim(job: &Job<'_>, out_dir: &Path) -> Result<Ran, EffectError> {
    let base_model = job.base_model;
    let base: SimParams = job
        .backend
        .export_model(base_model)
        .and_then(|b| serde_json::from_slice(&b).ok())
        .ok_or_else(|| format!("the built-in trainer cannot read model {base_model}"))?;
    let (params, checkpoint, loss, log) = sim_train(
        &base,
        job.learning_rate,
        job.train_jsonl,
        job.val_jsonl,
        out_dir,
    )?;
    let adapter = serde_json::to_vec_pretty(&params).map_err(|e| e.to_string())?;
    Ok((job.command.clone(), 0, checkpoint, loss, log, Some(adapter)))
}

/// A trainer command. One that cannot start, crashes, overruns its limit
/// or leaves no usable metrics is an infrastructure failure: the attempt is
/// recorded and a resume runs it again.
fn run_command(
    job: &Job<'_>,
    args: &TrainerArgs<'_>,
    tmp: &Path,
    out_dir: &Path,
) -> Result<Ran, EffectError> {
    let line = match job.trainer.expand_command(args) {
        Some(Ok(l)) => l,
        Some(Err(e)) => return Err(EffectError::final_(e)),
        None => return Err(EffectError::final_("trainer.command is missing")),
    };
    let (code, log) = run_trainer(&line, tmp, job.trainer.timeout_secs)?;
    let tail = |log: &str| {
        let t: Vec<&str> = log.lines().rev().take(5).collect();
        t.into_iter().rev().collect::<Vec<_>>().join(" | ")
    };
    if code != 0 {
        return Err(EffectError::transient(format!(
            "trainer exited with status {code}: {}",
            tail(&log)
        )));
    }
    let metrics_file = &job.trainer.metrics_file;
    let metrics = std::fs::read_to_string(out_dir.join(metrics_file)).map_err(|e| {
        EffectError::transient(format!(
            "the trainer wrote no {metrics_file} ({e}); it must write one JSON line per checkpoint with \"checkpoint\" and a finite \"validation_loss\""
        ))
    })?;
    let (checkpoint, loss, _) = best_checkpoint(&metrics)
        .filter(|(_, l, _)| l.is_finite())
        .ok_or_else(|| {
            EffectError::transient(format!(
                "{metrics_file} has no line with a \"checkpoint\" and a finite \"validation_loss\""
            ))
        })?;
    let adapter = std::fs::read(out_dir.join(&checkpoint).join("adapter.json")).ok();
    // The recorded command is the template: the expanded line names a
    // temporary directory, which must not enter an id.
    Ok((job.command.clone(), code, checkpoint, loss, log, adapter))
}

/// The effect's output: the trainer's files stored in the ledger.
fn output(
    job: &Job<'_>,
    ledger: &ledger::Ledger,
    out_dir: &Path,
    ran: Ran,
) -> Result<TrainOutput, EffectError> {
    let (line, status, checkpoint, loss, log, adapter) = ran;
    let put = |bytes: &[u8]| {
        ledger
            .put_blob(bytes)
            .map(|id| id.to_hex())
            .map_err(|e| e.to_string())
    };
    let metrics_file = &job.trainer.metrics_file;
    let metrics = std::fs::read(out_dir.join(metrics_file)).unwrap_or_default();
    let checkpoints = best_checkpoint(&String::from_utf8_lossy(&metrics)).map_or(0, |b| b.2);
    let checkpoint_dir = out_dir.join(&checkpoint);
    let adapter_tree = if checkpoint_dir.is_dir() {
        Some(
            ledger
                .snapshot_dir(&checkpoint_dir)
                .map_err(|e| e.to_string())?
                .to_hex(),
        )
    } else {
        None
    };
    Ok(TrainOutput {
        command: line,
        exit_status: status,
        checkpoint_reason: format!(
            "the lowest validation loss ({loss:.4}) of {checkpoints} checkpoint(s) in {metrics_file}"
        ),
        checkpoint,
        validation_loss: loss,
        base_validation_loss: crate::trainer::base_validation_loss(&String::from_utf8_lossy(
            &metrics,
        )),
        output_tree: ledger.snapshot_dir(out_dir).map_err(|e| e.to_string())?.to_hex(),
        log: put(log.as_bytes())?,
        adapter: adapter.map(|a| put(&a)).transpose()?,
        adapter_tree,
        hyperparameters: put(&job.hyperparameters)?,
        metrics: put(&metrics)?,
        trainer_version: trainer_version(out_dir),
    })
}

/// Makes the trained model callable and returns its name.
fn register_model(ctx: &Ctx<'_>, job: &Job<'_>, o: &TrainOutput) -> Result<String> {
    let (ledger, backend_name, cycle) = (ctx.session.ledger(), &job.backend_name, job.cycle);
    Ok(match (&o.adapter, &o.adapter_tree) {
        // The built-in simulation's parameters.
        (Some(a), _) => {
            let id = parse_id(a)?;
            let name = format!("{backend_name}/c{cycle}-{}", id.short(8));
            ctx.backends
                .register_adapter(backend_name, &name, &ledger.get_blob(&id)?)?;
            name
        }
        // Adapter files a server `mass` starts can load: checked out of
        // the ledger (also when the step is replayed: no trainer needed).
        (None, Some(tree)) if job.backend.serves_adapters() => {
            let id = parse_id(tree)?;
            // Served on the backend's base weights: named after them.
            let name = format!("{}+c{cycle}-{}", job.backend.base_model(), id.short(8));
            let dir = ctx.backends.checkout_adapter(ledger, &id)?;
            ctx.backends
                .register_adapter_dir(backend_name, &name, &dir, id)?;
            name
        }
        _ => format!("{}+c{cycle}", job.base_model),
    })
}

/// The `mass.training` record of a finished training.
fn training_record(
    ledger: &ledger::Ledger,
    job: &Job<'_>,
    o: &TrainOutput,
    new_model: &str,
    effect: Id,
    steps: u32,
) -> Result<Training> {
    let empty_tree = ledger.put_tree(&ledger::Tree::new(Vec::new())?)?;
    Ok(Training {
        cycle: job.cycle,
        dataset: job.dataset.into(),
        base_model: job.base_model.to_string(),
        new_model: new_model.to_string(),
        command: o.command.clone(),
        exit_status: o.exit_status,
        output: Hash32(parse_id(&o.output_tree)?.0),
        log: Hash32(parse_id(&o.log)?.0),
        checkpoint: o.checkpoint.clone(),
        validation_loss: o.validation_loss,
        base_validation_loss: o.base_validation_loss,
        effect: effect.into(),
        hyperparameters: Hash32(parse_id(&o.hyperparameters)?.0),
        checkpoint_reason: o.checkpoint_reason.clone(),
        adapter: match &o.adapter_tree {
            Some(t) => Hash32(parse_id(t)?.0),
            None => empty_tree.into(),
        },
        trainer_version: o.trainer_version.clone(),
        steps,
    })
}

/// Runs a trainer command line through `bash -c` in `dir`, supervised
/// (the `supervise` crate: its whole tree ends when it is stopped, when it
/// exits, and when `mass` dies however it dies, so a resume never trains
/// beside an orphan), its output to a log file (a pipe would block a chatty
/// trainer). Past `timeout_secs` the whole tree is killed. Returns the exit
/// code (-1 for a signal) and the log.
fn run_trainer(line: &str, dir: &Path, timeout_secs: u64) -> Result<(i32, String), EffectError> {
    let log_path = dir.join("trainer.log");
    let io = |e: std::io::Error| EffectError::transient(format!("cannot run trainer: {e}"));
    let sup =
        |e: supervise::SuperviseError| EffectError::transient(format!("cannot run trainer: {e}"));
    let log = std::fs::File::create(&log_path).map_err(io)?;
    let mut cmd = supervise::Command::new("bash");
    cmd.arg("-c")
        .arg(line)
        .current_dir(dir)
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone().map_err(io)?)
        .stderr(log);
    let mut child = cmd.spawn().map_err(sup)?;
    let limit = Duration::from_secs(timeout_secs);
    let Some(status) = child.wait_timeout(limit).map_err(sup)? else {
        let _ = child.kill();
        let log = std::fs::read_to_string(&log_path).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(3).collect();
        return Err(EffectError::transient(format!(
            "trainer ran past trainer.timeout_secs ({timeout_secs} s) and was killed; last lines: {}",
            tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
        )));
    };
    let log = std::fs::read(&log_path).map_err(io)?;
    Ok((
        status.code().unwrap_or(-1),
        String::from_utf8_lossy(&log).into_owned(),
    ))
}

/// The trainer's own account of its code: `name version sha256:...` from
/// `trainer.json` in its output directory, or empty when it wrote none.
fn trainer_version(out_dir: &Path) -> String {
    let Ok(bytes) = std::fs::read(out_dir.join("trainer.json")) else {
        return String::new();
    };
    let Ok(v) = serde_json::from_slice::<Value>(&bytes) else {
        return String::new();
    };
    ["name", "version", "script_sha256"]
        .iter()
        .filter_map(|k| match &v[*k] {
            Value::String(s) if *k == "script_sha256" => Some(format!("sha256:{s}")),
            Value::String(s) => Some(s.clone()),
            Value::Number(n) => Some(n.to_string()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// One `mass.train_step` event per metrics line that is a JSON object
/// with a numeric `step`; other lines are left out (the metrics file
/// itself is in the recorded output tree). Returns how many were recorded.
fn record_steps(st: &mut replay::Stream, cycle: u32, metrics: &[u8]) -> Result<u32> {
    let mut n = 0;
    for line in String::from_utf8_lossy(metrics).lines() {
        let Ok(v) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        let Some(step_no) = v["step"].as_u64() else {
            continue;
        };
        let finite = |k: &str| v[k].as_f64().filter(|x| x.is_finite());
        let ts = TrainStep {
            cycle,
            step: step_no,
            epoch: finite("epoch"),
            train_loss: finite("train_loss").or_else(|| finite("loss")),
            validation_loss: finite("validation_loss"),
            learning_rate: finite("learning_rate"),
            tokens: v["tokens"].as_u64(),
            checkpoint: v["checkpoint"].as_str().unwrap_or_default().to_string(),
            line: line.to_string(),
        };
        st.emit(schemas::to_event(&ts)?)?;
        n += 1;
    }
    Ok(n)
}
