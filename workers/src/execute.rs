//! Executing one claimed item on a worker: the context's backends and
//! tasks (built once, the two most recent kept), a scratch partial ledger
//! per item whose missing objects (the task suite, trained adapters, the
//! runs a judgment compares) are fetched from the store when read, the
//! engine's `InProcess` executor, and the push of what the item recorded.
//!
//! Event ids carry no run name, so what a worker records has the ids the
//! coordinator's own recording would have.

use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use engine::backend::Backends;
use engine::error::EngineError;
use engine::task::Task;
use engine::work::{Executor, InProcess};
use ledger::{Id, Ledger};
use remote::Remote;

use crate::error::{Result, WorkError};
use crate::wire::{self, Context, Envelope, Work};

/// The run name a worker records an item under (any name gives the same
/// ids: envelopes carry stream names relative to their run).
pub const RUN: &str = "work";

/// Contexts kept built: a cycle's items share one; the next cycle's
/// adapters make another.
const CONTEXTS: usize = 2;

/// Backends and tasks built for one context.
struct Prepared {
    key: String,
    _suite: engine::suite::SuiteCheckout,
    backends: Backends,
    tasks: Vec<Task>,
}

/// An item's scratch ledger (removed with it).
pub struct ItemLedger {
    _dir: tempfile::TempDir,
    pub ledger: Arc<Ledger>,
}

/// An item's execution in flight: its event when done.
pub type Handle = tokio::task::JoinHandle<engine::error::Result<Id>>;

/// Where a worker keeps its scratch: one directory per process, named with
/// its pid so a later worker can remove what a killed one left.
pub struct Scratch {
    root: tempfile::TempDir,
    prepared: VecDeque<Prepared>,
}

const PREFIX: &str = "mass-worker-";

impl Scratch {
    /// A fresh scratch root; roots of workers no longer alive are removed.
    pub fn new() -> Result<Scratch> {
        engine::backend::checkouts::remove_dead(&std::env::temp_dir(), PREFIX);
        let root = tempfile::Builder::new()
            .prefix(&format!("{PREFIX}{}-", std::process::id()))
            .tempdir()
            .map_err(|e| io("cannot make the worker's scratch directory", e))?;
        std::fs::create_dir_all(root.path().join("idx"))
            .map_err(|e| io("cannot make the worker's index cache", e))?;
        Ok(Scratch {
            root,
            prepared: VecDeque::new(),
        })
    }

    pub fn index_cache(&self) -> PathBuf {
        self.root.path().join("idx")
    }

    /// A scratch ledger fetching what it lacks from `url`.
    pub fn item_ledger(&self, url: &str) -> Result<ItemLedger> {
        let dir = tempfile::Builder::new()
            .prefix("item-")
            .tempdir_in(self.root.path())
            .map_err(|e| io("cannot make an item's scratch ledger", e))?;
        let ledger = Ledger::init(dir.path())?;
        ledger.set_promisor(Arc::new(remote::Fetcher::new(
            url,
            Some(self.index_cache()),
        )));
        Ok(ItemLedger {
            _dir: dir,
            ledger: Arc::new(ledger),
        })
    }

    /// Builds what `env` needs and spawns its execution.
    pub fn start(
        &mut self,
        remote: &Remote,
        url: &str,
        env: &Envelope,
    ) -> Result<(ItemLedger, Handle)> {
        let (backends, tasks) = self.prepare(url, &env.context)?;
        let item = self.item_ledger(url)?;
        let session = replay::Session::new(item.ledger.clone(), RUN, replay::Mode::Live)
            .map_err(EngineError::from)?;
        let exec = InProcess::new(session.clone(), backends, tasks);
        let rt = engine::exec::runtime()?;
        let poison = test_poison(env);
        let handle = match &env.work {
            Work::Rollout(r) => {
                session.set_seed(r.seed);
                let fut = exec.rollout(r.item());
                rt.spawn(async move {
                    test_delay().await;
                    poison?;
                    fut.await.map(|rr| rr.event)
                })
            }
            Work::Judgment(j) => {
                session.set_seed(j.seed);
                let fut = exec.judgment(judgment_item(remote, &item.ledger, j)?);
                rt.spawn(async move {
                    test_delay().await;
                    poison?;
                    fut.await.map(|(id, _)| id)
                })
            }
        };
        Ok((item, handle))
    }

    /// The backends and tasks of `ctx`, built once (the most recent kept).
    fn prepare(&mut self, url: &str, ctx: &Context) -> Result<(Backends, Vec<Task>)> {
        let key = blake3::hash(&serde_json::to_vec(ctx).unwrap_or_default())
            .to_hex()
            .to_string();
        if let Some(i) = self.prepared.iter().position(|p| p.key == key) {
            let p = self.prepared.remove(i).ok_or_else(|| missing("context"))?;
            let out = (p.backends.clone(), p.tasks.clone());
            self.prepared.push_front(p);
            return Ok(out);
        }
        let scratch = self.item_ledger(url)?;
        let l = &scratch.ledger;
        let suite = engine::suite::checkout(l, wire::id_of("context", &ctx.suite)?, RUN)?;
        let tasks = engine::task::load_suite(suite.path()).map_err(EngineError::from)?;
        let backends = Backends::build(&ctx.backends, suite.path())
            .map_err(|e| EngineError::Invalid(e.to_string()))?;
        for a in &ctx.adapters {
            let id = wire::id_of("context", &a.id)?;
            let done = if a.form == "params" {
                backends.register_adapter(&a.backend, &a.model, &l.get_blob(&id)?)
            } else {
                let dir = backends.checkout_adapter(l, &id)?;
                backends.register_adapter_dir(&a.backend, &a.model, &dir, id)
            };
            done.map_err(EngineError::from)?;
        }
        let out = (backends.clone(), tasks.clone());
        self.prepared.push_front(Prepared {
            key,
            _suite: suite,
            backends,
            tasks,
        });
        // Older contexts go (and the servers their backends started).
        self.prepared.truncate(CONTEXTS);
        Ok(out)
    }
}

/// The judgment item, with the two runs pulled (their events; the
/// workspaces come when read).
fn judgment_item(
    remote: &Remote,
    ledger: &Ledger,
    j: &wire::JudgmentWire,
) -> Result<engine::work::JudgmentItem> {
    let (a, b) = (wire::id_of("item", &j.a)?, wire::id_of("item", &j.b)?);
    let heads = BTreeMap::from([("inputs/a".to_string(), a), ("inputs/b".to_string(), b)]);
    let any = |_: &str, _: &ledger::EventEnvelope| Ok(());
    remote::pull_heads(
        ledger,
        remote,
        "work item",
        &heads,
        true,
        &any,
        &remote::Quiet,
    )?;
    Ok(engine::work::JudgmentItem {
        task: j.task.clone(),
        stream: j.stream.clone(),
        a: engine::work::run_ref_of(ledger, a)?,
        b: engine::work::run_ref_of(ledger, b)?,
        swapped: j.swapped,
        judge: j.judge.clone(),
        max_retries: j.max_retries,
        sampling: j.sampling.clone(),
        seed: j.seed,
        shown: j.shown,
    })
}

/// Every stream the item recorded (relative name to head).
pub fn recorded_heads(ledger: &Ledger) -> Result<BTreeMap<String, Id>> {
    let prefix = format!("{RUN}/");
    Ok(ledger
        .refs()?
        .into_iter()
        .filter_map(|(n, id)| n.strip_prefix(&prefix).map(|r| (r.to_string(), id)))
        .collect())
}

/// Test-only: `MASS_WORKER_TEST_ITEM_DELAY_MS=N` makes every item wait N ms
/// before it starts (an item long enough for a lease to matter).
async fn test_delay() {
    let ms = std::env::var("MASS_WORKER_TEST_ITEM_DELAY_MS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok());
    if let Some(ms) = ms {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
}

/// Test-only: `MASS_WORKER_TEST_FAIL_TASK=ID` makes every item of task ID
/// fail when executed on this worker (a poison item: one that fails
/// wherever it runs).
fn test_poison(env: &Envelope) -> engine::error::Result<()> {
    let Ok(task) = std::env::var("MASS_WORKER_TEST_FAIL_TASK") else {
        return Ok(());
    };
    let named = match &env.work {
        Work::Rollout(r) => r.task == task,
        Work::Judgment(j) => j.task == task,
    };
    if named {
        return Err(EngineError::Invalid(format!(
            "task {task} fails on this worker (MASS_WORKER_TEST_FAIL_TASK)"
        )));
    }
    Ok(())
}

fn missing(what: &str) -> WorkError {
    WorkError::Format {
        key: what.into(),
        detail: "vanished from the worker's cache".into(),
    }
}

pub fn io(context: &str, source: std::io::Error) -> WorkError {
    WorkError::Io {
        context: context.into(),
        source,
    }
}
