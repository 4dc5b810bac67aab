//! Guards against tampered work: what is checked on every run's final
//! workspace before the run can be judged, ranked or trained on.
//!
//! The seed articles' central warning is a run that edits what grades it (a
//! robotics team edited the simulator to teleport the box, and the judge
//! approved it). Validators already run outside the workspace (`checks.rs`);
//! these guards look at the work itself, by content, from the recorded trees:
//! a task's protected paths (`protected` in `task.toml`: data files,
//! simulators, provided code) must be byte-identical to the task's own, and a
//! run may change only so many files and bytes outside its deliverables
//! (`[guards]` in the experiment). The result is a `mass.guard` event (the
//! rollout's parent), flagged or not; what a flag does is the experiment's
//! policy (`GuardAction`), applied in the outer loop.

use ledger::{Change, EntryKind, Id, Ledger, Tree};
use schemas::{GuardCheck, Hash32};

use crate::config::GuardsConfig;
use crate::error::Result;
use crate::task::Task;

/// Scratch files the harness hands commands (`TMPDIR`); not the team's work.
const SCRATCH_PREFIX: &str = ".tmp/";

/// Inspects a run's final tree against its initial one (the task's files).
pub fn inspect(
    ledger: &Ledger,
    task: &Task,
    initial: Id,
    final_tree: Id,
    cfg: &GuardsConfig,
) -> Result<GuardCheck> {
    let before = ledger.get_tree(&initial)?;
    let after = ledger.get_tree(&final_tree)?;
    Ok(check_trees(task, &before, &after, initial, final_tree, cfg))
}

/// The pure part of [`inspect`].
pub fn check_trees(
    task: &Task,
    before: &Tree,
    after: &Tree,
    initial: Id,
    final_tree: Id,
    cfg: &GuardsConfig,
) -> GuardCheck {
    let protected_changed: Vec<String> = task
        .protected
        .iter()
        .filter(|p| before.get(p) != after.get(p))
        .cloned()
        .collect();
    let mut changed_files = 0u32;
    let mut changed_bytes = 0u64;
    for c in ledger::tree::diff(before, after) {
        let path = c.path();
        if task.deliverables.iter().any(|d| d == path) || path.starts_with(SCRATCH_PREFIX) {
            continue;
        }
        changed_files = changed_files.saturating_add(1);
        if let Change::Added(e) | Change::Modified { new: e, .. } = &c {
            if e.kind == EntryKind::File {
                changed_bytes = changed_bytes.saturating_add(e.size);
            }
        }
    }
    let mut violations = Vec::new();
    if !protected_changed.is_empty() {
        violations.push(format!(
            "protected files changed: {}",
            protected_changed.join(", ")
        ));
    }
    if changed_files > cfg.max_changed_files {
        violations.push(format!(
            "{changed_files} files changed outside the deliverables (limit {})",
            cfg.max_changed_files
        ));
    }
    if changed_bytes > cfg.max_changed_bytes {
        violations.push(format!(
            "{changed_bytes} bytes changed outside the deliverables (limit {})",
            cfg.max_changed_bytes
        ));
    }
    GuardCheck {
        task: task.id.clone(),
        initial: Hash32(initial.0),
        final_tree: Hash32(final_tree.0),
        protected_changed,
        changed_files,
        changed_bytes,
        violations,
        action: cfg.action.as_str().to_string(),
    }
}
