//! Where every bench leaves its figures: `target/bench/NAME.json` (under
//! `CARGO_TARGET_DIR` when set), one pretty-printed JSON document per bench,
//! replaced by each run. The keys of each document are listed at the top of
//! the bench that writes it.

use std::path::{Path, PathBuf};

/// The target directory this bench was built for.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"))
}

/// Writes `doc` to `target/bench/NAME.json` and returns the path; a figure
/// that cannot be written is reported, not fatal (the table was printed).
pub fn write(name: &str, doc: &serde_json::Value) -> Option<PathBuf> {
    let dir = target_dir().join("bench");
    let path = dir.join(format!("{name}.json"));
    let text = serde_json::to_string_pretty(doc).ok()? + "\n";
    match std::fs::create_dir_all(&dir).and_then(|_| std::fs::write(&path, text)) {
        Ok(()) => Some(path),
        Err(e) => {
            eprintln!("could not write {}: {e}", path.display());
            None
        }
    }
}
