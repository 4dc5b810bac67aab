//! The cycle's training step as a journaled effect, and promotion of the
//! trained model to the roles its backend plays.

use ledger::Id;
use replay::EffectError;
use schemas::{Hash32, Training};
use serde_json::json;

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
    let metrics_file = exp.trainer.metrics_file.clone();
    let trainer_cfg = exp.trainer.clone();
    let mut st = ctx.session.stream(&format!("c{cycle}/train"))?;
    let request = json!({"cycle": cycle, "dataset": dataset.to_hex(), "base_model": base_model, "trainer": kind, "command": command});
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
        std::fs::write(&train_path, train_jsonl).map_err(io)?;
        std::fs::write(&val_path, val_jsonl).map_err(io)?;
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
                };
                let line = match trainer_cfg.expand_command(&args) {
                    Some(Ok(l)) => l,
                    Some(Err(e)) => return Err(EffectError::final_(e)),
                    None => return Err(EffectError::final_("trainer.command is missing")),
                };
                // A trainer that cannot start, crashes or leaves no usable
                // metrics is an infrastructure failure: the attempt is
                // recorded and a resume runs the trainer again.
                let o = std::process::Command::new("bash")
                    .arg("-c")
                    .arg(&line)
                    .current_dir(&tmp)
                    .output()
                    .map_err(|e| EffectError::transient(format!("cannot run trainer: {e}")))?;
                let mut log = String::from_utf8_lossy(&o.stdout).into_owned();
                log.push_str(&String::from_utf8_lossy(&o.stderr));
                let tail = |log: &str| {
                    let t: Vec<&str> = log.lines().rev().take(5).collect();
                    t.into_iter().rev().collect::<Vec<_>>().join(" | ")
                };
                if !o.status.success() {
                    return Err(EffectError::transient(format!(
                        "trainer exited with {}: {}",
                        o.status,
                        tail(&log)
                    )));
                }
                let metrics_path = out_dir.join(&metrics_file);
                let metrics = std::fs::read_to_string(&metrics_path).map_err(|e| {
                    EffectError::transient(format!(
                        "the trainer wrote no {metrics_file} ({e}); it must write one JSON line per checkpoint with \"checkpoint\" and a finite \"validation_loss\""
                    ))
                })?;
                let (checkpoint, loss) = best_checkpoint(&metrics)
                    .filter(|(_, l)| l.is_finite())
                    .ok_or_else(|| {
                        EffectError::transient(format!(
                            "{metrics_file} has no line with a \"checkpoint\" and a finite \"validation_loss\""
                        ))
                    })?;
                let adapter = std::fs::read(out_dir.join(&checkpoint).join("adapter.json")).ok();
                // The recorded command is the template: the expanded line
                // names a temporary directory, which must not enter an id.
                (
                    command.clone(),
                    o.status.code().unwrap_or(-1),
                    checkpoint,
                    loss,
                    log,
                    adapter,
                )
            }
        };
        let (line, status, checkpoint, loss, log, adapter) = result;
        let tree = ledger.snapshot_dir(&out_dir).map_err(|e| e.to_string())?;
        let log_id = ledger.put_blob(log.as_bytes()).map_err(|e| e.to_string())?;
        let adapter_id = match adapter {
            Some(a) => Some(ledger.put_blob(&a).map_err(|e| e.to_string())?.to_hex()),
            None => None,
        };
        let _ = std::fs::remove_dir_all(&tmp);
        let o = TrainOutput {
            command: line,
            exit_status: status,
            checkpoint,
            validation_loss: loss,
            output_tree: tree.to_hex(),
            log: log_id.to_hex(),
            adapter: adapter_id,
        };
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
    let new_model = match &o.adapter {
        Some(a) => {
            let id = parse(a)?;
            let name = format!("{backend_name}/c{cycle}-{}", id.short(8));
            ctx.backends
                .register_adapter(&backend_name, &name, &ledger.get_blob(&id)?)?;
            name
        }
        None => format!("{base_model}+c{cycle}"),
    };
    let effect = st
        .head()
        .ok_or_else(|| EngineError::Invalid("training effect left no event".into()))?;
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
