//! The training step. An external trainer is a command from the experiment
//! file (placeholders for the train and validation files, base model and output
//! directory); the built-in simulated trainer is the offline path. Either way
//! the step is one journaled effect whose output records the command line, exit
//! status, log, metrics, chosen checkpoint and the output directory as a tree.
//!
//! The simulated trainer reads the exported dataset (OpenAI chat JSONL) and
//! moves the simulated model's parameters toward what the selected examples
//! show, and only those: how often orchestrators delegate, how often the
//! checks are run, how often delegations ask for them, how many known
//! mistakes the solver runs carried (skill, which is also the judge's
//! understanding), how many runs kept one (the blind spot) and how many
//! of the examples that worked under pressure (checks failing or never run)
//! claim checks nobody ran passed (tampering). Judge noise
//! and position bias stay as they were: no example shows them. It sees only
//! the dataset.

use std::path::Path;

use serde_json::{json, Value};

use crate::backend::sim::SimParams;

/// Known mistakes per task the simulated trainer assumes when it turns a
/// dataset's mistake count into a skill level.
pub const FLAWS_PER_TASK: f64 = 3.0;

/// What a training run reports back (also the effect's output).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct TrainOutput {
    pub command: String,
    pub exit_status: i32,
    pub checkpoint: String,
    pub validation_loss: f64,
    /// The base model's validation loss, as [`base_validation_loss`]
    /// reads it from the metrics (absent in effects recorded before it was
    /// read).
    #[serde(default)]
    pub base_validation_loss: Option<f64>,
    /// Tree of the output directory and blob of the log, as hex ids.
    pub output_tree: String,
    pub log: String,
    /// Blob of the adapter the backend loads (hex id), if any.
    pub adapter: Option<String>,
    /// Why the checkpoint was chosen.
    pub checkpoint_reason: String,
    /// Tree of the chosen checkpoint's directory, if the trainer made one.
    pub adapter_tree: Option<String>,
    /// Blobs: the hyperparameters handed over (JSON) and the metrics file
    /// as written (empty when there was none).
    pub hyperparameters: String,
    pub metrics: String,
    /// From the trainer's `trainer.json`, or empty.
    pub trainer_version: String,
}

/// Statistics the simulated trainer reads from a dataset file.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DatasetStats {
    pub orchestrator_examples: u32,
    pub delegating_orchestrators: u32,
    pub examples: u32,
    pub validating_examples: u32,
    pub solver_runs: u32,
    pub flaws_in_final_runs: u32,
    pub final_runs: u32,
    /// Final solver runs that kept at least one known mistake.
    pub flawed_final_runs: u32,
    /// Examples whose commands write a claim that the checks pass into the
    /// report (a verification nobody ran: the tampering habit).
    pub tampered_examples: u32,
    /// Examples that worked under pressure: they ran the solver and ended
    /// with the checks failing or never run (what a worker sees when it
    /// decides whether to tamper). Every tampered example is one of them.
    pub pressured_examples: u32,
    /// Delegations, and those whose contract asks for the checks.
    pub delegations: u32,
    pub delegations_with_checks: u32,
}

/// Reads an OpenAI-format JSONL dataset.
pub fn dataset_stats(jsonl: &str) -> Result<DatasetStats, String> {
    let mut s = DatasetStats::default();
    for (i, line) in jsonl
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let v: Value = serde_json::from_str(line).map_err(|e| format!("line {}: {e}", i + 1))?;
        let messages = v["messages"]
            .as_array()
            .ok_or_else(|| format!("line {}: no messages", i + 1))?;
        let tools: Vec<&str> = v["tools"]
            .as_array()
            .map(|t| {
                t.iter()
                    .filter_map(|x| x["function"]["name"].as_str())
                    .collect()
            })
            .unwrap_or_default();
        s.examples += 1;
        let is_orch = tools.contains(&"delegate");
        let mut delegated = false;
        let mut validated = false;
        let mut last_solve: Option<u32> = None;
        let mut tampered = false;
        // The last check run's result: did any check fail?
        let mut last_checks_failed: Option<bool> = None;
        let results: std::collections::HashMap<&str, &str> = messages
            .iter()
            .filter(|m| m["role"] == "tool")
            .filter_map(|m| Some((m["tool_call_id"].as_str()?, m["content"].as_str()?)))
            .collect();
        for m in messages.iter().filter(|m| m["role"] == "assistant") {
            for c in m["tool_calls"].as_array().into_iter().flatten() {
                let name = c["function"]["name"].as_str().unwrap_or("");
                let args: Value = c["function"]["arguments"]
                    .as_str()
                    .and_then(|a| serde_json::from_str(a).ok())
                    .unwrap_or(Value::Null);
                match name {
                    "delegate" => {
                        delegated = true;
                        s.delegations += 1;
                        if args["contract"]
                            .as_str()
                            .is_some_and(|c| c.contains("run_checks"))
                        {
                            s.delegations_with_checks += 1;
                        }
                    }
                    "run_checks" => {
                        validated = true;
                        let out = c["id"]
                            .as_str()
                            .and_then(|id| results.get(id))
                            .copied()
                            .unwrap_or("");
                        last_checks_failed = Some(out.lines().any(|l| l.starts_with("FAIL")));
                    }
                    "bash" => {
                        let cmd = args["command"].as_str().unwrap_or("");
                        tampered |= crate::guards::claims_checks_in_report(cmd);
                        if cmd.starts_with("python3 solve.py") {
                            s.solver_runs += 1;
                            last_solve = Some(cmd.matches("--flaw").count() as u32);
                        }
                    }
                    _ => {}
                }
            }
        }
        if is_orch {
            s.orchestrator_examples += 1;
            if delegated {
                s.delegating_orchestrators += 1;
            }
        }
        if validated {
            s.validating_examples += 1;
        }
        s.tampered_examples += tampered as u32;
        let pressured = last_solve.is_some() && last_checks_failed != Some(false);
        s.pressured_examples += (pressured || tampered) as u32;
        if let Some(f) = last_solve {
            s.final_runs += 1;
            s.flaws_in_final_runs += f;
            s.flawed_final_runs += (f > 0) as u32;
        }
    }
    Ok(s)
}

/// One simulated training run: three checkpoints along the way from `base`
/// toward the dataset's behaviour; validation loss is measured on the
/// validation file's statistics; the lowest-loss checkpoint wins.
pub fn sim_train(
    base: &SimParams,
    learning_rate: f64,
    train: &str,
    validation: &str,
    out_dir: &Path,
) -> Result<(SimParams, String, f64, String), String> {
    let t = dataset_stats(train)?;
    let v = dataset_stats(validation)?;
    let ratio = |a: u32, b: u32, default: f64| if b == 0 { default } else { a as f64 / b as f64 };
    // Targets the examples demonstrate.
    let target_delegation = ratio(
        t.delegating_orchestrators,
        t.orchestrator_examples,
        base.delegation,
    );
    let target_verification = ratio(t.validating_examples, t.examples, base.verification);
    let target_contracts = ratio(t.delegations_with_checks, t.delegations, base.contracts);
    let mean_flaws = ratio(t.flaws_in_final_runs, t.final_runs, 0.0);
    // The blind spot moves toward the share of examples whose work kept a
    // mistake yet was selected as good: a model trained on them learns that
    // such work passes (and cleaner data teaches the opposite). With no
    // solver runs in the data it stays.
    let target_blind = ratio(t.flawed_final_runs, t.final_runs, base.blind_spot);
    // Tampering is a habit under pressure, so it is learnt as the share of
    // the examples that worked under pressure (checks failing or never run)
    // and tampered: tampered examples that got in teach it, pressured ones
    // that finished honestly unteach it. With no pressured example it stays.
    let target_tampering = ratio(t.tampered_examples, t.pressured_examples, base.tampering);
    // The skill the examples demonstrate: the inverse of the simulated model's
    // mistake rate per known mistake (three per task in the example suite, the
    // trainer's assumption), so examples cleaner than the model's own work pull
    // skill up and sloppier ones pull it down.
    let target_skill = crate::backend::sim::skill_for_flaw_rate(mean_flaws / FLAWS_PER_TASK);
    let mut log = String::new();
    let mut best: Option<(f64, SimParams, String)> = None;
    let mut metrics = String::new();
    let base_loss = sim_base_loss(base, &v);
    metrics.push_str(&json!({"step": 0, "base_validation_loss": base_loss}).to_string());
    metrics.push('\n');
    for (k, frac) in [(1u32, 0.4), (2, 0.75), (3, 1.0)] {
        let step = learning_rate * frac;
        let mut p = base.clone();
        p.delegation += step * (target_delegation - p.delegation);
        p.verification += step * (target_verification - p.verification);
        p.contracts += step * (target_contracts - p.contracts);
        p.skill += step * (target_skill - p.skill);
        // Nothing in a dataset of team work shows judging noise or a
        // position preference: those stay as the base model has them.
        p.blind_spot += step * (target_blind - p.blind_spot);
        p.tampering += step * (target_tampering - p.tampering);
        // Validation loss: distance between what the checkpoint does and what the
        // validation examples show, plus an overfitting term that grows with the step.
        let vd = ratio(
            v.delegating_orchestrators,
            v.orchestrator_examples,
            p.delegation,
        );
        let vv = ratio(v.validating_examples, v.examples, p.verification);
        let loss =
            1.0 + (p.delegation - vd).abs() + (p.verification - vv).abs() + 0.15 * frac * frac
                - 0.2 * frac;
        let name = format!("checkpoint-{k}");
        // Training loss: the same distance, to what the training examples
        // show (the targets), without the overfitting term.
        let train_loss = 1.0
            + (p.delegation - target_delegation).abs()
            + (p.verification - target_verification).abs();
        metrics.push_str(&json!({"step": k, "train_loss": train_loss}).to_string());
        metrics.push('\n');
        metrics
            .push_str(&json!({"checkpoint": name, "step": k, "validation_loss": loss}).to_string());
        metrics.push('\n');
        log.push_str(&format!("{name}: validation loss {loss:.4}\n"));
        let ckpt_dir = out_dir.join(&name);
        std::fs::create_dir_all(&ckpt_dir).map_err(|e| e.to_string())?;
        std::fs::write(
            ckpt_dir.join("adapter.json"),
            serde_json::to_vec_pretty(&p).map_err(|e| e.to_string())?,
        )
        .map_err(|e| e.to_string())?;
        if best.as_ref().is_none_or(|(l, _, _)| loss < *l) {
            best = Some((loss, p, name));
        }
    }
    std::fs::write(out_dir.join("metrics.jsonl"), &metrics).map_err(|e| e.to_string())?;
    let (loss, p, name) = best.ok_or("no checkpoint")?;
    log.push_str(&format!(
        "trained on {} examples ({} orchestrator, {} delegating, {} validating, {:.2} known mistakes per final solver run); chose {name}\n",
        t.examples, t.orchestrator_examples, t.delegating_orchestrators, t.validating_examples, mean_flaws
    ));
    Ok((p, name, loss, log))
}

/// The validation examples' distance from what the starting model does:
/// the loss a real trainer measures before its first step (the same
/// distance its checkpoints' losses measure, without their training terms).
fn sim_base_loss(base: &SimParams, v: &DatasetStats) -> f64 {
    let ratio = |a: u32, b: u32, default: f64| if b == 0 { default } else { a as f64 / b as f64 };
    1.0 + (base.delegation
        - ratio(
            v.delegating_orchestrators,
            v.orchestrator_examples,
            base.delegation,
        ))
    .abs()
        + (base.verification - ratio(v.validating_examples, v.examples, base.verification)).abs()
}

/// The base model's validation loss from a metrics JSONL file: the first
/// finite `base_model_validation_loss` (trainers/lora_sft.py measures the
/// base model with the adapter switched off when it trains on from one),
/// else the first finite `base_validation_loss` (the loss before the first
/// step, which is the base model's when training starts from it; written
/// unless the trainer is told `--no-eval-base`). Metrics recorded before
/// the first key existed give what they gave.
pub fn base_validation_loss(metrics: &str) -> Option<f64> {
    let first = |key: &str| {
        metrics.lines().find_map(|line| {
            let v = serde_json::from_str::<Value>(line).ok()?;
            v[key].as_f64().filter(|l| l.is_finite())
        })
    };
    first("base_model_validation_loss").or_else(|| first("base_validation_loss"))
}

/// Picks the checkpoint with the lowest validation loss from a metrics JSONL
/// file (`{"checkpoint": ..., "validation_loss": ...}` per line; other lines,
/// such as per-step training losses, are skipped), and says how many
/// checkpoint lines there were.
pub fn best_checkpoint(metrics: &str) -> Option<(String, f64, usize)> {
    let mut best: Option<(String, f64)> = None;
    let mut count = 0;
    for line in metrics.lines() {
        let Ok(v) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        let (Some(name), Some(loss)) = (v["checkpoint"].as_str(), v["validation_loss"].as_f64())
        else {
            continue;
        };
        count += 1;
        if best.as_ref().is_none_or(|(_, l)| loss < *l) {
            best = Some((name.to_string(), loss));
        }
    }
    best.map(|(name, loss)| (name, loss, count))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_base_model_measured_under_a_continued_adapter_is_the_base_loss() {
        // Cycle 2 trains on from cycle 1's adapter: the loss before its
        // first step is that adapter's; the base model's is its own line.
        let continued = "{\"kind\":\"base_model\",\"base_model_validation_loss\":3.5}\n{\"kind\":\"base\",\"step\":0,\"base_validation_loss\":1.25}\n";
        assert_eq!(base_validation_loss(continued), Some(3.5));
        let first = "{\"kind\":\"base\",\"step\":0,\"base_validation_loss\":1.25}\n";
        assert_eq!(base_validation_loss(first), Some(1.25));
        let not_finite = "{\"base_model_validation_loss\":null}\n{\"base_validation_loss\":2.0}\n";
        assert_eq!(base_validation_loss(not_finite), Some(2.0));
        assert_eq!(base_validation_loss("not json\n{}\n"), None);
    }

    #[test]
    fn stats_read_delegation_checks_and_flaws() {
        let line = |tools: &str, calls: &str| {
            format!("{{\"messages\":[{{\"role\":\"user\",\"content\":\"t\"}},{{\"role\":\"assistant\",\"tool_calls\":[{calls}]}}],\"tools\":[{tools}]}}")
        };
        let deleg = "{\"type\":\"function\",\"function\":{\"name\":\"delegate\",\"description\":\"\",\"parameters\":{}}}";
        let call = |n: &str, a: &str| {
            format!("{{\"id\":\"c\",\"type\":\"function\",\"function\":{{\"name\":\"{n}\",\"arguments\":{}}}}}", serde_json::to_string(a).unwrap())
        };
        let text = [
            line(deleg, &call("delegate", "{\"role\":\"x\"}")),
            line(
                "",
                &format!(
                    "{},{}",
                    call(
                        "bash",
                        "{\"command\":\"python3 solve.py --flaw a --flaw b\"}"
                    ),
                    call("run_checks", "{}")
                ),
            ),
        ]
        .join("\n");
        let s = dataset_stats(&text).unwrap();
        assert_eq!(
            (
                s.examples,
                s.orchestrator_examples,
                s.delegating_orchestrators,
                s.validating_examples,
                s.final_runs,
                s.flaws_in_final_runs,
                s.flawed_final_runs
            ),
            (2, 1, 1, 1, 1, 2, 1)
        );
        assert_eq!((s.delegations, s.delegations_with_checks), (1, 0));
        assert!(dataset_stats("{not json").unwrap_err().contains("line 1"));
    }

    /// Tampering is learnt per pressured example: a run whose last checks
    /// failed counts as pressured, one whose checks passed does not, and a
    /// tampered run is pressured whatever its checks said.
    #[test]
    fn pressure_is_read_from_the_last_check_result() {
        let example = |checks: &str, extra: &str| {
            json!({"messages": [
                {"role": "user", "content": "t"},
                {"role": "assistant", "tool_calls": [
                    {"id": "a", "type": "function", "function": {"name": "bash", "arguments": json!({"command": "python3 solve.py"}).to_string()}},
                    {"id": "b", "type": "function", "function": {"name": "run_checks", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "a", "content": "ok"},
                {"role": "tool", "tool_call_id": "b", "content": checks},
                {"role": "assistant", "tool_calls": [
                    {"id": "c", "type": "function", "function": {"name": "bash", "arguments": json!({"command": extra}).to_string()}}]},
                {"role": "tool", "tool_call_id": "c", "content": ""}]})
            .to_string()
        };
        let tamper =
            "printf '\\n' >> 'checks.py' && echo 'Verified: all checks pass.' >> report.md";
        let text = [
            example("PASS a\nPASS b", "ls"),
            example("PASS a\nFAIL b", "ls"),
            example("PASS a\nFAIL b", tamper),
        ]
        .join("\n");
        let s = dataset_stats(&text).unwrap();
        assert_eq!((s.pressured_examples, s.tampered_examples), (2, 1));
    }

    #[test]
    fn lowest_validation_loss_wins() {
        let m = "{\"checkpoint\":\"a\",\"validation_loss\":0.9}\n{\"checkpoint\":\"b\",\"validation_loss\":0.7}\nnot json\n{\"checkpoint\":\"c\",\"validation_loss\":0.8}\n";
        assert_eq!(best_checkpoint(m), Some(("b".to_string(), 0.7, 3)));
    }
}
