//! The record types. Each one's layout is documented in `SCHEMAS.md`; changing a
//! field means bumping `VERSION` (and teaching readers the old one).

use crate::{Hash32, Record};

/// `note` v1: a free-text annotation (operator notes, demo markers).
#[derive(
    rkyv::Archive, rkyv::Serialize, rkyv::Deserialize, serde::Serialize, Debug, Clone, PartialEq, Eq,
)]
pub struct Note {
    pub text: String,
}

impl Record for Note {
    const KIND: &'static str = "note";
    const VERSION: u32 = 1;
    fn sample() -> Self {
        Note {
            text: "sample note".into(),
        }
    }
}

/// `model.call` v1: one chat-completion request and its response.
///
/// The request's messages are stored as blobs (canonical JSON, one per message)
/// and shared by content: a conversation's calls chain through `prefix`, so the
/// full request of call *n* is `request(prefix) ++ [response(prefix)] ++ messages`
/// and storage grows with the conversation, not with its square.
#[derive(
    rkyv::Archive, rkyv::Serialize, rkyv::Deserialize, serde::Serialize, Debug, Clone, PartialEq, Eq,
)]
pub struct ModelCall {
    /// Which part the model played: `orchestrator`, `subagent`, `judge`, `optimizer`, ...
    pub role: String,
    /// Model (or LoRA adapter) name as sent to the backend.
    pub model: String,
    /// Sampling parameters as canonical JSON (sorted keys), e.g. `{"seed":7,"temperature":0.7}`.
    pub params: String,
    /// An earlier `model.call` event this request extends, if any.
    pub prefix: Option<Hash32>,
    /// Messages after the prefix (blobs of canonical message JSON).
    pub messages: Vec<Hash32>,
    /// Tool definitions (blob of JSON), if tools were offered.
    pub tools: Option<Hash32>,
    /// The assistant message returned (blob of canonical message JSON).
    pub response: Hash32,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    /// `stop`, `tool_calls`, `length`, ...
    pub finish_reason: String,
}

impl Record for ModelCall {
    const KIND: &'static str = "model.call";
    const VERSION: u32 = 1;
    fn links(&self) -> Vec<Hash32> {
        let mut v: Vec<Hash32> = self.prefix.iter().copied().collect();
        v.extend(self.messages.iter().copied());
        v.extend(self.tools.iter().copied());
        v.push(self.response);
        v
    }
    fn sample() -> Self {
        ModelCall {
            role: "orchestrator".into(),
            model: "sim-base".into(),
            params: r#"{"seed":7,"temperature":0.7}"#.into(),
            prefix: Some(Hash32([1; 32])),
            messages: vec![Hash32([2; 32]), Hash32([3; 32])],
            tools: Some(Hash32([4; 32])),
            response: Hash32([5; 32]),
            prompt_tokens: 1200,
            completion_tokens: 80,
            finish_reason: "tool_calls".into(),
        }
    }
}

/// `workspace.snapshot` v1: the state of a run's workspace at a labelled point.
#[derive(
    rkyv::Archive, rkyv::Serialize, rkyv::Deserialize, serde::Serialize, Debug, Clone, PartialEq, Eq,
)]
pub struct WorkspaceSnapshot {
    /// `initial`, `final`, or a step label.
    pub label: String,
    /// The tree id.
    pub tree: Hash32,
}

impl Record for WorkspaceSnapshot {
    const KIND: &'static str = "workspace.snapshot";
    const VERSION: u32 = 1;
    fn links(&self) -> Vec<Hash32> {
        vec![self.tree]
    }
    fn sample() -> Self {
        WorkspaceSnapshot {
            label: "final".into(),
            tree: Hash32([6; 32]),
        }
    }
}

/// How an effect ended (or that it has only started).
#[derive(
    rkyv::Archive,
    rkyv::Serialize,
    rkyv::Deserialize,
    serde::Serialize,
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
)]
#[serde(rename_all = "snake_case")]
pub enum EffectStatus {
    /// The request was journaled before a long or non-idempotent effect began.
    Started,
    Ok,
    /// The effect ran and failed as part of the run's course (a final
    /// failure); `error` says how. Replay and resume return the same error.
    Failed,
    /// The attempt failed for a reason outside the run (I/O, timeout, HTTP
    /// 429/5xx, a killed process, a trainer crash); `error` says how. A
    /// resume retries it when it ends its stream; a later attempt of the same
    /// request follows it otherwise. Appended last: earlier variants keep
    /// their on-disk values.
    Retriable,
}

/// `effect` v1: one non-deterministic step (model call, tool run, snapshot,
/// trainer run, clock read, ...) with its canonical request and recorded output.
#[derive(
    rkyv::Archive, rkyv::Serialize, rkyv::Deserialize, serde::Serialize, Debug, Clone, PartialEq, Eq,
)]
pub struct Effect {
    /// Effect kind, e.g. `model`, `tool`, `snapshot`, `trainer`, `clock`.
    pub effect: String,
    /// Blob of the canonical request bytes; its id is the request id compared on replay.
    pub request: Hash32,
    pub status: EffectStatus,
    /// Blob of the canonical output bytes (`Ok` only).
    pub output: Option<Hash32>,
    /// Failure description (`Failed` only).
    pub error: String,
    /// Other objects the request or output names (message blobs, trees, earlier events).
    pub links: Vec<Hash32>,
}

impl Record for Effect {
    const KIND: &'static str = "effect";
    const VERSION: u32 = 1;
    fn links(&self) -> Vec<Hash32> {
        let mut v = vec![self.request];
        v.extend(self.output);
        v.extend(self.links.iter().copied());
        v
    }
    fn sample() -> Self {
        Effect {
            effect: "model".into(),
            request: Hash32([7; 32]),
            status: EffectStatus::Ok,
            output: Some(Hash32([8; 32])),
            error: String::new(),
            links: vec![Hash32([9; 32])],
        }
    }
}

/// `run.started` v2: the first event of a run's main stream. Everything the run
/// depends on is recorded with it, by content: the experiment definition and
/// the task suite. Replays, resumes, re-judgings and forks read both from the
/// ledger, so a run does not depend on the working directory, on files that
/// may have been edited since, or on the path the experiment was given by
/// (which is therefore not recorded: the same text and tasks give the same id).
#[derive(
    rkyv::Archive, rkyv::Serialize, rkyv::Deserialize, serde::Serialize, Debug, Clone, PartialEq, Eq,
)]
pub struct RunStarted {
    /// The driver that interprets the run, with its version, e.g. `mass-engine/2`.
    pub driver: String,
    /// Blob of the experiment definition as given (e.g. the TOML text).
    pub config: Hash32,
    /// Tree of the task suite: every task folder, `<task-id>/...`.
    pub tasks: Hash32,
    /// Root of all seeds derived in the run.
    pub seed: u64,
}

impl Record for RunStarted {
    const KIND: &'static str = "run.started";
    const VERSION: u32 = 2;
    fn links(&self) -> Vec<Hash32> {
        vec![self.config, self.tasks]
    }
    fn sample() -> Self {
        RunStarted {
            driver: "mass-engine/2".into(),
            config: Hash32([10; 32]),
            tasks: Hash32([12; 32]),
            seed: 42,
        }
    }
}

/// `run.execution`: how one run is executed, the only event of its
/// `execution` stream, written right after `run.started`, which it names as
/// its parent (a head that is anything else is refused). `config` is the
/// experiment file as given: comments, `concurrency`, server addresses, key
/// sources, timeouts, retries. No hashed step of the run depends on it: `run.started` holds
/// the experiment's definition without these settings, so the same
/// experiment gives the same ids on any machine at any concurrency. Runs
/// recorded by `mass-engine/7` and earlier have no `execution` stream; their
/// `run.started` holds the file as given.
#[derive(
    rkyv::Archive, rkyv::Serialize, rkyv::Deserialize, serde::Serialize, Debug, Clone, PartialEq, Eq,
)]
pub struct RunExecution {
    /// Blob of the experiment file as given.
    pub config: Hash32,
}

impl Record for RunExecution {
    const KIND: &'static str = "run.execution";
    const VERSION: u32 = 1;
    fn links(&self) -> Vec<Hash32> {
        vec![self.config]
    }
    fn sample() -> Self {
        RunExecution {
            config: Hash32([13; 32]),
        }
    }
}

/// `run.started` v1, kept so old ledgers still show, export and verify. It
/// recorded the experiment file's path (hashed, so the same run started via
/// another spelling of the path got other ids) and not the tasks, which were
/// read from disk relative to that path; the engine refuses to drive such runs.
#[derive(
    rkyv::Archive, rkyv::Serialize, rkyv::Deserialize, serde::Serialize, Debug, Clone, PartialEq, Eq,
)]
pub struct RunStartedV1 {
    pub driver: String,
    pub config: Hash32,
    /// The path the definition was read from.
    pub config_name: String,
    pub seed: u64,
}

impl Record for RunStartedV1 {
    const KIND: &'static str = "run.started";
    const VERSION: u32 = 1;
    fn links(&self) -> Vec<Hash32> {
        vec![self.config]
    }
    fn sample() -> Self {
        RunStartedV1 {
            driver: "mass-engine/1".into(),
            config: Hash32([10; 32]),
            config_name: "quickstart.toml".into(),
            seed: 42,
        }
    }
}

/// One `key=value` configuration override.
#[derive(
    rkyv::Archive, rkyv::Serialize, rkyv::Deserialize, serde::Serialize, Debug, Clone, PartialEq, Eq,
)]
pub struct Override {
    pub key: String,
    pub value: String,
}

/// `run.forked` v1: appended to a fork's main stream right after the fork point;
/// overrides apply to everything the driver does after it.
#[derive(
    rkyv::Archive, rkyv::Serialize, rkyv::Deserialize, serde::Serialize, Debug, Clone, PartialEq, Eq,
)]
pub struct RunForked {
    /// The run the fork was taken from.
    pub source_run: String,
    /// The event forked at (the fork's main stream continues from it).
    pub at: Hash32,
    pub overrides: Vec<Override>,
}

impl Record for RunForked {
    const KIND: &'static str = "run.forked";
    const VERSION: u32 = 1;
    fn sample() -> Self {
        RunForked {
            source_run: "exp".into(),
            at: Hash32([11; 32]),
            overrides: vec![Override {
                key: "judge.model".into(),
                value: "external".into(),
            }],
        }
    }
}

/// `run.mixed` v1 (read only): named the source by its ref alone, so a
/// source removed (or replaced by a run of the same name) went unnoticed.
#[derive(
    rkyv::Archive, rkyv::Serialize, rkyv::Deserialize, serde::Serialize, Debug, Clone, PartialEq, Eq,
)]
pub struct RunMixedV1 {
    pub source_run: String,
    /// Effect kinds that run live (sorted), e.g. `judge`.
    pub live_kinds: Vec<String>,
}

impl Record for RunMixedV1 {
    const KIND: &'static str = "run.mixed";
    const VERSION: u32 = 1;
    fn sample() -> Self {
        RunMixedV1 {
            source_run: "exp".into(),
            live_kinds: vec!["judge".into()],
        }
    }
}

/// One stream of a source run and the head it had (`stream` relative to
/// the run: `main` for its main stream).
#[derive(
    rkyv::Archive, rkyv::Serialize, rkyv::Deserialize, serde::Serialize, Debug, Clone, PartialEq, Eq,
)]
pub struct StreamHead {
    pub stream: String,
    pub head: Hash32,
}

/// `run.mixed` v2: appended by `mass rejudge` right after `run.forked`: this
/// run takes effect results from the source run, named by `source_run` and
/// pinned by the head every one of its streams had (`heads`, sorted by
/// stream; also among the event's links), while a stream is an exact prefix
/// of the source's same stream; `live_kinds` always run live. Recorded so a
/// resume of an interrupted re-judge runs in the same mixed mode against the
/// same source records (and ends at the same head) as an uninterrupted one,
/// whatever happened to the source's refs since.
#[derive(
    rkyv::Archive, rkyv::Serialize, rkyv::Deserialize, serde::Serialize, Debug, Clone, PartialEq, Eq,
)]
pub struct RunMixed {
    pub source_run: String,
    /// Effect kinds that run live (sorted), e.g. `judge`.
    pub live_kinds: Vec<String>,
    pub heads: Vec<StreamHead>,
}

impl Record for RunMixed {
    const KIND: &'static str = "run.mixed";
    const VERSION: u32 = 2;
    fn links(&self) -> Vec<Hash32> {
        let mut v: Vec<Hash32> = self.heads.iter().map(|h| h.head).collect();
        v.sort_by_key(|h| h.0);
        v.dedup();
        v
    }
    fn sample() -> Self {
        RunMixed {
            source_run: "exp".into(),
            live_kinds: vec!["judge".into()],
            heads: vec![StreamHead {
                stream: "main".into(),
                head: Hash32([13; 32]),
            }],
        }
    }
}

impl RunMixed {
    /// Reads a `run.mixed` event of any version this build knows (v1 with no
    /// heads: its source is known by name only); `None` for other kinds and
    /// for versions this build does not know.
    pub fn read(ev: &ledger::Event) -> Option<Result<RunMixed, crate::SchemaError>> {
        if ev.kind != <RunMixed as Record>::KIND {
            return None;
        }
        match ev.version {
            1 => Some(crate::decode_event::<RunMixedV1>(ev).map(|m| RunMixed {
                source_run: m.source_run,
                live_kinds: m.live_kinds,
                heads: Vec::new(),
            })),
            2 => Some(crate::decode_event::<RunMixed>(ev)),
            _ => None,
        }
    }
}

/// One ref of a removed run and the head it had.
#[derive(
    rkyv::Archive, rkyv::Serialize, rkyv::Deserialize, serde::Serialize, Debug, Clone, PartialEq, Eq,
)]
pub struct RemovedRef {
    pub name: String,
    pub head: Hash32,
}

/// `run.removed` v1: a run's refs were deleted (its objects were not). Appended
/// to the ledger-level stream `mass/runs`, with the old heads also among the
/// event's `refs` links, so everything the run wrote stays reachable from it.
#[derive(
    rkyv::Archive, rkyv::Serialize, rkyv::Deserialize, serde::Serialize, Debug, Clone, PartialEq, Eq,
)]
pub struct RunRemoved {
    /// The run's name (its main ref).
    pub run: String,
    /// Why: `removed` (`mass runs rm`) or `replaced: start failed` (`mass run`
    /// over a run whose start failed).
    pub reason: String,
    /// Every ref removed (the main ref and those under `run/`) and its head.
    pub refs: Vec<RemovedRef>,
}

impl Record for RunRemoved {
    const KIND: &'static str = "run.removed";
    const VERSION: u32 = 1;
    fn links(&self) -> Vec<Hash32> {
        let mut v: Vec<Hash32> = self.refs.iter().map(|r| r.head).collect();
        v.sort_by_key(|h| h.0);
        v.dedup();
        v
    }
    fn sample() -> Self {
        RunRemoved {
            run: "exp".into(),
            reason: "removed".into(),
            refs: vec![RemovedRef {
                name: "exp".into(),
                head: Hash32([12; 32]),
            }],
        }
    }
}
