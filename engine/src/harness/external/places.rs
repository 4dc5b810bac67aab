//! The directories a re-execution takes, and the check that a recorded
//! path is one mass makes for a rollout: a recording names where its
//! program ran, and a ledger from elsewhere must not make root create files
//! or run a program anywhere else.

use std::path::{Path, PathBuf};

use crate::error::{EngineError, Result};

/// Directories a re-execution takes for its run, given back when it ends:
/// each must not exist (another run may be using it), and the parents it
/// had to create go too.
pub(super) struct Places {
    made: Vec<PathBuf>,
    parents: Vec<PathBuf>,
    marks: Vec<PathBuf>,
}

impl Places {
    /// Directories made fresh for this run (nothing to claim).
    pub(super) fn taken(made: Vec<PathBuf>) -> Places {
        Places {
            made,
            parents: Vec::new(),
            marks: Vec::new(),
        }
    }

    pub(super) fn claim(dirs: &[&Path]) -> Result<Places> {
        let mut p = Places {
            made: Vec::new(),
            parents: Vec::new(),
            marks: Vec::new(),
        };
        for d in dirs {
            if !scratch_shaped(d) {
                return Err(EngineError::recording(
                    "harness output",
                    format!(
                        "the recorded path {} is not one mass makes for a rollout (TMP/mass-work-PID/NAME): refusing to create or run anything there",
                        d.display()
                    ),
                ));
            }
            if d.exists() {
                return Err(EngineError::Invalid(format!(
                    "{} exists: the rollout ran there and re-executes there; it is in use (or left over: remove it and retry)",
                    d.display()
                )));
            }
            let mut missing = Vec::new();
            let mut a = d.parent();
            while let Some(x) = a {
                if x.exists() {
                    break;
                }
                missing.push(x.to_path_buf());
                a = x.parent();
            }
            if let Some(parent) = d.parent() {
                let create = |e| EngineError::io(format!("create {}", parent.display()), e);
                if let Some(up) = parent.parent() {
                    std::fs::create_dir_all(up).map_err(create)?;
                }
                // Made private, or accepted only if it is this user's and
                // no one else can write to it.
                crate::harness::private_dir(parent, 0o711).map_err(create)?;
                // A live run's clean-up of dead processes' scratch roots
                // leaves this one alone while the mark is there.
                let mark = parent.join(crate::harness::claim_mark());
                if !mark.exists() {
                    std::fs::write(&mark, b"")
                        .map_err(|e| EngineError::io(format!("create {}", mark.display()), e))?;
                    p.marks.push(mark);
                }
            }
            p.made.push(d.to_path_buf());
            p.parents.extend(missing);
        }
        Ok(p)
    }
}

/// Whether `p` has the shape of a path mass gives a rollout: an absolute
/// `.../mass-work-PID/NAME` where NAME is a workspace's (hex tag, `-`, a
/// number), optionally followed by `.home` or `.proxy`. A recording naming
/// anything else (a ledger from elsewhere) must not make root create files
/// or run a program there.
fn scratch_shaped(p: &Path) -> bool {
    let (Some(parent), Some(name)) = (p.parent(), p.file_name()) else {
        return false;
    };
    let parent_ok = parent
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix("mass-work-"))
        .is_some_and(|pid| !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()));
    let name = name.to_string_lossy();
    let base = name
        .strip_suffix(".home")
        .or_else(|| name.strip_suffix(".proxy"))
        .unwrap_or(&name);
    let base_ok = base.split_once('-').is_some_and(|(tag, n)| {
        !tag.is_empty()
            && tag.bytes().all(|b| b.is_ascii_hexdigit())
            && !n.is_empty()
            && n.bytes().all(|b| b.is_ascii_digit())
    });
    p.is_absolute() && parent_ok && base_ok
}

impl Drop for Places {
    fn drop(&mut self) {
        for d in &self.made {
            let _ = std::fs::remove_dir_all(d);
        }
        for m in &self.marks {
            let _ = std::fs::remove_file(m);
        }
        // Parents only if nothing else came to live in them.
        for d in &self.parents {
            let _ = std::fs::remove_dir(d);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::scratch_shaped;
    use std::path::Path;

    /// Regression (#24 review): `mass harness-replay` took the workspace and
    /// home paths from the recording, so a ledger from elsewhere could make
    /// root create files and run its command anywhere.
    #[test]
    fn only_paths_mass_makes_for_rollouts_are_replayed_into() {
        for ok in [
            "/tmp/mass-work-12/0123456789abcdef01234567-0",
            "/tmp/mass-work-12/0123456789abcdef01234567-3.home",
            "/var/tmp/x/mass-work-1/ab-12.proxy",
        ] {
            assert!(scratch_shaped(Path::new(ok)), "{ok}");
        }
        for bad in [
            "/etc/systemd/system/x.service.d",
            "/tmp/mass-work-12/../../etc/cron.d",
            "/tmp/mass-work-x/0123-0",
            "/tmp/mass-work-12/0123-0/sub",
            "tmp/mass-work-12/0123-0",
            "/tmp/mass-work-12/zz-0",
            "/tmp/mass-work-12/0123-",
        ] {
            assert!(!scratch_shaped(Path::new(bad)), "{bad}");
        }
    }
}
