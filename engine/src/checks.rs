//! A task's checks (its validators): where they run and what each reader of
//! their output sees.
//!
//! Validators never live in a workspace. A team's workspace holds the task's
//! `files/` only; the checks run from the task's recorded folder, named to the
//! command as `$MASS_CHECKS`, with a fresh checkout of a recorded workspace
//! tree as the working directory, never the team's live directory, so nothing
//! a team planted (a `checks/hashlib.py`, an edited validator) is what runs,
//! and nothing a validator writes reaches the team's work. Task commands run
//! Python isolated (`python3 -I`: no working directory or user site on
//! `sys.path`). The full output, expected values included, is the rollout's
//! recorded validation (what the judge reads); a team sees [`feedback`]:
//! PASS/FAIL per check name, `HINT` lines a validator chooses to show, and
//! the score.

use std::path::{Path, PathBuf};
use std::time::Duration;

use ledger::{Id, Ledger};

use crate::task::Task;
use crate::tools::{self, BashOptions};

/// The variable that names the task's checks folder to a check command.
pub const CHECKS_VAR: &str = "MASS_CHECKS";

/// Runs every check of `task` on a fresh checkout of `tree` under `scratch`
/// (removed afterwards) and returns their combined output. The error is a
/// sentence for the record (the checkout or a process could not be made).
pub fn run_on_tree(
    ledger: &Ledger,
    task: &Task,
    tree: Id,
    scratch: &Path,
    opts: &BashOptions,
) -> Result<String, String> {
    let copy = ScratchCopy::new(scratch);
    ledger
        .checkout(&tree, &copy.0)
        .map_err(|e| format!("cannot materialise {} for the checks: {e}", tree.short(12)))?;
    close_to_others(&copy.0)?;
    let ws = tools::Workspace::new(&copy.0).map_err(|e| e.to_string())?;
    let checks_dir = task.checks_dir();
    let mut text = String::new();
    for c in &task.checks {
        let mut o = opts.clone();
        o.timeout = Duration::from_secs(c.timeout_secs.max(1));
        // Confined like a team's command, but the copy is read-only, the
        // checks folder readable (at a fixed place: a traceback then names
        // no host path), and there is never a network.
        o.confinement.read_only = true;
        o.confinement.network = false;
        o.confinement.readable.push(checks_dir.clone());
        o.confinement.places.push(sandbox::Place {
            path: checks_dir.clone(),
            at: PathBuf::from(crate::places::CHECKS),
        });
        // The suite's folder (every task's checks and files) cannot be
        // named at its host path, wherever the system temp dir is.
        if let Some(suite) = task
            .dir
            .parent()
            .filter(|p| p.is_absolute() && p.parent().is_some())
        {
            if o.confinement.fixes_paths() {
                o.confinement.hide.push(suite.to_path_buf());
            }
        }
        let seen = o.confinement.seen(&copy.0, &checks_dir);
        o.env
            .push((CHECKS_VAR.into(), seen.to_string_lossy().into_owned()));
        let r = ws.bash(&c.command, &o).map_err(|e| e.to_string())?;
        text.push_str(&r.stdout);
        if !r.stderr.is_empty() {
            text.push_str(&r.stderr);
        }
        if r.timed_out {
            text.push_str(&format!("check {} timed out\n", c.name));
        }
    }
    Ok(text)
}

/// The check copy's top directory can be entered only by the sandbox uid
/// (and root): no other local user may change the tree a check reads while
/// it runs. Without root the harness is that uid already, so 0700 suffices.
fn close_to_others(dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let why = |e: std::io::Error| format!("cannot close the check copy {}: {e}", dir.display());
    if sandbox::probe().root {
        std::os::unix::fs::lchown(dir, Some(sandbox::SANDBOX_ID), Some(sandbox::SANDBOX_ID))
            .map_err(why)?;
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(why)
}

/// A directory removed when dropped (also on an early return).
struct ScratchCopy(PathBuf);

impl ScratchCopy {
    fn new(path: &Path) -> ScratchCopy {
        let _ = std::fs::remove_dir_all(path);
        ScratchCopy(path.to_path_buf())
    }
}

impl Drop for ScratchCopy {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// What a team sees of the checks' output: `PASS name` / `FAIL name` without
/// the detail after the name (which states expected values), `HINT ...`
/// lines, timeouts and the `SCORE k/n` line. Everything else is dropped.
pub fn feedback(output: &str) -> String {
    let mut out = String::new();
    for line in output.lines().map(str::trim) {
        let kept = if let Some(rest) = line
            .strip_prefix("PASS ")
            .or_else(|| line.strip_prefix("FAIL "))
        {
            // Check names never contain spaces; the detail follows ": ".
            let name = rest.split_once(": ").map_or(rest, |(n, _)| n);
            let name = name.split_whitespace().next().unwrap_or("");
            format!("{} {name}", &line[..4])
        } else if line.starts_with("SCORE ")
            || line.starts_with("HINT ")
            || line.ends_with(" timed out")
        {
            line.to_string()
        } else {
            continue;
        };
        out.push_str(&kept);
        out.push('\n');
    }
    if out.is_empty() {
        out.push_str("(the checks printed no result)\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn feedback_never_shows_expected_values() {
        let full = "PASS deliverable:report.md: present\n\
                    FAIL total_return: reported 0.1234, expected 0.0871 (tol 1e-4)\n\
                    Traceback: something mentioning 0.0871\n\
                    HINT the cost model is per unit of turnover\n\
                    SCORE 1/2\n";
        let f = feedback(full);
        assert_eq!(
            f,
            "PASS deliverable:report.md\nFAIL total_return\nHINT the cost model is per unit of turnover\nSCORE 1/2\n"
        );
        assert!(!f.contains("0.0871"));
        assert_eq!(feedback("garbage"), "(the checks printed no result)\n");
    }
}
