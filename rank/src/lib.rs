//! Ranking for MASS self-training cycles: who is compared with whom, how the
//! verdicts become scores, and how head-to-head results are reported.
//!
//! In the outer loop (see MASS.md, "Outer loop") each task's champion workflow
//! is run 18 times; the runs are judged in pairs and the best become training
//! data. This crate is the pure, I/O-free arithmetic of that step:
//!
//! * [`schedule`]: a seeded, connected pairing schedule in which every run
//!   meets exactly `k` opponents (18 runs x 6 opponents = 54 pairs), with a
//!   balanced presentation order (which run the judge sees as "A").
//! * [`bt`]: Bradley-Terry scores from the verdicts by Hunter's MM iteration,
//!   a tie counting as half a win, with the reference code's prior of 0.5
//!   virtual win and 0.5 virtual loss against an average player (default), the
//!   pure maximum-likelihood fit, or an L2 penalty; plus ranks and counts.
//! * [`winrate`]: `W / (W + L)` with ties excluded and reported, and Wilson
//!   score intervals.
//! * [`jsonl`]: parsing a comparisons file (`{"a", "b", "winner"}` per line).
//!
//! All functions are deterministic: the same input gives the same output, bit
//! for bit, so results recorded in the ledger can be replayed. Bad input gives
//! a [`RankError`] with structured context, never a panic.
//!
//! # Example
//!
//! ```
//! use rank::bt::{fit, FitOptions};
//! use rank::jsonl::parse_comparisons;
//! use rank::schedule::pairing_schedule;
//!
//! // Who meets whom: 18 runs, 6 opponents each.
//! let schedule = pairing_schedule(18, 6, 42)?;
//! assert_eq!(schedule.len(), 54);
//!
//! // Verdicts, as a judge would emit them.
//! let file = r#"
//! {"a": "run-1", "b": "run-2", "winner": "a"}
//! {"a": "run-2", "b": "run-3", "winner": "tie"}
//! {"a": "run-3", "b": "run-1", "winner": "b"}
//! "#;
//! let parsed = parse_comparisons(file)?;
//! let result = fit(parsed.items.len(), &parsed.comparisons, &FitOptions::default())?;
//! let best = result.by_rank()[0];
//! assert_eq!(parsed.items[best.item], "run-1");
//! // Scores are natural-log strengths centred to mean 0.
//! let sum: f64 = result.ratings.iter().map(|r| r.score).sum();
//! assert!(sum.abs() < 1e-12);
//! # Ok::<(), rank::RankError>(())
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod bt;
mod error;
pub mod jsonl;
pub mod schedule;
pub mod winrate;

pub use error::{ItemLabel, LineProblem, MleObstacle, RankError};
