//! What the external-harness tests share (tests/external_harness.rs,
//! tests/qwen_code.rs): the scripted OpenAI-compatible server
//! (tests/fixtures/scripted_openai.py) as a child process killed on drop,
//! and the failure text of a `mass` run.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

// The failure text is the run-folder tests' (their `mass` and `ok` go
// unused here).
#[allow(dead_code)]
mod cli;
pub use cli::text;

/// A child process, killed and reaped when dropped (also on a failed
/// assertion).
pub struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The scripted server playing `script` (a file in tests/fixtures) on a
/// free port; its base URL. Its log goes to `dir/server.log`.
pub fn scripted_server(dir: &Path, script: &str) -> (Server, String) {
    scripted_server_dumping(dir, script, None)
}

/// [`scripted_server`], saving each request's headers and body in `dump`.
#[allow(dead_code)] // not every test crate sharing this module dumps
pub fn scripted_server_dumping(dir: &Path, script: &str, dump: Option<&Path>) -> (Server, String) {
    let port_file = dir.join(format!("port-{}", std::process::id()));
    let _ = std::fs::remove_file(&port_file);
    let mut cmd = Command::new("python3");
    cmd.arg(root().join("tests/fixtures/scripted_openai.py"))
        .args(["--port", "0", "--port-file"])
        .arg(&port_file)
        .arg("--script")
        .arg(root().join("tests/fixtures").join(script));
    if let Some(d) = dump {
        cmd.arg("--dump-dir").arg(d);
    }
    let child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::from(
            std::fs::File::create(dir.join("server.log")).expect("server log"),
        ))
        .spawn()
        .expect("python3");
    let server = Server(child);
    let start = Instant::now();
    loop {
        if let Ok(p) = std::fs::read_to_string(&port_file) {
            if !p.trim().is_empty() {
                return (server, format!("http://127.0.0.1:{}/v1", p.trim()));
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the scripted server did not start (see {})",
            dir.join("server.log").display()
        );
        std::thread::sleep(Duration::from_millis(30));
    }
}
