//! Run folders in the reference implementation's documented formats, for
//! tests (ours, written from the format descriptions in `reference.rs`;
//! no code of the reference is copied, as it carries no licence). One
//! cycle of one training task (`query51`, four collected candidates, ranks
//! 1-2 for training and 3 for validation), one held-out evaluation run,
//! a reference run and two inner-loop runs; every episode has a proxy log
//! with a model listing, an orchestrator turn with a tool call, a
//! subagent's request whose response reports no usage, and the closing
//! orchestrator turn. With [`Spec::external`] set, two more evaluation
//! runs and the external judges' verdicts on them (`evaluation/
//! external.jsonl`). Every episode leaves its workspace where the reference
//! leaves it (`reference/`, `workspaces/v{K}/`, `pool/workspaces/`,
//! `evaluation/workspaces/`): results, a report, a script and an empty
//! folder. With [`Spec::key`] set, that key is planted in every
//! file type and place a credential can be: JSON body fields, URLs (query
//! and userinfo), response headers, quoted headers, free text and the
//! workspaces' files.

use std::io::Write;
use std::path::Path;

use serde_json::{json, Value};

/// What to write.
#[derive(Debug, Clone, Default)]
pub struct Spec {
    /// A secret to plant everywhere.
    pub key: Option<String>,
    /// Changes the judge's verdicts and one reply, for a second run.
    pub variant: u32,
    /// Also writes the held-out evaluation's external judgments
    /// (`evaluation/external.jsonl`) and two more evaluation runs they pair.
    pub external: bool,
}

/// The verdicts [`Spec::external`] writes, line by line: one per pair
/// (this folder's `query60_r0`, `query60_r1` and `query51_r0`, each
/// against the same run of [`OTHER_RUN`]), judge (`openai` then
/// `anthropic`) and seed (42, 43, 44), as `(winner, swapped)`. A test's
/// oracle reads the file, not this table.
const EXTERNAL: [(&str, bool); 18] = [
    ("A", false),
    ("A", true),
    ("B", false),
    ("tie", false),
    ("A", true),
    ("B", false),
    ("B", false),
    ("A", true),
    ("A", false),
    ("tie", false),
    ("tie", true),
    ("B", false),
    ("A", false),
    ("B", true),
    ("A", false),
    ("A", false),
    ("tie", true),
    ("A", false),
];

/// The run folder the external judgments pair this folder's runs with
/// (another generation's, not in the folder).
pub const OTHER_RUN: &str = "/abs/runs/L0-other";

const MODEL: &str = "Qwen/Qwen3.6-27B-FP8";

fn put(dir: &Path, rel: &str, bytes: &[u8]) -> std::io::Result<()> {
    let p = dir.join(rel);
    if let Some(parent) = p.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(p, bytes)
}

fn put_json(dir: &Path, rel: &str, v: &Value) -> std::io::Result<()> {
    put(dir, rel, format!("{v:#}\n").as_bytes())
}

fn jsonl(rows: &[Value]) -> Vec<u8> {
    rows.iter()
        .map(|r| format!("{r}\n"))
        .collect::<String>()
        .into_bytes()
}

/// Gzip of `bytes`, as `gzip -6` leaves the proxy log.
pub fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut z = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::new(6));
    // Writing to a Vec cannot fail.
    let _ = z.write_all(bytes);
    z.finish().unwrap_or_default()
}

/// Writes a whole run folder at `dir`.
pub fn write_run(dir: &Path, spec: &Spec) -> std::io::Result<()> {
    let key = spec.key.clone().unwrap_or_default();
    let mut config = json!({
        "run_dir": "runs/demo", "model_id": MODEL, "generation": 0,
        "endpoint": "http://127.0.0.1:8001/v1", "proxy_port": 9001,
        "tasks": {"train": [51], "test": [60], "excluded": [], "train_candidates": [51]},
        "search": {"iterations": 1, "seed_base": 1000},
        "collection": {"candidates": 4, "train_ranks": 2, "validation_rank": 3, "seed_base": 5000},
        "ranking": {"opponents_per_episode": 2, "seed": 7},
        "training": {"steps": 20, "lr": 0.0001, "lora_r": 16},
        "parent_bf16": "models/L0-bf16", "next_bf16": "models/L1-bf16", "next_fp8": "models/L1-fp8",
    });
    if !key.is_empty() {
        config["api_key"] = json!(key);
        config["judge_endpoint"] = json!(format!("https://judge:{key}@judge.example/v1?key={key}"));
    }
    put_json(dir, "config.json", &config)?;
    episode(dir, "logs/reference/query51", "t51_bare", spec, 0)?;
    workspace(dir, "reference/query51", "t51_bare", spec, 0)?;
    episode(dir, "logs/search/v0/query51_ourTeam", "t51_v0", spec, 1)?;
    workspace(dir, "workspaces/v0/query51_ourTeam", "t51_v0", spec, 1)?;
    episode(dir, "logs/search/v1/query51_ourTeam", "t51_v1", spec, 2)?;
    workspace(dir, "workspaces/v1/query51_ourTeam", "t51_v1", spec, 2)?;
    let mut pool = Vec::new();
    for i in 0..4u32 {
        let name = format!("t51_L0_s{}", 10100 + i);
        episode(dir, &format!("pool/runlogs/{name}"), "t51_L0", spec, 10 + i)?;
        workspace(
            dir,
            &format!("pool/workspaces/{name}"),
            "t51_L0",
            spec,
            10 + i,
        )?;
        pool.push(
            json!({"episode": name, "task": 51, "condition": "t51_L0", "seed": 10100 + i,
            "workspace": format!("/abs/runs/demo/pool/workspaces/{name}"),
            "logs_dir": format!("/abs/runs/demo/pool/runlogs/{name}"),
            "teacher_prompt": "/abs/runs/demo/teacher_prompts/query51.txt"}),
        );
    }
    put_json(dir, "pool.json", &Value::Array(pool.clone()))?;
    put_json(
        dir,
        "search/query51_ourTeam/retained_workflow.json",
        &json!({"beats_reference": true, "version": 1}),
    )?;
    episode(dir, "evaluation/logs/query60_r0", "t60_bare", spec, 20)?;
    workspace(
        dir,
        "evaluation/workspaces/query60_r0",
        "t60_bare",
        spec,
        20,
    )?;
    if spec.external {
        external(dir, spec, &key)?;
    }
    stage_files(dir, spec, &key, &pool)
}

/// Two more evaluation runs, the rollout manifest, and
/// `evaluation/external.jsonl`: the external judges' verdicts on each of
/// this folder's three evaluation runs paired with [`OTHER_RUN`]'s run of
/// the same task and replicate, as `python -m mass report --pairs` leaves
/// them (`pair_id` is a stand-in: the reference hashes the pair).
fn external(dir: &Path, spec: &Spec, key: &str) -> std::io::Result<()> {
    episode(dir, "evaluation/logs/query60_r1", "t60_bare", spec, 21)?;
    workspace(
        dir,
        "evaluation/workspaces/query60_r1",
        "t60_bare",
        spec,
        21,
    )?;
    episode(dir, "evaluation/logs/query51_r0", "t51_bare", spec, 22)?;
    workspace(
        dir,
        "evaluation/workspaces/query51_r0",
        "t51_bare",
        spec,
        22,
    )?;
    let runs = [(60, 0), (60, 1), (51, 0)];
    let ws = |root: &str, (q, i): (u32, u32)| format!("{root}/evaluation/workspaces/query{q}_r{i}");
    let manifest: Vec<Value> = runs
        .iter()
        .map(
            |&(q, i)| json!({"task": q, "replicate": i, "workspace": ws("/abs/runs/demo", (q, i))}),
        )
        .collect();
    put_json(dir, "evaluation/rollouts.json", &Value::Array(manifest))?;
    let judges = [("openai", "gpt-5.5"), ("anthropic", "claude-opus-4-8")];
    let mut rows = Vec::new();
    for (p, &run) in runs.iter().enumerate() {
        let pair = json!({"task": run.0, "a": ws("/abs/runs/demo", run), "b": ws(OTHER_RUN, run)});
        for (k, (provider, model)) in judges.iter().enumerate() {
            for (n, seed) in [42, 43, 44].into_iter().enumerate() {
                let i = p * 6 + k * 3 + n;
                let (mut winner, swapped) = EXTERNAL[i];
                if i == 0 && spec.variant % 2 == 1 {
                    winner = "B";
                }
                let mut why = format!("Submission {winner} supports its claims with evidence.");
                if !key.is_empty() && i == 1 {
                    why.push_str(&format!(" (the workspace printed {key})"));
                }
                rows.push(json!({"pair_id": format!("{p:064x}"), "pair": pair, "provider": provider,
                    "model": model, "seed": seed, "swapped": swapped, "winner": winner, "rationale": why,
                    "metrics": {"usage": {"input_tokens": 30000 + i, "output_tokens": 900}, "estimated_cost_usd": 0.177,
                                "cost_estimate_note": "Linear estimate", "response_id": format!("resp_{i}")}}));
            }
        }
    }
    put(dir, "evaluation/external.jsonl", &jsonl(&rows))
}

/// The judge's matches, the ranking, the manifests and the training files.
fn stage_files(dir: &Path, spec: &Spec, key: &str, pool: &[Value]) -> std::io::Result<()> {
    let name = |i: usize| pool[i]["episode"].as_str().unwrap_or_default().to_string();
    let flip = spec.variant % 2 == 1;
    let pairs = [
        (0, 1, "A"),
        (1, 2, "A"),
        (2, 3, if flip { "B" } else { "A" }),
        (0, 3, "tie"),
    ];
    let rows: Vec<Value> = pairs
        .iter()
        .enumerate()
        .map(|(i, (a, b, w))| {
            let mut why = format!("Workspace {w} reports its results with evidence.");
            if !key.is_empty() && i == 0 {
                why.push_str(&format!(" (the config held {key})"));
            }
            json!({"a": name(*a), "b": name(*b), "winner": w, "rationale": why, "model": MODEL,
                   "seed": 7 + 51 * 1000 + i, "metrics": {"latency_s": 1.5}})
        })
        .collect();
    put(dir, "selection/task51_matches.jsonl", &jsonl(&rows))?;
    let order = if flip { [0, 1, 3, 2] } else { [0, 1, 2, 3] };
    let ranked: Vec<Value> = order
        .iter()
        .enumerate()
        .map(|(r, &i)| {
            let mut row = pool[i].clone();
            row["score"] = json!(1.0 - r as f64 * 0.5);
            row["rank"] = json!(r + 1);
            row
        })
        .collect();
    put_json(
        dir,
        "selection/task51_ranked.json",
        &Value::Array(ranked.clone()),
    )?;
    put_json(
        dir,
        "selection/train.json",
        &Value::Array(ranked[..2].to_vec()),
    )?;
    put_json(
        dir,
        "selection/val.json",
        &Value::Array(ranked[2..3].to_vec()),
    )?;
    let mut log = vec![
        json!({"step": 0, "val_loss": 1.5, "val_tokens": 900}),
        json!({"step": 10, "loss": 1.25, "lr": 0.0001, "epoch": 0.5}),
        json!({"step": 20, "loss": 1.0, "lr": 0.00005, "val_loss": 1.125, "val_tokens": 900}),
    ];
    if !key.is_empty() {
        log[1]["wandb_api_key"] = json!(key);
    }
    put(dir, "training/train_log.jsonl", &jsonl(&log))?;
    put_json(
        dir,
        "selected_checkpoint.json",
        &json!({"step": 20, "val_loss": 1.125,
        "checkpoint": "/abs/runs/demo/training/step_00020", "criterion": "minimum validation loss"}),
    )
}

/// One episode folder: prompt, status, trace, proxy log.
fn episode(dir: &Path, rel: &str, condition: &str, spec: &Spec, n: u32) -> std::io::Result<()> {
    let key = spec.key.clone().unwrap_or_default();
    let mut prompt = format!("Solve task {condition}: write results.json and report.md.\n");
    if !key.is_empty() {
        prompt.push_str(&format!("Use the API key {key} if a service asks.\n"));
    }
    put(dir, &format!("{rel}/prompt.txt"), prompt.as_bytes())?;
    let t0 = 1_767_225_600 + u64::from(n) * 3600; // 2026-01-01T00:00:00Z + n h
    let iso = |s: u64| {
        let (d, r) = (s / 86400, s % 86400);
        // Days after 2026-01-01 stay in January for the fixture's range.
        format!(
            "2026-01-{:02}T{:02}:{:02}:{:02}Z",
            1 + d - 20454,
            r / 3600,
            r % 3600 / 60,
            r % 60
        )
    };
    let mut status = json!({
        "started_at": iso(t0), "finished_at": iso(t0 + 600), "model": MODEL,
        "endpoint": "http://127.0.0.1:8001/v1", "seed": 10_000 + n, "qwen_code_version": "0.20.0",
        "exit_code": 0, "trace_has_success_result": true, "failure": null,
        "hiw": {"condition": condition, "client_endpoint": "http://127.0.0.1:9001/v1",
                "api_log": format!("{rel}/api_requests.jsonl.gz"), "api_requests": 4, "mass": true},
    });
    if !key.is_empty() {
        status["hiw"]["client_endpoint"] = json!(format!("http://user:{key}@127.0.0.1:9001/v1"));
    }
    put_json(dir, &format!("{rel}/run_status.json"), &status)?;
    let mut said = "Done: results.json written.".to_string();
    if !key.is_empty() {
        said.push_str(&format!(" Authorization: Bearer {key}"));
    }
    let trace = [
        json!({"type": "system", "subtype": "init", "model": MODEL}),
        json!({"type": "assistant", "message": {"content": [{"type": "text", "text": said}]}}),
        json!({"type": "result", "subtype": "success", "is_error": false, "result": said}),
    ];
    put(dir, &format!("{rel}/qwen_stream.jsonl"), &jsonl(&trace))?;
    let log = proxy_log(&prompt, &key, t0, spec.variant);
    put(
        dir,
        &format!("{rel}/api_requests.jsonl.gz"),
        &gzip(&jsonl(&log)),
    )?;
    put(dir, &format!("{rel}/proxy.log"), b"READY proxy\n")
}

/// The files of one episode's workspace, as the agent would leave them:
/// results, a report and a script in a subfolder (an empty folder too);
/// with [`Spec::key`], a `.env` holding the key and the report quoting it.
fn workspace(dir: &Path, rel: &str, condition: &str, spec: &Spec, n: u32) -> std::io::Result<()> {
    let results =
        json!({"condition": condition, "episode": n, "sharpe": 1.25 + f64::from(n) / 8.0});
    put_json(dir, &format!("{rel}/results.json"), &results)?;
    let mut report = format!("# Report of {condition}\n\nSharpe ratio in results.json.\n");
    if let Some(key) = &spec.key {
        report.push_str(&format!("Called the service with {key}.\n"));
        put(
            dir,
            &format!("{rel}/.env"),
            format!("OPENAI_API_KEY={key}\n").as_bytes(),
        )?;
    }
    put(dir, &format!("{rel}/report.md"), report.as_bytes())?;
    put(
        dir,
        &format!("{rel}/src/solve.py"),
        b"import json\nprint(json.load(open('results.json')))\n",
    )?;
    std::fs::create_dir_all(dir.join(rel).join("out"))
}

/// The proxy's records of one episode.
fn proxy_log(prompt: &str, key: &str, t0: u64, variant: u32) -> Vec<Value> {
    let ts = |k: u64| (t0 + k) as f64 + 0.25;
    let sys = json!({"role": "system", "content": "You are Qwen Code, an interactive CLI agent."});
    let user = json!({"role": "user", "content": prompt});
    let call = json!({"index": 0, "id": "call_1", "type": "function",
                      "function": {"name": "run_shell_command", "arguments": "{\"command\":\"ls\"}"}});
    let asked = json!({"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function",
                      "function": {"name": "run_shell_command", "arguments": "{\"command\":\"ls\"}"}}]});
    let tool = json!({"role": "tool", "tool_call_id": "call_1", "content": "data.csv"});
    let mut path = "/v1/chat/completions".to_string();
    let mut body_extra = json!({});
    let mut headers = json!({"content-type": "text/event-stream", "x-request-id": "req-1"});
    if !key.is_empty() {
        path.push_str(&format!("?key={key}"));
        body_extra = json!({"api_key": key});
        headers["x-api-key"] = json!(key);
    }
    let chat = |seq: u64, messages: Value, reply: Value, usage: Value, finish: &str| {
        let mut req = json!({"model": MODEL, "messages": messages, "stream": true, "temperature": 0.6,
                             "tools": [{"type": "function", "function": {"name": "run_shell_command"}}]});
        if let (Some(r), Some(x)) = (req.as_object_mut(), body_extra.as_object()) {
            r.extend(x.clone());
        }
        json!({"ts_start": ts(seq * 10), "method": "POST", "path": path, "seq": seq, "request": req,
               "status": 200, "response_headers": headers, "stream": true, "response_bytes": 100,
               "response": {"id": format!("chatcmpl-{seq}"), "model": MODEL, "object": "chat.completion.reassembled",
                            "choices": [{"index": 0, "message": reply, "finish_reason": finish, "stop_reason": null}],
                            "usage": usage, "error": null, "n_chunks": 3, "n_bad_chunks": 0},
               "sse_raw": format!("data: {{\"choices\":[]}}\n\ndata: [DONE]\n{}", if key.is_empty() { String::new() } else { format!("x-api-key: {key}\n") }),
               "duration_s": 1.5})
    };
    let models = json!({"ts_start": ts(0), "method": "GET", "path": "/v1/models", "seq": 0, "request": null,
                        "status": 200, "response_headers": {"content-type": "application/json"}, "stream": false,
                        "response": {"data": [{"id": MODEL}]}, "duration_s": 0.01});
    let reply1 = json!({"role": "assistant", "content": null, "reasoning_content": "List files first.",
                        "reasoning_details": null, "tool_calls": [call]});
    let sub = json!([{"role": "system", "content": "You are a general-purpose subagent."},
                     {"role": "user", "content": "Summarise data.csv."}]);
    let reply2 = json!({"role": "assistant", "content": "It has 3 columns.", "reasoning_content": null,
                        "reasoning_details": null, "tool_calls": null});
    let done = if variant % 2 == 1 {
        "Finished; see report.md."
    } else {
        "Finished."
    };
    let reply3 = json!({"role": "assistant", "content": done, "reasoning_content": null,
                        "reasoning_details": null, "tool_calls": null});
    vec![
        models,
        chat(
            1,
            json!([sys, user]),
            reply1,
            json!({"prompt_tokens": 120, "completion_tokens": 30}),
            "tool_calls",
        ),
        chat(2, sub, reply2, Value::Null, "stop"),
        chat(
            3,
            json!([sys, user, asked, tool]),
            reply3,
            json!({"prompt_tokens": 160, "completion_tokens": 8}),
            "stop",
        ),
    ]
}
