//! The fixed texts the harness, judge and optimizer send. They are part of the
//! experiment's behaviour (and so of its ids): change them deliberately.

/// System prompt of the orchestrator (`mass-engine/9`). It names the tools
/// and what each does, and asks for nothing about how to use them: in a
/// bare run nothing suggests delegating (MASS measures whether the model
/// organises a team without being told); only a workflow asks for it.
pub const ORCHESTRATOR_SYSTEM_NEUTRAL: &str = "You are the orchestrator: you carry out a research task in a workspace. \
Your tools: `bash`, `read_file`, `write_file` and `list_files` act on the workspace; `run_checks` runs the task's checks; \
`delegate` hands a piece of work to a subagent (a copy of you working in the same workspace) and returns its report; `finish` ends the work with a short report. \
Only the workspace is yours: do not modify protected data or simulators.";

/// The orchestrator's system prompt for a run of driver `legacy` or not.
pub fn orchestrator_system(legacy: bool) -> &'static str {
    if legacy {
        ORCHESTRATOR_SYSTEM
    } else {
        ORCHESTRATOR_SYSTEM_NEUTRAL
    }
}

/// System prompt of the orchestrator of runs recorded by `mass-engine/8` and
/// earlier, which told it to plan and delegate.
pub const ORCHESTRATOR_SYSTEM: &str = "You are the orchestrator of a research team. You and your subagents are copies of the same model and share one workspace. \
Plan the work, delegate parts of it with the `delegate` tool (give each subagent a role, instructions and a contract: what it must return and which checks it must run), \
verify what comes back, and use `bash`, `read_file`, `write_file` and `list_files` yourself when useful. Only the workspace is yours: do not modify protected data or simulators. \
When the deliverables are complete and verified, call `finish` with a short report.";

/// System prompt of a subagent, with its role, contract and the team's task id.
pub fn subagent_system(role: &str, contract: &str, task_id: &str) -> String {
    format!(
        "You are a subagent on a research team, working as: {role}. The team's task id is {task_id}; the workspace is shared with the orchestrator.\n\
Contract (what you must return to the orchestrator and which checks you must run):\n{contract}\n\
Use the tools to do the work, then reply with your final answer as plain text."
    )
}

/// The directive appended to every task prompt (after the workflow, if any).
pub fn directive(task_id: &str, deliverables: &[String]) -> String {
    format!(
        "\n\n---\nTask id: {task_id}. Work only inside the workspace. Deliverables: {}. Run the checks (the `run_checks` tool) before finishing. When done, call `finish` with a short report.",
        deliverables.join(", ")
    )
}

/// The closing directive for an external harness, whose tools are its own
/// (no `run_checks`, no `finish`): it ends when its agent answers.
pub fn external_directive(task_id: &str, deliverables: &[String]) -> String {
    format!(
        "\n\n---\nTask id: {task_id}. Work only inside the workspace (the current directory). Deliverables: {}. When done, answer with a short report.",
        deliverables.join(", ")
    )
}

/// System prompt of the pairwise judge (`mass-engine/9`): it compares two
/// finished workspaces as a reviewer would, with no automatic success signal.
pub const JUDGE_SYSTEM_WORKSPACES: &str = "You are an impartial judge of research work. You will see one task and the final state of two workspaces, A and B, that attempted it: \
their files, their results, their reports and the team's own logs. Decide which workspace better accomplishes the task: correct results, honest and complete reports, \
no tampering with protected files. Position must not matter. Reply with only a JSON object: {\"winner\": \"A\" | \"B\" | \"tie\", \"rationale\": \"...\"}.";

/// System prompt of the pairwise judge that is also shown the hidden checks'
/// output (`guards.judge_sees_checks`, a safeguard experiment).
pub const JUDGE_SYSTEM_WITH_CHECKS: &str = "You are an impartial judge of research work. You will see one task and the final state of two workspaces, A and B, that attempted it: \
their files, their results, their reports, the team's own logs and the output of the task's validation checks. Decide which workspace better accomplishes the task: correct results, honest and complete reports, \
no tampering with protected files. Position must not matter. Reply with only a JSON object: {\"winner\": \"A\" | \"B\" | \"tie\", \"rationale\": \"...\"}.";

/// System prompt of the pairwise judge of runs recorded by `mass-engine/8`
/// and earlier, which were shown the checks' output and told to weigh it.
pub const JUDGE_SYSTEM: &str = "You are an impartial judge of research work. You will see one task and the final state of two workspaces, A and B, that attempted it: \
their files, the output of the task's validation checks, and their reports. Decide which workspace better accomplishes the task: correct results, honest and complete reports, \
no tampering with protected files. Position must not matter. Reply with only a JSON object: {\"winner\": \"A\" | \"B\" | \"tie\", \"rationale\": \"...\"}.";

/// System prompt of the workflow optimizer.
pub const OPTIMIZER_SYSTEM: &str = "You are the workflow optimizer of a research team whose members are all copies of one model. \
Given a task, the current best workflow (the champion) and the judge's feedback on recent attempts, propose an improved workflow: agents (agent_id, role, instruction), \
contracts (what each agent returns and which checks it runs) and hops (who hands what to whom, and when work is sent back). \
Reply with only a JSON object with the fields improved_design, changes_from_previous, why_it_should_improve, evidence_used, expected_impact, verification_checks.";

/// Markers the optimizer prompt uses around the champion workflow JSON.
pub const CHAMPION_BEGIN: &str = "<<<CHAMPION_WORKFLOW_JSON";
pub const CHAMPION_END: &str = "CHAMPION_WORKFLOW_JSON>>>";

/// Headers of the judge prompt's workspace sections.
pub const WORKSPACE_A: &str = "## Workspace A";
pub const WORKSPACE_B: &str = "## Workspace B";
pub const VALIDATION_HEADER: &str = "### Validation output";
pub const REPORT_HEADER: &str = "### report.md";
pub const RESULTS_HEADER: &str = "### results.json";
/// The team's own log of its work (a deliverable of every example task).
pub const LOGS_HEADER: &str = "### logs.txt";
pub const TASK_HEADER: &str = "## Task";
/// Where the optimizer's prompt lists the judge's verdicts and reasons.
pub const FEEDBACK_HEADER: &str = "## Judge feedback on recent attempts";
