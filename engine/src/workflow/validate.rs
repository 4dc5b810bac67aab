//! The rules a workflow must satisfy before it is run: unique, well-formed
//! agent ids, contracts and hops that name agents which exist, and size
//! bounds. Every problem is reported with its path, together, so the
//! optimizer can be re-asked with all of them at once.

use std::collections::BTreeMap;

use super::{
    Invalid, ProposalError, Workflow, MAX_AGENTS, MAX_CHECKS_PER_CONTRACT, MAX_CONTRACTS, MAX_HOPS,
    MAX_ID_CHARS, MAX_TEXT_CHARS, ORCHESTRATOR,
};

impl Workflow {
    /// Checks the rules a proposed design must satisfy (unique non-empty ids,
    /// references to existing agents, size bounds). Reports every problem.
    pub fn validate(&self) -> Result<(), ProposalError> {
        self.validate_at("")
    }

    /// [`Workflow::validate`] with every path prefixed (`improved_design.`
    /// when the workflow is a proposal's design).
    pub(super) fn validate_at(&self, prefix: &str) -> Result<(), ProposalError> {
        let mut bad = Vec::new();
        let mut add = |path: String, message: String| bad.push(Invalid { path, message });
        let ids = self.check_agents(prefix, &mut add);
        self.check_contracts(prefix, &ids, &mut add);
        self.check_hops(prefix, &ids, &mut add);
        if bad.is_empty() {
            Ok(())
        } else {
            Err(ProposalError::Invalid(bad))
        }
    }

    /// The agents' count, ids and texts; returns the valid ids, each with
    /// the index of the agent that has it.
    fn check_agents<'w>(
        &'w self,
        prefix: &str,
        add: &mut impl FnMut(String, String),
    ) -> BTreeMap<&'w str, usize> {
        if self.agents.len() > MAX_AGENTS {
            add(
                format!("{prefix}agents"),
                format!(
                    "has {} agents; at most {MAX_AGENTS} are allowed",
                    self.agents.len()
                ),
            );
        }
        let mut ids: BTreeMap<&str, usize> = BTreeMap::new();
        for (i, a) in self.agents.iter().enumerate() {
            let p = format!("{prefix}agents[{i}]");
            if let Some(m) = id_problem(&a.agent_id) {
                add(format!("{p}.agent_id"), m);
            } else if a.agent_id == ORCHESTRATOR {
                add(
                    format!("{p}.agent_id"),
                    format!("\"{ORCHESTRATOR}\" is reserved for the orchestrator itself"),
                );
            } else if let Some(first) = ids.insert(&a.agent_id, i) {
                ids.insert(&a.agent_id, first);
                add(
                    format!("{p}.agent_id"),
                    format!(
                        "\"{}\" duplicates {prefix}agents[{first}].agent_id",
                        a.agent_id
                    ),
                );
            }
            text_problem(add, format!("{p}.role"), &a.role);
            text_problem(add, format!("{p}.instruction"), &a.instruction);
        }
        ids
    }

    /// The contracts' count, the agents they name (existing, one contract
    /// each) and their texts.
    fn check_contracts(
        &self,
        prefix: &str,
        ids: &BTreeMap<&str, usize>,
        add: &mut impl FnMut(String, String),
    ) {
        if self.contracts.len() > MAX_CONTRACTS {
            add(
                format!("{prefix}contracts"),
                format!(
                    "has {} contracts; at most {MAX_CONTRACTS} are allowed",
                    self.contracts.len()
                ),
            );
        }
        let mut contracted: BTreeMap<&str, usize> = BTreeMap::new();
        for (i, c) in self.contracts.iter().enumerate() {
            let p = format!("{prefix}contracts[{i}]");
            if !ids.contains_key(c.agent_id.as_str()) {
                add(
                    format!("{p}.agent_id"),
                    format!("names agent \"{}\" which is not in agents", c.agent_id),
                );
            } else if let Some(first) = contracted.insert(&c.agent_id, i) {
                contracted.insert(&c.agent_id, first);
                add(
                    format!("{p}.agent_id"),
                    format!(
                        "agent \"{}\" already has a contract ({prefix}contracts[{first}])",
                        c.agent_id
                    ),
                );
            }
            text_problem(add, format!("{p}.returns"), &c.returns);
            if c.checks.len() > MAX_CHECKS_PER_CONTRACT {
                add(
                    format!("{p}.checks"),
                    format!(
                        "has {} checks; at most {MAX_CHECKS_PER_CONTRACT} are allowed",
                        c.checks.len()
                    ),
                );
            }
            for (j, check) in c.checks.iter().enumerate() {
                text_problem(add, format!("{p}.checks[{j}]"), check);
            }
        }
    }

    /// The hops' count, their ends (existing agents or the orchestrator, not
    /// the same) and their texts.
    fn check_hops(
        &self,
        prefix: &str,
        ids: &BTreeMap<&str, usize>,
        add: &mut impl FnMut(String, String),
    ) {
        if self.hops.len() > MAX_HOPS {
            add(
                format!("{prefix}hops"),
                format!(
                    "has {} hops; at most {MAX_HOPS} are allowed",
                    self.hops.len()
                ),
            );
        }
        for (i, h) in self.hops.iter().enumerate() {
            let p = format!("{prefix}hops[{i}]");
            for (field, end) in [("from", &h.from), ("to", &h.to)] {
                if end != ORCHESTRATOR && !ids.contains_key(end.as_str()) {
                    add(
                        format!("{p}.{field}"),
                        format!(
                            "names agent \"{end}\" which is not in agents (or \"{ORCHESTRATOR}\")"
                        ),
                    );
                }
            }
            if h.from == h.to {
                add(p.clone(), format!("goes from \"{}\" to itself", h.from));
            }
            text_problem(add, format!("{p}.handoff"), &h.handoff);
            if let Some(s) = &h.send_back_when {
                text_problem(add, format!("{p}.send_back_when"), s);
            }
        }
    }
}

fn id_problem(id: &str) -> Option<String> {
    if id.trim().is_empty() {
        Some("must not be empty".into())
    } else if id.trim() != id {
        Some("must not start or end with whitespace".into())
    } else if id.chars().any(char::is_control) {
        Some("must not contain control characters or line breaks".into())
    } else if id.chars().count() > MAX_ID_CHARS {
        Some(format!("is longer than {MAX_ID_CHARS} characters"))
    } else {
        None
    }
}

fn text_problem(add: &mut impl FnMut(String, String), path: String, text: &str) {
    let n = text.chars().count();
    if text.trim().is_empty() {
        add(path, "must not be empty".into());
    } else if n > MAX_TEXT_CHARS {
        add(
            path,
            format!("is {n} characters long; at most {MAX_TEXT_CHARS} are allowed"),
        );
    }
}
