#!/usr/bin/env python3
"""Reference solver for fin-bond-duration. Run with cwd = workspace.

    python3 <task>/solution/solve.py [--flaw annual_compounding|macaulay_as_modified|duration_only_narrative ...]
"""
import argparse
import csv
import json

FLAWS = ["annual_compounding", "macaulay_as_modified", "duration_only_narrative"]
SHOCK = 0.01

log_lines = []


def log(msg):
    log_lines.append(f"[step {len(log_lines) + 1:02d}] {msg}")


class Bond:
    def __init__(self, bid, coupon_pct, maturity, freq):
        self.id, self.freq = bid, freq
        self.n = int(round(maturity * freq))
        self.cf = [coupon_pct / freq] * self.n
        self.cf[-1] += 100.0

    def price(self, y):
        d = 1 + y / self.freq
        return sum(c / d ** k for k, c in enumerate(self.cf, 1))

    def ytm(self, p):
        lo, hi = -0.05, 0.50          # price is decreasing in y: bisection
        for _ in range(200):
            mid = (lo + hi) / 2
            if self.price(mid) > p:
                lo = mid
            else:
                hi = mid
        return (lo + hi) / 2

    def analytics(self, y):
        f, d = self.freq, 1 + y / self.freq
        p = self.price(y)
        mac = sum(k / f * c / d ** k for k, c in enumerate(self.cf, 1)) / p
        conv = sum(c * k * (k + 1) / f ** 2 / d ** (k + 2) for k, c in enumerate(self.cf, 1)) / p
        return p, mac, mac / d, conv


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--flaw", action="append", default=[], choices=FLAWS)
    flaws = set(ap.parse_args().flaw)
    freq = 1 if "annual_compounding" in flaws else 2

    with open("data/bonds.csv", newline="") as f:
        bonds = list(csv.DictReader(f))
    with open("data/portfolio.csv", newline="") as f:
        face = {r["bond_id"]: float(r["face_value"]) for r in csv.DictReader(f)}
    log(f"loaded {len(bonds)} bonds and {len(face)} portfolio positions; coupon frequency {freq}/year")

    out, rows = {}, []
    for r in bonds:
        b = Bond(r["bond_id"], float(r["coupon_pct"]), float(r["maturity_years"]), freq)
        px = float(r["price"])
        y = b.ytm(px)
        p, mac, mod, conv = b.analytics(y)
        if "macaulay_as_modified" in flaws:
            mod = mac
        dv01 = mod * px / 1e4
        exact = b.price(y + SHOCK)
        dur = px * (1 - mod * SHOCK)
        durc = px * (1 - mod * SHOCK + 0.5 * conv * SHOCK ** 2)
        out[b.id] = {"price": px, "ytm": y, "macaulay_duration": mac, "modified_duration": mod,
                     "convexity": conv, "dv01": dv01, "price_up100_exact": exact,
                     "price_up100_duration": dur, "price_up100_dur_conv": durc}
        rows.append(b.id)
        log(f"{b.id}: ytm {y:.5%} mac {mac:.3f} mod {mod:.3f} conv {conv:.2f} dv01 {dv01:.4f}")

    mv = sum(face[i] / 100 * out[i]["price"] for i in rows)
    dv01_p = sum(face[i] / 100 * out[i]["dv01"] for i in rows)
    pnl_exact = sum(face[i] / 100 * (out[i]["price_up100_exact"] - out[i]["price"]) for i in rows)
    pnl_dur = sum(face[i] / 100 * (out[i]["price_up100_duration"] - out[i]["price"]) for i in rows)
    pnl_durc = sum(face[i] / 100 * (out[i]["price_up100_dur_conv"] - out[i]["price"]) for i in rows)
    port = {"market_value": mv, "dv01": dv01_p, "modified_duration": dv01_p / mv * 1e4,
            "pnl_up100_exact": pnl_exact, "pnl_up100_duration": pnl_dur, "pnl_up100_dur_conv": pnl_durc}
    log(f"portfolio MV {mv:,.0f} DV01 {dv01_p:,.0f} exact +100bp P&L {pnl_exact:,.0f}")
    with open("results.json", "w") as f:
        json.dump({"shock_bp": 100, "bonds": out, "portfolio": port}, f, indent=2)
    log("wrote results.json")

    L = ["# Bond yields, duration and convexity; +100 bp parallel shock", "",
         "## Method", "",
         "Yield to maturity: bond-equivalent yield (semiannual coupons, semiannual compounding) solved by bisection on the quoted price "
         "(settlement on a coupon date, so price = dirty price). Macaulay duration = PV-weighted time of cash flows; modified duration = "
         "Macaulay / (1 + y/2); convexity = (1/P) d2P/dy2 in years^2; DV01 = modified duration x price / 10,000 per 100 face.", "",
         "## Bond analytics", "", "| bond | price | YTM | Macaulay | modified | convexity | DV01 |", "|---|---|---|---|---|---|---|"]
    for i in rows:
        o = out[i]
        L.append(f"| {i} | {o['price']:.4f} | {o['ytm']:.4%} | {o['macaulay_duration']:.3f} | {o['modified_duration']:.3f} | "
                 f"{o['convexity']:.2f} | {o['dv01']:.4f} |")
    L += ["", "## Portfolio", "",
          f"Market value {mv:,.0f}; DV01 {dv01_p:,.0f} per bp; modified duration {port['modified_duration']:.2f}.",
          f"+100 bp parallel shock: exact repricing P&L {pnl_exact:,.0f}; duration-only estimate {pnl_dur:,.0f}; "
          f"duration + convexity {pnl_durc:,.0f}.", ""]
    if "duration_only_narrative" in flaws:
        L += ["## Shock analysis", "",
              "Duration is an accurate measure of the portfolio's rate risk for moves of this size, so the DV01 above can be "
              "used directly to size hedges for any parallel shift."]
    else:
        L += ["## Shock analysis: where the linear approximation breaks", "",
              "| bond | exact | duration only (error) | + convexity (error) |", "|---|---|---|---|"]
        for i in rows:
            o = out[i]
            L.append(f"| {i} | {o['price_up100_exact']:.4f} | {o['price_up100_duration']:.4f} "
                     f"({o['price_up100_duration'] - o['price_up100_exact']:+.4f}) | {o['price_up100_dur_conv']:.4f} "
                     f"({o['price_up100_dur_conv'] - o['price_up100_exact']:+.4f}) |")
        worst = max(rows, key=lambda i: out[i]["price_up100_exact"] - out[i]["price_up100_duration"])
        L += ["", f"Duration alone overstates the loss of every bond (positive convexity); the error grows with maturity and is "
                  f"largest for {worst} ({out[worst]['price_up100_exact'] - out[worst]['price_up100_duration']:.4f} per 100 face). "
                  f"At portfolio level duration-only overstates the loss by {pnl_exact - pnl_dur:,.0f} "
                  f"({(pnl_exact - pnl_dur) / abs(pnl_exact):.1%} of the exact P&L); adding convexity leaves "
                  f"{pnl_exact - pnl_durc:,.0f}. DV01 hedges sized from duration alone must be rebalanced after large moves, "
                  "and the long zero-coupon and 30-year positions dominate the convexity.",
              "Limitations: parallel shifts only; no key-rate or curve-twist risk."]
    with open("report.md", "w") as f:
        f.write("\n".join(L) + "\n")
    log("wrote report.md")
    with open("logs.txt", "w") as f:
        f.write("\n".join(log_lines) + "\n")


if __name__ == "__main__":
    main()
