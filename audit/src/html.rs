//! `mass report RUN --html FILE`: the report as one self-contained HTML
//! page (inline CSS and SVG; no script, font or image is fetched) with a
//! plot where people would rather look than read: per cycle the search
//! progress of each task's inner loop, workflow edit size against outcome,
//! win rates with both intervals, Bradley-Terry scores per task, judge
//! agreement, and tokens and wall time per stage. Every plotted datum is
//! one SVG element of class `mark` inside an `svg` whose `data-chart`
//! names the plot, and carries a `<title>` with its numbers, so a browser
//! test can count what was drawn against `report --json` and a reader can
//! hover for the figure. Each plot is followed by the same numbers as a
//! table.

use std::fmt::Write as _;

use super::report::{CycleReport, Report};

/// Plot geometry (SVG user units): width, left gutter for labels, right
/// margin, row height.
const WIDTH: f64 = 760.0;
const LEFT: f64 = 190.0;
const RIGHT: f64 = 30.0;
const ROW: f64 = 26.0;
const TOP: f64 = 24.0;
const BOTTOM: f64 = 34.0;

const ACCEPTED: &str = "#1b7837";
const REJECTED: &str = "#b2b2b2";
const PROMPT: &str = "#4575b4";
const COMPLETION: &str = "#f46d43";

/// Escapes text for HTML element content and attribute values.
fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn pct(x: Option<f64>) -> String {
    x.map_or("n/a".into(), |v| format!("{:.0}%", v * 100.0))
}

fn span(i: Option<[f64; 2]>) -> String {
    i.map_or("n/a".into(), |[a, b]| {
        format!("{:.0}-{:.0}%", a * 100.0, b * 100.0)
    })
}

fn selection_color(selection: &str) -> &'static str {
    match selection {
        "train" => "#1b7837",
        "validation" => "#7fbc41",
        "excluded" => "#d73027",
        _ => "#8c8c8c",
    }
}

/// One plot: an `svg` with `rows` labelled lanes and a horizontal axis.
struct Plot {
    svg: String,
    height: f64,
}

impl Plot {
    fn new(chart: &str, cycle: u32, rows: usize, title: &str) -> Plot {
        let height = TOP + ROW * rows.max(1) as f64 + BOTTOM;
        let mut svg = String::new();
        let _ = write!(
            svg,
            r#"<svg xmlns="http://www.w3.org/2000/svg" data-chart="{chart}" data-cycle="{cycle}" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" role="img" aria-label="{}">"#,
            esc(title)
        );
        Plot { svg, height }
    }

    fn plot_width() -> f64 {
        WIDTH - LEFT - RIGHT
    }

    fn row_y(i: usize) -> f64 {
        TOP + ROW * i as f64 + ROW / 2.0
    }

    fn label(&mut self, i: usize, text: &str) {
        let _ = write!(
            self.svg,
            r#"<text class="label" x="{}" y="{}" text-anchor="end" dominant-baseline="middle">{}</text>"#,
            LEFT - 8.0,
            Self::row_y(i),
            esc(text)
        );
    }

    /// The x axis from `lo` to `hi` with `ticks` labelled ticks.
    fn axis(&mut self, lo: f64, hi: f64, ticks: usize, fmt: impl Fn(f64) -> String) {
        let y = self.height - BOTTOM + 4.0;
        let _ = write!(
            self.svg,
            r##"<line class="axis-x" x1="{LEFT}" y1="{y}" x2="{}" y2="{y}" stroke="#444"/>"##,
            LEFT + Self::plot_width()
        );
        for k in 0..=ticks {
            let v = lo + (hi - lo) * k as f64 / ticks.max(1) as f64;
            let x = LEFT + Self::plot_width() * k as f64 / ticks.max(1) as f64;
            let _ = write!(
                self.svg,
                r##"<line x1="{x}" y1="{TOP}" x2="{x}" y2="{y}" stroke="#eee"/><text class="tick" x="{x}" y="{}" text-anchor="middle">{}</text>"##,
                y + 16.0,
                esc(&fmt(v))
            );
        }
    }

    /// Says in the plot's first row why it has nothing to draw.
    fn empty(&mut self, why: &str) {
        let _ = write!(
            self.svg,
            r#"<text class="note" x="{}" y="{}" text-anchor="middle" dominant-baseline="middle">{}</text>"#,
            LEFT + Self::plot_width() / 2.0,
            Self::row_y(0),
            esc(why)
        );
    }

    fn finish(mut self) -> String {
        self.svg.push_str("</svg>");
        self.svg
    }
}

/// The range of `values` widened by `pad` of its width on each side; a
/// single value gets `half` on each side, no value the range 0..1.
fn padded_range(values: &[f64], pad: f64, half: f64) -> (f64, f64) {
    let lo = values.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if values.is_empty() {
        (0.0, 1.0)
    } else if hi - lo < 1e-9 {
        (lo - half, hi + half)
    } else {
        let w = (hi - lo) * pad;
        (lo - w, hi + w)
    }
}

/// Maps `v` in `lo..=hi` to an x coordinate of the plot area.
fn x_of(v: f64, lo: f64, hi: f64) -> f64 {
    let t = if hi > lo { (v - lo) / (hi - lo) } else { 0.5 };
    LEFT + Plot::plot_width() * t.clamp(0.0, 1.0)
}

fn search_progress(c: &CycleReport, out: &mut String) {
    let cycle = c.figures.cycle;
    let max_it = c
        .inner
        .iter()
        .flat_map(|t| t.iterations.iter().map(|i| i.iteration))
        .max()
        .unwrap_or(1)
        .max(1);
    let max_edit = c
        .inner
        .iter()
        .flat_map(|t| t.iterations.iter().map(|i| i.edit_lines))
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    let mut p = Plot::new(
        "search",
        cycle,
        c.inner.len(),
        "inner-loop steps per task: filled when accepted, ringed when it beat the reference, size by workflow lines changed",
    );
    p.axis(0.5, max_it as f64 + 0.5, 1, |_| String::new());
    if c.inner.is_empty() {
        p.empty("no inner-loop step was recorded");
    }
    for (row, t) in c.inner.iter().enumerate() {
        p.label(row, &t.task);
        for it in &t.iterations {
            let x = x_of(it.iteration as f64, 0.5, max_it as f64 + 0.5);
            let r = 3.0 + 6.0 * (it.edit_lines as f64 / max_edit).sqrt();
            let (fill, stroke, sw) = match (it.accepted, it.beat_reference) {
                (true, true) => (ACCEPTED, "#000", 2.0),
                (true, false) => (ACCEPTED, ACCEPTED, 1.0),
                (false, _) => ("#fff", REJECTED, 1.5),
            };
            let _ = write!(
                p.svg,
                r#"<circle class="mark" cx="{x:.1}" cy="{:.1}" r="{r:.1}" fill="{fill}" stroke="{stroke}" stroke-width="{sw}"><title>{}: iteration {} {}{}, {} workflow line(s) changed: {}</title></circle>"#,
                Plot::row_y(row),
                esc(&t.task),
                it.iteration,
                if it.accepted { "accepted" } else { "rejected" },
                if it.beat_reference {
                    ", beat the reference"
                } else {
                    ""
                },
                it.edit_lines,
                esc(&it.reason)
            );
        }
    }
    // Iteration numbers under the axis.
    let y = p.height - BOTTOM + 20.0;
    for k in 1..=max_it {
        let _ = write!(
            p.svg,
            r#"<text class="tick" x="{:.1}" y="{y}" text-anchor="middle">{k}</text>"#,
            x_of(k as f64, 0.5, max_it as f64 + 0.5)
        );
    }
    figure(out, "Search progress (inner-loop iteration; filled = accepted, black ring = beat the reference, size = workflow lines changed)", &p.finish());
}

fn edit_size(c: &CycleReport, out: &mut String) {
    let max_edit = c
        .inner
        .iter()
        .flat_map(|t| t.iterations.iter().map(|i| i.edit_lines))
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    let mut p = Plot::new(
        "edits",
        c.figures.cycle,
        2,
        "workflow lines changed by each inner-loop candidate, by outcome",
    );
    p.label(0, "accepted");
    p.label(1, "rejected");
    p.axis(0.0, max_edit, 4, |v| format!("{v:.0}"));
    let mut k = 0usize;
    for t in &c.inner {
        for it in &t.iterations {
            let row = usize::from(!it.accepted);
            // A small deterministic spread so equal sizes stay visible.
            let dy = ((k % 5) as f64 - 2.0) * 3.0;
            k += 1;
            let _ = write!(
                p.svg,
                r#"<circle class="mark" cx="{:.1}" cy="{:.1}" r="4" fill="{}" fill-opacity="0.7"><title>{}: iteration {}, {} line(s) changed, {}</title></circle>"#,
                x_of(it.edit_lines as f64, 0.0, max_edit),
                Plot::row_y(row) + dy,
                if it.accepted { ACCEPTED } else { "#777" },
                esc(&t.task),
                it.iteration,
                it.edit_lines,
                if it.accepted { "accepted" } else { "rejected" }
            );
        }
    }
    figure(
        out,
        "Workflow edit size against outcome (lines of the workflow the candidate changed)",
        &p.finish(),
    );
}

fn win_rates(c: &CycleReport, out: &mut String) {
    let evals = &c.figures.evaluations;
    let mut p = Plot::new(
        "winrates",
        c.figures.cycle,
        evals.len(),
        "win rates: W/(W+L) over judgments, ties excluded (red diamond); pair majority W/(W+L) over pairs (blue dot) with its 95% Wilson (thick) and bootstrap (thin) intervals",
    );
    p.axis(0.0, 1.0, 4, |v| format!("{:.0}%", v * 100.0));
    let mid = x_of(0.5, 0.0, 1.0);
    let _ = write!(
        p.svg,
        r##"<line x1="{mid}" y1="{TOP}" x2="{mid}" y2="{}" stroke="#999" stroke-dasharray="4 3"/>"##,
        p.height - BOTTOM
    );
    for (row, (e, boot)) in evals.iter().zip(&c.bootstrap).enumerate() {
        p.label(
            row,
            &format!(
                "{} vs {} by {}{}",
                e.split,
                e.against,
                e.judge,
                if e.self_judge { " (self)" } else { "" }
            ),
        );
        let y = Plot::row_y(row);
        if let Some([lo, hi]) = e.interval {
            let _ = write!(
                p.svg,
                r##"<line class="interval" x1="{:.1}" y1="{y}" x2="{:.1}" y2="{y}" stroke="#2166ac" stroke-width="4" stroke-opacity="0.45"/>"##,
                x_of(lo, 0.0, 1.0),
                x_of(hi, 0.0, 1.0)
            );
        }
        if let Some([lo, hi]) = boot {
            let _ = write!(
                p.svg,
                r##"<line class="interval" x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#000" stroke-width="1"/>"##,
                x_of(*lo, 0.0, 1.0),
                y + 6.0,
                x_of(*hi, 0.0, 1.0),
                y + 6.0
            );
        }
        if let (Some(w), Some(text)) = (e.judgment_win_rate, e.judgment_text()) {
            let _ = write!(
                p.svg,
                r##"<path class="mark-judgments" data-value="{w}" d="M{:.2},{:.1} l6,6 l-6,6 l-6,-6 z" fill="#d73027"><title>{} vs {} by {}: win rate {}</title></path>"##,
                x_of(w, 0.0, 1.0),
                y - 6.0,
                esc(&e.split),
                esc(&e.against),
                esc(&e.judge),
                esc(&text)
            );
        }
        match e.win_rate {
            Some(w) => {
                let _ = write!(
                    p.svg,
                    r##"<circle class="mark" data-value="{w}" cx="{:.2}" cy="{y}" r="5" fill="#2166ac"><title>{} vs {} ({} vs {}) by {} ({}): pair majority {} of {} pairs [Wilson {} | bootstrap {}], {}-{} with {} tied pair(s)</title></circle>"##,
                    x_of(w, 0.0, 1.0),
                    esc(&e.split),
                    esc(&e.against),
                    esc(&e.model),
                    esc(&e.baseline),
                    esc(&e.judge),
                    esc(&e.judge_model),
                    pct(Some(w)),
                    e.pairs,
                    span(e.interval),
                    span(*boot),
                    e.wins,
                    e.losses,
                    e.ties
                );
            }
            None => {
                let _ = write!(
                    p.svg,
                    r#"<text class="note" x="{mid}" y="{y}" dominant-baseline="middle" text-anchor="middle">every pair tied ({} pairs)</text>"#,
                    e.pairs
                );
            }
        }
    }
    figure(
        out,
        "Win rates of the trained model (pairs of bare-task runs; W/(W+L) over judgments and pair majority over pairs; dashed line = 50%)",
        &p.finish(),
    );
}

fn bt_scores(c: &CycleReport, out: &mut String) {
    let all: Vec<f64> = c
        .scores
        .iter()
        .flat_map(|t| t.runs.iter().map(|r| r.score))
        .collect();
    let (lo, hi) = padded_range(&all, 0.05, 1.0);
    let mut p = Plot::new(
        "scores",
        c.figures.cycle,
        c.scores.len(),
        "Bradley-Terry score of every ranked collected run, coloured by selection",
    );
    // `+ 0.0` turns a negative zero into zero (no "-0.00" tick).
    p.axis(lo, hi, 4, |v| {
        format!("{:.2}", (v * 100.0).round() / 100.0 + 0.0)
    });
    for (row, t) in c.scores.iter().enumerate() {
        p.label(row, &t.task);
        for r in &t.runs {
            let _ = write!(
                p.svg,
                r##"<circle class="mark" data-value="{}" cx="{:.2}" cy="{}" r="5" fill="{}" fill-opacity="0.8" stroke="#fff"><title>{}: run {} ({}) score {:.3}, rank {}, {}</title></circle>"##,
                r.score,
                x_of(r.score, lo, hi),
                Plot::row_y(row),
                selection_color(&r.selection),
                esc(&t.task),
                r.index,
                &r.rollout[..r.rollout.len().min(12)],
                r.score,
                r.rank.map_or("-".into(), |k| k.to_string()),
                esc(&r.selection)
            );
        }
    }
    figure(
        out,
        "Bradley-Terry scores per task (dark green = train, light green = validation, grey = not selected, red = excluded)",
        &p.finish(),
    );
}

fn agreement(c: &CycleReport, out: &mut String) {
    let a = &c.figures.agreement;
    let mut p = Plot::new(
        "agreement",
        c.figures.cycle,
        a.len(),
        "share of verdicts on the same pair in the same order where two judges agreed",
    );
    p.axis(0.0, 1.0, 4, |v| format!("{:.0}%", v * 100.0));
    if a.is_empty() {
        p.empty("one judge only: no two judges judged the same pairs");
    }
    for (row, g) in a.iter().enumerate() {
        p.label(row, &format!("{} / {}", g.judge_model, g.other_model));
        if let Some(rate) = g.rate {
            let y = Plot::row_y(row) - ROW * 0.3;
            let _ = write!(
                p.svg,
                r##"<rect class="mark" data-value="{rate}" x="{LEFT}" y="{y:.1}" width="{:.2}" height="{:.1}" fill="#762a83"><title>{} ({}) with {} ({}): {} of {} verdicts agreed ({})</title></rect>"##,
                x_of(rate, 0.0, 1.0) - LEFT,
                ROW * 0.6,
                esc(&g.judge),
                esc(&g.judge_model),
                esc(&g.other),
                esc(&g.other_model),
                g.agreed,
                g.compared,
                pct(Some(rate))
            );
        }
    }
    figure(out, "Judge agreement", &p.finish());
}

fn token_cost(c: &CycleReport, out: &mut String) {
    let max = c
        .stages
        .iter()
        .map(|s| s.prompt_tokens + s.completion_tokens)
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    let mut p = Plot::new(
        "tokens",
        c.figures.cycle,
        c.stages.len(),
        "prompt and completion tokens per stage",
    );
    p.axis(0.0, max, 4, |v| format!("{v:.0}"));
    for (row, s) in c.stages.iter().enumerate() {
        p.label(row, &s.stage);
        let y = Plot::row_y(row) - ROW * 0.3;
        let mut x = LEFT;
        for (what, n, color) in [
            ("prompt", s.prompt_tokens, PROMPT),
            ("completion", s.completion_tokens, COMPLETION),
        ] {
            if n == 0 {
                continue;
            }
            let w = x_of(n as f64, 0.0, max) - LEFT;
            let _ = write!(
                p.svg,
                r#"<rect class="mark" data-value="{n}" x="{x:.2}" y="{y:.1}" width="{w:.2}" height="{:.1}" fill="{color}"><title>{}: {n} {what} tokens over {} model call(s)</title></rect>"#,
                ROW * 0.6,
                esc(&s.stage),
                s.model_calls
            );
            x += w;
        }
    }
    figure(
        out,
        "Token cost per stage (blue = prompt, orange = completion; every recorded model call)",
        &p.finish(),
    );
}

fn wall_time(c: &CycleReport, out: &mut String) {
    let max = c
        .stages
        .iter()
        .filter_map(|s| s.wall_seconds)
        .fold(0.0, f64::max)
        .max(1e-3);
    let mut p = Plot::new(
        "walltime",
        c.figures.cycle,
        c.stages.len(),
        "wall time per stage",
    );
    p.axis(0.0, max, 4, |v| format!("{v:.1} s"));
    for (row, s) in c.stages.iter().enumerate() {
        p.label(row, &s.stage);
        let Some(secs) = s.wall_seconds else {
            let why = if s.not_run {
                "not run (no step of the run closed it)"
            } else {
                "unknown (the run logged no time here)"
            };
            let _ = write!(
                p.svg,
                r#"<text class="note" x="{}" y="{:.1}" dominant-baseline="middle">{why}</text>"#,
                LEFT + 4.0,
                Plot::row_y(row),
            );
            continue;
        };
        if secs <= 0.0 {
            continue;
        }
        let _ = write!(
            p.svg,
            r##"<rect class="mark" data-value="{}" x="{LEFT}" y="{:.1}" width="{:.2}" height="{:.1}" fill="#5e3c99"><title>{}: {:.1} s</title></rect>"##,
            secs,
            Plot::row_y(row) - ROW * 0.3,
            x_of(secs, 0.0, max) - LEFT,
            ROW * 0.6,
            esc(&s.stage),
            secs
        );
    }
    figure(out, "Wall time per stage", &p.finish());
}

/// Training and validation loss against the trainer's step: one mark per
/// recorded loss (circles: training, diamonds: validation; the chosen
/// checkpoint ringed).
fn loss_curve(c: &CycleReport, chosen: Option<&str>, out: &mut String) {
    let points: Vec<(u64, f64, bool, &str)> = c
        .loss
        .iter()
        .flat_map(|p| {
            let mut v = Vec::new();
            if let Some(l) = p.train_loss {
                v.push((p.step, l, false, ""));
            }
            if let Some(l) = p.validation_loss {
                v.push((p.step, l, true, p.checkpoint.as_str()));
            }
            v
        })
        .collect();
    let (lo_s, hi_s) = points
        .iter()
        .fold((u64::MAX, 0), |(a, b), p| (a.min(p.0), b.max(p.0)));
    let (lo_s, hi_s) = if points.is_empty() {
        (0, 1)
    } else {
        (lo_s, hi_s.max(lo_s + 1))
    };
    let losses: Vec<f64> = points.iter().map(|p| p.1).collect();
    let (lo_l, hi_l) = padded_range(&losses, 0.08, 0.5);
    let mut p = Plot::new(
        "loss",
        c.figures.cycle,
        6,
        "training and validation loss by trainer step",
    );
    p.axis(lo_s as f64, hi_s as f64, 4, |v| format!("{v:.0}"));
    let (top, bottom) = (TOP, p.height - BOTTOM);
    let y_of = |l: f64| bottom - (bottom - top) * ((l - lo_l) / (hi_l - lo_l)).clamp(0.0, 1.0);
    for k in 0..=3 {
        let l = lo_l + (hi_l - lo_l) * k as f64 / 3.0;
        let _ = write!(
            p.svg,
            r##"<line x1="{LEFT}" y1="{y:.1}" x2="{}" y2="{y:.1}" stroke="#eee"/><text class="tick" x="{}" y="{y:.1}" text-anchor="end" dominant-baseline="middle">{l:.3}</text>"##,
            WIDTH - RIGHT,
            LEFT - 8.0,
            y = y_of(l)
        );
    }
    if points.is_empty() {
        p.empty("no training metrics were recorded");
    }
    let train: Vec<String> = points
        .iter()
        .filter(|q| !q.2)
        .map(|q| {
            format!(
                "{:.1},{:.1}",
                x_of(q.0 as f64, lo_s as f64, hi_s as f64),
                y_of(q.1)
            )
        })
        .collect();
    if train.len() > 1 {
        let _ = write!(
            p.svg,
            r##"<polyline points="{}" fill="none" stroke="#4575b4" stroke-width="1.5"/>"##,
            train.join(" ")
        );
    }
    for (step, l, validation, ckpt) in &points {
        let (x, y) = (x_of(*step as f64, lo_s as f64, hi_s as f64), y_of(*l));
        if *validation {
            let ring = if chosen == Some(*ckpt) {
                r##" stroke="#000" stroke-width="2""##
            } else {
                ""
            };
            let _ = write!(
                p.svg,
                r##"<path class="mark" data-value="{l}" d="M{x:.1},{:.1} l6,6 l-6,6 l-6,-6 z" fill="#d73027"{ring}><title>step {step}: validation loss {l:.4}{}</title></path>"##,
                y - 6.0,
                if ckpt.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", esc(ckpt))
                }
            );
        } else {
            let _ = write!(
                p.svg,
                r##"<circle class="mark" data-value="{l}" cx="{x:.1}" cy="{y:.1}" r="3" fill="#4575b4"><title>step {step}: training loss {l:.4}</title></circle>"##
            );
        }
    }
    figure(
        out,
        "Loss by trainer step (blue = training, red diamonds = validation; ringed = the chosen checkpoint)",
        &p.finish(),
    );
}

fn figure(out: &mut String, caption: &str, svg: &str) {
    let _ = write!(
        out,
        "<figure>{svg}<figcaption>{}</figcaption></figure>",
        esc(caption)
    );
}

fn table(out: &mut String, head: &[&str], rows: Vec<Vec<String>>) {
    out.push_str("<table><thead><tr>");
    for h in head {
        let _ = write!(out, "<th>{}</th>", esc(h));
    }
    out.push_str("</tr></thead><tbody>");
    for r in rows {
        out.push_str("<tr>");
        for cell in r {
            let _ = write!(out, "<td>{}</td>", esc(&cell));
        }
        out.push_str("</tr>");
    }
    out.push_str("</tbody></table>");
}

fn cycle_section(c: &CycleReport, out: &mut String) {
    cycle_heading(c, out);
    out.push_str("<h3>Workflow search</h3>");
    search_progress(c, out);
    edit_size(c, out);
    out.push_str("<h3>Evaluation</h3>");
    win_rates(c, out);
    evaluation_table(c, out);
    agreement(c, out);
    bare_delegation(c, out);
    out.push_str("<h3>Ranking</h3>");
    bt_scores(c, out);
    exclusions(c, out);
    out.push_str("<h3>Training</h3>");
    loss_curve(c, chosen_checkpoint(c), out);
    out.push_str("<h3>Cost</h3>");
    token_cost(c, out);
    wall_time(c, out);
    stage_cost_table(c, out);
    out.push_str("</section>");
}

/// The section's opening and heading, and the cycle's figures in one sentence.
fn cycle_heading(c: &CycleReport, out: &mut String) {
    let f = &c.figures;
    let _ = write!(
        out,
        "<section id=\"cycle-{}\"><h2>Cycle {}: {} &rarr; {}</h2><p>{} of {} inner-loop steps accepted; {} run(s) selected; {} supervised tokens; delegation with the champion workflow {}; tampered training examples {}.</p>",
        f.cycle,
        f.cycle,
        esc(&f.model),
        esc(&f.next_model),
        f.inner_wins,
        f.inner_iterations,
        f.selected_runs,
        f.supervised_tokens
            .map_or("not recorded".into(), |n| n.to_string()),
        pct(f.delegation_rate),
        f.tampered_in_training
            .map_or("not recorded".into(), |n| n.to_string())
    );
}

/// One row per evaluation, with its Wilson and bootstrap intervals.
fn evaluation_table(c: &CycleReport, out: &mut String) {
    let f = &c.figures;
    table(
        out,
        &[
            "split",
            "against",
            "model",
            "baseline",
            "judge",
            "win rate (judgments, W/(W+L), ties excluded)",
            "judgments W-L [ties]",
            "order",
            "pair majority (pairs, W/(W+L))",
            "Wilson 95% (pairs)",
            "bootstrap 95% (pairs)",
            "pairs W-L [tied]",
            "pairs",
            "position bias (opposite-order judgment pairs)",
        ],
        f.evaluations
            .iter()
            .zip(&c.bootstrap)
            .map(|(e, b)| {
                vec![
                    e.split.clone(),
                    e.against.clone(),
                    e.model.clone(),
                    e.baseline.clone(),
                    format!(
                        "{} ({}){}",
                        e.judge,
                        e.judge_model,
                        if e.self_judge { ", self" } else { "" }
                    ),
                    match e.judgment_wins {
                        Some(_) => pct(e.judgment_win_rate),
                        None => "not counted (runs of mass-engine/8 and earlier)".into(),
                    },
                    match (e.judgment_wins, e.judgment_losses, e.judgment_ties) {
                        (Some(w), Some(l), Some(t)) => format!("{w}-{l} [{t}]"),
                        _ => "n/a".into(),
                    },
                    e.order_text(),
                    pct(e.win_rate),
                    span(e.interval),
                    span(*b),
                    format!("{}-{} [{}]", e.wins, e.losses, e.ties),
                    e.pairs.to_string(),
                    format!("{} of {}", pct(e.position_bias), e.swapped),
                ]
            })
            .collect(),
    );
}

/// Delegation measured in the bare-task runs, or that it was not.
fn bare_delegation(c: &CycleReport, out: &mut String) {
    let f = &c.figures;
    let bare: Vec<String> = f.bare_delegation.iter().map(|d| d.describe()).collect();
    let _ = write!(
        out,
        "<p>Delegation in bare-task runs (no workflow): {}.</p>",
        esc(&if bare.is_empty() {
            "not measured".to_string()
        } else {
            bare.join("; ")
        })
    );
}

/// Runs left out of ranking or training data, by reason.
fn exclusions(c: &CycleReport, out: &mut String) {
    if c.exclusions.is_empty() {
        out.push_str("<p>No run was excluded.</p>");
    } else {
        table(
            out,
            &["excluded because", "runs"],
            c.exclusions
                .iter()
                .map(|(why, n)| vec![why.clone(), n.to_string()])
                .collect(),
        );
    }
    if !c.excluded_runs.is_empty() {
        table(
            out,
            &["task", "run", "excluded because"],
            c.excluded_runs
                .iter()
                .map(|x| {
                    let run = match x.index {
                        Some(i) => format!("{} (#{i})", &x.rollout[..x.rollout.len().min(12)]),
                        None => x.rollout[..x.rollout.len().min(12)].to_string(),
                    };
                    vec![x.task.clone(), run, x.reason.clone()]
                })
                .collect(),
        );
    }
    for s in &c.shortfalls {
        out.push_str(&format!(
            "<p>Selection short for {}: {} of {} training and {} of {} validation runs ({}).</p>",
            esc(&s.task),
            s.train,
            s.wanted_train,
            s.validation,
            s.wanted_validation,
            esc(&s.why)
        ));
    }
}

/// The checkpoint with the lowest recorded validation loss, if any.
fn chosen_checkpoint(c: &CycleReport) -> Option<&str> {
    c.loss
        .iter()
        .filter(|p| !p.checkpoint.is_empty())
        .filter_map(|p| p.validation_loss.map(|l| (l, p.checkpoint.as_str())))
        .min_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, name)| name)
}

/// Model calls, tokens and wall time per stage.
fn stage_cost_table(c: &CycleReport, out: &mut String) {
    table(
        out,
        &[
            "stage",
            "model calls",
            "prompt tokens",
            "completion tokens",
            "wall s",
        ],
        c.stages
            .iter()
            .map(|s| {
                vec![
                    s.stage.clone(),
                    s.model_calls.to_string(),
                    s.prompt_tokens.to_string(),
                    s.completion_tokens.to_string(),
                    match s.wall_seconds {
                        Some(w) => format!("{w:.1}"),
                        None if s.not_run => "not run".to_string(),
                        None => "unknown".to_string(),
                    },
                ]
            })
            .collect(),
    );
}

const STYLE: &str = "body{font:14px/1.45 system-ui,sans-serif;margin:24px auto;max-width:800px;color:#222}\
h1{font-size:22px}h2{font-size:18px;border-top:1px solid #ccc;padding-top:12px}h3{font-size:15px;margin-bottom:4px}\
figure{margin:8px 0 16px}figcaption{font-size:12px;color:#555}svg text{font-size:11px;fill:#333}\
table{border-collapse:collapse;font-size:12px;margin:6px 0 14px}td,th{border:1px solid #ddd;padding:2px 6px;text-align:left}";

/// The report as one self-contained HTML page.
pub fn render(r: &Report) -> String {
    let mut out = String::new();
    let _ = write!(
        out,
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>mass report: {}</title><style>{STYLE}</style></head><body><h1>mass report: run {}</h1><p>{} cycle(s). Every figure is read from the run's ledger records; hover a mark for its numbers.</p>",
        esc(&r.run),
        esc(&r.run),
        r.cycles.len()
    );
    for c in &r.cycles {
        cycle_section(c, &mut out);
    }
    out.push_str("</body></html>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_from_the_ledger_is_escaped_so_a_task_name_cannot_inject_markup() {
        assert_eq!(
            esc(r#"<script>alert("x")</script> & 'y'"#),
            "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; &#39;y&#39;"
        );
    }

    #[test]
    fn values_map_onto_the_plot_area_and_out_of_range_values_are_clamped() {
        assert_eq!(x_of(0.0, 0.0, 1.0), LEFT);
        assert_eq!(x_of(1.0, 0.0, 1.0), WIDTH - RIGHT);
        assert_eq!(x_of(2.0, 0.0, 1.0), WIDTH - RIGHT);
        assert_eq!(x_of(5.0, 5.0, 5.0), LEFT + Plot::plot_width() / 2.0);
    }
}
