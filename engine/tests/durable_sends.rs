//! A model request leaves the process only once every record it is built
//! on is durable. The harness leaves a reply's record and the file tools'
//! records after it unsettled (`Stream::finish_unsettled`) and settles them
//! with one wait before the next request; this test is the model server's
//! view: at every request it receives, nothing the ledger was handed is
//! still waiting for its fsync, so a power cut at that moment could not
//! take back a reply or tool result the request carries. It holds over
//! many seeded team runs mixing file tools, commands, checks, malformed
//! calls and delegations (a subagent's first request is built on the
//! orchestrator's reply), and once a run is reported done, everything it
//! recorded is durable.
//!
//! The test fails for the right reason: with the settling switched off
//! (`effects::unprotected_send_unsettled`), requests arrive while records
//! are still unsettled, in every seed. One test function, because that
//! switch is process-wide.

use std::sync::{Arc, Mutex};

use engine::backend::{Backend, BackendError, ChatRequest, ChatResponse};
use engine::chat::{Message, ToolCall, Usage};
use engine::harness::{run_team, RunRules, RunSpec, Team};
use engine::task::Task;
use engine::workflow::Workflow;
use ledger::Ledger;
use replay::{Mode, Session};

/// xorshift64*: a seeded script per run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Replies from a script and notes, at each request, whether the ledger
/// had made every submitted commit durable.
struct Watching {
    ledger: Arc<Ledger>,
    replies: Mutex<Vec<Message>>,
    /// Per request: how many messages it carried, and whether everything
    /// was durable when it arrived.
    seen: Mutex<Vec<(usize, bool)>>,
}

impl Backend for Watching {
    fn name(&self) -> &str {
        "watching"
    }
    fn base_model(&self) -> String {
        "watching/base".into()
    }
    fn complete<'a>(&'a self, req: &'a ChatRequest) -> engine::backend::Reply<'a> {
        Box::pin(std::future::ready(self.reply(req)))
    }
}

impl Watching {
    fn reply(&self, req: &ChatRequest) -> Result<ChatResponse, BackendError> {
        let durable = self.ledger.all_durable();
        self.seen
            .lock()
            .unwrap()
            .push((req.messages.len(), durable));
        let m = self
            .replies
            .lock()
            .unwrap()
            .pop()
            .unwrap_or_else(|| call("finish", r#"{"report": "out of script"}"#));
        Ok(ChatResponse {
            finish_reason: if m.tool_calls.is_empty() {
                "stop".into()
            } else {
                "tool_calls".into()
            },
            message: m,
            usage: Usage {
                prompt_tokens: 10,
                completion_tokens: 5,
            },
            raw: None,
            raw_body: None,
            trainer_tokens: None,
        })
    }
}

fn call(name: &str, args: &str) -> Message {
    Message::tool_calls(vec![ToolCall::new(
        format!("c-{name}-{}", args.len()),
        name,
        args,
    )])
}

/// One tool call of the kinds a team makes, file tools most often.
fn step(rng: &mut Rng, i: usize) -> Message {
    match rng.below(8) {
        0 | 1 => call(
            "write_file",
            &format!(r#"{{"path": "notes/{i}.md", "content": "step {i}"}}"#),
        ),
        2 | 3 => call("read_file", r#"{"path": "README.md"}"#),
        4 => call("list_files", r#"{"path": "."}"#),
        5 => call(
            "bash",
            &format!(r#"{{"command": "echo {i} > out{i}.txt"}}"#),
        ),
        6 => call("run_checks", "{}"),
        _ => call("write_file", r#"{"path": "x.txt", "content": "#),
    }
}

/// A seeded orchestrator script: steps, perhaps delegations (whose
/// subagent makes its own steps and answers), then `finish`. Returned in
/// reply order.
fn script(seed: u64) -> Vec<Message> {
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let mut out = Vec::new();
    let turns = 3 + rng.below(6) as usize;
    for i in 0..turns {
        if rng.below(4) == 0 {
            out.push(call(
                "delegate",
                r#"{"role": "analyst", "instructions": "look around", "contract": "say ok"}"#,
            ));
            for j in 0..rng.below(3) as usize {
                out.push(step(&mut rng, 100 * (i + 1) + j));
            }
            out.push(Message::assistant("ok"));
        } else {
            out.push(step(&mut rng, i));
        }
    }
    out.push(call("finish", r#"{"report": "done"}"#));
    out
}

fn task() -> Task {
    Task::load(
        &std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../examples/tasks/fin-momentum-backtest"),
    )
    .unwrap()
}

/// Plays one seeded team run; what the backend saw, and whether the
/// ledger was all durable once the run was reported.
fn run(seed: u64) -> (Vec<(usize, bool)>, bool) {
    let d = tempfile::tempdir().unwrap();
    let l = Arc::new(Ledger::init(d.path()).unwrap());
    let s = Session::new(l.clone(), "t", Mode::Live).unwrap();
    let mut replies = script(seed);
    replies.reverse();
    let b = Arc::new(Watching {
        ledger: l.clone(),
        replies: Mutex::new(replies),
        seen: Mutex::new(Vec::new()),
    });
    let team = Team {
        orchestrator: b.clone(),
        orchestrator_model: "watching/base".into(),
        subagent: b.clone(),
        subagent_model: "watching/base".into(),
        sampling: engine::config::SamplingConfig::with(0.0, 100),
    };
    let t = task();
    let spec = RunSpec {
        task: &t,
        workflow: &Workflow::bare(),
        stream: format!("r{seed}"),
        purpose: "test",
        cycle: 1,
        index: 0,
    };
    let out = engine::exec::block_on(run_team(&s, &spec, &team, &RunRules::default()))
        .expect("the engine's runtime starts")
        .expect("the run plays");
    assert_eq!(
        out.record.status, "finished",
        "seed {seed}: {}",
        out.record.detail
    );
    let done_durable = l.all_durable();
    let seen = b.seen.lock().unwrap().clone();
    (seen, done_durable)
}

#[test]
fn a_request_leaves_only_once_what_it_is_built_on_is_durable() {
    const SEEDS: u64 = 24;
    for seed in 0..SEEDS {
        let (seen, done) = run(seed);
        assert!(seen.len() >= 4, "seed {seed}: {} requests", seen.len());
        for (i, (messages, durable)) in seen.iter().enumerate() {
            assert!(
                durable,
                "seed {seed}: request {i} ({messages} messages) arrived while records it \
                 is built on were not yet durable"
            );
        }
        assert!(
            done,
            "seed {seed}: the run was reported with records not durable"
        );
    }
    // The protection off: requests leave while the last reply's record
    // (or the initial snapshot's) still waits for its fsync.
    engine::effects::unprotected_send_unsettled(true);
    let caught = (0..SEEDS)
        .filter(|&seed| run(seed).0.iter().any(|(_, durable)| !durable))
        .count();
    engine::effects::unprotected_send_unsettled(false);
    assert_eq!(
        caught, SEEDS as usize,
        "without settling, every seed sends a request before its records are durable"
    );
}
