//! The command-line grammar (clap derive). Behaviour lives in `commands`.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

const EXIT_CODES: &str = "Exit codes:
  0  success (also when the reader of the output stops early, as `| head` does)
  1  other error
  2  usage error (bad arguments, malformed id or ref name)
  3  integrity problem (verify found problems, a read hit corrupt data, a remote's pack failed its hash)
  4  not found, or an abbreviated id is ambiguous (or a location is not a mass remote)
  5  conflict: a ref moved since it was read (also on a remote: pull, then fork to keep yours)
  6  the ledger is in use by another process
  7  a run stopped on an infrastructure failure (`mass resume` retries it)
  8  the sandbox the experiment asks for is unavailable on this machine (see `mass sandbox`)";

#[derive(Debug, Parser)]
#[command(name = "mass", version, about = "MASS self-training cycles on an event-sourced, content-addressed ledger", after_help = EXIT_CODES)]
pub struct Cli {
    /// Ledger directory.
    #[arg(
        long,
        global = true,
        env = "MASS_LEDGER",
        default_value = "mass-ledger"
    )]
    pub ledger: PathBuf,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create an empty ledger.
    Init,
    /// List events, newest first: a stream from a ref or event, or the whole ledger.
    Log {
        /// Ref name or (abbreviated) event id; omit for every event.
        start: Option<String>,
        /// Only events of this kind.
        #[arg(long)]
        kind: Option<String>,
        /// At most this many events.
        #[arg(long)]
        limit: Option<usize>,
        #[arg(long)]
        json: bool,
    },
    /// Show an event, tree or blob.
    Show {
        /// Ref name or id (any unique prefix of at least 8 hex digits).
        id: String,
        #[arg(long)]
        json: bool,
    },
    /// Write a blob's raw bytes to standard output.
    Cat { id: String },
    /// List refs and their heads.
    Refs {
        #[arg(long)]
        json: bool,
    },
    /// Create a ref at an existing event. At a step of a run's main stream this
    /// forks the run: `mass resume NAME` then continues it with the overrides.
    Fork {
        /// Event id or ref to fork from.
        id: String,
        /// Name of the new ref (or run).
        #[arg(long)]
        name: String,
        /// Configuration override for the forked run, e.g. `inner.iterations=6`.
        #[arg(long = "set", value_name = "KEY=VALUE")]
        set: Vec<String>,
        /// The run to fork (recorded as the fork's parent). Needed when the
        /// event is on the main stream of several runs (a run and its forks).
        #[arg(long = "from", value_name = "RUN")]
        from: Option<String>,
        /// Fork right before this stage of cycle --cycle (ID names the run):
        /// search, collect, judge, rank, select, dataset, train or evaluate.
        /// The stage and everything after it run again with the overrides.
        #[arg(long, requires = "cycle", conflicts_with = "from")]
        stage: Option<String>,
        /// With --stage: the cycle (from 1).
        #[arg(long, requires = "stage")]
        cycle: Option<u32>,
    },
    /// Manage runs as a whole.
    #[command(args_conflicts_with_subcommands = true)]
    Runs {
        #[command(subcommand)]
        what: Option<RunsWhat>,
        /// List this run's rollouts: id, task, cycle, kind (reference,
        /// search candidate, collection, evaluation), status, checks,
        /// Bradley-Terry score, rank and selection.
        run: Option<String>,
        #[arg(long)]
        cycle: Option<u32>,
        #[arg(long)]
        task: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Run a MASS experiment (all cycles), or continue the run if it exists.
    Run {
        experiment: PathBuf,
        /// The run's name (default: the experiment's name).
        #[arg(long = "ref")]
        name: Option<String>,
        /// Override a key of the experiment, e.g. `outer.cycles=1` or
        /// `inner.iterations=2` (repeatable; checked as `mass fork --set`
        /// checks them). The run records the experiment with the overrides
        /// applied, so resume, replay and forks need no flag.
        #[arg(long = "set", value_name = "KEY=VALUE")]
        set: Vec<String>,
        /// No progress bars.
        #[arg(long)]
        quiet: bool,
        #[command(flatten)]
        workers: WorkersArgs,
    },
    /// Continue a run (or a fork) from its ledger: replay to the head, then live.
    Resume {
        run: String,
        #[arg(long)]
        quiet: bool,
        #[command(flatten)]
        workers: WorkersArgs,
    },
    /// Execute work items published on a store by `mass run --workers URL`,
    /// on this machine, until stopped (or idle for --idle-exit).
    Worker {
        /// The store (as in `mass remote add`: s3://, gs://, az://, a folder).
        url: String,
        /// Items executed at once.
        #[arg(long, default_value_t = 1)]
        slots: u32,
        /// Shown in claims and results (default: host/pid).
        #[arg(long)]
        name: Option<String>,
        /// Lease length in seconds; renewed every third of it.
        #[arg(long, default_value_t = 30.0)]
        lease_secs: f64,
        /// Stop after this many seconds with nothing to do.
        #[arg(long)]
        idle_exit: Option<f64>,
        /// How often to look for new items, in milliseconds.
        #[arg(long, default_value_t = 250)]
        poll_ms: u64,
    },
    /// Re-run the driver over a run's recorded effects and compare every event id.
    Replay {
        run: String,
        /// Required: the check is the only replay mode so far.
        #[arg(long)]
        check: bool,
    },
    /// Replay a run with its rollouts served from the ledger and only the judge
    /// calls live (mixed mode), as a new run.
    Rejudge {
        run: String,
        #[arg(long)]
        name: String,
        /// Re-judge one cycle: its inner loop and collected runs are kept
        /// as recorded; judging, ranking, selection and the dataset run
        /// again, and the re-judge stops there (no training) unless
        /// --through-training is given.
        #[arg(long)]
        cycle: Option<u32>,
        /// The judge: a backend the run's experiment defines (`roles.judge`),
        /// or a TOML file defining one as `[backends.NAME]` (recorded in the
        /// re-judge by value).
        #[arg(long)]
        judge: Option<String>,
        /// With --cycle: train on the re-judged data, evaluate, and go on
        /// through the run's remaining cycles.
        #[arg(long)]
        through_training: bool,
        /// Overrides, e.g. `backends.sim.sim.judge_noise=0`.
        #[arg(long = "set", value_name = "KEY=VALUE")]
        set: Vec<String>,
        #[arg(long)]
        quiet: bool,
    },
    /// Run one command exactly as a rollout's `bash` tool would (same
    /// confinement, environment, timeout and output caps), to check a setup;
    /// `--probe` lists the confinement layers this machine offers.
    Sandbox {
        /// The directory the command works in (it may write only here).
        #[arg(long)]
        workspace: Option<PathBuf>,
        /// An experiment file (its `[sandbox]` table) or a file with the
        /// table's keys: `level` and `[limits]`.
        #[arg(long)]
        limits: Option<PathBuf>,
        /// The level to use: full, landlock or none (default: the file's, or full).
        #[arg(long, value_parser = parse_level)]
        level: Option<sandbox::Level>,
        /// Allow the network, as for a task that declares it.
        #[arg(long)]
        network: bool,
        #[arg(long = "timeout", default_value_t = 60, value_name = "SECS")]
        timeout_secs: u64,
        /// Report which layers and levels are available, and run nothing.
        #[arg(long)]
        probe: bool,
        /// The command, after `--`: one argument is a bash line (`-- 'ls |
        /// wc -l'`); several are a program and its arguments, each passed
        /// as given (quoted for bash before they are joined).
        #[arg(last = true)]
        command: Vec<String>,
    },
    /// An OpenAI-compatible recording proxy for any client (an external agent
    /// harness, a script): point the client's base URL at the printed
    /// `http://LISTEN/v1`. Records every exchange, streamed ones included,
    /// into stream STREAM of run RUN; with `--replay`, answers the client
    /// from that recording instead (no upstream needed), matching requests
    /// by their normalised content and failing closed (HTTP 400 naming the
    /// stream, the position and a diff) on a request the recording does not
    /// hold. Runs until SIGINT or SIGTERM; then takes no new requests, waits
    /// up to --drain-secs (10 s; a second signal: no longer) for exchanges in
    /// flight, waits for every record to be durable, and exits 1 naming any
    /// exchange it could not record. API keys pass through (or, with
    /// --upstream-key-env, mass sends its own) and are never recorded,
    /// printed or echoed: key-like query parameters, URL passwords and
    /// key-like body fields are redacted in everything kept or shown.
    Proxy {
        /// Address to listen on (port 0: any free port).
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: std::net::SocketAddr,
        /// The server's OpenAI base URL, e.g. http://127.0.0.1:8080/v1
        /// (recording; with --replay, where misses go in mixed mode).
        #[arg(long)]
        upstream: Option<String>,
        /// The run whose stream is recorded into or replayed.
        #[arg(long)]
        run: String,
        /// The stream of the run, e.g. `agent` or `sessions/1`.
        #[arg(long, default_value = "proxy")]
        stream: String,
        /// Answer from the recording instead of an upstream.
        #[arg(long)]
        replay: bool,
        /// Replay normaliser: a TOML file with `ignore = [fields]` and
        /// `[[rules]] pattern = '...' replace = '...'` (see README).
        #[arg(long, value_name = "FILE")]
        normalise: Option<PathBuf>,
        /// Mixed mode (with --replay and --upstream): record everything
        /// served, misses sent live, into this run's stream of the same name.
        #[arg(long, value_name = "RUN")]
        into: Option<String>,
        /// Write the client base URL to this file once listening.
        #[arg(long, value_name = "FILE")]
        url_file: Option<PathBuf>,
        #[command(flatten)]
        guards: ProxyGuards,
    },
    /// Run a recorded external-harness rollout's program again (`[harness]
    /// kind = "external"`), in a fresh checkout of its initial workspace,
    /// against a proxy that answers only from the rollout's recorded
    /// traffic (no model server needed), and say whether every request and
    /// the final workspace repeat. Exit 0 when identical, 1 when not.
    HarnessReplay {
        /// The rollout (its `mass.rollout` event id or a unique prefix).
        rollout: String,
        #[arg(long)]
        json: bool,
    },
    /// Why a rollout is where it is: its evidence chain (guard findings,
    /// workflow lineage, tool calls, every judgment, its Bradley-Terry rank,
    /// the selection decision, the dataset lines it became, the training
    /// step that consumed them), each link with its event id. ID is a
    /// rollout (or a unique prefix), a conversation `<rollout>#<n>`, an
    /// agent stream's head, a line of an exported dataset file `FILE:LINE`
    /// (through its `*.provenance.jsonl` sidecar), a trained model's name
    /// (or its `mass.training` event), or a `mass.dataset` event.
    Why {
        id: String,
        #[arg(long)]
        json: bool,
        /// Only what run RUN recorded about the rollout (its judgments,
        /// ranking, selection, dataset and training), when runs share it.
        #[arg(long, value_name = "RUN")]
        run: Option<String>,
    },
    /// Per cycle: inner-loop progress per task and iteration (accepted,
    /// workflow edit size), win rates with Wilson and bootstrap intervals,
    /// position bias, judge agreement, delegation with and without a
    /// workflow, supervised tokens, model calls, tokens and wall time per
    /// stage, guard exclusions by reason, Bradley-Terry scores per task.
    Report {
        run: String,
        #[arg(long)]
        json: bool,
        /// Also write the report as one self-contained HTML page with plots
        /// (inline SVG; opens offline) to FILE.
        #[arg(long, value_name = "FILE")]
        html: Option<PathBuf>,
        /// Fold every stream of the run again from the ledger instead of
        /// reading the facts kept by earlier reports (the report
        /// projection, `LEDGER/cache/report/`), and keep the new ones.
        #[arg(long)]
        fresh: bool,
    },
    /// Where runs stand.
    Status {
        run: Option<String>,
        #[arg(long)]
        json: bool,
        /// Also show the work on this store: workers, items claimed, done
        /// and failed.
        #[arg(long)]
        workers: Option<String>,
    },
    /// Store a directory as a tree; prints the tree id.
    Snapshot { dir: PathBuf },
    /// Materialise a tree into a new or empty directory.
    Checkout { tree: String, dir: PathBuf },
    /// Two trees: the paths added (A), removed (D) or modified (M). Two
    /// runs: where their streams diverge, then what differs in champions,
    /// verdicts, rankings, selections, datasets and training (e.g. a
    /// re-judged run against its source).
    Diff {
        a: String,
        b: String,
        #[arg(long)]
        json: bool,
    },
    /// Re-hash every object and check every reference (and the index).
    Verify {
        /// Check the log only, not the derived index (faster on big ledgers).
        #[arg(long)]
        log_only: bool,
        #[arg(long)]
        json: bool,
    },
    /// Objects by kind, bytes, deduplication and compression ratios.
    Stats {
        #[arg(long)]
        json: bool,
    },
    /// Rebuild the index from the segment files, stepping over damaged
    /// records as `repair` does. Refuses, changing nothing, if the log holds
    /// less than the index or the watermark proved it did.
    Reindex,
    /// Rebuild the index keeping every intact record: damaged byte ranges
    /// are copied into quarantine/, listed in quarantine/damaged.jsonl and
    /// stepped over from then on; the segment files are not changed. Prints
    /// what it listed.
    Repair {
        #[arg(long)]
        json: bool,
    },
    /// Copy a ledger written by an older mass (format 1) into a new ledger
    /// at --ledger: every committed batch, with the same ids, metadata and
    /// refs. The old ledger is only read.
    Migrate {
        /// The format-1 ledger directory.
        #[arg(long)]
        from: std::path::PathBuf,
    },
    /// Name remotes: object stores (s3://, gs://, az://) or folders that
    /// hold pushed runs. Credentials come from the environment, never a URL.
    Remote {
        #[command(subcommand)]
        what: RemoteWhat,
    },
    /// Upload runs to a remote (`origin` when not named): only the objects
    /// it lacks, then its run records by compare-and-swap. A run the remote
    /// holds further than this ledger is refused (exit 5).
    Push {
        /// A remote name, URL or folder path (a first word that is none of
        /// these is taken as a run, and the default remote is used).
        remote: Option<String>,
        /// Runs to push (default: every run).
        runs: Vec<String>,
        /// No progress lines.
        #[arg(long)]
        quiet: bool,
    },
    /// Download runs from a remote: only what they reach and this ledger
    /// lacks, every object checked against its hash, landed in one commit.
    Pull {
        /// A remote name, URL or folder path (as for push).
        remote: Option<String>,
        /// Runs to pull (default: every run the remote holds).
        runs: Vec<String>,
        /// Leave blobs on the remote: every event and tree lands, and a
        /// command that reads a blob fetches it then (the ledger becomes
        /// partial; a pull without --lazy fetches what it reaches).
        #[arg(long)]
        lazy: bool,
        #[arg(long)]
        quiet: bool,
    },
    /// Create a ledger in DIR from every run of a remote (named `origin`).
    Clone {
        url: String,
        dir: PathBuf,
        /// A partial clone: blobs stay on the remote until a command reads
        /// them (`show`, `why`, `report`, `replay --check` fetch them).
        #[arg(long)]
        lazy: bool,
        #[arg(long)]
        quiet: bool,
    },
    /// Import a run recorded elsewhere.
    Import {
        #[command(subcommand)]
        what: ImportWhat,
    },
    /// Export ledger contents.
    Export {
        #[command(subcommand)]
        what: ExportWhat,
    },
    /// Fit Bradley-Terry scores to a comparisons file (one JSON object per line:
    /// {"a": "...", "b": "...", "winner": "a"|"b"|"tie"}).
    Rank {
        file: PathBuf,
        /// Virtual wins and losses against an average player; 0 for the pure MLE.
        #[arg(long, default_value_t = 0.5)]
        prior: f64,
        #[arg(long)]
        json: bool,
    },
    /// Fill the ledger with a short scripted demonstration (no model involved).
    Demo {
        /// Workspace files to snapshot; a small generated one when omitted.
        #[arg(long)]
        workspace: Option<PathBuf>,
    },
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum DatasetFormat {
    Openai,
    Trl,
}

#[derive(Debug, Subcommand)]
pub enum RemoteWhat {
    /// Name a remote URL (s3://BUCKET/PREFIX, gs://..., az://..., a folder).
    Add { name: String, url: String },
    /// List the named remotes.
    List {
        #[arg(long)]
        json: bool,
    },
    /// Forget a remote's name (nothing on the store is touched).
    Remove { name: String },
}

#[derive(Debug, Subcommand)]
pub enum RunsWhat {
    /// Remove a run's refs (NAME and every ref under NAME/), recorded as a
    /// `run.removed` event in the stream `mass/runs`. No object is deleted:
    /// the run's events stay readable by id (`mass show`, `mass log ID`).
    Rm { run: String },
}

#[derive(Debug, Subcommand)]
pub enum ImportWhat {
    /// A run folder of the reference implementation (SakanaAI/mass,
    /// `run_dir` of its config): episodes, judgments, rankings, selection,
    /// training metrics. All or nothing; importing the same folder again
    /// writes nothing. What the reference does not record (workspace
    /// snapshots, checks, tournament seeds) stays absent.
    Sakana {
        run_dir: PathBuf,
        /// The run's name (default: the folder's name).
        #[arg(long)]
        name: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
pub enum ExportWhat {
    /// A cycle's training data: FILE gets the train split, FILE with
    /// `.validation` before its extension the validation split.
    Dataset {
        run: String,
        #[arg(long)]
        cycle: u32,
        #[arg(long, value_enum, default_value = "openai")]
        format: DatasetFormat,
        #[arg(long)]
        out: PathBuf,
    },
    /// Events as JSON lines, oldest first, with ids and decoded payloads.
    Events {
        /// A run: all of its streams (main and every `RUN/...` stream), in
        /// log order, each line naming its stream. Another ref or an event:
        /// that stream. Omitted: every event in log order.
        start: Option<String>,
        #[arg(long)]
        out: PathBuf,
    },
    /// One table per concept of a run (runs, cycles, stages, rollouts,
    /// model_calls, tool_calls, judgments, rankings, selections,
    /// dataset_lines, trainings, training_steps, evaluations), for pandas,
    /// polars and DuckDB; columns in schemas/SCHEMAS.md ("Tables"). Several
    /// runs go into the same tables, each row naming its run. Files are
    /// replaced only once every table is complete.
    Tables {
        #[arg(required = true)]
        runs: Vec<String>,
        /// Directory for the files (created if missing): NAME.parquet or
        /// NAME.csv per table.
        #[arg(long)]
        out: PathBuf,
        #[arg(long, value_enum, default_value = "parquet")]
        format: TableFormat,
    },
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum TableFormat {
    Parquet,
    Csv,
}

fn parse_level(s: &str) -> Result<sandbox::Level, String> {
    match s {
        "full" => Ok(sandbox::Level::Full),
        "landlock" => Ok(sandbox::Level::Landlock),
        "none" => Ok(sandbox::Level::None),
        other => Err(format!(
            "unknown sandbox level {other:?}: use full, landlock or none"
        )),
    }
}

/// `mass proxy`'s credentials, caps and shutdown.
#[derive(Debug, Clone, clap::Args)]
pub struct ProxyGuards {
    /// Send the key in environment variable VAR upstream (`Authorization:
    /// Bearer`), in place of the client's credentials.
    #[arg(long, value_name = "VAR")]
    pub upstream_key_env: Option<String>,
    /// Serve only requests carrying the token in environment variable VAR
    /// (`Authorization: Bearer`, `api-key` or `x-api-key`); others get 401.
    #[arg(long, value_name = "VAR")]
    pub token_env: Option<String>,
    /// Refuse a request body longer than this (HTTP 413).
    #[arg(long, value_name = "BYTES", default_value_t = 32 << 20)]
    pub max_request_bytes: usize,
    /// Abort a response body longer than this (recorded as failed).
    #[arg(long, value_name = "BYTES", default_value_t = 128 << 20)]
    pub max_response_bytes: usize,
    /// On SIGINT/SIGTERM, wait this long for exchanges in flight.
    #[arg(long, value_name = "SECS", default_value_t = 10)]
    pub drain_secs: u64,
}

/// Where a run's work items execute.
#[derive(Debug, Clone, clap::Args)]
pub struct WorkersArgs {
    /// Execute rollouts and judgments on `mass worker` processes through
    /// this store (s3://, gs://, az://, or a folder) instead of here.
    #[arg(long, value_name = "URL")]
    pub workers: Option<String>,
    /// With --workers: seconds the store may be unreachable before the run
    /// stops (exit 7; `mass resume` continues).
    #[arg(long, default_value_t = 300.0, requires = "workers")]
    pub store_patience: f64,
    /// With --workers: attempts per item before it is recorded as failed.
    #[arg(long, default_value_t = 3, requires = "workers")]
    pub max_attempts: u32,
}
