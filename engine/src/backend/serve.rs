//! Model servers `mass` starts itself (`[backends.NAME.serve]`): one server
//! per model the run calls live, started on the first call for that model
//! and kept until the backend is dropped. The base model is served with
//! `command`; a trained model with `adapter_command`, its `{adapter}` the
//! directory of the adapter files (the chosen checkpoint, checked out of
//! the ledger). A replayed call never reaches a server, so replaying,
//! re-judging offline or auditing a run starts none.
//!
//! Each server runs supervised (the `supervise` crate): its output goes to a
//! log file beside the others (the path is in every error), and its whole
//! tree, daemons that left its process group included, ends when the pool
//! is dropped or when `mass` dies however it dies. A server is ready when
//! `ready_path` answers HTTP 200; one that exits first, or is not ready in
//! `start_timeout_secs`, is an infrastructure failure naming its log.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::BackendError;
use crate::config::{expand_placeholders, shell_quote, ServeParams};
use supervise::{Child, Command};

/// How often a starting server is polled.
const POLL: Duration = Duration::from_millis(250);

/// A running server.
struct Server {
    child: Child,
    base_url: String,
}

/// The servers of one backend.
pub struct ServerPool {
    backend: String,
    params: ServeParams,
    base_model: String,
    /// Trained model name -> its adapter directory.
    adapters: Mutex<BTreeMap<String, PathBuf>>,
    servers: tokio::sync::Mutex<BTreeMap<String, Server>>,
    logs: PathBuf,
}

impl std::fmt::Debug for ServerPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerPool")
            .field("backend", &self.backend)
            .field("logs", &self.logs)
            .finish()
    }
}

impl ServerPool {
    pub fn new(backend: &str, params: &ServeParams, base_model: &str) -> ServerPool {
        let logs =
            std::env::temp_dir().join(format!("mass-serve-{}-{backend}", std::process::id()));
        ServerPool {
            backend: backend.to_string(),
            params: params.clone(),
            base_model: base_model.to_string(),
            adapters: Mutex::new(BTreeMap::new()),
            servers: tokio::sync::Mutex::new(BTreeMap::new()),
            logs,
        }
    }

    fn failed(&self, detail: String) -> BackendError {
        BackendError::Failed {
            backend: self.backend.clone(),
            detail,
            retry_after: None,
        }
    }

    /// Makes trained model `model` servable from the adapter files in `dir`.
    pub fn register(&self, model: &str, dir: &Path) {
        self.adapters
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(model.to_string(), dir.to_path_buf());
    }

    /// The base URL (`http://127.0.0.1:PORT/v1`) of the server for `model`,
    /// started and waited for if it is not running.
    pub async fn base_url(&self, model: &str) -> Result<String, BackendError> {
        let mut servers = self.servers.lock().await;
        if let Some(s) = servers.get_mut(model) {
            match s.child.try_wait() {
                Ok(None) => return Ok(s.base_url.clone()),
                // It died since: take down what it left in its group, then
                // start it again below.
                _ => {
                    if let Some(mut dead) = servers.remove(model) {
                        kill_group(&mut dead.child);
                    }
                }
            }
        }
        let adapter = if model == self.base_model {
            None
        } else {
            let known = self
                .adapters
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(model)
                .cloned();
            Some(known.ok_or_else(|| BackendError::UnknownModel {
                backend: self.backend.clone(),
                model: model.to_string(),
            })?)
        };
        let server = self.start(model, adapter.as_deref()).await?;
        let url = server.base_url.clone();
        servers.insert(model.to_string(), server);
        Ok(url)
    }

    async fn start(&self, model: &str, adapter: Option<&Path>) -> Result<Server, BackendError> {
        let template = match adapter {
            None => self.params.command.as_str(),
            Some(_) => self.params.adapter_command.as_deref().ok_or_else(|| BackendError::Config {
                backend: self.backend.clone(),
                detail: format!(
                    "model {model} is a trained adapter, and serve.adapter_command is not set: say how to serve the base model with an adapter"
                ),
            })?,
        };
        let port = free_port().map_err(|e| self.failed(format!("no free port: {e}")))?;
        let line = expand_placeholders(template, |name| match name {
            "port" => Some(port.to_string()),
            "model" => Some(shell_quote(model)),
            "adapter" => Some(shell_quote(
                &adapter
                    .map(|a| a.to_string_lossy().into_owned())
                    .unwrap_or_default(),
            )),
            _ => None,
        })
        .map_err(|e| BackendError::Config {
            backend: self.backend.clone(),
            detail: format!("serve command: {e}"),
        })?;
        std::fs::create_dir_all(&self.logs)
            .map_err(|e| self.failed(format!("{}: {e}", self.logs.display())))?;
        let log_path = self.logs.join(format!("{}.log", sanitize(model)));
        let log = std::fs::File::create(&log_path)
            .map_err(|e| self.failed(format!("{}: {e}", log_path.display())))?;
        let err_log = log
            .try_clone()
            .map_err(|e| self.failed(format!("{}: {e}", log_path.display())))?;
        let mut cmd = Command::new("bash");
        cmd.arg("-c")
            .arg(&line)
            .stdin(std::process::Stdio::null())
            .stdout(log)
            .stderr(err_log);
        let mut child = cmd
            .spawn()
            .map_err(|e| self.failed(format!("cannot start the model server: {e}")))?;
        let base_url = format!("http://127.0.0.1:{port}/v1");
        let ready = format!("http://127.0.0.1:{port}{}", self.params.ready_path);
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .build()
            .map_err(|e| self.failed(format!("cannot build the HTTP client: {e}")))?;
        let started = Instant::now();
        let limit = Duration::from_secs(self.params.start_timeout_secs);
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(self.failed(format!(
                    "the model server for {model} exited with {status} before it was ready; its log: {} ({})",
                    log_path.display(),
                    tail(&log_path)
                )));
            }
            if let Ok(r) = client.get(&ready).send().await {
                if r.status().is_success() {
                    return Ok(Server { child, base_url });
                }
            }
            if started.elapsed() >= limit {
                kill_group(&mut child);
                return Err(self.failed(format!(
                    "the model server for {model} was not ready at {ready} within serve.start_timeout_secs ({} s); its log: {} ({})",
                    self.params.start_timeout_secs,
                    log_path.display(),
                    tail(&log_path)
                )));
            }
            tokio::time::sleep(POLL).await;
        }
    }
}

impl Drop for ServerPool {
    fn drop(&mut self) {
        let servers = self.servers.get_mut();
        for s in servers.values_mut() {
            kill_group(&mut s.child);
        }
    }
}

/// Ends a server's whole tree: SIGTERM, then after the grace period
/// SIGKILL to everything it left behind; returns when nothing is left.
fn kill_group(child: &mut Child) {
    let _ = child.stop();
}

/// A port nobody listens on now (the OS picks it; the server binds it a
/// moment later).
fn free_port() -> std::io::Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

fn sanitize(model: &str) -> String {
    model
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The last lines of a log, for an error message.
fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().rev().take(3).collect();
    lines.into_iter().rev().collect::<Vec<_>>().join(" | ")
}
