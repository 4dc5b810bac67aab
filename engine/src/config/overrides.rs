//! `key=value` overrides of an experiment (`--set`, forks, rejudging) and
//! judge files (`mass rejudge --judge FILE.toml`), which become an override
//! that adds their backend. An override set is applied to the experiment's
//! TOML table and the result deserialised and validated again, so an
//! override can never produce an experiment a file could not.

use std::collections::BTreeSet;

use super::{resolve_tasks_dir, Backend, ConfigError, Experiment};
use crate::toml_error::{clean_serde_message, locate_toml_error};

impl Experiment {
    /// Applies one `key=value` override (see [`Experiment::apply_override_set`]).
    pub fn apply_override(&mut self, key: &str, value: &str) -> Result<(), ConfigError> {
        self.apply_override_set(&[(key.to_string(), value.to_string())])
    }

    /// Applies dotted-key overrides (`inner.iterations=3`, `roles.judge=external`,
    /// `backends.sim.sim.skill=0.6`). The value is parsed as a TOML value; if it
    /// is not valid TOML it is taken as a bare string, so `roles.judge=external`
    /// works without quotes. The result is re-validated; on error `self` is unchanged.
    ///
    /// All of `overrides` are set first and the experiment is validated
    /// once, so their order does not matter (a role may name a backend
    /// another override of the same set adds). A key given twice is refused:
    /// which value would win is not something to leave to the order.
    pub fn apply_override_set(
        &mut self,
        overrides: &[(String, String)],
    ) -> Result<(), ConfigError> {
        let mut seen = BTreeSet::new();
        for (k, _) in overrides {
            if !seen.insert(k.trim()) {
                return Err(ConfigError::Override {
                    key: k.trim().to_string(),
                    message: "given twice: give each key once".into(),
                });
            }
        }
        let label = overrides
            .iter()
            .map(|(k, _)| k.trim())
            .collect::<Vec<_>>()
            .join(", ");
        let mut root = toml::Table::try_from(&*self).map_err(|e| ConfigError::Override {
            key: label.clone(),
            message: format!("cannot serialise the current experiment: {e}"),
        })?;
        for (k, v) in overrides {
            insert_override(&mut root, k.trim(), v.trim())?;
        }
        let fail = |message: String| ConfigError::Override {
            key: label.clone(),
            message,
        };
        let mut updated: Experiment = toml::Value::Table(root)
            .try_into()
            .map_err(|e: toml::de::Error| fail(clean_serde_message(e.message())))?;
        updated.origin = self.origin.clone();
        updated.backends_as_written = self.backends_as_written;
        updated.method = self.method;
        // The resolved tasks folder is kept unless the override is of
        // tasks_dir itself: a driver points it at the run's recorded suite,
        // which an unrelated override must not send back to the disk.
        updated.tasks_path = if updated.tasks_dir == self.tasks_dir {
            self.tasks_path.clone()
        } else {
            resolve_tasks_dir(&self.origin, &updated.tasks_dir)
        };
        updated.validate()?;
        *self = updated;
        Ok(())
    }

    /// Applies `key=value` strings as one set (as given on a command line;
    /// see [`Experiment::apply_override_set`]).
    pub fn apply_overrides<'a>(
        &mut self,
        overrides: impl IntoIterator<Item = &'a str>,
    ) -> Result<(), ConfigError> {
        let mut set = Vec::new();
        for item in overrides {
            let Some((key, value)) = item.split_once('=') else {
                return Err(ConfigError::Override {
                    key: item.to_string(),
                    message: "expected key=value".into(),
                });
            };
            set.push((key.trim().to_string(), value.trim().to_string()));
        }
        self.apply_override_set(&set)
    }
}

/// A backend defined on its own in a TOML file (`mass rejudge --judge
/// FILE.toml`): the file holds one `[backends.NAME]` table and nothing else,
/// written as in an experiment file. Returns NAME and the override that adds
/// it (`backends.NAME = { ... }` as an inline table), so the definition is
/// recorded in the fork by value, never as a path.
pub fn backend_override(
    text: &str,
    origin: &str,
) -> Result<(String, (String, String)), ConfigError> {
    let syntax = |line: usize, column: usize, message: String| ConfigError::Syntax {
        origin: origin.to_string(),
        line,
        column,
        message,
    };
    let mut doc: toml::Table = text.parse().map_err(|e: toml::de::Error| {
        let (line, column, message) = locate_toml_error(text, &e);
        syntax(line, column, message)
    })?;
    let shape = || {
        syntax(
            1,
            1,
            "a judge file defines exactly one backend, as a [backends.NAME] table, and nothing else".into(),
        )
    };
    let Some(toml::Value::Table(backends)) = doc.remove("backends") else {
        return Err(shape());
    };
    if !doc.is_empty() || backends.len() != 1 {
        return Err(shape());
    }
    let Some((name, def)) = backends.into_iter().next() else {
        return Err(shape());
    };
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        return Err(syntax(
            1,
            1,
            format!("backend name {name:?}: use letters, digits, '_' and '-' only"),
        ));
    }
    // Checked as a backend now, so a mistake is reported against this file.
    let _: Backend = def.clone().try_into().map_err(|e: toml::de::Error| {
        syntax(
            1,
            1,
            format!("[backends.{name}]: {}", clean_serde_message(e.message())),
        )
    })?;
    let value = def.to_string();
    Ok((name.clone(), (format!("backends.{name}"), value)))
}

/// A TOML value if `value` parses as one, else the raw text as a string.
fn parse_override_value(value: &str) -> toml::Value {
    // Parsing `v = <value>` as a document, and insisting on exactly one key,
    // stops a value like "1\nother = 2" from injecting extra keys.
    if let Ok(mut doc) = format!("v = {value}").parse::<toml::Table>() {
        if doc.len() == 1 {
            if let Some(v) = doc.remove("v") {
                return v;
            }
        }
    }
    toml::Value::String(value.to_string())
}

/// Sets `key` (dotted) to `value` in the experiment's TOML table, creating
/// missing tables (so optional tables, e.g. a new backend's `[sim]`, can be
/// set; deserialisation afterwards rejects anything the schema does not
/// know).
fn insert_override(root: &mut toml::Table, key: &str, value: &str) -> Result<(), ConfigError> {
    let fail = |message: String| ConfigError::Override {
        key: key.to_string(),
        message,
    };
    let segments: Vec<&str> = key.split('.').map(str::trim).collect();
    if segments.iter().any(|s| s.is_empty()) {
        return Err(fail("the key has an empty segment".into()));
    }
    let Some((last, parents)) = segments.split_last() else {
        return Err(fail("the key is empty".into()));
    };
    let mut table = root;
    for (depth, seg) in parents.iter().enumerate() {
        let entry = table
            .entry(seg.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        table = match entry {
            toml::Value::Table(t) => t,
            other => {
                return Err(fail(format!(
                    "{} is a {}, not a table",
                    segments[..=depth].join("."),
                    other.type_str()
                )))
            }
        };
    }
    table.insert(last.to_string(), parse_override_value(value));
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use crate::config::tests::minimal;
    use crate::config::{Acceptance, Backend, ConfigError, SimConfig};

    #[test]
    fn overrides_apply_and_revalidate() {
        let mut e = minimal();
        e.backends
            .insert("external".into(), Backend::Sim(SimConfig::default()));
        e.apply_override("inner.iterations", "3")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(e.inner.iterations, 3);
        e.apply_override("roles.judge", "external")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(e.roles.judge, "external");
        e.apply_override("backends.sim.sim.skill", "0.6")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            e.backend("sim"),
            Some(&Backend::Sim(SimConfig {
                skill: 0.6,
                ..SimConfig::default()
            }))
        );
        e.apply_override("outer.prior", "0")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(e.outer.prior, 0.0);
        e.apply_override("inner.acceptance", "reference-then-champion")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(e.inner.acceptance, Acceptance::ReferenceThenChampion);
        e.apply_override("train", "[\"a\", \"b\"]")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(e.train, Some(vec!["a".to_string(), "b".to_string()]));
        // A tasks folder set by the driver (a recorded suite's checkout)
        // survives other overrides.
        e.tasks_path = PathBuf::from("/checkout");
        e.apply_override("outer.prior", "0.5")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(e.tasks_path, PathBuf::from("/checkout"));
        e.apply_override("tasks_dir", "other")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(e.tasks_path, PathBuf::from("dir/other"));
        e.apply_overrides(["roles.subagent=external", "cycles = 3"])
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(e.roles.subagent_backend(), "external");
        assert_eq!(e.cycles, 3);
    }

    #[test]
    fn bad_overrides_are_clear_and_leave_the_experiment_unchanged() {
        let mut e = minimal();
        let before = e.clone();
        let msg = |r: Result<(), ConfigError>| match r {
            Ok(()) => panic!("expected an error"),
            Err(e) => e.to_string(),
        };
        let m = msg(e.apply_override("inner.iteratons", "3"));
        assert!(
            m.starts_with("override inner.iteratons: unknown field \"iteratons\""),
            "{m}"
        );
        let m = msg(e.apply_override("bogus", "1"));
        assert!(m.contains("unknown field \"bogus\""), "{m}");
        let m = msg(e.apply_override("inner.iterations.x", "1"));
        assert!(
            m.contains("inner.iterations is a integer, not a table"),
            "{m}"
        );
        let m = msg(e.apply_override("inner.iterations", "many"));
        assert!(m.contains("invalid type"), "{m}");
        let m = msg(e.apply_override("roles.judge", "nope"));
        assert!(m.contains("roles.judge names backend \"nope\""), "{m}");
        let m = msg(e.apply_override("backends.sim.api_key", "sk-live-123"));
        assert!(m.contains("secrets never go in experiment files"), "{m}");
        assert!(!m.contains("sk-live-123"), "{m}");
        let m = msg(e.apply_override("inner..x", "1"));
        assert!(m.contains("empty segment"), "{m}");
        let m = msg(e.apply_overrides(["cycles"]));
        assert!(m.contains("expected key=value"), "{m}");
        // Injection of a second key through the value is taken as a string.
        let m = msg(e.apply_override("cycles", "1\nseed = 9"));
        assert!(m.contains("invalid type"), "{m}");
        assert_eq!(e, before);
    }
}
