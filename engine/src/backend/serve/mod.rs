//! Model servers `mass` starts itself (`[backends.NAME.serve]`): one server
//! per model the run calls live (with `adapter_api`, one for the base model
//! and every adapter: loaded into it through vLLM's API, or given to
//! llama.cpp's server when it starts, see [`llama_cpp`]), started on the
//! first call for that model and kept until the backend is dropped
//! (llama.cpp's: restarted for each new adapter). The base model is served
//! with `command`; without `adapter_api`, a trained model with
//! `adapter_command`, its `{adapter}` the directory of the adapter files
//! (the chosen checkpoint, checked out of the ledger). A replayed call never reaches a server, so replaying,
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

mod llama_cpp;

/// How often a starting server is polled.
const POLL: Duration = Duration::from_millis(250);

/// A running server.
struct Server {
    child: Child,
    base_url: String,
    /// Adapters loaded into it at runtime (`adapter_api = "vllm"`); a
    /// restarted server starts with none.
    loaded: std::collections::BTreeSet<String>,
    /// Adapters it was started with and their ids on it (`adapter_api =
    /// "llama-cpp"`).
    lora_ids: BTreeMap<String, u64>,
    /// Held (shared) by every request in flight to it; a restart takes it
    /// whole, so it waits for them instead of cutting them off.
    gate: std::sync::Arc<tokio::sync::RwLock<()>>,
}

/// Where one request goes: the server's base URL and, on llama.cpp's
/// server with adapters, the `lora` list its body carries. Holding it
/// keeps the server from being restarted under the request.
pub struct Route {
    pub base_url: String,
    pub lora: Option<serde_json::Value>,
    _gate: tokio::sync::OwnedRwLockReadGuard<()>,
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
    /// Sent to llama-server's `GET /lora-adapters` as to the model calls;
    /// never in an error.
    api_key: Option<String>,
    /// llama.cpp: adapters the server could not start with (a missing or
    /// unloadable file), each with the reason; left out of later starts so
    /// the base model and the other adapters stay served.
    broken: Mutex<BTreeMap<String, String>>,
    /// llama.cpp: the adapters of the last server that started.
    good: Mutex<std::collections::BTreeSet<String>>,
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
    pub fn new(
        backend: &str,
        params: &ServeParams,
        base_model: &str,
        api_key: Option<String>,
    ) -> ServerPool {
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
            api_key,
            broken: Mutex::new(BTreeMap::new()),
            good: Mutex::new(Default::default()),
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

    /// The base URL (`http://127.0.0.1:PORT/v1`) of the server for
    /// `model`, for a program that calls it itself (an external harness).
    /// With `adapter_api = "llama-cpp"` only the base model: an adapter
    /// there is chosen by a field of each request body, which such a
    /// program does not send.
    pub async fn base_url(&self, model: &str) -> Result<String, BackendError> {
        Ok(self.external(model).await?.base_url)
    }

    /// [`ServerPool::base_url`] with the route held: while the caller
    /// keeps it, the server is not restarted under the program using it.
    pub async fn external(&self, model: &str) -> Result<Route, BackendError> {
        if self.params.adapter_api == Some(AdapterApi::LlamaCpp) && model != self.base_model {
            return Err(BackendError::Config {
                backend: self.backend.clone(),
                detail: format!(
                    "trained model {model} is served by llama.cpp's per-request adapters (serve.adapter_api = \"llama-cpp\"), which a program calling the server itself does not select: serve adapters with serve.adapter_command for an external harness"
                ),
            });
        }
        self.route(model).await
    }

    /// Where a request for `model` goes, its server started and waited
    /// for if it is not running. With `adapter_api`, a trained adapter is
    /// served by the base model's server: loaded into it on its first call
    /// (vLLM; again after that server restarted), or given to it when it
    /// starts, the server restarted for an adapter it was started without
    /// (llama.cpp).
    pub async fn route(&self, model: &str) -> Result<Route, BackendError> {
        let mut servers = self.servers.lock().await;
        let adapter = self.adapter_dir(model)?;
        let base = self.base_model.clone();
        let (server, lora) = match (self.params.adapter_api, &adapter) {
            (Some(AdapterApi::LlamaCpp), _) => {
                self.refuse_broken(model)?;
                let stale = servers
                    .get(&base)
                    .is_some_and(|s| adapter.is_some() && !s.lora_ids.contains_key(model));
                if stale {
                    self.restart(&mut servers, &base).await;
                }
                let server = self.running(&mut servers, &base, None).await?;
                if adapter.is_some() && !server.lora_ids.contains_key(model) {
                    // Found broken while starting: the server runs without it.
                    self.refuse_broken(model)?;
                    return Err(self.failed(format!("the server did not load adapter {model}")));
                }
                let lora = llama_cpp::request_loras(&server.lora_ids, model);
                (server, lora)
            }
            (Some(AdapterApi::Vllm), Some(dir)) => {
                let server = self.running(&mut servers, &base, None).await?;
                if !server.loaded.contains(model) {
                    self.load(&server.base_url, model, dir).await?;
                    server.loaded.insert(model.to_string());
                }
                (server, None)
            }
            _ => {
                let server = self
                    .running(&mut servers, model, adapter.as_deref())
                    .await?;
                (server, None)
            }
        };
        Ok(Route {
            base_url: server.base_url.clone(),
            lora,
            _gate: server.gate.clone().read_owned().await,
        })
    }

    /// Stops server `name` once the requests in flight to it have ended
    /// (the next [`ServerPool::running`] starts it afresh). A stop asked
    /// for is no failure: its log goes with the others.
    async fn restart(&self, servers: &mut BTreeMap<String, Server>, name: &str) {
        let Some(gate) = servers.get(name).map(|s| s.gate.clone()) else {
            return;
        };
        // Drained before it leaves the pool: a caller that gives up while
        // waiting here (a cancelled item) leaves the server serving.
        let _drained = gate.write_owned().await;
        if let Some(mut old) = servers.remove(name) {
            if matches!(old.child.try_wait(), Ok(Some(_))) {
                // It had died under the run: its log is kept.
                self.failed
                    .store(true, std::sync::atomic::Ordering::Relaxed);
            }
            stop(old.child).await;
        }
    }

    /// The error for a call to adapter `model` that llama.cpp's server
    /// could not load, if it is one.
    fn refuse_broken(&self, model: &str) -> Result<(), BackendError> {
        let broken = self.broken.lock().unwrap_or_else(|p| p.into_inner());
        match broken.get(model) {
            Some(why) => Err(BackendError::Failed {
                backend: self.backend.clone(),
                detail: format!("adapter {model} cannot be served by llama-server: {why}"),
                retry_after: None,
            }),
            None => Ok(()),
        }
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
            if let Some(dead) = servers.remove(model) {
                self.failed
                    .store(true, std::sync::atomic::Ordering::Relaxed);
                stop(dead.child).await;
            }
            let llama = self.params.adapter_api == Some(AdapterApi::LlamaCpp);
            let server = if llama && model == self.base_model {
                self.start_with_adapters(model).await?
            } else {
                self.start(model, adapter, &BTreeMap::new()).await?
            };
            servers.insert(model.to_string(), server);
        }
        servers
            .get_mut(model)
            .ok_or_else(|| self.failed(format!("the server for {model} is not in the pool")))
    }

    /// Loads trained adapter `model` (files in `dir`) into the running
    /// vLLM server at `base_url`.
    async fn load(&self, base_url: &str, model: &str, dir: &Path) -> Result<(), BackendError> {
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

    /// Starts the server for `model` (an adapter's files in `adapter`;
    /// with llama.cpp's adapters, the base model's server with every
    /// adapter registered so far) and waits until it is ready.
    async fn start(
        &self,
        model: &str,
        adapter: Option<&Path>,
        loras: &BTreeMap<String, PathBuf>,
    ) -> Result<Server, BackendError> {
        let template = match adapter {
            None => self.params.command.as_str(),
            Some(_) => self.params.adapter_command.as_deref().ok_or_else(|| BackendError::Config {
                backend: self.backend.clone(),
                detail: format!(
                    "model {model} is a trained adapter, and serve.adapter_command is not set: say how to serve the base model with an adapter"
                ),
            })?,
        };
        let file = self.params.adapter_file();
        let port = free_port().map_err(|e| self.failed(format!("no free port: {e}")))?;
        let line = expand_placeholders(template, |name| match name {
            "port" => Some(port.to_string()),
            "model" => Some(shell_quote(model)),
            "adapter" => Some(shell_quote(
                &adapter
                    .map(|a| a.to_string_lossy().into_owned())
                    .unwrap_or_default(),
            )),
            "loras" => Some(llama_cpp::loras_arg(loras, file)),
            _ => None,
        })
        .map_err(|e| BackendError::Config {
            backend: self.backend.clone(),
            detail: format!("serve command: {e}"),
        })?;
        let (mut child, log_path) = self.spawn(model, &line)?;
        let base_url = format!("http://127.0.0.1:{port}/v1");
        self.wait_ready(model, &mut child, port, &log_path).await?;
        let lora_ids = if self.params.adapter_api == Some(AdapterApi::LlamaCpp) {
            let limit = Duration::from_secs(self.params.start_timeout_secs);
            let origin = llama_cpp::origin(&base_url);
            match llama_cpp::read_ids(origin, loras, file, self.api_key.as_deref(), limit).await {
                Ok(ids) => ids,
                Err(e) => {
                    stop(child).await;
                    return Err(
                        self.failed(format!("{e}; the server's log: {}", log_path.display()))
                    );
                }
            }
        } else {
            BTreeMap::new()
        };
        Ok(Server {
            child,
            base_url,
            loaded: std::collections::BTreeSet::new(),
            lora_ids,
            gate: std::sync::Arc::new(tokio::sync::RwLock::new(())),
        })
    }

    /// Starts llama.cpp's server for the base model with every adapter
    /// registered and not broken. An adapter whose file is missing is
    /// broken at once. When a start with adapters new since the last good
    /// start fails twice (once could be a port taken meanwhile), it is
    /// tried without all of them; if that starts, every one of them is
    /// marked broken with the first error (in the loop one adapter is new
    /// at a time; after a resume, several may be, and a good one goes down
    /// with a bad one), so the base model and the other adapters stay
    /// served.
    async fn start_with_adapters(&self, model: &str) -> Result<Server, BackendError> {
        let file = self.params.adapter_file();
        let mut loras = self
            .adapters
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        {
            let mut broken = self.broken.lock().unwrap_or_else(|p| p.into_inner());
            for (name, path) in llama_cpp::missing(&loras, file) {
                broken.entry(name).or_insert_with(|| {
                    format!("its file {path} is missing (serve.adapter_file names the GGUF inside the adapter's directory)")
                });
            }
            loras.retain(|name, _| !broken.contains_key(name));
        }
        let good = self.good.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let mut known = loras.clone();
        known.retain(|name, _| good.contains(name));
        let fresh: Vec<String> = loras
            .keys()
            .filter(|n| !good.contains(*n))
            .cloned()
            .collect();
        let first = match self.start(model, None, &loras).await {
            Ok(server) => return Ok(self.started(server, &loras)),
            Err(first) if !fresh.is_empty() => first,
            Err(first) => return Err(first),
        };
        if let Ok(server) = self.start(model, None, &loras).await {
            return Ok(self.started(server, &loras));
        }
        let Ok(server) = self.start(model, None, &known).await else {
            return Err(first);
        };
        let mut broken = self.broken.lock().unwrap_or_else(|p| p.into_inner());
        for name in fresh {
            broken.insert(name, format!("the server did not start with it: {first}"));
        }
        drop(broken);
        Ok(self.started(server, &known))
    }

    /// Notes the adapters of a server that started, and hands it back.
    fn started(&self, server: Server, loras: &BTreeMap<String, PathBuf>) -> Server {
        *self.good.lock().unwrap_or_else(|p| p.into_inner()) = loras.keys().cloned().collect();
        server
    }

    /// Runs the server command `line` under supervision, its output to a
    /// log file in the pool's directory.
    fn spawn(&self, model: &str, line: &str) -> Result<(Child, PathBuf), BackendError> {
        std::fs::create_dir_all(&self.logs)
            .map_err(|e| self.failed(format!("{}: {e}", self.logs.display())))?;
        // A server started again (restarted for an adapter, or after it
        // died) logs beside its predecessor, whose log may say why.
        let name = sanitize(model);
        let log_path = (1..)
            .map(|n| match n {
                1 => self.logs.join(format!("{name}.log")),
                n => self.logs.join(format!("{name}.{n}.log")),
            })
            .find(|p| !p.exists())
            .unwrap_or_else(|| self.logs.join(format!("{name}.log")));
        let log = std::fs::File::create(&log_path)
            .map_err(|e| self.failed(format!("{}: {e}", log_path.display())))?;
        let err_log = log
            .try_clone()
            .map_err(|e| self.failed(format!("{}: {e}", log_path.display())))?;
        let mut cmd = Command::new("bash");
        cmd.arg("-c")
            .arg(line)
            .stdin(std::process::Stdio::null())
            .stdout(log)
            .stderr(err_log);
        let child = cmd
            .spawn()
            .map_err(|e| self.failed(format!("cannot start the model server: {e}")))?;
        Ok((child, log_path))
    }

    /// Polls `ready_path` until it answers 200; a server that exits first
    /// or is not ready in time is an error naming its log (and is ended).
    async fn wait_ready(
        &self,
        model: &str,
        child: &mut Child,
        port: u16,
        log_path: &Path,
    ) -> Result<(), BackendError> {
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
                    tail(log_path)
                )));
            }
            if let Ok(r) = client.get(&ready).send().await {
                if r.status().is_success() {
                    return Ok(());
                }
            }
            if started.elapsed() >= limit {
                kill_group(child);
                return Err(self.failed(format!(
                    "the model server for {model} was not ready at {ready} within serve.start_timeout_secs ({} s); its log: {} ({})",
                    self.params.start_timeout_secs,
                    log_path.display(),
                    tail(log_path)
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

/// [`kill_group`] off the runtime's threads (it may wait out the grace
/// period), from async code.
async fn stop(mut child: Child) {
    if let Err(e) = tokio::task::spawn_blocking(move || kill_group(&mut child)).await {
        eprintln!("mass: stopping a model server failed: {e}");
    }
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
