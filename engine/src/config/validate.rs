//! The semantic checks of an experiment that serde cannot express: ranges,
//! names that must refer to something, settings that only make sense
//! together. Every problem names its dotted key, and all of them are
//! collected before any is reported, so a file can be fixed in one pass.

use std::collections::BTreeSet;
use std::path::Path;

use super::{
    expand_placeholders, quote_list, AdapterApi, Backend, ConfigError, Experiment, HarnessKind,
    OpenAiParams, Problem, ServeParams, SimConfig, TrainerKind, SERVE_PLACEHOLDERS,
    TRAINER_PLACEHOLDERS,
};

impl Experiment {
    /// All problems as a list (empty = valid). [`Experiment::validate`] wraps this.
    pub fn problems(&self) -> Vec<Problem> {
        let mut v = Validator::default();
        self.check(&mut v);
        v.problems
    }

    /// Semantic checks that serde cannot express; every problem names its key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let problems = self.problems();
        if problems.is_empty() {
            Ok(())
        } else {
            Err(ConfigError::Invalid {
                origin: self.origin.clone(),
                problems,
            })
        }
    }

    fn check(&self, v: &mut Validator) {
        self.check_sampling(v);
        if self.name.trim().is_empty() {
            v.add("name", "name must not be empty");
        } else if self.name.chars().any(char::is_control) {
            v.add("name", "name must not contain control characters");
        }
        // TOML integers are signed 64-bit: a larger seed could not be written
        // back by canonical_toml.
        if self.seed > i64::MAX as u64 {
            v.add(
                "seed",
                format!("seed ({}) must be at most {}", self.seed, i64::MAX),
            );
        }
        if self.tasks_dir.trim().is_empty() {
            v.add("tasks_dir", "tasks_dir must not be empty");
        }
        if self.cycles == 0 {
            v.add("cycles", "cycles must be at least 1");
        }
        if self.concurrency == 0 {
            v.add("concurrency", "concurrency must be at least 1");
        }
        self.check_task_lists(v);
        self.check_backends(v);
        self.check_roles(v);
        self.check_outer(v);
        self.check_limits(v);
        self.check_trainer(v);
        self.check_harness(v);
    }

    /// `[sampling.ROLE]`: ranges, and a `tool_choice` the team's tools know.
    fn check_sampling(&self, v: &mut Validator) {
        for (role, c) in [
            ("team", &self.sampling.team),
            ("judge", &self.sampling.judge),
            ("optimizer", &self.sampling.optimizer),
        ] {
            if !(0.0..=2.0).contains(&c.temperature) {
                v.add(
                    format!("sampling.{role}.temperature"),
                    format!("sampling.{role}.temperature must be between 0 and 2"),
                );
            }
            if c.max_tokens == 0 {
                v.add(
                    format!("sampling.{role}.max_tokens"),
                    format!("sampling.{role}.max_tokens must be at least 1"),
                );
            }
            if c.top_p.is_some_and(|p| !(p > 0.0 && p <= 1.0)) {
                v.add(
                    format!("sampling.{role}.top_p"),
                    format!("sampling.{role}.top_p must be in (0, 1]"),
                );
            }
            if let Some(tc) = &c.tool_choice {
                let known = ["auto", "none", "required"].contains(&tc.as_str())
                    || crate::tools::tool_defs(true)
                        .iter()
                        .any(|t| t.function.name == *tc);
                if !known {
                    v.add(
                        format!("sampling.{role}.tool_choice"),
                        format!(
                            "sampling.{role}.tool_choice must be auto, none, required or a tool name ({})",
                            crate::tools::tool_defs(true)
                                .iter()
                                .map(|t| t.function.name.as_str())
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    );
                }
            }
        }
    }

    /// An external harness calls its model's server itself, with bodies
    /// `mass` does not write: it cannot select one of llama.cpp's
    /// per-request adapters, so a trained model would be answered by the
    /// base model. Refused before anything is recorded.
    fn check_harness_backend(&self, v: &mut Validator) {
        let name = self.roles.orchestrator.as_str();
        let Some(Backend::OpenAi(p)) = self.backends.get(name) else {
            return;
        };
        if p.serve.as_ref().and_then(|s| s.adapter_api) == Some(AdapterApi::LlamaCpp) {
            v.add(
                "harness.kind",
                format!("harness.kind = \"external\" cannot call the adapters of backends.{name} (serve.adapter_api = \"llama-cpp\"): the harness sends its own requests, which select no adapter, so a trained model would be answered by the base model; serve adapters with serve.adapter_command instead"),
            );
        }
    }

    fn check_harness(&self, v: &mut Validator) {
        let h = &self.harness;
        match h.kind {
            HarnessKind::Builtin => {
                if !h.is_builtin() {
                    v.add(
                        "harness.kind",
                        "[harness] settings only apply to harness.kind = \"external\"",
                    );
                }
            }
            HarnessKind::External => {
                if h.command.trim().is_empty() {
                    v.add(
                        "harness.command",
                        "harness.command is required when harness.kind = \"external\"",
                    );
                } else if let Err(e) = expand_placeholders(&h.command, |name| {
                    ["prompt_file", "workspace", "home", "base_url", "model"]
                        .contains(&name)
                        .then(String::new)
                }) {
                    v.add("harness.command", format!("harness.command: {e}"));
                }
                if h.timeout_secs == 0 {
                    v.add(
                        "harness.timeout_secs",
                        "harness.timeout_secs must be at least 1",
                    );
                }
                // Refused here, before the run records anything: a value in
                // harness.env is part of the recorded experiment and of every
                // harness request, and would reach the sandboxed program.
                for name in h.env.keys().chain(h.pass_env.iter()) {
                    if proxy::scrub::is_secret_name(name) {
                        v.add(
                            "harness.env",
                            format!("harness: {name} is named like a credential: a sandboxed program never gets one (the proxy adds the backend's key upstream); remove it from harness.env / harness.pass_env"),
                        );
                    }
                }
                self.check_harness_backend(v);
                if let Err(e) = proxy::Normaliser::new(&h.normalise) {
                    v.add("harness.normalise", format!("harness.normalise: {e}"));
                }
                if matches!(
                    self.backends.get(&self.roles.orchestrator),
                    Some(Backend::Sim(_))
                ) {
                    v.add(
                        "roles.orchestrator",
                        "roles.orchestrator: an external harness needs an OpenAI-compatible backend (kind = \"openai\"), not the simulation",
                    );
                }
            }
        }
    }

    fn check_task_lists(&self, v: &mut Validator) {
        for (key, list) in [("train", &self.train), ("heldout", &self.heldout)] {
            let Some(list) = list else { continue };
            let mut seen = BTreeSet::new();
            for id in list {
                if id.trim().is_empty() {
                    v.add(key, format!("{key} contains an empty task id"));
                } else if !seen.insert(id) {
                    v.add(key, format!("{key} lists task \"{id}\" twice"));
                }
            }
        }
        if let (Some(train), Some(heldout)) = (&self.train, &self.heldout) {
            let train: BTreeSet<&String> = train.iter().collect();
            let both: Vec<&str> = heldout
                .iter()
                .filter(|id| train.contains(id))
                .map(String::as_str)
                .collect();
            if !both.is_empty() {
                v.add(
                    "heldout",
                    format!(
                        "train and heldout overlap ({}): held-out tasks must never reach training",
                        quote_list(&both)
                    ),
                );
            }
        }
        if self.train.as_ref().is_some_and(Vec::is_empty) {
            v.add("train", "train is empty: at least one train task is needed");
        }
    }

    fn check_backends(&self, v: &mut Validator) {
        if self.backends.is_empty() {
            v.add(
                "backends",
                "at least one backend must be defined under [backends]",
            );
        }
        for (name, backend) in &self.backends {
            let key = format!("backends.{name}");
            // Overrides address backends with dotted keys, so a name must be
            // a single key segment.
            if name.is_empty()
                || !name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            {
                v.add(
                    &key,
                    format!("backend name \"{name}\" must use only letters, digits, '_' and '-'"),
                );
            }
            match backend {
                Backend::Sim(p) => check_sim(&key, p, v),
                Backend::OpenAi(p) => check_openai(&key, p, v),
            }
        }
    }

    fn check_roles(&self, v: &mut Validator) {
        let r = &self.roles;
        let mut named: Vec<(String, &str)> = vec![
            ("roles.orchestrator".into(), r.orchestrator.as_str()),
            ("roles.judge".into(), r.judge.as_str()),
            ("roles.optimizer".into(), r.optimizer.as_str()),
        ];
        if let Some(s) = &r.subagent {
            named.push(("roles.subagent".into(), s.as_str()));
        }
        for (i, e) in r.external_judges.iter().enumerate() {
            named.push((format!("roles.external_judges[{i}]"), e.as_str()));
        }
        for (key, backend) in named {
            if !self.backends.contains_key(backend) {
                let known: Vec<&str> = self.backends.keys().map(String::as_str).collect();
                v.add(
                    &key,
                    format!(
                        "{key} names backend \"{backend}\", which is not defined under [backends] (defined: {})",
                        if known.is_empty() { "none".to_string() } else { quote_list(&known) }
                    ),
                );
            }
        }
        let mut seen = BTreeSet::new();
        for e in &r.external_judges {
            if !seen.insert(e) {
                v.add(
                    "roles.external_judges",
                    format!("roles.external_judges lists \"{e}\" twice"),
                );
            }
        }
    }

    fn check_outer(&self, v: &mut Validator) {
        let o = &self.outer;
        if o.runs_per_task < 2 {
            v.add(
                "outer.runs_per_task",
                format!(
                    "outer.runs_per_task ({}) must be at least 2 to compare runs",
                    o.runs_per_task
                ),
            );
        }
        // A k-regular pairing schedule on n runs exists iff 1 <= k < n and n*k is even.
        let product = u64::from(o.runs_per_task) * u64::from(o.opponents_per_run);
        if o.opponents_per_run == 0 || o.opponents_per_run >= o.runs_per_task || product % 2 != 0 {
            v.add(
                "outer.opponents_per_run",
                format!(
                    "outer.opponents_per_run ({}) must be >= 1 and < runs_per_task ({}), \
                     and runs_per_task * opponents_per_run ({product}) must be even",
                    o.opponents_per_run, o.runs_per_task
                ),
            );
        }
        if !(o.prior.is_finite() && o.prior >= 0.0) {
            v.add(
                "outer.prior",
                format!(
                    "outer.prior ({}) must be a finite number >= 0 (0 = pure MLE)",
                    o.prior
                ),
            );
        }
        if o.train_ranks == 0 {
            v.add("outer.train_ranks", "outer.train_ranks must be at least 1");
        }
        let used = u64::from(o.train_ranks) + u64::from(o.validation_ranks);
        if used > u64::from(o.runs_per_task) {
            v.add(
                "outer.train_ranks",
                format!(
                    "outer.train_ranks + outer.validation_ranks ({used}) exceeds outer.runs_per_task ({})",
                    o.runs_per_task
                ),
            );
        }
        if o.eval_runs == 0 {
            v.add("outer.eval_runs", "outer.eval_runs must be at least 1");
        }
        if o.external_judgments == 0 && !self.roles.external_judges.is_empty() {
            v.add(
                "outer.external_judgments",
                "outer.external_judgments must be at least 1 when roles.external_judges is not empty",
            );
        }
    }

    fn check_limits(&self, v: &mut Validator) {
        let l = &self.limits;
        for (key, value) in [
            ("limits.max_turns", u64::from(l.max_turns)),
            ("limits.max_tokens", l.max_tokens),
            ("limits.tool_timeout_secs", l.tool_timeout_secs),
            ("limits.tool_output_bytes", l.tool_output_bytes),
        ] {
            if value == 0 {
                v.add(key, format!("{key} must be at least 1"));
            }
        }
    }

    fn check_trainer(&self, v: &mut Validator) {
        let t = &self.trainer;
        if t.timeout_secs == 0 {
            v.add(
                "trainer.timeout_secs",
                "trainer.timeout_secs must be at least 1",
            );
        }
        match (t.kind, &t.command) {
            (TrainerKind::Command, None) => v.add(
                "trainer.command",
                "trainer.command is required when trainer.kind = \"command\"",
            ),
            (TrainerKind::Sim, Some(_)) => v.add(
                "trainer.command",
                "trainer.command only applies to trainer.kind = \"command\"",
            ),
            (TrainerKind::Command, Some(cmd)) => {
                if cmd.trim().is_empty() {
                    v.add("trainer.command", "trainer.command must not be empty");
                } else if let Err(e) = expand_placeholders(cmd, |name| {
                    TRAINER_PLACEHOLDERS.contains(&name).then(String::new)
                }) {
                    v.add(
                        "trainer.command",
                        format!(
                            "trainer.command: {e}, expected one of {}",
                            TRAINER_PLACEHOLDERS
                                .iter()
                                .map(|p| format!("\"{{{p}}}\""))
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    );
                }
            }
            (TrainerKind::Sim, None) => {}
        }
        let m = Path::new(&t.metrics_file);
        if t.metrics_file.is_empty()
            || m.is_absolute()
            || m.components()
                .any(|c| !matches!(c, std::path::Component::Normal(_)))
        {
            v.add(
                "trainer.metrics_file",
                format!(
                    "trainer.metrics_file (\"{}\") must be a relative path inside the output directory",
                    t.metrics_file
                ),
            );
        }
    }
}

/// `[backends.NAME.sim]`: every parameter in its range.
fn check_sim(key: &str, p: &SimConfig, v: &mut Validator) {
    let unit = [
        ("skill", p.skill),
        ("delegation", p.delegation),
        ("blind_spot", p.blind_spot),
        ("tampering", p.tampering),
        ("learning_rate", p.learning_rate),
    ];
    for (field, x) in unit {
        if !(0.0..=1.0).contains(&x) {
            v.add(
                format!("{key}.sim.{field}"),
                format!("{key}.sim.{field} ({x}) must be between 0 and 1"),
            );
        }
    }
    if !(p.judge_noise.is_finite() && p.judge_noise >= 0.0) {
        v.add(
            format!("{key}.sim.judge_noise"),
            format!(
                "{key}.sim.judge_noise ({}) must be a finite number >= 0",
                p.judge_noise
            ),
        );
    }
    if !(-1.0..=1.0).contains(&p.position_bias) {
        v.add(
            format!("{key}.sim.position_bias"),
            format!(
                "{key}.sim.position_bias ({}) must be between -1 and 1",
                p.position_bias
            ),
        );
    }
}

/// `[backends.NAME]` of kind `openai`, its `serve` table included.
fn check_openai(key: &str, p: &OpenAiParams, v: &mut Validator) {
    check_base_url(key, &p.base_url, v);
    if p.model.trim().is_empty() {
        v.add(
            format!("{key}.model"),
            format!("{key}.model must not be empty"),
        );
    }
    if let Some(env) = &p.api_key_env {
        check_api_key_env(key, env, v);
    }
    check_openai_request(key, p, v);
    if let Some(serve) = &p.serve {
        check_serve(key, serve, v);
    }
}

/// An http(s) address with a host and no credentials in it.
fn check_base_url(key: &str, base_url: &str, v: &mut Validator) {
    let url = base_url.trim();
    let scheme_rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"));
    match scheme_rest {
        None => v.add(
            format!("{key}.base_url"),
            format!("{key}.base_url must start with http:// or https://"),
        ),
        Some(rest) => {
            let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
            if authority.is_empty() {
                v.add(
                    format!("{key}.base_url"),
                    format!("{key}.base_url has no host"),
                );
            }
            if authority.contains('@') {
                v.add(
                    format!("{key}.base_url"),
                    format!(
                        "{key}.base_url contains credentials: secrets never go in experiment files; use api_key_env"
                    ),
                );
            }
        }
    }
}

/// The name of an environment variable, never a key pasted in its place.
fn check_api_key_env(key: &str, env: &str, v: &mut Validator) {
    let valid = env
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && env.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !valid {
        v.add(
            format!("{key}.api_key_env"),
            format!(
                "{key}.api_key_env must be the NAME of an environment variable (letters, digits, '_'), not the key itself"
            ),
        );
    }
}

/// What each request to the server carries: timeout, sampling, adapter.
fn check_openai_request(key: &str, p: &OpenAiParams, v: &mut Validator) {
    if p.timeout_secs == 0 {
        v.add(
            format!("{key}.timeout_secs"),
            format!("{key}.timeout_secs must be at least 1"),
        );
    }
    if !(0.0..=2.0).contains(&p.temperature) {
        v.add(
            format!("{key}.temperature"),
            format!(
                "{key}.temperature ({}) must be between 0 and 2",
                p.temperature
            ),
        );
    }
    if p.max_tokens == 0 {
        v.add(
            format!("{key}.max_tokens"),
            format!("{key}.max_tokens must be at least 1"),
        );
    }
    if p.lora_adapter
        .as_deref()
        .is_some_and(|s| s.trim().is_empty())
    {
        v.add(
            format!("{key}.lora_adapter"),
            format!("{key}.lora_adapter must not be empty when given"),
        );
    }
}

/// `[backends.NAME.serve]`: its commands, start timeout and ready path.
fn check_serve(key: &str, serve: &ServeParams, v: &mut Validator) {
    let commands = [
        ("command", Some(&serve.command)),
        ("adapter_command", serve.adapter_command.as_ref()),
    ];
    for (name, cmd) in commands {
        let Some(cmd) = cmd else { continue };
        check_serve_command(key, name, cmd, serve.adapter_api, v);
    }
    check_adapter_api(key, serve, v);
    if serve.start_timeout_secs == 0 {
        v.add(
            format!("{key}.serve.start_timeout_secs"),
            format!("{key}.serve.start_timeout_secs must be at least 1"),
        );
    }
    if !serve.ready_path.starts_with('/') {
        v.add(
            format!("{key}.serve.ready_path"),
            format!("{key}.serve.ready_path must start with '/'"),
        );
    }
    // No placeholders; `{{` and `}}` are braces, as in the serve commands.
    if let Some(Err(e)) = serve
        .prompt_tokens_command
        .as_deref()
        .map(|c| expand_placeholders(c, |_| None))
    {
        v.add(
            format!("{key}.serve.prompt_tokens_command"),
            format!("{key}.serve.prompt_tokens_command: {e}; it takes no placeholders (write {{{{ and }}}} for braces)"),
        );
    }
}

/// `serve.adapter_api` beside the keys it replaces or needs: never with
/// `adapter_command` (one of the two would be silently unused); with
/// `"llama-cpp"`, an `adapter_file` inside the adapter's directory.
fn check_adapter_api(key: &str, serve: &ServeParams, v: &mut Validator) {
    if serve.adapter_api.is_some() && serve.adapter_command.is_some() {
        v.add(
            format!("{key}.serve.adapter_command"),
            format!("{key}.serve.adapter_command is not used with adapter_api (adapters are served by the base model's server): remove one of the two"),
        );
    }
    if let Some(file) = &serve.adapter_file {
        let path = std::path::Path::new(file);
        let inside = !file.trim().is_empty()
            && path
                .components()
                .all(|c| matches!(c, std::path::Component::Normal(_)));
        if !inside {
            v.add(
                format!("{key}.serve.adapter_file"),
                format!("{key}.serve.adapter_file must be a relative path inside the adapter's directory, such as \"adapter.gguf\" (got {file:?})"),
            );
        }
        if serve.adapter_api != Some(AdapterApi::LlamaCpp) {
            v.add(
                format!("{key}.serve.adapter_file"),
                format!("{key}.serve.adapter_file is used only with adapter_api = \"llama-cpp\""),
            );
        }
    }
}

/// One serve command (`name` is `command` or `adapter_command`): known
/// placeholders only, `{port}` always, `{adapter}` in the adapter command,
/// `{loras}` in `command` exactly when adapters go to llama.cpp's server.
fn check_serve_command(
    key: &str,
    name: &str,
    cmd: &str,
    api: Option<AdapterApi>,
    v: &mut Validator,
) {
    let mut used = Vec::new();
    let checked = expand_placeholders(cmd, |n| {
        used.push(n.to_string());
        SERVE_PLACEHOLDERS.contains(&n).then(String::new)
    });
    let field = format!("{key}.serve.{name}");
    if cmd.trim().is_empty() {
        v.add(field, format!("{key}.serve.{name} must not be empty"));
    } else if let Err(e) = checked {
        v.add(
            field,
            format!(
                "{key}.serve.{name}: {e}; the placeholders are {}",
                quote_list(
                    &SERVE_PLACEHOLDERS
                        .map(|p| format!("{{{p}}}"))
                        .iter()
                        .map(String::as_str)
                        .collect::<Vec<_>>()
                )
            ),
        );
    } else if !used.iter().any(|u| u == "port") {
        v.add(
            field,
            format!("{key}.serve.{name} must use {{port}}: mass picks the port"),
        );
    } else if name == "adapter_command" && !used.iter().any(|u| u == "adapter") {
        v.add(field, format!("{key}.serve.adapter_command must use {{adapter}}, the directory of the adapter files"));
    } else if let Some(problem) = loras_problem(key, name, &used, api) {
        v.add(field, problem);
    }
}

/// Where `{loras}` is wrong: anywhere but `command`, or in `command`
/// without `adapter_api = "llama-cpp"` (nothing would fill it), or
/// missing from `command` with it (the server would know no adapter).
fn loras_problem(
    key: &str,
    name: &str,
    used: &[String],
    api: Option<AdapterApi>,
) -> Option<String> {
    let has = used.iter().any(|u| u == "loras");
    let llama = api == Some(AdapterApi::LlamaCpp);
    match (name, has, llama) {
        ("command", false, true) => Some(format!(
            "{key}.serve.command must use {{loras}} with adapter_api = \"llama-cpp\": mass puts the adapters' --lora options there"
        )),
        ("command", true, false) => Some(format!(
            "{key}.serve.command uses {{loras}}, which only adapter_api = \"llama-cpp\" fills: set it, or remove {{loras}}"
        )),
        ("command", _, _) | (_, false, _) => None,
        (_, true, _) => Some(format!(
            "{key}.serve.{name} cannot use {{loras}}: only serve.command takes it"
        )),
    }
}

#[derive(Default)]
pub(super) struct Validator {
    pub(super) problems: Vec<Problem>,
}

impl Validator {
    pub(super) fn add(&mut self, key: impl Into<String>, message: impl Into<String>) {
        self.problems.push(Problem {
            key: key.into(),
            message: message.into(),
        });
    }
}

#[cfg(test)]
mod tests {
    use crate::config::tests::{err_text, MINIMAL};
    use crate::config::{ConfigError, Experiment};

    #[test]
    fn semantic_errors_name_keys() {
        let text = format!(
            "{MINIMAL}\n[outer]\nruns_per_task = 12\ntrain_ranks = 15\nvalidation_ranks = 1\nopponents_per_run = 6\n"
        );
        let msg = err_text(&text);
        assert!(
            msg.contains(
                "outer.train_ranks + outer.validation_ranks (16) exceeds outer.runs_per_task (12)"
            ),
            "{msg}"
        );
        let msg = err_text(&format!(
            "{MINIMAL}\n[outer]\nruns_per_task = 7\nopponents_per_run = 3\ntrain_ranks = 5\n"
        ));
        assert!(
            msg.contains("outer.opponents_per_run (3) must be >= 1 and < runs_per_task (7)"),
            "{msg}"
        );
        assert!(msg.contains("must be even"), "{msg}");
        let msg = err_text(&MINIMAL.replace("judge = \"sim\"", "judge = \"foo\""));
        assert!(
            msg.contains(
                "roles.judge names backend \"foo\", which is not defined under [backends]"
            ),
            "{msg}"
        );
        let msg = err_text(&MINIMAL.replace(
            "tasks_dir = \"tasks\"",
            "tasks_dir = \"tasks\"\ntrain = [\"a\", \"b\"]\nheldout = [\"b\"]",
        ));
        assert!(msg.contains("train and heldout overlap (\"b\")"), "{msg}");
        let msg =
            err_text(&MINIMAL.replace("[roles]", "[backends.sim.sim]\nskill = 1.5\n\n[roles]"));
        assert!(
            msg.contains("backends.sim.sim.skill (1.5) must be between 0 and 1"),
            "{msg}"
        );
    }

    #[test]
    fn several_problems_are_reported_together() {
        let text = MINIMAL
            .replace("judge = \"sim\"", "judge = \"foo\"")
            .replace("seed = 7", "seed = 7\ncycles = 0");
        match Experiment::parse(&text, "exp.toml") {
            Err(ConfigError::Invalid { problems, .. }) => {
                let keys: Vec<&str> = problems.iter().map(|p| p.key.as_str()).collect();
                assert_eq!(keys, ["cycles", "roles.judge"]);
            }
            other => panic!("{other:?}"),
        }
    }
}
