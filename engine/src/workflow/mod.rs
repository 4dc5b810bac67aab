//! Structured team workflows: what the inner loop searches over.
//!
//! A [`Workflow`] lists agents (`agent_id`, `role`, `instruction`), contracts
//! (what each agent returns to the orchestrator and which checks it runs) and
//! hops (the ordered orchestrator-subagent round trips). It has exactly one
//! text form, [`Workflow::render`], which is appended to the task prompt.
//!
//! The rendering is meant for a model to read, but it is also a precise
//! format: [`parse_rendered`] recovers the identical structure from any
//! prompt that contains it, and [`strip_from_prompt`] removes it so the
//! training prompt is byte-identical to the bare task (MASS.md, outer loop
//! step 5). To make that exact for arbitrary text (multi-line, unicode,
//! leading spaces, lines that look like markers), every value is written
//! either inline (`key: value`, only for single-line values without
//! surrounding whitespace) or as an indented block with one `| ` line per
//! value line. Every line a value produces is therefore indented, and the
//! structural lines (heading, end marker) start in column 0, so task text
//! inside a value can never end the section early.
//!
//! The optimizer answers with JSON ([`Proposal`]); [`parse_proposal`] finds
//! the object in whatever prose surrounds it and reports problems with a path
//! (`improved_design.agents[1]`), so the inner loop can re-ask with the error.
//!
//! Where things live: the types, limits and error here; the canonical text
//! in `render.rs`, read back by `parse.rs`; finding and stripping the
//! section in a prompt in `strip.rs`; the design rules in `validate.rs`;
//! the optimizer's JSON in `proposal.rs`. Everything public is re-exported
//! here, so `crate::workflow::X` names it wherever it is defined.

use std::fmt;

use serde::{Deserialize, Serialize};

mod parse;
mod proposal;
mod render;
mod strip;
mod validate;

pub use proposal::parse_proposal;
pub use strip::{find_section, parse_rendered, strip_from_prompt};

/// The heading that opens the rendered section.
pub const SECTION_HEADING: &str = "## Team workflow";
/// The line that closes the rendered section.
pub const END_MARKER: &str = "<!-- end of team workflow -->";
/// Fixed guidance at the top of the section; part of the format.
pub const PREAMBLE: &str = "You are the orchestrator and the agents below are your team. \
Delegate to each agent with its instruction, hold it to its contract (what it must \
return to you and which checks it must run), and follow the hops in order, sending \
work back whenever a hop's send-back condition holds.";

/// Reserved endpoint name for hops: the orchestrator itself.
pub const ORCHESTRATOR: &str = "orchestrator";
pub const MAX_AGENTS: usize = 12;
/// One contract per agent at most (checked separately), so this is a backstop.
pub const MAX_CONTRACTS: usize = MAX_AGENTS;
pub const MAX_HOPS: usize = 48;
pub const MAX_CHECKS_PER_CONTRACT: usize = 16;
pub const MAX_LIST_ITEMS: usize = 32;
pub const MAX_ID_CHARS: usize = 64;
pub const MAX_TEXT_CHARS: usize = 4000;
/// Larger optimizer replies are rejected before any scanning.
pub const MAX_REPLY_BYTES: usize = 1 << 20;

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Agent {
    pub agent_id: String,
    pub role: String,
    pub instruction: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Contract {
    pub agent_id: String,
    /// What the agent must hand back to the orchestrator.
    pub returns: String,
    /// Checks the agent must run before returning.
    #[serde(default)]
    pub checks: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hop {
    /// An agent id or [`ORCHESTRATOR`].
    pub from: String,
    pub to: String,
    /// What is handed over.
    pub handoff: String,
    /// When the receiver sends the work back for revision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub send_back_when: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Workflow {
    #[serde(default)]
    pub agents: Vec<Agent>,
    #[serde(default)]
    pub contracts: Vec<Contract>,
    #[serde(default)]
    pub hops: Vec<Hop>,
}

/// Coarse shape of a workflow, used by the simulated model.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct WorkflowFeatures {
    pub agents: usize,
    pub contracts_with_checks: usize,
    pub hops: usize,
    pub send_backs: usize,
    /// Total characters (not bytes) of all agent instructions.
    pub instruction_chars: usize,
}

/// An optimizer's proposal (the MASS optimizer JSON).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Proposal {
    pub improved_design: Workflow,
    pub changes_from_previous: Vec<String>,
    pub why_it_should_improve: String,
    pub evidence_used: Vec<String>,
    pub expected_impact: String,
    pub verification_checks: Vec<String>,
}

/// One validation problem at a path such as `improved_design.hops[0].to`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    pub path: String,
    pub message: String,
}

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.path, self.message)
    }
}

/// Why an optimizer reply could not be used. Messages are written to be sent
/// back to the optimizer verbatim.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProposalError {
    #[error("the optimizer's reply is too long ({bytes} bytes; at most {MAX_REPLY_BYTES})")]
    TooLarge { bytes: usize },
    #[error("no JSON object found in the optimizer's reply")]
    NoJsonObject,
    /// A `{...}` region was found but is not valid JSON.
    #[error("the JSON object in the optimizer's reply is not valid JSON: {message}")]
    Json { message: String },
    /// The JSON does not have the proposal's shape.
    #[error("{}", schema_message(path, message))]
    Schema { path: String, message: String },
    /// The shape is right but the content breaks a rule.
    #[error("{}", join_invalid(.0))]
    Invalid(Vec<Invalid>),
}

fn schema_message(path: &str, message: &str) -> String {
    if path.is_empty() {
        format!("proposal {message}")
    } else {
        format!("proposal field \"{path}\" {message}")
    }
}

fn join_invalid(items: &[Invalid]) -> String {
    items
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

impl Workflow {
    /// The empty workflow: the bare task, no team section at all.
    pub fn bare() -> Workflow {
        Workflow::default()
    }

    pub fn is_bare(&self) -> bool {
        self.agents.is_empty() && self.contracts.is_empty() && self.hops.is_empty()
    }

    /// Counts the simulated model uses to score a workflow.
    pub fn summary_features(&self) -> WorkflowFeatures {
        WorkflowFeatures {
            agents: self.agents.len(),
            contracts_with_checks: self
                .contracts
                .iter()
                .filter(|c| !c.checks.is_empty())
                .count(),
            hops: self.hops.len(),
            send_backs: self
                .hops
                .iter()
                .filter(|h| h.send_back_when.is_some())
                .count(),
            instruction_chars: self
                .agents
                .iter()
                .map(|a| a.instruction.chars().count())
                .sum(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn sample() -> Workflow {
        Workflow {
            agents: vec![
                Agent {
                    agent_id: "analyst".into(),
                    role: "Data analyst".into(),
                    instruction: "Load data/prices.csv and run the backtest.".into(),
                },
                Agent {
                    agent_id: "reviewer".into(),
                    role: "Reviewer".into(),
                    instruction: "Check every number in report.md.\n\nRun the validator.".into(),
                },
            ],
            contracts: vec![Contract {
                agent_id: "analyst".into(),
                returns: "results.json and a summary".into(),
                checks: vec![
                    "python3 checks/validate.py passes".into(),
                    " padded ".into(),
                ],
            }],
            hops: vec![
                Hop {
                    from: "orchestrator".into(),
                    to: "analyst".into(),
                    handoff: "the task".into(),
                    send_back_when: None,
                },
                Hop {
                    from: "analyst".into(),
                    to: "reviewer".into(),
                    handoff: "results.json".into(),
                    send_back_when: Some("a check fails".into()),
                },
            ],
        }
    }

    const SAMPLE_RENDERED: &str = "
## Team workflow

You are the orchestrator and the agents below are your team. Delegate to each agent with its instruction, hold it to its contract (what it must return to you and which checks it must run), and follow the hops in order, sending work back whenever a hop's send-back condition holds.

### Agents

- agent_id: analyst
  role: Data analyst
  instruction: Load data/prices.csv and run the backtest.

- agent_id: reviewer
  role: Reviewer
  instruction:
    | Check every number in report.md.
    |
    | Run the validator.

### Contracts

- agent_id: analyst
  returns: results.json and a summary
  checks:
    - python3 checks/validate.py passes
    -
      |  padded 

### Hops (in order)

1. from: orchestrator
   to: analyst
   handoff: the task

2. from: analyst
   to: reviewer
   handoff: results.json
   send_back_when: a check fails

<!-- end of team workflow -->
";

    #[test]
    fn render_is_pinned() {
        assert_eq!(sample().render(), SAMPLE_RENDERED);
    }

    #[test]
    fn bare_renders_empty_and_is_not_found() {
        assert_eq!(Workflow::bare().render(), "");
        assert!(Workflow::bare().is_bare());
        assert_eq!(parse_rendered("# Task\nDo it.\n"), None);
        assert_eq!(strip_from_prompt("# Task\nDo it.\n"), "# Task\nDo it.\n");
    }

    #[test]
    fn round_trip_sample_and_strip() {
        let prompt = "# Task\n\nCompute things.\n";
        let full = format!("{prompt}{}", sample().render());
        assert_eq!(parse_rendered(&full), Some(sample()));
        assert_eq!(strip_from_prompt(&full), prompt);
        // A directive appended after the section survives stripping.
        let with_directive = format!("{full}\nBegin now.\n");
        assert_eq!(parse_rendered(&with_directive), Some(sample()));
        assert_eq!(
            strip_from_prompt(&with_directive),
            format!("{prompt}\nBegin now.\n")
        );
        // No trailing newline on the prompt, and an empty prompt.
        let full = format!("no newline{}", sample().render());
        assert_eq!(strip_from_prompt(&full), "no newline");
        assert_eq!(parse_rendered(&sample().render()), Some(sample()));
        assert_eq!(strip_from_prompt(&sample().render()), "");
    }

    #[test]
    fn decoy_heading_in_task_text_is_ignored() {
        let prompt = "Intro\n## Team workflow\nThe task talks about a team workflow.\n<!-- end of team workflow -->\n";
        let full = format!("{prompt}{}", sample().render());
        assert_eq!(parse_rendered(&full), Some(sample()));
        assert_eq!(strip_from_prompt(&full), prompt);
    }

    #[test]
    fn prompt_ending_in_the_heading_text_is_handled() {
        // Regression: the prompt's own "\n## Team workflow" shares a newline
        // with the section's opening needle.
        let prompt = "Task\n## Team workflow";
        let full = format!("{prompt}{}", sample().render());
        assert_eq!(parse_rendered(&full), Some(sample()));
        assert_eq!(strip_from_prompt(&full), prompt);
    }

    #[test]
    fn damaged_sections_are_not_parsed() {
        let r = sample().render();
        for broken in [
            r.replace(END_MARKER, "<!-- end -->"),
            r.replace("  role: Reviewer", "  role:  Reviewer"),
            r.replace("2. from", "3. from"),
            r.replace("    |\n", "    |x\n"),
            r.replace("### Contracts\n\n", "### Contracts\n"),
        ] {
            assert_eq!(parse_rendered(&broken), None, "{broken}");
            assert_eq!(strip_from_prompt(&broken), broken);
        }
        // A truncated end marker line without its newline still parses.
        let trimmed = r.trim_end_matches('\n');
        assert_eq!(parse_rendered(trimmed), Some(sample()));
    }

    /// Deterministic generator (SplitMix64): no extra dev-dependency needed.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
        fn text(&mut self) -> String {
            const PIECES: &[&str] = &[
                "a",
                "word",
                " ",
                "  ",
                "\n",
                "\n\n",
                "\r\n",
                "\t",
                "|",
                "| ",
                "- ",
                "-",
                "1. ",
                "none",
                "None.",
                "checks: none",
                "## Team workflow",
                "\n## Team workflow\n",
                END_MARKER,
                "<!--",
                "é",
                "日本語",
                "🦀",
                "\u{2028}",
                "\u{a0}",
                "{",
                "}",
                "\"",
                "\\",
                "agent_id:",
                "role: x",
                "### Hops (in order)",
                "\u{0}",
                "",
            ];
            let n = self.below(6);
            (0..n).map(|_| PIECES[self.below(PIECES.len())]).collect()
        }
        fn list<T>(&mut self, max: usize, mut f: impl FnMut(&mut Self) -> T) -> Vec<T> {
            let n = self.below(max + 1);
            (0..n).map(|_| f(self)).collect()
        }
        fn workflow(&mut self) -> Workflow {
            Workflow {
                agents: self.list(4, |r| Agent {
                    agent_id: r.text(),
                    role: r.text(),
                    instruction: r.text(),
                }),
                contracts: self.list(3, |r| Contract {
                    agent_id: r.text(),
                    returns: r.text(),
                    checks: r.list(3, Rng::text),
                }),
                // Up to 12 hops so two-digit numbering is exercised.
                hops: self.list(12, |r| Hop {
                    from: r.text(),
                    to: r.text(),
                    handoff: r.text(),
                    send_back_when: if r.below(2) == 0 {
                        None
                    } else {
                        Some(r.text())
                    },
                }),
            }
        }
    }

    #[test]
    fn round_trip_property_on_generated_workflows() {
        let mut rng = Rng(0x5EED);
        let mut checked = 0;
        for _ in 0..3000 {
            let w = rng.workflow();
            let prompt = rng.text();
            let rendered = w.render();
            let full = format!("{prompt}{rendered}");
            if w.is_bare() {
                assert_eq!(rendered, "");
                continue;
            }
            checked += 1;
            assert_eq!(parse_rendered(&full).as_ref(), Some(&w), "{full:?}");
            assert_eq!(strip_from_prompt(&full), prompt, "{full:?}");
            // Text after the section (e.g. a directive) is kept by strip.
            let suffix = rng.text();
            let with_suffix = format!("{full}{suffix}");
            assert_eq!(
                parse_rendered(&with_suffix).as_ref(),
                Some(&w),
                "{with_suffix:?}"
            );
            assert_eq!(strip_from_prompt(&with_suffix), format!("{prompt}{suffix}"));
            // Rendering is a function of the workflow alone.
            assert_eq!(parse_rendered(&full).map(|p| p.render()), Some(rendered));
        }
        assert!(checked > 2500, "{checked}");
    }

    #[test]
    fn workflow_json_round_trip() {
        let w = sample();
        let json = serde_json::to_string(&w).unwrap_or_default();
        let back: Workflow = serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(back, w);
    }

    #[test]
    fn summary_features_counts() {
        let f = sample().summary_features();
        assert_eq!(
            f,
            WorkflowFeatures {
                agents: 2,
                contracts_with_checks: 1,
                hops: 2,
                send_backs: 1,
                instruction_chars: "Load data/prices.csv and run the backtest.".len()
                    + "Check every number in report.md.\n\nRun the validator.".len(),
            }
        );
        assert_eq!(
            Workflow::bare().summary_features(),
            WorkflowFeatures::default()
        );
        let unicode = Workflow {
            agents: vec![Agent {
                agent_id: "a".into(),
                role: "r".into(),
                instruction: "日本語".into(),
            }],
            ..Workflow::default()
        };
        assert_eq!(unicode.summary_features().instruction_chars, 3);
    }

    /// Compact JSON written out literally (not with `json!`), so the key
    /// order the tests edit does not depend on serde_json's features.
    fn proposal_json() -> String {
        concat!(
            r#"{"improved_design":{"agents":["#,
            r#"{"agent_id":"analyst","role":"Data analyst","instruction":"Run it."},"#,
            r#"{"agent_id":"qa","role":"QA","instruction":"Check it."}],"#,
            r#""contracts":[{"agent_id":"analyst","returns":"results.json","checks":"validate passes"}],"#,
            r#""hops":[{"from":"orchestrator","to":"analyst","handoff":"task","send_back_when":null},"#,
            r#"{"from":"analyst","to":"qa","handoff":"results","send_back_when":"a check fails"}]},"#,
            r#""changes_from_previous":"added qa","#,
            r#""why_it_should_improve":"QA catches errors {like this}","#,
            r#""evidence_used":["judge said numbers were wrong","iteration 2 lost"],"#,
            r#""expected_impact":"fewer wrong numbers","#,
            r#""verification_checks":["qa ran validate"]}"#
        )
        .to_string()
    }

    fn ok(text: &str) -> Proposal {
        parse_proposal(text).unwrap_or_else(|e| panic!("{e}\n{text}"))
    }

    fn err(text: &str) -> String {
        match parse_proposal(text) {
            Ok(p) => panic!("expected an error, got {p:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn proposal_in_all_wrappings() {
        let json = proposal_json();
        let expected = ok(&json);
        assert_eq!(expected.improved_design.agents.len(), 2);
        assert_eq!(expected.changes_from_previous, ["added qa"]);
        assert_eq!(expected.evidence_used.len(), 2);
        assert_eq!(
            expected.improved_design.contracts[0].checks,
            ["validate passes"]
        );
        assert_eq!(expected.improved_design.hops[0].send_back_when, None);
        assert_eq!(
            expected.improved_design.hops[1].send_back_when.as_deref(),
            Some("a check fails")
        );
        let pretty = serde_json::from_str::<Value>(&json)
            .and_then(|v| serde_json::to_string_pretty(&v))
            .unwrap_or_default();
        for wrapped in [
            format!("```json\n{pretty}\n```"),
            format!("Here is my proposal {{with braces}} and a stray {{ brace:\n\n```json\n{pretty}\n```\nThanks! }}"),
            format!("Thinking... the old design was {{\"agents\": []}}.\nFinal answer: {json} -- done"),
            format!("<think>{{not json}}</think>\n{json}"),
        ] {
            assert_eq!(ok(&wrapped), expected, "{wrapped}");
        }
    }

    #[test]
    fn double_encoded_design_is_accepted() {
        let inner =
            serde_json::json!({"agents": [{"agent_id": "a", "role": "r", "instruction": "i"}]});
        let text = serde_json::json!({"improved_design": inner.to_string()}).to_string();
        let p = ok(&text);
        assert_eq!(p.improved_design.agents[0].agent_id, "a");
        assert!(p.changes_from_previous.is_empty());
    }

    #[test]
    fn proposal_errors_say_what_and_where() {
        assert_eq!(
            err("I could not decide."),
            "no JSON object found in the optimizer's reply"
        );
        assert_eq!(err(""), "no JSON object found in the optimizer's reply");
        let m = err("```json\n{\"improved_design\": {\"agents\": [],}}\n```");
        assert!(
            m.starts_with("the JSON object in the optimizer's reply is not valid JSON"),
            "{m}"
        );
        assert!(m.contains("line 1"), "{m}");
        assert_eq!(
            err("{\"why\": 1}"),
            "proposal is missing \"improved_design\""
        );

        let missing = proposal_json().replace(",\"instruction\":\"Check it.\"", "");
        assert_eq!(
            err(&missing),
            "proposal field \"improved_design.agents[1]\" is missing \"instruction\""
        );
        let wrong_hop = proposal_json().replace("\"to\":\"qa\"", "\"to\":\"qb\"");
        assert_eq!(
            err(&wrong_hop),
            "improved_design.hops[1].to names agent \"qb\" which is not in agents (or \"orchestrator\")"
        );
        let typed = proposal_json().replace("\"role\":\"QA\"", "\"role\":3");
        assert_eq!(
            err(&typed),
            "proposal field \"improved_design.agents[1].role\" must be a string, found a number"
        );
        let extra = proposal_json().replace("\"role\":\"QA\"", "\"role\":\"QA\",\"tools\":[]");
        assert!(
            err(&extra).starts_with(
                "proposal field \"improved_design.agents[1]\" has unknown field \"tools\""
            ),
            "{}",
            err(&extra)
        );
        let bad_list = proposal_json().replace("\"added qa\"", "{\"x\":1}");
        assert_eq!(
            err(&bad_list),
            "proposal field \"changes_from_previous\" must be a string or a list of strings, found an object"
        );
        let not_obj = "{\"improved_design\": [1, 2]}";
        assert_eq!(
            err(not_obj),
            "proposal field \"improved_design\" must be an object, found a list"
        );
    }

    #[test]
    fn validation_rules() {
        let dup = proposal_json().replace("\"agent_id\":\"qa\"", "\"agent_id\":\"analyst\"");
        let m = err(&dup);
        assert!(
            m.contains("improved_design.agents[1].agent_id \"analyst\" duplicates improved_design.agents[0].agent_id"),
            "{m}"
        );
        let empty = proposal_json().replace("\"agent_id\":\"qa\"", "\"agent_id\":\"  \"");
        assert!(err(&empty).contains("improved_design.agents[1].agent_id must not be empty"));
        let reserved =
            proposal_json().replace("\"agent_id\":\"qa\"", "\"agent_id\":\"orchestrator\"");
        assert!(err(&reserved).contains("is reserved for the orchestrator"));
        let contract = proposal_json().replace(
            "\"contracts\":[{\"agent_id\":\"analyst\"",
            "\"contracts\":[{\"agent_id\":\"ghost\"",
        );
        assert!(
            err(&contract).contains("improved_design.contracts[0].agent_id names agent \"ghost\" which is not in agents"),
            "{}",
            err(&contract)
        );
        let self_hop = proposal_json().replace("\"from\":\"analyst\"", "\"from\":\"qa\"");
        assert!(err(&self_hop).contains("improved_design.hops[1] goes from \"qa\" to itself"));

        let many = Workflow {
            agents: (0..13)
                .map(|i| Agent {
                    agent_id: format!("a{i}"),
                    role: "r".into(),
                    instruction: "i".into(),
                })
                .collect(),
            ..Workflow::default()
        };
        let m = many
            .validate()
            .map_err(|e| e.to_string())
            .err()
            .unwrap_or_default();
        assert_eq!(m, "agents has 13 agents; at most 12 are allowed");

        let long = Workflow {
            agents: vec![Agent {
                agent_id: "a".into(),
                role: "r".into(),
                instruction: "x".repeat(MAX_TEXT_CHARS + 1),
            }],
            ..Workflow::default()
        };
        let m = long
            .validate()
            .map_err(|e| e.to_string())
            .err()
            .unwrap_or_default();
        assert_eq!(
            m,
            "agents[0].instruction is 4001 characters long; at most 4000 are allowed"
        );
        assert_eq!(sample().validate(), Ok(()));
        assert_eq!(Workflow::bare().validate(), Ok(()));
    }

    #[test]
    fn multiple_problems_are_reported_together() {
        let w = Workflow {
            agents: vec![Agent {
                agent_id: "a".into(),
                role: "".into(),
                instruction: "i".into(),
            }],
            contracts: vec![],
            hops: vec![Hop {
                from: "a".into(),
                to: "b".into(),
                handoff: "h".into(),
                send_back_when: None,
            }],
        };
        match w.validate() {
            Err(ProposalError::Invalid(items)) => {
                let paths: Vec<&str> = items.iter().map(|i| i.path.as_str()).collect();
                assert_eq!(paths, ["agents[0].role", "hops[0].to"]);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn oversized_and_adversarial_replies_do_not_hang() {
        let big = "x".repeat(MAX_REPLY_BYTES + 1);
        assert!(matches!(
            parse_proposal(&big),
            Err(ProposalError::TooLarge { .. })
        ));
        let braces = "{".repeat(200_000);
        assert_eq!(parse_proposal(&braces), Err(ProposalError::NoJsonObject));
        let nested = format!("{}{}", "{\"a\":".repeat(10_000), "}".repeat(10_000));
        assert!(parse_proposal(&nested).is_err());
    }

    #[test]
    fn parsed_proposal_renders_and_round_trips() {
        let p = ok(&proposal_json());
        let full = format!("Task.\n{}", p.improved_design.render());
        assert_eq!(parse_rendered(&full), Some(p.improved_design.clone()));
        let json = serde_json::to_string(&p).unwrap_or_default();
        let back: Proposal = serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(back, p);
    }
}
