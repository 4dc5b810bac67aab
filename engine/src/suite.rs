//! A run's task suite, recorded in the ledger.
//!
//! A run depends on its tasks as much as on its experiment file: prompts,
//! validators, data and reference solvers decide every workspace, check and
//! verdict. So when a run starts, every task folder under `tasks_dir` (each
//! directory holding a `task.toml`, as [`load_suite`] reads them) is stored as
//! one tree, `<task-id>/...`, and its id goes into the hashed `run.started`.
//! Every session of the run — the first one included — then works on a fresh
//! checkout of that tree, never on the folder it came from: a replay, resume,
//! re-judging or fork gives the same result from any working directory, on a
//! copy of the ledger without the examples, and after the files on disk have
//! been edited. The whole suite is recorded rather than only the selected
//! tasks so that a fork may re-select tasks (`train`/`heldout` overrides).

use std::path::Path;

use ledger::{EntryKind, Id, Ledger, Tree, TreeEntry};

use crate::error::{EngineError, Result};
use crate::task::{Task, TaskError};

/// A recorded suite materialised for one session; the directory is removed
/// when this is dropped.
pub struct SuiteCheckout {
    dir: tempfile::TempDir,
    tree: Id,
}

impl SuiteCheckout {
    /// The directory holding the task folders (use it as `tasks_dir`).
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The recorded tree this checkout holds.
    pub fn tree(&self) -> Id {
        self.tree
    }
}

/// Permission bits as recorded: only "executable or not" is kept (as git
/// does), so the suite's id — and every id after it — does not depend on the
/// umask or file system of the machine the tasks were copied to.
fn normalised_mode(kind: EntryKind, mode: u32) -> u32 {
    match kind {
        EntryKind::File if mode & 0o111 != 0 => 0o755,
        EntryKind::File => 0o644,
        EntryKind::Dir => 0o755,
        EntryKind::Symlink => 0o777,
    }
}

/// Stores the folders of a suite loaded from disk (by [`load_suite`], which
/// has checked every task and reports problems with their paths on disk) as
/// one tree, in one durable batch; returns the tree id.
pub fn record(ledger: &Ledger, suite: &[Task]) -> Result<Id> {
    let mut batch = ledger.batch();
    let mut entries = Vec::new();
    for task in suite {
        // `load_suite` guarantees the folder name is the task id.
        entries.push(TreeEntry {
            path: task.id.clone(),
            kind: EntryKind::Dir,
            mode: 0o755,
            size: 0,
            blob: [0; 32],
        });
        for item in ledger::tree::walk(&task.dir)? {
            let path = format!("{}/{}", task.id, item.rel);
            let (size, blob) = match item.kind {
                EntryKind::Dir => (0, [0; 32]),
                EntryKind::File => {
                    let content = ledger::tree::read_item(&item)?;
                    (content.len() as u64, batch.put_blob(&content)?.0)
                }
                // A link would make the run depend on what it points to on
                // this machine, which is exactly what recording prevents.
                EntryKind::Symlink => {
                    return Err(TaskError::Invalid {
                        path: item.abs,
                        message: "symlinks are not allowed in task folders (a run records its tasks by content); copy the file instead".into(),
                    }
                    .into())
                }
            };
            entries.push(TreeEntry {
                path,
                kind: item.kind,
                mode: normalised_mode(item.kind, item.mode),
                size,
                blob,
            });
        }
    }
    let tree = batch.put_tree(&Tree::new(entries)?)?;
    batch.commit()?;
    Ok(tree)
}

/// Materialises a recorded suite into a fresh temporary directory. `run` names
/// the run in errors.
pub fn checkout(ledger: &Ledger, tree: Id, run: &str) -> Result<SuiteCheckout> {
    let dir = tempfile::Builder::new()
        .prefix("mass-tasks-")
        .tempdir()
        .map_err(|e| EngineError::io("cannot create a directory for the recorded tasks", e))?;
    // The checks run confined as an unprivileged user that must reach
    // them: traverse, not list (a temporary directory is 0700).
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o711),
    )
    .map_err(|e| {
        EngineError::io(
            "cannot open the recorded tasks' directory to the sandbox",
            e,
        )
    })?;
    ledger.checkout(&tree, dir.path()).map_err(|e| {
        EngineError::recording(
            format!("task suite of run {run} (tree {})", tree.short(12)),
            format!("{e}; `mass verify` checks the ledger"),
        )
    })?;
    Ok(SuiteCheckout { dir, tree })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::task::load_suite;
    use std::fs;

    fn rec(l: &Ledger, dir: &Path) -> Id {
        let suite = load_suite(dir).unwrap_or_else(|e| panic!("{e}"));
        record(l, &suite).unwrap_or_else(|e| panic!("{e}"))
    }

    fn write(path: &Path, text: &str) {
        if let Some(p) = path.parent() {
            fs::create_dir_all(p).unwrap_or_else(|e| panic!("{e}"));
        }
        fs::write(path, text).unwrap_or_else(|e| panic!("{e}"));
    }

    fn task(root: &Path, id: &str) {
        let dir = root.join(id);
        write(
            &dir.join("task.toml"),
            &format!(
                "id = \"{id}\"\ndomain = \"finance\"\nsplit = \"train\"\ntitle = \"t\"\ndeliverables = [\"report.md\"]\n"
            ),
        );
        write(&dir.join("prompt.md"), "Do it.\n");
        write(&dir.join("files/data.csv"), "a\n1\n");
        write(&dir.join("solution/solve.py"), "print(1)\n");
    }

    #[test]
    fn records_task_folders_only_and_checks_out_the_same_suite() {
        let src = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        task(src.path(), "a");
        task(src.path(), "b");
        write(&src.path().join("README.md"), "not a task\n");
        write(&src.path().join("notes/x.txt"), "not a task either\n");
        let ld = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let l = Ledger::init(ld.path()).unwrap_or_else(|e| panic!("{e}"));
        let tree = rec(&l, src.path());
        let t = l.get_tree(&tree).unwrap_or_else(|e| panic!("{e}"));
        assert!(t.get("README.md").is_none() && t.get("notes").is_none());
        assert!(t.get("a/solution/solve.py").is_some());
        let co = checkout(&l, tree, "r").unwrap_or_else(|e| panic!("{e}"));
        let suite = load_suite(co.path()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(suite.len(), 2);
        assert_eq!(suite[1].prompt, "Do it.\n");
        assert_eq!(co.tree(), tree);
        // A checkout is a snapshot of the recording, not of the source folder.
        write(&src.path().join("a/prompt.md"), "Changed.\n");
        let again = checkout(&l, tree, "r").unwrap_or_else(|e| panic!("{e}"));
        let a = fs::read_to_string(again.path().join("a/prompt.md"));
        assert_eq!(a.unwrap_or_else(|e| panic!("{e}")), "Do it.\n");
        // And content, not location or permission noise, decides the id.
        assert_ne!(rec(&l, src.path()), tree);
        let path = co.path().to_path_buf();
        drop(co);
        assert!(!path.exists(), "the checkout is removed with its handle");
    }

    #[cfg(unix)]
    #[test]
    fn modes_are_normalised_and_symlinks_refused() {
        use std::os::unix::fs::PermissionsExt;
        let ld = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let l = Ledger::init(ld.path()).unwrap_or_else(|e| panic!("{e}"));
        let mut ids = Vec::new();
        for (file_mode, dir_mode) in [(0o644, 0o755), (0o664, 0o775), (0o600, 0o700)] {
            let src = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
            task(src.path(), "a");
            let set = |p: &Path, m: u32| {
                fs::set_permissions(p, fs::Permissions::from_mode(m))
                    .unwrap_or_else(|e| panic!("{e}"))
            };
            set(&src.path().join("a/prompt.md"), file_mode);
            set(&src.path().join("a/files"), dir_mode);
            ids.push(rec(&l, src.path()));
        }
        assert!(ids.windows(2).all(|w| w[0] == w[1]), "{ids:?}");

        let src = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        task(src.path(), "a");
        std::os::unix::fs::symlink("/etc/hostname", src.path().join("a/solution/link"))
            .unwrap_or_else(|e| panic!("{e}"));
        let suite = load_suite(src.path()).unwrap_or_else(|e| panic!("{e}"));
        let err = record(&l, &suite).map(|_| ()).unwrap_err().to_string();
        assert!(err.contains("symlinks are not allowed"), "{err}");
    }
}
