//! `mass rank`: Bradley-Terry on any comparisons file, with the engine's code.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use rank::bt::{fit_named, FitOptions, Prior};
use serde_json::json;

pub fn run(file: &Path, prior: f64, json: bool) -> Result<ExitCode> {
    if !(prior.is_finite() && prior >= 0.0) {
        bail!("--prior must be a non-negative number (0 = pure maximum likelihood), got {prior}");
    }
    let text =
        std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
    let parsed =
        rank::jsonl::parse_comparisons(&text).with_context(|| format!("in {}", file.display()))?;
    let opts = FitOptions {
        prior: if prior == 0.0 {
            Prior::None
        } else {
            Prior::Virtual(prior)
        },
        ..FitOptions::default()
    };
    let fit = fit_named(&parsed.items, &parsed.comparisons, &opts)
        .context("cannot fit Bradley-Terry scores")?;
    let mut out = crate::output::stdout();
    if json {
        let v: Vec<_> = fit
            .by_rank()
            .iter()
            .map(|r| json!({"item": parsed.items[r.item], "score": r.score, "rank": r.rank, "wins": r.wins, "losses": r.losses, "ties": r.ties}))
            .collect();
        serde_json::to_writer_pretty(&mut out, &v)?;
        writeln!(out)?;
    } else {
        writeln!(
            out,
            "{:>4}  {:>9}  {:>4} {:>4} {:>4}  item",
            "rank", "score", "W", "L", "T"
        )?;
        for r in fit.by_rank() {
            writeln!(
                out,
                "{:>4}  {:>9.4}  {:>4} {:>4} {:>4}  {}",
                r.rank, r.score, r.wins, r.losses, r.ties, parsed.items[r.item]
            )?;
        }
        if !fit.converged {
            writeln!(
                out,
                "warning: did not converge in {} iterations",
                fit.iterations
            )?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
