//! The cycle's training step as a journaled effect, and promotion of the
//! trained model to the roles its backend plays. The effect runs the
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

use crate::backend::sim::SimParams;
use crate::config::{Backend as BackendCfg, Experiment, TrainerArgs, TrainerKind};
use crate::cycle::{json_effect, step, Ctx, Models};
use crate::error::{EngineError, Result};
use crate::trainer::{best_checkpoint, sim_train, TrainOutput};

#[allow(clippy::too_many_arguments)]
pub fn train(
    ctx: &Ctx<'_>,
    main: &mut replay::Stream,
    exp: &mut Experiment,
    cycle: u32,
    base_model: &str,
    dataset: Id,
    train_jsonl: &str,
    val_jsonl: &str,
    m: &Models,
) -> Result<Models> {
    let ledger = ctx.session.ledger().clone();
    let backend_name = exp.roles.orchestrator.clone();
    let backend = ctx.backends.get(&backend_name)?.clone();
    let (kind, command) = match exp.trainer.kind {
        TrainerKind::Sim => ("sim", "builtin:sim".to_string()),
        TrainerKind::Command => ("command", exp.trainer.command.clone().unwrap_or_default()),
    };
    let learning_rate = match exp.backends.get(&backend_name) {
        Some(BackendCfg::Sim(p)) => p.learning_rate,
        _ => 0.5,
    };
    let base_adapter = ctx.backends.adapter_dir(&backend_name, base_model);
    let metrics_file = exp.trainer.metrics_file.clone();
    let trainer_cfg = exp.trainer.clone();
    let hyperparameters = serde_json::to_vec_pretty(&exp.trainer.hyperparameters)
        .map_err(|e| EngineError::Invalid(format!("trainer.hyperparameters: {e}")))?;
    let mut st = ctx.session.stream(&format!("c{cycle}/train"))?;
    // The data by content (the blob ids the dataset record names), not by
    // the dataset event's id: that id depends on the main stream's history
    // (a re-judge's `run.mixed` record), the data does not. The trained
    // backend's definition is named too (the simulated trainer's learning
    // rate, a served model's command): a re-judge serves a recorded
    // training only for the same data, base model, trainer and backend.
    let backend_def = serde_json::to_value(
        exp.backends
            .get(&backend_name)
            .map(|b| b.named(exp.backends_as_written)),
    )
    .map_err(|e| EngineError::Invalid(format!("backends.{backend_name}: {e}")))?;
    let data = json!({
        "train": Id::of(ledger::ObjectKind::Blob, train_jsonl.as_bytes()).to_hex(),
        "validation": Id::of(ledger::ObjectKind::Blob, val_jsonl.as_bytes()).to_hex(),
    });
    let request = json!({"cycle": cycle, "data": data, "backend": backend_def, "base_model": base_model, "trainer": kind, "command": command, "hyperparameters": exp.trainer.hyperparameters, "timeout_secs": exp.trainer.timeout_secs});
    let out = json_effect(&mut st, "trainer", request, || {
        let tmp = std::env::temp_dir().join(format!(
            "mass-train-{}-{}",
            std::process::id(),
            dataset.short(12)
        ));
        let _ = std::fs::remove_dir_all(&tmp);
        let out_dir = tmp.join("output");
        let io = |e: std::io::Error| EffectError::transient(format!("{}: {e}", tmp.display()));
        std::fs::create_dir_all(&out_dir).map_err(io)?;
        let (train_path, val_path) = (tmp.join("train.jsonl"), tmp.join("validation.jsonl"));
        let hp_path = tmp.join("hyperparameters.json");
        std::fs::write(&train_path, train_jsonl).map_err(io)?;
        std::fs::write(&val_path, val_jsonl).map_err(io)?;
        std::fs::write(&hp_path, &hyperparameters).map_err(io)?;
        let result = match kind {
            "sim" => {
                let base: SimParams = backend
                    .export_model(base_model)
                    .and_then(|b| serde_json::from_slice(&b).ok())
                    .ok_or_else(|| {
                        format!("the built-in trainer cannot read model {base_model}")
                    })?;
                let (params, checkpoint, loss, log) =
                    sim_train(&base, learning_rate, train_jsonl, val_jsonl, &out_dir)?;
                let adapter = serde_json::to_vec_pretty(&params).map_err(|e| e.to_string())?;
                (command.clone(), 0, checkpoint, loss, log, Some(adapter))
            }
            _ => {
                let args = TrainerArgs {
                    train: &train_path,
                    validation: &val_path,
                    base_model,
                    output_dir: &out_dir,
                    hyperparameters: &hp_path,
                    base_adapter: base_adapter.as_deref(),
                };
                let line = match trainer_cfg.expand_command(&args) {
                    Some(Ok(l)) => l,
                    Some(Err(e)) => return Err(EffectError::final_(e)),
                    None => return Err(EffectError::final_("trainer.command is missing")),
                };
                // A trainer that cannot start, crashes, overruns its limit
                // or leaves no usable metrics is an infrastructure failure:
                // the attempt is recorded and a resume runs it again.
                let (code, log) = run_trainer(&line, &tmp, trainer_cfg.timeout_secs)?;
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
                let metrics_path = out_dir.join(&metrics_file);
                let metrics = std::fs::read_to_string(&metrics_path).map_err(|e| {
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
                // The recorded command is the template: the expanded line
                // names a temporary directory, which must not enter an id.
                (command.clone(), code, checkpoint, loss, log, adapter)
            }
        };
        let (line, status, checkpoint, loss, log, adapter) = result;
        let put = |bytes: &[u8]| {
            ledger
                .put_blob(bytes)
                .map(|id| id.to_hex())
                .map_err(|e| e.to_string())
        };
        let metrics = std::fs::read(out_dir.join(&metrics_file)).unwrap_or_default();
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
        let o = TrainOutput {
            command: line,
            exit_status: status,
            checkpoint_reason: format!(
                "the lowest validation loss ({loss:.4}) of {checkpoints} checkpoint(s) in {metrics_file}"
            ),
            checkpoint,
            validation_loss: loss,
            output_tree: ledger.snapshot_dir(&out_dir).map_err(|e| e.to_string())?.to_hex(),
            log: put(log.as_bytes())?,
            adapter: adapter.map(|a| put(&a)).transpose()?,
            adapter_tree,
            hyperparameters: put(&hyperparameters)?,
            metrics: put(&metrics)?,
            trainer_version: trainer_version(&out_dir),
        };
        let _ = std::fs::remove_dir_all(&tmp);
        serde_json::to_value(&o).map_err(|e| EffectError::final_(e.to_string()))
    })?;
    let o: TrainOutput =
        serde_json::from_value(out).map_err(|e| EngineError::recording("trainer output", e))?;
    if o.exit_status != 0 {
        return Err(EngineError::Invalid(format!(
            "trainer exited with status {}: {}",
            o.exit_status, o.command
        )));
    }
    let parse = |h: &str| {
        h.parse::<Id>()
            .map_err(|e| EngineError::recording("trainer output id", e))
    };
    let new_model = match (&o.adapter, &o.adapter_tree) {
        // The built-in simulation's parameters.
        (Some(a), _) => {
            let id = parse(a)?;
            let name = format!("{backend_name}/c{cycle}-{}", id.short(8));
            ctx.backends
                .register_adapter(&backend_name, &name, &ledger.get_blob(&id)?)?;
            name
        }
        // Adapter files a server `mass` starts can load: checked out of
        // the ledger (also when the step is replayed: no trainer needed).
        (None, Some(tree)) if backend.serves_adapters() => {
            let id = parse(tree)?;
            // Served on the backend's base weights: named after them.
            let name = format!("{}+c{cycle}-{}", backend.base_model(), id.short(8));
            let dir = checkout_adapter(&ledger, &id)?;
            ctx.backends
                .register_adapter_dir(&backend_name, &name, &dir)?;
            name
        }
        _ => format!("{base_model}+c{cycle}"),
    };
    let steps = record_steps(&mut st, cycle, &ledger.get_blob(&parse(&o.metrics)?)?)?;
    let effect = st
        .head()
        .ok_or_else(|| EngineError::Invalid("training effect left no event".into()))?;
    let empty_tree = ledger.put_tree(&ledger::Tree::new(Vec::new())?)?;
    let rec = Training {
        cycle,
        dataset: dataset.into(),
        base_model: base_model.to_string(),
        new_model: new_model.clone(),
        command: o.command.clone(),
        exit_status: o.exit_status,
        output: Hash32(parse(&o.output_tree)?.0),
        log: Hash32(parse(&o.log)?.0),
        checkpoint: o.checkpoint.clone(),
        validation_loss: o.validation_loss,
        effect: effect.into(),
        hyperparameters: Hash32(parse(&o.hyperparameters)?.0),
        checkpoint_reason: o.checkpoint_reason.clone(),
        adapter: match &o.adapter_tree {
            Some(t) => Hash32(parse(t)?.0),
            None => empty_tree.into(),
        },
        trainer_version: o.trainer_version.clone(),
        steps,
    };
    step(
        main,
        exp,
        schemas::to_event(&rec)?.with_parents(vec![effect]),
    )?;
    // The trained model plays every role its backend played.
    let promote = |role_backend: &str, current: &str| {
        if role_backend == backend_name {
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

/// Runs a trainer command line through `bash -c` in `dir`, supervised
/// (`crate::supervise`: its whole tree ends when it is stopped, when it
/// exits, and when `mass` dies however it dies, so a resume never trains
/// beside an orphan), its output to a log file (a pipe would block a chatty
/// trainer). Past `timeout_secs` the whole tree is killed. Returns the exit
/// code (-1 for a signal) and the log.
fn run_trainer(line: &str, dir: &Path, timeout_secs: u64) -> Result<(i32, String), EffectError> {
    let log_path = dir.join("trainer.log");
    let io = |e: std::io::Error| EffectError::transient(format!("cannot run trainer: {e}"));
    let sup = |e: crate::supervise::SuperviseError| {
        EffectError::transient(format!("cannot run trainer: {e}"))
    };
    let log = std::fs::File::create(&log_path).map_err(io)?;
    let mut cmd = crate::supervise::Command::new("bash");
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

/// The adapter files of tree `id`, checked out (once per content: the
/// directory is named by the tree id) under the system's temporary
/// directory. A checkout goes to a fresh directory renamed into place, so
/// a crash mid-checkout never leaves a half directory under the final name.
fn checkout_adapter(l: &ledger::Ledger, id: &Id) -> Result<std::path::PathBuf> {
    let root = std::env::temp_dir().join("mass-adapters");
    let dir = root.join(id.to_hex());
    if dir.is_dir() {
        return Ok(dir);
    }
    let io = |e: std::io::Error| {
        EngineError::io(format!("adapter checkout under {}", root.display()), e)
    };
    std::fs::create_dir_all(&root).map_err(io)?;
    let partial = root.join(format!(".{}-{}", id.short(16), std::process::id()));
    let _ = std::fs::remove_dir_all(&partial);
    l.checkout(id, &partial)?;
    match std::fs::rename(&partial, &dir) {
        Ok(()) => Ok(dir),
        // Another process put the same content in place first.
        Err(_) if dir.is_dir() => {
            let _ = std::fs::remove_dir_all(&partial);
            Ok(dir)
        }
        Err(e) => Err(io(e)),
    }
}
