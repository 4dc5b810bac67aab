//! Task folders: the research problems a team works on.
//!
//! A task is a directory `<tasks_dir>/<id>/` holding `task.toml` (metadata,
//! machine checks, known flaws), `prompt.md` (the bare task prompt), `files/`
//! (copied into every run's workspace) and `checks/` (the validator, which
//! never enters a workspace: it runs from here, see `checks.rs`). See
//! `examples/tasks/README.md` for the contract.
//!
//! Loading is strict for the same reason as the experiment file: a typo in
//! `task.toml` must not silently change what a run means. Errors name the file
//! and, for TOML problems, the line and column.

use std::fmt;
use std::fs;
use std::io;
use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::toml_error::locate_toml_error;

/// Which side of the train/held-out wall a task is on. Held-out tasks never
/// reach training data, validation or checkpoint selection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Split {
    Train,
    Heldout,
}

impl fmt::Display for Split {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Split::Train => "train",
            Split::Heldout => "heldout",
        })
    }
}

/// A task's research domain (`finance`, `robotics`, `pharmacy`, ...). Kept as
/// free text: the domain only groups results, it changes no behaviour.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Domain(pub String);

impl Domain {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Domain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl PartialEq<str> for Domain {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl PartialEq<&str> for Domain {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

/// A machine check, run from the workspace root.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Check {
    pub name: String,
    pub command: String,
    #[serde(default = "default_check_timeout")]
    pub timeout_secs: u64,
}

fn default_check_timeout() -> u64 {
    60
}

/// A plausible mistake the simulated model can make; `caught_by_checks =
/// false` marks a blind spot only a careful judge notices.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Flaw {
    pub name: String,
    pub description: String,
    pub caught_by_checks: bool,
    /// For a flaw the checks miss: a phrase that `report.md` contains when
    /// the mistake is made (a claim an expert reader recognises as wrong).
    /// The simulated judge looks for it in the workspace its prompt shows,
    /// and notices it as often as its understanding lets it; nothing runs
    /// the solver to find out. The task self-test checks the phrase is in
    /// the flawed report and not in the reference one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evidence: Option<String>,
    /// Literal substrings of the deliverables (`report.md`, `results.json`,
    /// `logs.txt`) that the solver writes whenever this flaw is active, in
    /// any combination with the task's other flaws, and never otherwise: the
    /// trace an expert reader notices (e.g. `1.000 (fixed)` next to a Hill
    /// coefficient that should have been fitted). They are what the
    /// simulated judge can perceive of the flaw; the hidden checks never
    /// reach the judge. `examples/tasks/check_signs.py` verifies them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub signs: Vec<String>,
}

/// The on-disk shape of `task.toml`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TaskToml {
    id: String,
    domain: Domain,
    split: Split,
    title: String,
    deliverables: Vec<String>,
    #[serde(default)]
    protected: Vec<String>,
    /// Whether the team's commands may use the network (default: no).
    #[serde(default)]
    network: bool,
    #[serde(default)]
    checks: Vec<Check>,
    #[serde(default)]
    flaws: Vec<Flaw>,
}

/// A loaded task folder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Task {
    /// The task folder.
    pub dir: PathBuf,
    pub id: String,
    pub domain: Domain,
    pub split: Split,
    pub title: String,
    /// Files the team must produce in the workspace root.
    pub deliverables: Vec<String>,
    /// Workspace files the team must not modify (relative to the workspace).
    pub protected: Vec<String>,
    /// The task declares that its commands need the network.
    pub network: bool,
    pub checks: Vec<Check>,
    pub flaws: Vec<Flaw>,
    /// `prompt.md`, verbatim.
    pub prompt: String,
    /// Files under `files/`: relative, `/`-separated, sorted bytewise.
    pub files: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{}:{line}:{column}: {message}", path.display())]
    Syntax {
        path: PathBuf,
        line: usize,
        column: usize,
        message: String,
    },
    #[error("{}: {message}", path.display())]
    Invalid { path: PathBuf, message: String },
    #[error("task id \"{id}\" is used by both {} and {}", first.display(), second.display())]
    DuplicateId {
        id: String,
        first: PathBuf,
        second: PathBuf,
    },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> TaskError + '_ {
    move |source| TaskError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn invalid(path: &Path, message: impl Into<String>) -> TaskError {
    TaskError::Invalid {
        path: path.to_path_buf(),
        message: message.into(),
    }
}

/// A relative path that stays inside its root: no `..`, no absolute or empty parts.
fn is_safe_relative(p: &str) -> bool {
    !p.is_empty()
        && !p.contains('\\')
        && Path::new(p)
            .components()
            .all(|c| matches!(c, Component::Normal(_)))
}

impl TaskToml {
    /// Reads and parses `task.toml`; TOML errors carry the line and column.
    fn read(toml_path: &Path) -> Result<TaskToml, TaskError> {
        let text = fs::read_to_string(toml_path).map_err(io_err(toml_path))?;
        toml::from_str(&text).map_err(|e| {
            let (line, column, message) = locate_toml_error(&text, &e);
            TaskError::Syntax {
                path: toml_path.to_path_buf(),
                line,
                column,
                message,
            }
        })
    }

    /// Every check of `task.toml` on its own, in the order the first
    /// failing one is reported.
    fn check(&self, dir: &Path, toml_path: &Path) -> Result<(), TaskError> {
        self.check_id(dir, toml_path)?;
        self.check_text(toml_path)?;
        self.check_paths(toml_path)?;
        self.check_checks(toml_path)?;
        self.check_flaws(toml_path)
    }

    fn check_id(&self, dir: &Path, toml_path: &Path) -> Result<(), TaskError> {
        let folder = dir.file_name().map(|n| n.to_string_lossy().into_owned());
        if folder.as_deref() != Some(self.id.as_str()) {
            return Err(invalid(
                toml_path,
                format!(
                    "id \"{}\" must equal the folder name \"{}\"",
                    self.id,
                    folder.unwrap_or_default()
                ),
            ));
        }
        // Ids become path segments, ledger names and dotted keys elsewhere.
        if self.id.is_empty()
            || !self
                .id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(invalid(
                toml_path,
                format!(
                    "id \"{}\" must use only letters, digits, '-' and '_'",
                    self.id
                ),
            ));
        }
        Ok(())
    }

    fn check_text(&self, toml_path: &Path) -> Result<(), TaskError> {
        if self.title.trim().is_empty() {
            return Err(invalid(toml_path, "title must not be empty"));
        }
        if self.domain.0.trim().is_empty() {
            return Err(invalid(toml_path, "domain must not be empty"));
        }
        if self.deliverables.is_empty() {
            return Err(invalid(
                toml_path,
                "deliverables must list at least one file",
            ));
        }
        Ok(())
    }

    fn check_paths(&self, toml_path: &Path) -> Result<(), TaskError> {
        for (key, list) in [
            ("deliverables", &self.deliverables),
            ("protected", &self.protected),
        ] {
            if let Some(bad) = list.iter().find(|p| !is_safe_relative(p)) {
                return Err(invalid(
                    toml_path,
                    format!("{key} entry \"{bad}\" must be a relative path inside the workspace"),
                ));
            }
        }
        Ok(())
    }

    fn check_checks(&self, toml_path: &Path) -> Result<(), TaskError> {
        let mut names = std::collections::BTreeSet::new();
        for (i, c) in self.checks.iter().enumerate() {
            if c.name.trim().is_empty() || c.command.trim().is_empty() {
                return Err(invalid(
                    toml_path,
                    format!("checks[{i}] needs a non-empty name and command"),
                ));
            }
            if c.timeout_secs == 0 {
                return Err(invalid(
                    toml_path,
                    format!("checks[{i}].timeout_secs must be at least 1"),
                ));
            }
            if !names.insert(c.name.as_str()) {
                return Err(invalid(
                    toml_path,
                    format!("check name \"{}\" is used twice", c.name),
                ));
            }
        }
        Ok(())
    }

    fn check_flaws(&self, toml_path: &Path) -> Result<(), TaskError> {
        let mut names = std::collections::BTreeSet::new();
        for f in &self.flaws {
            if !names.insert(f.name.as_str()) {
                return Err(invalid(
                    toml_path,
                    format!("flaw name \"{}\" is used twice", f.name),
                ));
            }
        }
        Ok(())
    }
}

/// `prompt.md`, verbatim; an empty prompt is refused.
fn read_prompt(dir: &Path) -> Result<String, TaskError> {
    let prompt_path = dir.join("prompt.md");
    let prompt = fs::read_to_string(&prompt_path).map_err(io_err(&prompt_path))?;
    if prompt.trim().is_empty() {
        return Err(invalid(&prompt_path, "the prompt is empty"));
    }
    Ok(prompt)
}

/// The files under `files/` (none if it is missing), sorted bytewise.
fn read_files_list(dir: &Path) -> Result<Vec<String>, TaskError> {
    let files_dir = dir.join("files");
    if !files_dir.exists() {
        return Ok(Vec::new());
    }
    let mut files = Vec::new();
    list_files(&files_dir, "", &mut files)?;
    files.sort();
    Ok(files)
}

/// Every protected path must be one of the task's files.
fn check_protected_exist(
    protected: &[String],
    files: &[String],
    toml_path: &Path,
) -> Result<(), TaskError> {
    for p in protected {
        if files.binary_search(p).is_err() {
            return Err(invalid(
                toml_path,
                format!("protected file \"{p}\" does not exist under files/"),
            ));
        }
    }
    Ok(())
}

impl Task {
    /// Loads and checks a task folder.
    pub fn load(dir: &Path) -> Result<Task, TaskError> {
        let toml_path = dir.join("task.toml");
        let meta = TaskToml::read(&toml_path)?;
        meta.check(dir, &toml_path)?;
        let prompt = read_prompt(dir)?;
        let files = read_files_list(dir)?;
        check_protected_exist(&meta.protected, &files, &toml_path)?;
        Ok(Task {
            dir: dir.to_path_buf(),
            id: meta.id,
            domain: meta.domain,
            split: meta.split,
            title: meta.title,
            deliverables: meta.deliverables,
            protected: meta.protected,
            network: meta.network,
            checks: meta.checks,
            flaws: meta.flaws,
            prompt,
            files,
        })
    }

    /// The folder holding the validator (`<dir>/checks`).
    pub fn checks_dir(&self) -> PathBuf {
        self.dir.join("checks")
    }

    /// Copies `files/` into `workspace` (created if missing), preserving
    /// permission bits. Refuses to write through a symlink in the workspace,
    /// so a workspace cannot redirect the copy outside itself. The checks are
    /// not copied: they run from the task folder (see `checks.rs`).
    pub fn copy_files_into(&self, workspace: &Path) -> io::Result<()> {
        let src_root = self.dir.join("files");
        for rel in &self.files {
            copy_one(&src_root.join(rel), &workspace.join(rel))?;
        }
        Ok(())
    }
}

fn copy_one(src: &Path, dst: &Path) -> io::Result<()> {
    if let Some(parent) = dst.parent() {
        fs::create_dir_all(parent)?;
    }
    if let Ok(meta) = fs::symlink_metadata(dst) {
        if meta.file_type().is_symlink() {
            return Err(io::Error::other(format!(
                "refusing to overwrite symlink {}",
                dst.display()
            )));
        }
    }
    // fs::copy also copies the permission bits (e.g. executable scripts).
    fs::copy(src, dst)?;
    Ok(())
}

/// Recursively lists regular files under `dir` as `/`-joined relative paths.
/// Symlinks are rejected: a task folder is data, and a link could pull host
/// files into every workspace.
fn list_files(dir: &Path, prefix: &str, out: &mut Vec<String>) -> Result<(), TaskError> {
    let mut entries = fs::read_dir(dir)
        .map_err(io_err(dir))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(io_err(dir))?;
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let path = entry.path();
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
            return Err(invalid(&path, "file name is not valid UTF-8"));
        };
        let rel = if prefix.is_empty() {
            name
        } else {
            format!("{prefix}/{name}")
        };
        let kind = entry.file_type().map_err(io_err(&path))?;
        if kind.is_symlink() {
            return Err(invalid(&path, "symlinks are not allowed in task folders"));
        } else if kind.is_dir() {
            list_files(&path, &rel, out)?;
        } else if kind.is_file() {
            out.push(rel);
        } else {
            return Err(invalid(&path, "not a regular file or directory"));
        }
    }
    Ok(())
}

/// Loads every task folder (a directory with a `task.toml`) under `tasks_dir`,
/// sorted by id. Other entries (README.md, scripts, hidden folders) are skipped.
pub fn load_suite(tasks_dir: &Path) -> Result<Vec<Task>, TaskError> {
    let mut entries = fs::read_dir(tasks_dir)
        .map_err(io_err(tasks_dir))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(io_err(tasks_dir))?;
    entries.sort_by_key(|e| e.file_name());
    let mut tasks: Vec<Task> = Vec::new();
    for entry in entries {
        let path = entry.path();
        let hidden = entry.file_name().to_string_lossy().starts_with('.');
        if hidden || !path.is_dir() || !path.join("task.toml").is_file() {
            continue;
        }
        tasks.push(Task::load(&path)?);
    }
    if tasks.is_empty() {
        return Err(invalid(
            tasks_dir,
            "no task folders (directories with a task.toml) found",
        ));
    }
    tasks.sort_by(|a, b| a.id.cmp(&b.id));
    // Folder names are unique, and id == folder name, so this only fires on
    // case-insensitive file systems or odd names; cheap to check anyway.
    for pair in tasks.windows(2) {
        if pair[0].id == pair[1].id {
            return Err(TaskError::DuplicateId {
                id: pair[0].id.clone(),
                first: pair[0].dir.clone(),
                second: pair[1].dir.clone(),
            });
        }
    }
    Ok(tasks)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// examples/tasks next to the engine crate, or (when compiled from a
    /// scratch crate) in the main checkout.
    fn suite_dir() -> PathBuf {
        let beside = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/tasks");
        if beside.is_dir() {
            beside
        } else {
            PathBuf::from("/work/main/examples/tasks")
        }
    }

    const TASK_TOML: &str = r#"id = "demo"
domain = "finance"
split = "train"
title = "A demo task"
deliverables = ["report.md"]
protected = ["data/x.csv"]

[[checks]]
name = "validate"
command = "python3 -I \"$MASS_CHECKS/validate.py\""
timeout_secs = 30

[[flaws]]
name = "oops"
description = "does it wrong"
caught_by_checks = false
"#;

    fn write(path: &Path, text: &str) {
        if let Some(p) = path.parent() {
            fs::create_dir_all(p).unwrap_or_else(|e| panic!("{e}"));
        }
        fs::write(path, text).unwrap_or_else(|e| panic!("{e}"));
    }

    /// A minimal valid task folder `<root>/demo`.
    fn demo(root: &Path) -> PathBuf {
        let dir = root.join("demo");
        write(&dir.join("task.toml"), TASK_TOML);
        write(&dir.join("prompt.md"), "# Demo\nDo it.\n");
        write(&dir.join("files/data/x.csv"), "a,b\n1,2\n");
        write(&dir.join("files/README.md"), "readme\n");
        write(&dir.join("checks/validate.py"), "print('SCORE 1/1')\n");
        dir
    }

    fn load_err(dir: &Path) -> String {
        match Task::load(dir) {
            Ok(_) => panic!("expected an error"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn example_suite_loads() {
        let suite = load_suite(&suite_dir()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(suite.len(), 12);
        let ids: Vec<&str> = suite.iter().map(|t| t.id.as_str()).collect();
        let mut sorted = ids.clone();
        sorted.sort();
        assert_eq!(ids, sorted);
        assert_eq!(
            suite.iter().filter(|t| t.split == Split::Heldout).count(),
            3
        );
        for t in &suite {
            assert!(t.checks_dir().join("validate.py").is_file(), "{}", t.id);
            assert!(!t.prompt.is_empty());
            assert_eq!(t.checks.len(), 1);
            assert_eq!(t.flaws.iter().filter(|f| !f.caught_by_checks).count(), 1);
        }
        let arm = suite.iter().find(|t| t.id == "rob-arm-ik");
        let arm = arm.unwrap_or_else(|| panic!("rob-arm-ik missing"));
        assert_eq!(arm.domain, "robotics");
        assert_eq!(
            arm.files,
            [
                "README.md",
                "data/targets.csv",
                "sim/__init__.py",
                "sim/arm.py"
            ]
        );
    }

    #[test]
    fn load_reads_all_parts() {
        let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let t = Task::load(&demo(tmp.path())).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(t.id, "demo");
        assert_eq!(t.domain, Domain("finance".into()));
        assert_eq!(t.split, Split::Train);
        assert_eq!(t.deliverables, ["report.md"]);
        assert_eq!(t.checks[0].timeout_secs, 30);
        assert!(!t.flaws[0].caught_by_checks);
        assert_eq!(t.prompt, "# Demo\nDo it.\n");
        assert_eq!(t.files, ["README.md", "data/x.csv"]);
    }

    #[test]
    fn flaw_signs_are_read() {
        let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let dir = demo(tmp.path());
        let t = Task::load(&dir).unwrap_or_else(|e| panic!("{e}"));
        assert!(t.flaws[0].signs.is_empty(), "signs default to none");
        write(
            &dir.join("task.toml"),
            &format!("{TASK_TOML}signs = [\"1.000 (fixed)\", '\"n_points\": 10,']\n"),
        );
        let t = Task::load(&dir).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(t.flaws[0].signs, ["1.000 (fixed)", "\"n_points\": 10,"]);
        let suite = load_suite(&suite_dir()).unwrap_or_else(|e| panic!("{e}"));
        let hill = suite.iter().find(|t| t.id == "pha-hill-fit");
        let hill = hill.unwrap_or_else(|| panic!("pha-hill-fit missing"));
        let fixed = hill.flaws.iter().find(|f| f.name == "fixed_hill");
        let fixed = fixed.unwrap_or_else(|| panic!("fixed_hill missing"));
        assert_eq!(fixed.signs, ["1.000 (fixed)"]);
        for t in &suite {
            for f in &t.flaws {
                assert!(
                    !f.signs.is_empty(),
                    "{}: flaw {} has no signs",
                    t.id,
                    f.name
                );
            }
        }
    }

    #[test]
    fn toml_errors_are_located() {
        let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let dir = demo(tmp.path());
        write(
            &dir.join("task.toml"),
            &TASK_TOML.replace("timeout_secs = 30", "timeout = 30"),
        );
        let msg = load_err(&dir);
        assert!(
            msg.contains("task.toml:11:1: unknown field \"timeout\""),
            "{msg}"
        );
        write(
            &dir.join("task.toml"),
            &TASK_TOML.replace("\"train\"", "\"test\""),
        );
        let msg = load_err(&dir);
        assert!(msg.contains("task.toml:3:9:"), "{msg}");
        assert!(msg.contains("\"heldout\""), "{msg}");
    }

    #[test]
    fn semantic_errors() {
        let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let dir = demo(tmp.path());
        write(
            &dir.join("task.toml"),
            &TASK_TOML.replace("id = \"demo\"", "id = \"other\""),
        );
        assert!(load_err(&dir).contains("must equal the folder name \"demo\""));
        write(
            &dir.join("task.toml"),
            &TASK_TOML.replace("data/x.csv", "data/missing.csv"),
        );
        assert!(load_err(&dir).contains("protected file \"data/missing.csv\" does not exist"));
        write(
            &dir.join("task.toml"),
            &TASK_TOML.replace("report.md", "../report.md"),
        );
        assert!(load_err(&dir).contains("must be a relative path"));
        write(&dir.join("task.toml"), TASK_TOML);
        write(&dir.join("prompt.md"), "  \n");
        assert!(load_err(&dir).contains("the prompt is empty"));
        fs::remove_file(dir.join("prompt.md")).unwrap_or_else(|e| panic!("{e}"));
        assert!(load_err(&dir).contains("prompt.md"));
    }

    #[cfg(unix)]
    #[test]
    fn symlinks_in_files_are_rejected() {
        let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let dir = demo(tmp.path());
        std::os::unix::fs::symlink("/etc/passwd", dir.join("files/passwd"))
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(load_err(&dir).contains("symlinks are not allowed"));
    }

    #[test]
    fn suite_skips_non_tasks_and_detects_bad_ids() {
        let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        demo(tmp.path());
        write(&tmp.path().join("README.md"), "x");
        fs::create_dir_all(tmp.path().join("notes")).unwrap_or_else(|e| panic!("{e}"));
        let suite = load_suite(tmp.path()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(suite.len(), 1);

        let copy = tmp.path().join("demo2");
        fs::create_dir_all(copy.join("files")).unwrap_or_else(|e| panic!("{e}"));
        write(&copy.join("task.toml"), TASK_TOML);
        write(&copy.join("prompt.md"), "p\n");
        let msg = load_suite(tmp.path()).map(|_| ()).unwrap_err().to_string();
        assert!(
            msg.contains("id \"demo\" must equal the folder name \"demo2\""),
            "{msg}"
        );

        let empty = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let msg = load_suite(empty.path())
            .map(|_| ())
            .unwrap_err()
            .to_string();
        assert!(msg.contains("no task folders"), "{msg}");
    }

    #[test]
    fn duplicate_ids_error_names_both_folders() {
        let e = TaskError::DuplicateId {
            id: "a".into(),
            first: "x/a".into(),
            second: "y/a".into(),
        };
        assert_eq!(e.to_string(), "task id \"a\" is used by both x/a and y/a");
    }

    #[cfg(unix)]
    #[test]
    fn copy_files_preserves_content_and_modes() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let dir = demo(tmp.path());
        write(&dir.join("files/run.sh"), "#!/bin/sh\n");
        fs::set_permissions(dir.join("files/run.sh"), fs::Permissions::from_mode(0o755))
            .unwrap_or_else(|e| panic!("{e}"));
        let t = Task::load(&dir).unwrap_or_else(|e| panic!("{e}"));
        let ws = tmp.path().join("ws");
        t.copy_files_into(&ws).unwrap_or_else(|e| panic!("{e}"));
        let read = |p: &str| fs::read_to_string(ws.join(p)).unwrap_or_else(|e| panic!("{p}: {e}"));
        assert_eq!(read("data/x.csv"), "a,b\n1,2\n");
        assert_eq!(read("README.md"), "readme\n");
        // The validator stays in the task folder.
        assert!(!ws.join("checks").exists());
        let mode = fs::metadata(ws.join("run.sh"))
            .unwrap_or_else(|e| panic!("{e}"))
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o755);

        // A symlink planted in the workspace is not written through.
        let ws2 = tmp.path().join("ws2");
        fs::create_dir_all(&ws2).unwrap_or_else(|e| panic!("{e}"));
        let outside = tmp.path().join("outside.txt");
        std::os::unix::fs::symlink(&outside, ws2.join("README.md"))
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(t.copy_files_into(&ws2).is_err());
        assert!(!outside.exists());
    }
}
