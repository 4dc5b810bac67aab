#!/usr/bin/env python3
"""Reference solver for fin-momentum-backtest. Run with cwd = workspace.

    python3 <task>/solution/solve.py [--flaw lookahead|no_costs|overclaim ...]
"""
import argparse
import csv
import json
import math
import statistics

FLAWS = ["lookahead", "no_costs", "overclaim"]
FAST, SLOW, COST_BPS = 20, 100, 10.0

log_lines = []


def log(msg):
    log_lines.append(f"[step {len(log_lines) + 1:02d}] {msg}")


def load_prices(path="data/prices.csv"):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    return [r["date"] for r in rows], [float(r["close"]) for r in rows]


def sma_signal(closes, fast, slow):
    """s[t] = 1 if SMA_fast(t) > SMA_slow(t) using closes up to and including t."""
    n = len(closes)
    pref = [0.0]
    for c in closes:
        pref.append(pref[-1] + c)
    sig = [None] * n
    for t in range(slow - 1, n):
        f = (pref[t + 1] - pref[t + 1 - fast]) / fast
        s = (pref[t + 1] - pref[t + 1 - slow]) / slow
        sig[t] = 1 if f > s else 0
    return sig


def metrics(rets):
    eq, peak, mdd = 1.0, 1.0, 0.0
    for r in rets:
        eq *= 1.0 + r
        peak = max(peak, eq)
        mdd = max(mdd, 1.0 - eq / peak)
    years = len(rets) / 252.0
    sd = statistics.stdev(rets)
    return {
        "total_return": eq - 1.0,
        "cagr": eq ** (1.0 / years) - 1.0,
        "ann_vol": sd * math.sqrt(252),
        "sharpe": statistics.fmean(rets) / sd * math.sqrt(252) if sd > 0 else 0.0,
        "max_drawdown": mdd,
    }


def backtest(closes, fast, slow, cost_bps, flaws):
    n = len(closes)
    r = [None] + [closes[t] / closes[t - 1] - 1.0 for t in range(1, n)]
    sig = sma_signal(closes, fast, slow)
    cost = 0.0 if "no_costs" in flaws else cost_bps / 1e4
    rets, bh, prev, trades, long_days = [], [], 0, 0, 0
    for t in range(slow, n):
        # correct: the position for day t's return is decided at the close of t-1
        pos = sig[t] if "lookahead" in flaws else sig[t - 1]
        if pos != prev:
            trades += 1
        rets.append(pos * r[t] - cost * abs(pos - prev))
        bh.append(r[t])
        long_days += pos
        prev = pos
    m = metrics(rets)
    m.update({"n_trades": trades, "exposure": long_days / len(rets)})
    return m, metrics(bh), len(rets)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--flaw", action="append", default=[], choices=FLAWS)
    flaws = set(ap.parse_args().flaw)

    dates, closes = load_prices()
    log(f"loaded {len(closes)} closes from data/prices.csv ({dates[0]} .. {dates[-1]})")
    strat, bh, n_eval = backtest(closes, FAST, SLOW, COST_BPS, flaws)
    eval_start = dates[SLOW]
    log(f"backtest SMA{FAST}/SMA{SLOW}, cost {0.0 if 'no_costs' in flaws else COST_BPS} bps, eval {eval_start} .. {dates[-1]} ({n_eval} days)")
    log(f"strategy: total {strat['total_return']:.4f} sharpe {strat['sharpe']:.3f} mdd {strat['max_drawdown']:.4f} trades {strat['n_trades']}")
    log(f"buy&hold: total {bh['total_return']:.4f} sharpe {bh['sharpe']:.3f} mdd {bh['max_drawdown']:.4f}")

    grid = []
    if "overclaim" not in flaws:
        for f in (10, 20, 50):
            for s in (100, 150, 200):
                # same evaluation window for every cell: start at day 200
                m, _, _ = backtest(closes[200 - s:], f, s, COST_BPS, flaws)
                grid.append((f, s, m["sharpe"], m["total_return"]))
        log("parameter sensitivity grid computed (fast in 10/20/50, slow in 100/150/200, common window)")

    results = {
        "params": {"fast": FAST, "slow": SLOW, "cost_bps": COST_BPS},
        "eval_start": eval_start,
        "eval_days": n_eval,
        "strategy": {k: strat[k] for k in ("total_return", "cagr", "ann_vol", "sharpe", "max_drawdown", "n_trades", "exposure")},
        "buy_and_hold": {k: bh[k] for k in ("total_return", "cagr", "ann_vol", "sharpe", "max_drawdown")},
    }
    with open("results.json", "w") as f:
        json.dump(results, f, indent=2)
    log("wrote results.json")

    beats = strat["sharpe"] > bh["sharpe"]
    L = [f"# SMA{FAST}/SMA{SLOW} trend-following backtest", ""]
    L += ["## Method", "",
          f"Long/flat rule on `data/prices.csv`: long when the {FAST}-day SMA of closes is above the {SLOW}-day SMA.",
          ("The signal computed at the close of day t sets the position held over day t."
           if "lookahead" in flaws else
           "The signal computed at the close of day t-1 sets the position held over day t (no look-ahead)."),
          ("Returns are before trading costs." if "no_costs" in flaws else
           f"Trading cost {COST_BPS:.0f} bps per unit change in position.") + f" Evaluation window {eval_start} to {dates[-1]} ({n_eval} daily returns); Sharpe uses rf = 0, sample std, sqrt(252).", ""]
    L += ["## Results", "", "| metric | strategy | buy & hold |", "|---|---|---|"]
    for k, lab in (("total_return", "total return"), ("cagr", "CAGR"), ("ann_vol", "annualised vol"),
                   ("sharpe", "Sharpe"), ("max_drawdown", "max drawdown")):
        fmt = "{:.3f}" if k == "sharpe" else "{:.2%}"
        L.append(f"| {lab} | {fmt.format(strat[k])} | {fmt.format(bh[k])} |")
    L += ["", f"Trades: {strat['n_trades']}; time in market: {strat['exposure']:.1%}.", ""]
    if "overclaim" in flaws:
        L += ["## Conclusion", "",
              "The trend filter clearly outperforms buy-and-hold on a risk-adjusted basis and cuts drawdowns;",
              "the edge is robust and the strategy is ready for live deployment."]
    else:
        L += ["## Sensitivity (Sharpe / total return, common window from day 200)", "",
              "| fast \\ slow | 100 | 150 | 200 |", "|---|---|---|---|"]
        for f in (10, 20, 50):
            cells = [f"{sh:.2f} / {tr:.1%}" for (ff, s, sh, tr) in grid if ff == f]
            L.append(f"| {f} | " + " | ".join(cells) + " |")
        sharpes = [g[2] for g in grid]
        L += ["", f"Sharpe across the 9 settings ranges from {min(sharpes):.2f} to {max(sharpes):.2f}.", "",
              "## Conclusion", ""]
        if beats:
            dd = "a shallower" if strat["max_drawdown"] < bh["max_drawdown"] else "a deeper"
            L.append(f"The rule's Sharpe ({strat['sharpe']:.2f}) exceeds buy-and-hold ({bh['sharpe']:.2f}) over this window, "
                     f"with {dd} maximum drawdown ({strat['max_drawdown']:.1%} vs {bh['max_drawdown']:.1%}) "
                     f"and a lower total return ({strat['total_return']:.1%} vs {bh['total_return']:.1%})."
                     if strat["total_return"] < bh["total_return"] else
                     f"The rule's Sharpe ({strat['sharpe']:.2f}) exceeds buy-and-hold ({bh['sharpe']:.2f}) over this window, "
                     f"with {dd} maximum drawdown ({strat['max_drawdown']:.1%} vs {bh['max_drawdown']:.1%}).")
        else:
            L.append(f"The rule does NOT beat buy-and-hold on a risk-adjusted basis: Sharpe {strat['sharpe']:.2f} vs {bh['sharpe']:.2f}; "
                     f"its benefit is a shallower drawdown ({strat['max_drawdown']:.1%} vs {bh['max_drawdown']:.1%}).")
        L += ["The result comes from one synthetic asset and one window; the spread across the sensitivity grid shows how much",
              "of the outcome depends on the parameter choice, so it is not evidence of a deployable edge."]
    with open("report.md", "w") as f:
        f.write("\n".join(L) + "\n")
    log("wrote report.md")
    with open("logs.txt", "w") as f:
        f.write("\n".join(log_lines) + "\n")


if __name__ == "__main__":
    main()
