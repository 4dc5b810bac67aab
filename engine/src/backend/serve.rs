//! Model servers `mass` starts itself (`[backends.NAME.serve]`): one server
//! per model the run calls live (with `adapter_api`, one for the base model
//! and every adapter loaded into it), started on the first call for that
//! model and kept until the backend is dropped. The base model is served with
//! `command`; a trained model with `adapter_command`, its `{adapter}` the
//! directory of the adapter files (the chosen checkpoint, checked out of
//! the ledger). A replayed call never reaches a server, so replaying,
//! re-judging offline or auditing a run starts none.
//!
//! Each server runs supervised (the `supervise` crate): its output goes to a
//! log file beside the others (the path is in every error), and its whole
//! tree, daemons that left its process group included, ends when the pool
//! is dropped or when `mass` dies however it dies. The logs are removed
//! when the pool ends, unless a server failed to start or died before it
//! was stopped: then they are kept and their directory named on stderr. A server is ready when
//! `ready_path` answers HTTP 200; one that exits first, or is not ready in
//! `start_timeout_secs`, is an infrastructure failure naming its log.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::BackendError;
use crate::config::{expand_placeholders, shell_quote, AdapterApi, ServeParams};
use supervise::{Child, Command};

/// How often a starting server is polled.
const POLL: Duration = Duration::from_millis(250);

/// A running server.
struct Server {
    child: Child,
    base_url: String,
    /// Adapters loaded into it at runtime (`serve.adapter_api`); a
    /// restarted server starts with none.
    loaded: std::collections::BTreeSet<String>,
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
    /// A server failed to start, or died before the pool stopped it: its
    /// log is kept (and named) when the pool ends, not removed.
    failed: std::sync::atomic::AtomicBool,
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
        // Numbered: two pools of one backend name in a process (a worker's
        // two contexts, a fork's rebuilt backend) must not share, or remove,
        // each other's logs.
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let logs =
            std::env::temp_dir().join(format!("mass-serve-{}-{n}-{backend}", std::process::id()));
        ServerPool {
            backend: backend.to_string(),
            params: params.clone(),
            base_model: base_model.to_string(),
            adapters: Mutex::new(BTreeMap::new()),
            servers: tokio::sync::Mutex::new(BTreeMap::new()),
            logs,
            failed: std::sync::atomic::AtomicBool::new(false),
        }
    }

    fn failed(&self, detail: String) -> BackendError {
        self.failed
            .store(true, std::sync::atomic::Ordering::Relaxed);
        BackendError::Failed {
            backend: self.backend.clone(),
            detail,
            retry_after: None,
        }
    }

    /// The directory of the servers' logs (removed when the pool ends
    /// unless a server failed).
    pub fn logs(&self) -> &Path {
        &self.logs
    }

    /// Makes trained model `model` servable from the adapter files in `dir`.
    pub fn register(&self, model: &str, dir: &Path) {
        self.adapters
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(model.to_string(), dir.to_path_buf());
    }

    /// The base URL (`http://127.0.0.1:PORT/v1`) of the server for `model`,
    /// started and waited for if it is not running. With `adapter_api`, a
    /// trained adapter is served by the base model's server, loaded into
    /// it on its first call (and again after that server restarted).
    pub async fn base_url(&self, model: &str) -> Result<String, BackendError> {
        let mut servers = self.servers.lock().await;
        let adapter = self.adapter_dir(model)?;
        if let (Some(dir), Some(api)) = (&adapter, self.params.adapter_api) {
            let base = self.base_model.clone();
            let server = self.running(&mut servers, &base, None).await?;
            if !server.loaded.contains(model) {
                self.load(api, &server.base_url, model, dir).await?;
                server.loaded.insert(model.to_string());
            }
            return Ok(server.base_url.clone());
        }
        let server = self
            .running(&mut servers, model, adapter.as_deref())
            .await?;
        Ok(server.base_url.clone())
    }

    /// The adapter directory of `model`; `None` for the base model.
    fn adapter_dir(&self, model: &str) -> Result<Option<PathBuf>, BackendError> {
        if model == self.base_model {
            return Ok(None);
        }
        let known = self
            .adapters
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(model)
            .cloned();
        known.map(Some).ok_or_else(|| BackendError::UnknownModel {
            backend: self.backend.clone(),
            model: model.to_string(),
        })
    }

    /// The running server named `model`, started if it is not (or no
    /// longer) running.
    async fn running<'a>(
        &self,
        servers: &'a mut BTreeMap<String, Server>,
        model: &str,
        adapter: Option<&Path>,
    ) -> Result<&'a mut Server, BackendError> {
        let alive = match servers.get_mut(model) {
            Some(s) => matches!(s.child.try_wait(), Ok(None)),
            None => false,
        };
        if !alive {
            // It died under the run: take down what it left in its group
            // (its log is kept when the pool ends), then start it again.
            if let Some(mut dead) = servers.remove(model) {
                self.failed
                    .store(true, std::sync::atomic::Ordering::Relaxed);
                kill_group(&mut dead.child);
            }
            let server = self.start(model, adapter).await?;
            servers.insert(model.to_string(), server);
        }
        servers
            .get_mut(model)
            .ok_or_else(|| self.failed(format!("the server for {model} is not in the pool")))
    }

    /// Loads trained adapter `model` (files in `dir`) into the running
    /// server at `base_url`.
    async fn load(
        &self,
        api: AdapterApi,
        base_url: &str,
        model: &str,
        dir: &Path,
    ) -> Result<(), BackendError> {
        let AdapterApi::Vllm = api;
        let url = format!("{base_url}/load_lora_adapter");
        let body = serde_json::json!({"lora_name": model, "lora_path": dir});
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(self.params.start_timeout_secs))
            .build()
            .map_err(|e| self.failed(format!("cannot build the HTTP client: {e}")))?;
        let resp = client
            .post(&url)
            .json(&body)
            .send()
            .await
            .map_err(|e| self.failed(format!("cannot load adapter {model} at {url}: {e}")))?;
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        // Loaded already: a load whose answer this side gave up on may have
        // finished on the server. The name is a content id, so the loaded
        // files are these.
        if status.is_success() || text.contains("already been loaded") {
            return Ok(());
        }
        Err(self.failed(format!(
            "the server at {base_url} did not load adapter {model} from {}: HTTP {status}: {}",
            dir.display(),
            text.chars().take(300).collect::<String>()
        )))
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
        let loaded = std::collections::BTreeSet::new();
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
                    return Ok(Server {
                        child,
                        base_url,
                        loaded,
                    });
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
    /// Stops every server, then removes their logs, unless one of them
    /// failed: then the logs stay, and their directory is named.
    fn drop(&mut self) {
        let mut failed = *self.failed.get_mut();
        let servers = self.servers.get_mut();
        for s in servers.values_mut() {
            // Exited before it was told to: it died under the run.
            failed |= matches!(s.child.try_wait(), Ok(Some(_)));
            kill_group(&mut s.child);
        }
        if !self.logs.exists() {
            return;
        }
        if failed {
            eprintln!(
                "mass: a model server of backend {} failed; its logs are kept in {}",
                self.backend,
                self.logs.display()
            );
        } else {
            let _ = std::fs::remove_dir_all(&self.logs);
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
