//! The harness: one team run of a task. An orchestrator conversation with the
//! workspace tools plus `delegate` and `finish`; each delegation is a subagent
//! conversation of the same model in its own stream. Every model call and tool
//! call is an effect, so a run replays from the ledger without touching a model
//! or a process; when a partly recorded run resumes, its workspace is
//! materialised from the last recorded snapshot, never shared with another run.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ledger::{Id, Ledger};
use replay::Stream;
use schemas::{GuardCheck, Hash32, Rollout};
use serde_json::json;

use crate::backend::Backend;
use crate::chat::Message;
use crate::checks;
use crate::config::{GuardsConfig, Limits, SandboxConfig};
use crate::effects::{call_model_unsettled, tool_effect, Conversation, Sampling, ToolOutcome};
use crate::error::{EngineError, Result};
use crate::exec;
use crate::prompts;
use crate::task::Task;
use crate::tools::{self, BashOptions, Invocation};
use crate::workflow::Workflow;

pub mod external;

/// Who plays the team's parts.
#[derive(Clone)]
pub struct Team {
    pub orchestrator: Arc<dyn Backend>,
    pub orchestrator_model: String,
    pub subagent: Arc<dyn Backend>,
    pub subagent_model: String,
    /// How the orchestrator and subagents sample (`[sampling.team]`).
    pub sampling: crate::config::SamplingConfig,
}

/// The experiment's rules for every run: budgets, tamper guards and how
/// commands are confined.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunRules {
    pub limits: Limits,
    pub guards: GuardsConfig,
    pub sandbox: SandboxConfig,
    pub harness: crate::config::HarnessConfig,
    /// The recording driver's method (the orchestrator's prompt depends on it).
    pub method: crate::config::Method,
}

impl RunRules {
    pub fn of(exp: &crate::config::Experiment) -> RunRules {
        RunRules {
            limits: exp.limits.clone(),
            guards: exp.guards.clone(),
            sandbox: exp.sandbox,
            harness: exp.harness.clone(),
            method: exp.method,
        }
    }
}

/// One run to perform.
pub struct RunSpec<'a> {
    pub task: &'a Task,
    pub workflow: &'a Workflow,
    /// Stream name prefix, e.g. `c1/fin-x/collect/07`.
    pub stream: String,
    pub purpose: &'a str,
    pub cycle: u32,
    pub index: u32,
}

/// What a run produced.
#[derive(Debug, Clone)]
pub struct RunOutcome {
    /// The `mass.rollout` event.
    pub event: Id,
    pub record: Rollout,
    /// What the tamper guards found (`violations` empty: not flagged).
    pub guard: GuardCheck,
}

/// The workspace of a run, created on first live use.
pub(crate) struct LiveWorkspace<'a> {
    ledger: Arc<Ledger>,
    task: &'a Task,
    scratch: PathBuf,
    dir: Option<PathBuf>,
    /// `dir` opened as a workspace (its root canonicalised), made with it:
    /// opening it per tool call cost a `readlink` per path component and
    /// was 2.5% of a recording's CPU (`benches/orchestration.rs`).
    opened: Option<tools::Workspace>,
    /// The tree the live directory currently holds (if created).
    dir_tree: Option<Id>,
    /// The latest recorded tree of this run.
    last_tree: Option<Id>,
    /// How much a snapshot of it may hold (`[sandbox]`).
    limits: ledger::tree::SnapshotLimits,
}

impl<'a> LiveWorkspace<'a> {
    pub(crate) fn new(
        session: &replay::Session,
        spec: &RunSpec<'a>,
        rules: &RunRules,
    ) -> LiveWorkspace<'a> {
        LiveWorkspace {
            limits: rules.sandbox.snapshot_limits(),
            ledger: session.ledger().clone(),
            task: spec.task,
            scratch: scratch_dir(session.run(), &spec.stream),
            dir: None,
            opened: None,
            dir_tree: None,
            last_tree: None,
        }
    }

    /// The live directory as a workspace for the file tools and `bash`
    /// ([`ensure`](Self::ensure)d first).
    pub(crate) fn open(&mut self) -> std::result::Result<tools::Workspace, String> {
        let dir = self.ensure()?;
        // Still a directory (one `stat`, not the `readlink`s): a command of
        // an unconfined run may have removed the root, and then the call
        // fails as it did when the root was opened per call, instead of a
        // `write_file` recreating an empty root and recording its tree.
        if let Some(w) = &self.opened {
            if std::fs::metadata(w.root()).is_ok_and(|m| m.is_dir()) {
                return Ok(w.clone());
            }
            self.opened = None;
        }
        let w = tools::Workspace::new(&dir).map_err(|e| e.to_string())?;
        self.opened = Some(w.clone());
        Ok(w)
    }

    pub(crate) fn ensure(&mut self) -> std::result::Result<PathBuf, String> {
        if let (Some(d), true) = (&self.dir, self.dir_tree == self.last_tree) {
            return Ok(d.clone());
        }
        self.opened = None;
        if let Some(d) = self.dir.take() {
            let _ = std::fs::remove_dir_all(&d);
        }
        let d = self.scratch.clone();
        let _ = std::fs::remove_dir_all(&d);
        ensure_scratch_root()
            .map_err(|e| format!("cannot create {}: {e}", scratch_root().display()))?;
        match self.last_tree {
            Some(t) => exec::ledger(|| self.ledger.checkout(&t, &d))
                .map_err(|e| format!("cannot materialise workspace {}: {e}", t.short(12)))?,
            None => {
                std::fs::create_dir_all(&d).map_err(|e| e.to_string())?;
                self.task
                    .copy_files_into(&d)
                    .map_err(|e| format!("cannot copy task files: {e}"))?;
            }
        }
        self.dir = Some(d.clone());
        self.dir_tree = self.last_tree;
        Ok(d)
    }

    /// Where the checks get their copy of a tree: beside the workspace, never
    /// inside it.
    fn checks_scratch(&self) -> PathBuf {
        let mut name = self.scratch.as_os_str().to_owned();
        name.push(".checks");
        PathBuf::from(name)
    }

    /// Stores the live directory as a tree. Called only inside a tool
    /// effect's `perform`: the tool's record, committed next, links the
    /// tree, so the tree is not waited for here. Groups become durable in
    /// order, so once that record is durable the tree is too. Nothing
    /// reads the tree back before then: the live directory holds it (`ensure`
    /// checks out only trees served from history), and the checks that
    /// read the final tree start with a journaled commit, awaited.
    pub(crate) fn snapshot(&mut self) -> std::result::Result<Id, String> {
        let d = self.dir.clone().ok_or("no workspace")?;
        let t = exec::ledger(|| {
            let mut b = self.ledger.batch();
            let t = b.snapshot_dir_limited(&d, self.limits)?;
            drop(b.submit()?);
            Ok::<_, ledger::LedgerError>(t)
        })
        .map_err(|e| format!("snapshot failed: {e}"))?;
        self.dir_tree = Some(t);
        Ok(t)
    }

    /// Notes the tree a recorded step left; a live directory that does not
    /// hold it is re-materialised on its next use (see `ensure`).
    pub(crate) fn record_tree(&mut self, t: Option<Id>) {
        if let Some(t) = t {
            self.last_tree = Some(t);
        }
    }
}

impl Drop for LiveWorkspace<'_> {
    fn drop(&mut self) {
        if let Some(d) = &self.dir {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

/// Where live workspaces are created: one directory per `mass` process
/// that others may traverse but not list (mode 0711), in which every
/// workspace, home and check copy gets a name no one can guess. Sandboxed
/// commands see none of it but their own (`Confinement::hide`).
pub fn scratch_root() -> PathBuf {
    std::env::temp_dir().join(format!("mass-work-{}", std::process::id()))
}

/// Creates the scratch root (mode 0711, this process's) if it is missing,
/// and refuses one that is not safely ours: a directory another user made
/// (or a symlink planted) at the predictable path before this process
/// created it would let that user list, read, replace or race everything
/// under it, the root-run steps included.
fn ensure_scratch_root() -> std::io::Result<()> {
    private_dir(&scratch_root(), 0o711)
}

/// Makes `dir` with `mode` (exactly: set through the open directory, not
/// by path, whatever the umask), or accepts an existing one only if it is
/// a real directory owned by this process's user that no one else may
/// write to.
pub(crate) fn private_dir(dir: &Path, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {
            let f = std::fs::File::open(dir)?;
            // The fd is the directory just made: a swap after `mkdir` fails
            // the ownership check below instead of moving the chmod.
            f.set_permissions(std::fs::Permissions::from_mode(mode))?;
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let m = std::fs::symlink_metadata(dir)?;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if !m.is_dir() || m.uid() != me || m.mode() & 0o022 != 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!(
                "{} exists but is not a private directory of this user (owner uid {}, mode {:o}): another user may have made it; remove it and retry",
                dir.display(),
                m.uid(),
                m.mode() & 0o7777
            ),
        ));
    }
    Ok(())
}

/// Removes what dead `mass` processes left in the system temp dir: their
/// scratch roots (`mass-work-PID`: workspaces, homes, proxy sockets and
/// check copies of rollouts that never finished) and their model servers'
/// logs (`mass-serve-PID-*`). Only directories named for a pid that no
/// longer runs (a pid now used by another process keeps its directory: it
/// cannot be told apart), and none a live process claimed. Nothing in them is recorded: the ledger holds
/// every snapshot a run took. Returns what was removed.
pub fn clean_stale_scratch() -> Vec<PathBuf> {
    let tmp = std::env::temp_dir();
    let Ok(entries) = std::fs::read_dir(&tmp) else {
        return Vec::new();
    };
    let mut removed = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let pid = name
            .strip_prefix("mass-work-")
            .or_else(|| name.strip_prefix("mass-serve-"))
            .and_then(|rest| rest.split('-').next())
            .and_then(|p| p.parse::<u32>().ok());
        let Some(pid) = pid else { continue };
        let is_dir = e.file_type().map(|t| t.is_dir()).unwrap_or(false);
        if !is_dir || alive(pid) || claimed(&e.path()) {
            continue;
        }
        if std::fs::remove_dir_all(e.path()).is_ok() {
            removed.push(e.path());
        }
    }
    removed
}

fn alive(pid: u32) -> bool {
    pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists()
}

/// The name of the file a process that reuses a dead process's scratch root
/// (`mass harness-replay`, at the recorded paths) leaves in it while it
/// works there.
pub(crate) fn claim_mark() -> String {
    format!(".claimed-by-{}", std::process::id())
}

/// Whether a live process claimed `dir` (see [`claim_mark`]).
fn claimed(dir: &Path) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    entries.flatten().any(|e| {
        e.file_name()
            .to_string_lossy()
            .strip_prefix(".claimed-by-")
            .and_then(|p| p.parse::<u32>().ok())
            .is_some_and(alive)
    })
}

/// A fresh directory name for one run's workspace: unique within the process
/// even when several sessions run the same stream names at once, and not
/// guessable (a random part). The path is never part of what is recorded.
fn scratch_dir(run: &str, stream: &str) -> PathBuf {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    static NONCE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    // Unguessable where the kernel gives randomness; unique regardless.
    let nonce = NONCE.get_or_init(|| {
        random_hex().unwrap_or_else(|_| format!("{:?}", std::time::SystemTime::now()))
    });
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tag = blake3::hash(format!("{nonce}/{run}/{stream}/{n}").as_bytes()).to_hex();
    scratch_root().join(format!("{}-{n}", &tag[..24]))
}

/// A fresh, empty directory name in this process's scratch root (made if
/// missing), for a unit that runs outside a session (a re-execution).
pub(crate) fn fresh_scratch(run: &str, stream: &str) -> std::io::Result<PathBuf> {
    ensure_scratch_root()?;
    Ok(scratch_dir(run, stream))
}

/// 16 bytes from the kernel's random source (`getrandom(2)`), as hex.
fn random_hex() -> std::io::Result<String> {
    let mut b = [0u8; 16];
    let mut got = 0;
    while got < b.len() {
        // SAFETY: writes at most the remaining length into `b`.
        let n = unsafe { libc::getrandom(b[got..].as_mut_ptr().cast(), b.len() - got, 0) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(e);
            }
            continue;
        }
        got += n as usize;
    }
    Ok(hex::encode(b))
}

/// A fresh token for one rollout's proxy route: what its program gets as
/// `OPENAI_API_KEY` in place of a key. It opens that route only, and only
/// while the rollout runs.
pub(crate) fn rollout_token() -> std::io::Result<String> {
    Ok(format!("mass-rollout-{}", random_hex()?))
}

struct Budget {
    turns_left: u32,
    tokens_left: i64,
    prompt_tokens: u64,
    completion_tokens: u64,
    turns: u32,
}

enum Halt {
    Turns,
    Tokens,
    /// The server rejected a request for good (e.g. the conversation outgrew
    /// its context): this run ends, the experiment goes on.
    Rejected(String),
}

/// Runs a team on a task and records the outcome as a `mass.rollout` event at
/// the end of the orchestrator's stream.
pub async fn run_team(
    session: &replay::Session,
    spec: &RunSpec<'_>,
    team: &Team,
    rules: &RunRules,
) -> Result<RunOutcome> {
    let limits = &rules.limits;
    if rules.harness.kind == crate::config::HarnessKind::External {
        return external::run(session, spec, team, rules).await;
    }
    let mut orch = exec::ledger(|| session.stream(&format!("{}/orch", spec.stream)))?;
    let mut ws = LiveWorkspace::new(session, spec, rules);
    let initial = initial_snapshot(&mut orch, &mut ws, spec).await?;
    let mut play = Orchestration {
        session,
        spec,
        team,
        limits,
        bash_opts: command_options(spec, rules),
        budget: Budget {
            turns_left: limits.max_turns,
            tokens_left: limits.max_tokens as i64,
            prompt_tokens: 0,
            completion_tokens: 0,
            turns: 0,
        },
        subagents: Vec::new(),
        report: String::new(),
        system: prompts::orchestrator_system(rules.method.legacy()),
    };
    let ending = play.turns(&mut orch, &mut ws).await?;
    let (status, detail) = status_of(ending, limits);
    let played = Played {
        status,
        detail,
        report: play.report,
        orchestrator: None,
        subagents: play.subagents,
        turns: play.budget.turns,
        prompt_tokens: play.budget.prompt_tokens,
        completion_tokens: play.budget.completion_tokens,
    };
    close_run(&mut orch, &mut ws, spec, team, rules, initial, played).await
}

/// How the note that opens a rollout or judgment never executed begins.
pub const NOT_EXECUTED: &str = "not executed: ";

/// Why the rollout or judgment recorded on a stream whose first event is
/// `first` was never executed, if it was not.
pub fn not_executed(first: &ledger::Event) -> Option<String> {
    let note: schemas::Note = schemas::decode_event(first).ok()?;
    note.text.strip_prefix(NOT_EXECUTED).map(str::to_string)
}

/// Records a rollout that was never played: the task's initial workspace,
/// its checks and guard, and a `mass.rollout` with status `failed` and
/// `detail` (why it could not run: an executor that failed on every
/// attempt). The run goes on as for any failed rollout: it is set aside,
/// never judged or trained on.
pub async fn record_unrun(
    session: &replay::Session,
    spec: &RunSpec<'_>,
    team: &Team,
    rules: &RunRules,
    detail: String,
) -> Result<RunOutcome> {
    let mut orch = exec::ledger(|| session.stream(&format!("{}/orch", spec.stream)))?;
    // First on its stream, so a replay or resume knows it was never played.
    let note = schemas::to_event(&schemas::Note {
        text: format!("{NOT_EXECUTED}{detail}"),
    })?;
    exec::ledger(|| orch.emit(note))?;
    let mut ws = LiveWorkspace::new(session, spec, rules);
    let initial = initial_snapshot(&mut orch, &mut ws, spec).await?;
    let played = Played {
        status: "failed",
        detail: format!("{NOT_EXECUTED}{detail}"),
        report: String::new(),
        orchestrator: None,
        subagents: Vec::new(),
        turns: 0,
        prompt_tokens: 0,
        completion_tokens: 0,
    };
    close_run(&mut orch, &mut ws, spec, team, rules, initial, played).await
}

/// The rollout's status and detail for how the orchestrator's turns ended.
fn status_of(ending: std::result::Result<(), Halt>, limits: &Limits) -> (&'static str, String) {
    match ending {
        Ok(()) => ("finished", String::new()),
        Err(Halt::Turns) => (
            "halted",
            format!("turn limit ({}) reached", limits.max_turns),
        ),
        Err(Halt::Tokens) => (
            "halted",
            format!("token limit ({}) reached", limits.max_tokens),
        ),
        Err(Halt::Rejected(detail)) => ("failed", detail),
    }
}

/// The orchestrator's side of one team run while it plays: what it may
/// use, what it has spent, and what it has produced so far.
struct Orchestration<'r, 'a> {
    session: &'r replay::Session,
    spec: &'r RunSpec<'a>,
    team: &'r Team,
    limits: &'r Limits,
    bash_opts: BashOptions,
    budget: Budget,
    /// The subagents' conversation heads, in delegation order.
    subagents: Vec<Id>,
    report: String,
    /// The orchestrator's system prompt.
    system: &'static str,
}

/// What answering one of the orchestrator's tool calls came to.
enum Answer {
    /// The tool result to send back.
    Text(String),
    /// `finish`, with the team's report: the run ends.
    Finished(String),
}

impl Orchestration<'_, '_> {
    /// The orchestrator's conversation, turn by turn, until it finishes (a
    /// plain answer or `finish`) or a limit halts it.
    async fn turns(
        &mut self,
        orch: &mut Stream,
        ws: &mut LiveWorkspace<'_>,
    ) -> Result<std::result::Result<(), Halt>> {
        let spec = self.spec;
        let prompt = task_prompt(
            spec,
            &prompts::directive(&spec.task.id, &spec.task.deliverables),
        );
        let mut conv = Conversation::new(
            vec![Message::system(self.system), Message::user(prompt)],
            tools::tool_defs(true),
        );
        let sampling = Sampling::of(&self.team.sampling, orch.derive_seed("sampling"));
        while self.budget.turns_left > 0 {
            if self.budget.tokens_left <= 0 {
                return Ok(Err(Halt::Tokens));
            }
            self.budget.turns_left -= 1;
            self.budget.turns += 1;
            let resp = match call_model_unsettled(
                orch,
                "model",
                &self.team.orchestrator,
                &self.team.orchestrator_model,
                &mut conv,
                &sampling,
            )
            .await
            {
                Err(EngineError::Backend(e)) => return Ok(Err(Halt::Rejected(e.to_string()))),
                other => other?,
            };
            spend(&mut self.budget, resp.usage);
            if resp.message.tool_calls.is_empty() {
                // A plain answer ends the run like `finish`.
                self.report = resp.message.content_str().to_string();
                return Ok(Ok(()));
            }
            for call in resp.message.tool_calls.clone() {
                match self.answer(orch, ws, &call).await? {
                    Answer::Text(text) => conv.messages.push(Message::tool_result(&call.id, text)),
                    Answer::Finished(report) => {
                        self.report = report;
                        conv.messages
                            .push(Message::tool_result(&call.id, "finished"));
                        return Ok(Ok(()));
                    }
                }
            }
        }
        Ok(Err(Halt::Turns))
    }

    /// Answers one tool call: a workspace tool, a delegation (a subagent's
    /// whole conversation), or `finish`.
    async fn answer(
        &mut self,
        orch: &mut Stream,
        ws: &mut LiveWorkspace<'_>,
        call: &crate::chat::ToolCall,
    ) -> Result<Answer> {
        let text = match tools::parse_call(&call.function.name, &call.function.arguments) {
            Err(e) => format!("error: {e}"),
            Ok(Invocation::Finish { report }) => return Ok(Answer::Finished(report)),
            Ok(Invocation::Delegate {
                role,
                instructions,
                contract,
            }) => {
                // The subagent's first request is built on the reply that
                // asked for it: durable before it leaves, as on the stream
                // itself (`effects::attempts`).
                crate::effects::settle_before_send(orch).await?;
                self.delegate(ws, &role, &instructions, &contract).await?
            }
            Ok(inv) => workspace_tool(orch, ws, &inv, &self.bash_opts, self.limits).await?,
        };
        Ok(Answer::Text(text))
    }

    /// Runs a subagent, within the delegation limit; its answer.
    async fn delegate(
        &mut self,
        ws: &mut LiveWorkspace<'_>,
        role: &str,
        instructions: &str,
        contract: &str,
    ) -> Result<String> {
        let limits = self.limits;
        if self.subagents.len() as u32 >= limits.max_delegations {
            return Ok(format!(
                "error: delegation limit reached ({} subagents)",
                limits.max_delegations
            ));
        }
        let n = self.subagents.len();
        let (answer, head) = run_subagent(
            self.session,
            self.spec,
            self.team,
            limits,
            &self.bash_opts,
            ws,
            &mut self.budget,
            n,
            role,
            instructions,
            contract,
        )
        .await?;
        self.subagents.push(head);
        Ok(answer)
    }
}

/// How a run's commands (a team's `bash`, the checks) are run: the
/// experiment's limits and sandbox, the task's network declaration.
pub(crate) fn command_options(spec: &RunSpec<'_>, rules: &RunRules) -> BashOptions {
    BashOptions {
        timeout: Duration::from_secs(rules.limits.tool_timeout_secs),
        max_output_bytes: rules.limits.tool_output_bytes as usize,
        env: Vec::new(),
        confinement: tools::Confinement {
            level: rules.sandbox.level,
            limits: rules.sandbox.limits,
            network: spec.task.network,
            // No rollout can name another's workspace, home or check copy.
            hide: vec![scratch_root()],
            forward: Vec::new(),
            ..Default::default()
        },
    }
}

/// The team's first prompt: the task, the workflow's rendering, and the
/// closing directive (what to hand in, and how).
pub(crate) fn task_prompt(spec: &RunSpec<'_>, directive: &str) -> String {
    let workflow_text = spec.workflow.render();
    let mut prompt = spec.task.prompt.clone();
    if !workflow_text.is_empty() {
        prompt.push_str("\n\n");
        prompt.push_str(&workflow_text);
    }
    prompt.push_str(directive);
    prompt
}

/// Records the initial workspace, so resumed and replayed runs know it.
pub(crate) async fn initial_snapshot(
    orch: &mut Stream,
    ws: &mut LiveWorkspace<'_>,
    spec: &RunSpec<'_>,
) -> Result<Id> {
    let init = tool_effect(
        orch,
        "snapshot",
        json!({"label": "initial", "task": spec.task.id}),
        false,
        || {
            ws.ensure()?;
            Ok(ToolOutcome {
                text: "initial".into(),
                tree: Some(ws.snapshot()?),
            })
        },
    )
    .await?;
    ws.record_tree(init.tree);
    init.tree
        .ok_or_else(|| EngineError::Invalid("run has no initial workspace snapshot".into()))
}

/// What a harness made of a run, before validation.
pub(crate) struct Played {
    pub status: &'static str,
    pub detail: String,
    pub report: String,
    /// The orchestrator's conversation head when it is not the head of the
    /// orchestrator's stream (an external harness's last orchestrator call).
    pub orchestrator: Option<Id>,
    /// The subagents' conversation heads.
    pub subagents: Vec<Id>,
    pub turns: u32,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
}

/// Ends a run: the task's checks on the final workspace, the tamper guard,
/// and the `mass.rollout` event at the end of the orchestrator's stream
/// (whose head is the orchestrator's conversation unless
/// `played.orchestrator` names another event: an external harness's last
/// orchestrator call).
pub(crate) async fn close_run(
    orch: &mut Stream,
    ws: &mut LiveWorkspace<'_>,
    spec: &RunSpec<'_>,
    team: &Team,
    rules: &RunRules,
    initial: Id,
    played: Played,
) -> Result<RunOutcome> {
    let bash_opts = &command_options(spec, rules);
    let guards = &rules.guards;
    let ledger = ws.ledger.clone();
    let subagents = played.subagents.clone();
    // Validation on the final workspace, with the task's own (pristine) checks.
    let final_tree = ws
        .last_tree
        .ok_or_else(|| EngineError::Invalid("run has no workspace snapshot".into()))?;
    let validation = run_checks(orch, ws, spec.task, final_tree, bash_opts).await?;
    let (guard, validation_blob, workflow_blob) = exec::ledger(|| {
        let guard = crate::guards::inspect(&ledger, spec.task, initial, final_tree, guards)?;
        let validation_blob = ledger.put_blob(validation.as_bytes())?;
        let workflow_blob = ledger.put_blob(
            &serde_json::to_vec(spec.workflow).map_err(|e| EngineError::Invalid(e.to_string()))?,
        )?;
        Ok::<_, EngineError>((guard, validation_blob, workflow_blob))
    })?;
    let (passed, total) = parse_score(&validation);
    let record = Rollout {
        task: spec.task.id.clone(),
        purpose: spec.purpose.to_string(),
        cycle: spec.cycle,
        index: spec.index,
        workflow: workflow_blob.into(),
        orchestrator_model: team.orchestrator_model.clone(),
        subagent_model: team.subagent_model.clone(),
        status: played.status.into(),
        detail: played.detail,
        tree: final_tree.into(),
        validation: validation_blob.into(),
        score_passed: passed,
        score_total: total,
        orchestrator: Hash32(
            played
                .orchestrator
                .or(orch.head())
                .map(|h| h.0)
                .unwrap_or([0; 32]),
        ),
        subagents: subagents.iter().map(|h| Hash32(h.0)).collect(),
        delegations: subagents.len() as u32,
        turns: played.turns,
        prompt_tokens: played.prompt_tokens,
        completion_tokens: played.completion_tokens,
        report: played.report,
    };
    // The guard check and the rollout that names it as a parent are one
    // commit: no extra fsync per run.
    let rollout = schemas::to_event(&record)?;
    let guard_event = schemas::to_event(&guard)?;
    let (_, event) = exec::ledger(|| {
        orch.emit_two(guard_event, |guard_event| {
            let mut parents = subagents.clone();
            parents.push(guard_event);
            rollout.with_parents(parents)
        })
    })?;
    Ok(RunOutcome {
        event,
        record,
        guard,
    })
}

fn spend(b: &mut Budget, u: crate::chat::Usage) {
    b.prompt_tokens += u.prompt_tokens;
    b.completion_tokens += u.completion_tokens;
    b.tokens_left -= (u.prompt_tokens + u.completion_tokens) as i64;
}

#[allow(clippy::too_many_arguments)]
async fn run_subagent(
    session: &replay::Session,
    spec: &RunSpec<'_>,
    team: &Team,
    limits: &Limits,
    bash_opts: &BashOptions,
    ws: &mut LiveWorkspace<'_>,
    budget: &mut Budget,
    n: usize,
    role: &str,
    instructions: &str,
    contract: &str,
) -> Result<(String, Id)> {
    let mut st = exec::ledger(|| session.stream(&format!("{}/sub{n}", spec.stream)))?;
    let mut conv = Conversation::new(
        vec![
            Message::system(prompts::subagent_system(role, contract, &spec.task.id)),
            Message::user(instructions),
        ],
        tools::tool_defs(false),
    );
    let sampling = Sampling::of(&team.sampling, st.derive_seed("sampling"));
    let mut answer = None;
    for _ in 0..limits.max_turns {
        if budget.tokens_left <= 0 {
            break;
        }
        budget.turns += 1;
        let resp = match call_model_unsettled(
            &mut st,
            "model",
            &team.subagent,
            &team.subagent_model,
            &mut conv,
            &sampling,
        )
        .await
        {
            Err(EngineError::Backend(e)) => {
                answer = Some(format!("error: the {role} subagent stopped: {e}"));
                break;
            }
            other => other?,
        };
        spend(budget, resp.usage);
        if resp.message.tool_calls.is_empty() {
            answer = Some(resp.message.content_str().to_string());
            break;
        }
        for call in resp.message.tool_calls.clone() {
            let text = match tools::parse_call(&call.function.name, &call.function.arguments) {
                Err(e) => format!("error: {e}"),
                Ok(Invocation::Delegate { .. }) => "error: subagents cannot delegate".into(),
                Ok(Invocation::Finish { report }) => {
                    answer = Some(report);
                    "finished".into()
                }
                Ok(inv) => workspace_tool(&mut st, ws, &inv, bash_opts, limits).await?,
            };
            conv.messages.push(Message::tool_result(&call.id, text));
        }
        if answer.is_some() {
            break;
        }
    }
    let answer = answer.unwrap_or_else(|| {
        format!("error: the {role} subagent stopped without an answer (turn or token limit)")
    });
    let note = schemas::to_event(&schemas::Note {
        text: format!("subagent {role} returned: {answer}"),
    })?;
    let head = exec::ledger(|| st.emit(note))?;
    Ok((answer, head))
}

/// Runs one workspace tool as an effect; mutating tools record the new tree.
async fn workspace_tool(
    st: &mut Stream,
    ws: &mut LiveWorkspace<'_>,
    inv: &Invocation,
    bash_opts: &BashOptions,
    limits: &Limits,
) -> Result<String> {
    let (name, args, mutating) = match inv {
        Invocation::Bash {
            command,
            timeout_secs,
        } => (
            "bash",
            json!({"command": command, "timeout_secs": timeout_secs}),
            true,
        ),
        Invocation::ReadFile { path } => ("read_file", json!({"path": path}), false),
        Invocation::WriteFile { path, content } => (
            "write_file",
            json!({"path": path, "content": content}),
            true,
        ),
        Invocation::ListFiles { path } => ("list_files", json!({"path": path}), false),
        Invocation::RunChecks => return team_checks(st, ws, bash_opts).await,
        Invocation::Delegate { .. } | Invocation::Finish { .. } => {
            return Ok("error: handled by the harness".into())
        }
    };
    let mut opts = bash_opts.clone();
    if let Invocation::Bash {
        timeout_secs: Some(t),
        ..
    } = inv
    {
        opts.timeout = Duration::from_secs((*t).min(limits.tool_timeout_secs).max(1));
    }
    let read_cap = limits.tool_output_bytes as usize;
    let out = tool_effect(
        st,
        "tool",
        json!({"tool": name, "args": args}),
        name == "bash",
        || {
            let w = ws.open()?;
            let text = w.run(inv, &opts, read_cap);
            let tree = if mutating { Some(ws.snapshot()?) } else { None };
            Ok(ToolOutcome { text, tree })
        },
    )
    .await?;
    ws.record_tree(out.tree);
    Ok(out.text)
}

/// The team's `run_checks` tool: the task's checks on the workspace as it
/// stands, answered with what a team may see of them (`checks::feedback`).
async fn team_checks(
    st: &mut Stream,
    ws: &mut LiveWorkspace<'_>,
    bash_opts: &BashOptions,
) -> Result<String> {
    let task = ws.task;
    let out = tool_effect(
        st,
        "tool",
        json!({"tool": "run_checks", "args": {}}),
        true,
        || {
            ws.ensure()?;
            let tree = ws.last_tree.ok_or("no workspace snapshot yet")?;
            let full =
                checks::run_on_tree(&ws.ledger, task, tree, &ws.checks_scratch(), bash_opts)?;
            Ok(ToolOutcome {
                text: checks::feedback(&full),
                tree: None,
            })
        },
    )
    .await?;
    Ok(out.text)
}

/// The final validation: the task's checks on `tree`, full output (recorded
/// as the rollout's validation, read by the judge, never shown to the team).
async fn run_checks(
    st: &mut Stream,
    ws: &mut LiveWorkspace<'_>,
    task: &Task,
    tree: Id,
    bash_opts: &BashOptions,
) -> Result<String> {
    let names: Vec<&str> = task.checks.iter().map(|c| c.name.as_str()).collect();
    let out = tool_effect(
        st,
        "check",
        json!({"task": task.id, "tree": tree.to_hex(), "checks": names}),
        true,
        || {
            let text =
                checks::run_on_tree(&ws.ledger, task, tree, &ws.checks_scratch(), bash_opts)?;
            Ok(ToolOutcome { text, tree: None })
        },
    )
    .await?;
    Ok(out.text)
}

/// Reads the validators' closing `SCORE k/n` line (summed over checks).
pub fn parse_score(output: &str) -> (u32, u32) {
    let mut passed = 0;
    let mut total = 0;
    for line in output.lines() {
        if let Some(rest) = line.trim().strip_prefix("SCORE ") {
            let mut it = rest.split('/');
            if let (Some(Ok(k)), Some(Ok(n))) = (
                it.next().map(|k| k.trim().parse::<u32>()),
                it.next().map(|n| n.trim().parse::<u32>()),
            ) {
                passed += k;
                total += n;
            }
        }
    }
    (passed, total)
}

#[cfg(test)]
mod tests {
    use super::private_dir;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    /// Regression (#24 review): the scratch root's path is predictable
    /// (`mass-work-PID`), and an existing directory was used as it was: a
    /// local user who made it first (mode 777, or a symlink) could list,
    /// read and replace every rollout's files and race the root-run steps.
    #[test]
    fn a_scratch_root_someone_else_made_first_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let ours = t.path().join("ours");
        private_dir(&ours, 0o711).unwrap();
        let m = std::fs::metadata(&ours).unwrap();
        assert_eq!(m.mode() & 0o7777, 0o711);
        private_dir(&ours, 0o711).unwrap();

        let open = t.path().join("world-writable");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = private_dir(&open, 0o711).unwrap_err();
        assert!(e.to_string().contains("not a private directory"), "{e}");

        let link = t.path().join("link");
        std::os::unix::fs::symlink(&ours, &link).unwrap();
        assert!(private_dir(&link, 0o711).is_err());

        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            let theirs = t.path().join("theirs");
            std::fs::create_dir(&theirs).unwrap();
            std::os::unix::fs::lchown(&theirs, Some(65534), Some(65534)).unwrap();
            std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o711)).unwrap();
            assert!(private_dir(&theirs, 0o711).is_err());
        }
    }
}
