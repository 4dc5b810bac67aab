//! The tasks an experiment trains on and holds out, resolved against a
//! loaded task suite. This is where the held-out wall is first enforced: a
//! task whose `task.toml` says `split = "heldout"` is refused for training,
//! and the two lists may not overlap.

use std::collections::{BTreeMap, BTreeSet};

use super::validate::Validator;
use super::{quote_list, ConfigError, Experiment};
use crate::task::{Split, Task};

/// The tasks an experiment trains on and holds out, resolved against a suite.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskSelection {
    pub train: Vec<Task>,
    pub heldout: Vec<Task>,
}

impl Experiment {
    /// Resolves the train and held-out task lists against a loaded suite:
    /// defaults come from each task's `split`; every id must exist; a task
    /// whose `task.toml` says `split = "heldout"` may never be trained on
    /// (DESIGN.md invariant 4), and the two lists may not overlap.
    pub fn select_tasks(&self, suite: &[Task]) -> Result<TaskSelection, ConfigError> {
        let mut v = Validator::default();
        let by_id: BTreeMap<&str, &Task> = suite.iter().map(|t| (t.id.as_str(), t)).collect();
        let pick = |key: &str, list: &Option<Vec<String>>, split: Split, v: &mut Validator| {
            match list {
                None => suite
                    .iter()
                    .filter(|t| t.split == split)
                    .cloned()
                    .collect::<Vec<_>>(),
                Some(ids) => ids
                    .iter()
                    .filter_map(|id| match by_id.get(id.as_str()) {
                        Some(t) => Some((*t).clone()),
                        None => {
                            v.add(
                                key,
                                // tasks_dir as written, not the resolved
                                // path: a run's sessions read a temporary
                                // checkout of its recorded suite.
                                format!(
                                    "{key} names task \"{id}\", which is not in the task suite (tasks_dir \"{}\"; known: {})",
                                    self.tasks_dir,
                                    quote_list(&by_id.keys().copied().collect::<Vec<_>>())
                                ),
                            );
                            None
                        }
                    })
                    .collect(),
            }
        };
        let train = pick("train", &self.train, Split::Train, &mut v);
        let heldout = pick("heldout", &self.heldout, Split::Heldout, &mut v);
        for t in &train {
            if t.split == Split::Heldout {
                v.add(
                    "train",
                    format!(
                        "train names task \"{}\", whose task.toml says split = \"heldout\": held-out tasks never enter training",
                        t.id
                    ),
                );
            }
        }
        let train_ids: BTreeSet<&str> = train.iter().map(|t| t.id.as_str()).collect();
        let both: Vec<&str> = heldout
            .iter()
            .map(|t| t.id.as_str())
            .filter(|id| train_ids.contains(id))
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
        if train.is_empty() && v.problems.is_empty() {
            v.add("train", "no train tasks selected");
        }
        if v.problems.is_empty() {
            Ok(TaskSelection { train, heldout })
        } else {
            Err(ConfigError::Invalid {
                origin: self.origin.clone(),
                problems: v.problems,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::config::tests::{examples_dir, minimal};
    use crate::config::Experiment;

    #[test]
    fn example_files_load_from_disk_and_select_tasks() {
        let dir = examples_dir();
        let suite = crate::task::load_suite(&dir.join("tasks")).unwrap_or_else(|e| panic!("{e}"));
        let q = Experiment::load(&dir.join("quickstart.toml")).unwrap_or_else(|e| panic!("{e}"));
        let sel = q.select_tasks(&suite).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(sel.train.len(), 9);
        assert_eq!(sel.heldout.len(), 3);
        let s = Experiment::load(&dir.join("smoke.toml")).unwrap_or_else(|e| panic!("{e}"));
        let sel = s.select_tasks(&suite).unwrap_or_else(|e| panic!("{e}"));
        let ids: Vec<&str> = sel.train.iter().map(|t| t.id.as_str()).collect();
        assert_eq!(ids, ["fin-momentum-backtest", "pha-hill-fit"]);
        assert_eq!(sel.heldout.len(), 1);
    }

    #[test]
    fn select_tasks_guards_heldout() {
        let dir = examples_dir().join("tasks");
        let suite = crate::task::load_suite(&dir).unwrap_or_else(|e| panic!("{e}"));
        let mut e = minimal();
        e.tasks_path = dir.clone();
        e.train = Some(vec!["fin-bond-duration".into()]);
        e.heldout = Some(vec![]);
        let m = e.select_tasks(&suite).map(|_| ()).unwrap_err().to_string();
        assert!(m.contains("split = \"heldout\""), "{m}");
        e.train = Some(vec!["no-such-task".into()]);
        let m = e.select_tasks(&suite).map(|_| ()).unwrap_err().to_string();
        assert!(m.contains("train names task \"no-such-task\""), "{m}");
        // Default train list + an explicit heldout naming a train task overlaps.
        e.train = None;
        e.heldout = Some(vec!["pha-hill-fit".into()]);
        let m = e.select_tasks(&suite).map(|_| ()).unwrap_err().to_string();
        assert!(m.contains("overlap"), "{m}");
    }
}
