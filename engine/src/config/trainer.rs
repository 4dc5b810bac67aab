//! `[trainer]`: the training step, the built-in simulated trainer or an
//! external command, and the placeholder expansion and shell quoting its
//! command shares with a backend's `serve` commands and an external
//! harness's command line.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// Placeholders a `[trainer] command` may use.
pub const TRAINER_PLACEHOLDERS: [&str; 6] = [
    "train",
    "validation",
    "base_model",
    "output_dir",
    "hyperparameters",
    "base_adapter",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TrainerKind {
    Sim,
    Command,
}

/// The training step: built-in simulated trainer or an external command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrainerConfig {
    pub kind: TrainerKind,
    /// Shell command with `{train}`, `{validation}`, `{base_model}`, `{output_dir}`
    /// placeholders; `{{` and `}}` stand for literal braces.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// Metrics written by the trainer, relative to the output directory.
    pub metrics_file: String,
    /// Wall-clock limit of one trainer attempt; past it the trainer's
    /// process group is killed and the attempt recorded as an
    /// infrastructure failure (`mass resume` runs it again).
    pub timeout_secs: u64,
    /// Handed to the trainer as a JSON file (the `{hyperparameters}`
    /// placeholder names it) and recorded with the training step.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub hyperparameters: BTreeMap<String, serde_json::Value>,
}

impl Default for TrainerConfig {
    fn default() -> Self {
        TrainerConfig {
            kind: TrainerKind::Sim,
            command: None,
            metrics_file: "metrics.jsonl".into(),
            timeout_secs: 6 * 3600,
            hyperparameters: BTreeMap::new(),
        }
    }
}

/// Values substituted into a trainer command.
#[derive(Debug, Clone, Copy)]
pub struct TrainerArgs<'a> {
    pub train: &'a Path,
    pub validation: &'a Path,
    pub base_model: &'a str,
    pub output_dir: &'a Path,
    pub hyperparameters: &'a Path,
    /// The adapter files of the model being trained when it is itself a
    /// trained adapter (to continue from), or empty for a base model.
    pub base_adapter: Option<&'a Path>,
}

impl TrainerConfig {
    /// The command with placeholders replaced by shell-quoted values (the
    /// command runs through `sh -c`, and paths may contain spaces).
    /// `None` for the simulated trainer.
    pub fn expand_command(&self, args: &TrainerArgs<'_>) -> Option<Result<String, String>> {
        let template = self.command.as_deref()?;
        Some(expand_placeholders(template, |name| {
            let value = match name {
                "train" => args.train.to_string_lossy().into_owned(),
                "validation" => args.validation.to_string_lossy().into_owned(),
                "base_model" => args.base_model.to_string(),
                "output_dir" => args.output_dir.to_string_lossy().into_owned(),
                "hyperparameters" => args.hyperparameters.to_string_lossy().into_owned(),
                "base_adapter" => args
                    .base_adapter
                    .map(|p| p.to_string_lossy().into_owned())
                    .unwrap_or_default(),
                _ => return None,
            };
            Some(shell_quote(&value))
        }))
    }
}

/// Replaces `{name}` using `lookup`; `{{` / `}}` are literal braces. Errors
/// name the unknown placeholder or the unbalanced brace.
pub fn expand_placeholders(
    template: &str,
    mut lookup: impl FnMut(&str) -> Option<String>,
) -> Result<String, String> {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(i) = rest.find(['{', '}']) {
        out.push_str(&rest[..i]);
        let tail = &rest[i..];
        if let Some(after) = tail.strip_prefix("{{") {
            out.push('{');
            rest = after;
        } else if let Some(after) = tail.strip_prefix("}}") {
            out.push('}');
            rest = after;
        } else if tail.starts_with('}') {
            return Err("unmatched \"}\" (write \"}}\" for a literal brace)".into());
        } else {
            let Some(close) = tail.find('}') else {
                return Err("unclosed \"{\" (write \"{{\" for a literal brace)".into());
            };
            let name = &tail[1..close];
            match lookup(name) {
                Some(v) => out.push_str(&v),
                None => return Err(format!("unknown placeholder \"{{{name}}}\"")),
            }
            rest = &tail[close + 1..];
        }
    }
    out.push_str(rest);
    Ok(out)
}

/// POSIX single-quoting, only when needed so simple commands stay readable.
pub fn shell_quote(s: &str) -> String {
    let plain = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-./=:,+@%".contains(c));
    if plain {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::{err_text, minimal, MINIMAL};
    use crate::config::Experiment;

    #[test]
    fn trainer_command_placeholders() {
        let base = format!("{MINIMAL}\n[trainer]\nkind = \"command\"\n");
        let msg = err_text(&base);
        assert!(msg.contains("trainer.command is required"), "{msg}");
        let msg = err_text(&format!("{base}command = \"train --data {{dataset}}\"\n"));
        assert!(msg.contains("unknown placeholder \"{dataset}\""), "{msg}");
        let msg = err_text(&format!("{base}command = \"train {{train\"\n"));
        assert!(msg.contains("unclosed"), "{msg}");
        let e = Experiment::parse(
            &format!(
                "{base}command = \"awk '{{{{print}}}}' {{train}} && lora --val {{validation}} --base {{base_model}} --out {{output_dir}} --config {{hyperparameters}}\"\n"
            ),
            "exp.toml",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let args = TrainerArgs {
            train: Path::new("/d/train.jsonl"),
            validation: Path::new("/d/my val.jsonl"),
            base_model: "Qwen/Qwen3",
            output_dir: Path::new("/o"),
            hyperparameters: Path::new("/d/hp.json"),
            base_adapter: None,
        };
        let cmd = e.trainer.expand_command(&args);
        assert_eq!(
            cmd,
            Some(Ok(
                "awk '{print}' /d/train.jsonl && lora --val '/d/my val.jsonl' --base Qwen/Qwen3 --out /o --config /d/hp.json"
                    .to_string()
            ))
        );
        assert_eq!(minimal().trainer.expand_command(&args), None);
        let msg = err_text(&MINIMAL.replace("[roles]", "[trainer]\ncommand = \"x\"\n\n[roles]"));
        assert!(
            msg.contains("only applies to trainer.kind = \"command\""),
            "{msg}"
        );
    }

    /// A preset of trainers/README.md (the TOML block after `# preset: NAME`).
    fn preset(name: &str) -> String {
        let readme = concat!(env!("CARGO_MANIFEST_DIR"), "/../trainers/README.md");
        let text = std::fs::read_to_string(readme).unwrap_or_else(|e| panic!("{readme}: {e}"));
        let marker = format!("```toml\n# preset: {name}\n");
        let start = text
            .find(&marker)
            .unwrap_or_else(|| panic!("trainers/README.md has no preset {name}"))
            + marker.len();
        let len = text[start..]
            .find("```")
            .unwrap_or_else(|| panic!("unclosed preset {name}"));
        text[start..start + len].to_string()
    }

    /// The MASS reference settings, as trainers/README.md gives them, are
    /// a `[trainer]` setting: they parse, keep their values and reach the
    /// JSON file the engine hands to the trainer (`{hyperparameters}`, the
    /// same map the trainer request records) under the keys lora_sft.py
    /// reads; the definition round-trips.
    #[test]
    fn the_reference_preset_reaches_the_trainer() {
        let text = format!(
            "{MINIMAL}\n[trainer]\nkind = \"command\"\ncommand = \"lora_sft --config {{hyperparameters}}\"\n\n{}",
            preset("mass-reference")
        );
        let e = Experiment::parse(&text, "exp.toml").unwrap_or_else(|e| panic!("{e}"));
        let hp = serde_json::to_value(&e.trainer.hyperparameters).unwrap_or_default();
        let want = serde_json::json!({
            "rank": 64, "alpha": 128, "dropout": 0.05, "learning-rate": 3e-5,
            "lr-scheduler": "cosine", "warmup-steps": 5, "min-lr-ratio": 0.1,
            "adam-beta1": 0.9, "adam-beta2": 0.95,
        });
        assert_eq!(hp, want);
        let again =
            Experiment::parse(&e.definition_toml(), "exp.toml").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(again.definition_toml(), e.definition_toml());
        assert_eq!(again.trainer.hyperparameters, e.trainer.hyperparameters);
    }

    /// examples/real-cpu.toml trains with the README's small CPU preset.
    #[test]
    fn the_cpu_example_uses_the_small_preset() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/real-cpu.toml");
        let example: toml::Table = std::fs::read_to_string(path)
            .unwrap_or_default()
            .parse()
            .unwrap_or_else(|e| panic!("{path}: {e}"));
        let small: toml::Table = preset("cpu-small")
            .parse()
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            example["trainer"]["hyperparameters"], small["trainer"]["hyperparameters"],
            "examples/real-cpu.toml and the cpu-small preset of trainers/README.md differ"
        );
    }
}
