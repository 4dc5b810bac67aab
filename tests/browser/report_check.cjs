// Loads a `mass report --html` page in headless Chromium (Debian's package,
// driven by playwright-core) and checks what the browser drew against the
// same run's `mass report --json`:
//   - the page makes no request but for itself (it must open offline);
//   - per cycle, each plot has one rendered mark per datum of the JSON
//     (search and edit plots: inner-loop iterations; win rates: evaluations
//     with a win rate; scores: ranked runs; agreement: judge pairs with a
//     rate; tokens: stages x {prompt, completion} with tokens; wall time:
//     stages with time; loss: recorded training and validation losses),
//     every mark laid out inside its plot;
//   - marks sit where their values say: a win-rate dot's centre and an
//     agreement bar's right end are at the value's share of the x axis
//     (within 1% of the axis), and token bars are ordered as their counts;
//   - no console error; then a full-page screenshot is written.
// Usage: node report_check.cjs REPORT.html REPORT.json SCREENSHOT.png
// Needs: MASS_PLAYWRIGHT (path of the playwright-core package) and
// MASS_CHROMIUM (the browser binary); scripts/browser-env.sh provides both.
'use strict';
const fs = require('fs');
const path = require('path');
const { chromium } = require(process.env.MASS_PLAYWRIGHT || 'playwright-core');

function expected(report) {
  const out = [];
  for (const c of report.cycles) {
    const cyc = c.figures.cycle;
    const iterations = c.inner.reduce((n, t) => n + t.iterations.length, 0);
    out.push([cyc, 'search', iterations]);
    out.push([cyc, 'edits', iterations]);
    out.push([cyc, 'winrates', c.figures.evaluations.filter((e) => e.win_rate !== null).length]);
    out.push([cyc, 'scores', c.scores.reduce((n, t) => n + t.runs.length, 0)]);
    out.push([cyc, 'agreement', c.figures.agreement.filter((a) => a.rate !== null).length]);
    out.push([cyc, 'tokens', c.stages.reduce((n, s) => n + (s.prompt_tokens > 0) + (s.completion_tokens > 0), 0)]);
    out.push([cyc, 'walltime', c.stages.filter((s) => s.wall_seconds > 0).length]);
    out.push([cyc, 'loss', c.loss.reduce((n, p) => n + (p.train_loss !== null) + (p.validation_loss !== null), 0)]);
  }
  return out;
}

async function main() {
  const [html, json, shot] = process.argv.slice(2);
  if (!html || !json || !shot) throw new Error('usage: report_check.cjs REPORT.html REPORT.json SCREENSHOT.png');
  const report = JSON.parse(fs.readFileSync(json, 'utf8'));
  const url = 'file://' + path.resolve(html);
  const browser = await chromium.launch({
    executablePath: process.env.MASS_CHROMIUM || '/usr/bin/chromium',
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
  const failures = [];
  try {
    const page = await browser.newPage({ viewport: { width: 820, height: 1000 } });
    const requests = [];
    const errors = [];
    page.on('request', (r) => requests.push(r.url()));
    page.on('console', (m) => { if (m.type() === 'error') errors.push(m.text()); });
    page.on('pageerror', (e) => errors.push(String(e)));
    await page.goto(url, { waitUntil: 'load' });
    const foreign = requests.filter((u) => u !== url);
    if (foreign.length) failures.push(`the page fetched ${foreign.length} other resource(s): ${foreign.join(', ')}`);
    if (errors.length) failures.push(`console errors: ${errors.join(' | ')}`);

    const drawn = await page.evaluate(() => [...document.querySelectorAll('svg[data-chart]')].map((svg) => {
      const box = svg.getBoundingClientRect();
      const axis = svg.querySelector('.axis-x');
      const a = axis ? axis.getBoundingClientRect() : null;
      const marks = [...svg.querySelectorAll('.mark')].map((m) => {
        const b = m.getBoundingClientRect();
        return { x: b.x, y: b.y, w: b.width, h: b.height, value: Number(m.getAttribute('data-value')), tag: m.tagName };
      });
      return { chart: svg.dataset.chart, cycle: Number(svg.dataset.cycle), box: { x: box.x, y: box.y, w: box.width, h: box.height }, axis: a && { x: a.x, w: a.width }, marks };
    }));

    let checked = 0;
    for (const [cycle, chart, count] of expected(report)) {
      const plots = drawn.filter((d) => d.cycle === cycle && d.chart === chart);
      if (plots.length !== 1) { failures.push(`cycle ${cycle}: ${plots.length} '${chart}' plots, expected 1`); continue; }
      const p = plots[0];
      if (p.marks.length !== count) failures.push(`cycle ${cycle} ${chart}: ${p.marks.length} marks drawn, the JSON has ${count}`);
      for (const m of p.marks) {
        const inside = m.x >= p.box.x - 0.5 && m.y >= p.box.y - 0.5 &&
          m.x + m.w <= p.box.x + p.box.w + 0.5 && m.y + m.h <= p.box.y + p.box.h + 0.5;
        if (!inside) failures.push(`cycle ${cycle} ${chart}: a mark at (${m.x},${m.y}) lies outside its plot`);
        if (m.h <= 0 || (m.tag === 'circle' && m.w <= 0)) failures.push(`cycle ${cycle} ${chart}: a mark has no size`);
      }
      if (chart === 'winrates' || chart === 'agreement') {
        for (const m of p.marks) {
          const end = chart === 'winrates' ? m.x + m.w / 2 : m.x + m.w;
          const share = (end - p.axis.x) / p.axis.w;
          if (Math.abs(share - m.value) > 0.01) failures.push(`cycle ${cycle} ${chart}: a mark for ${m.value} is drawn at ${share.toFixed(3)} of the axis`);
        }
        const want = chart === 'winrates'
          ? report.cycles.find((c) => c.figures.cycle === cycle).figures.evaluations.filter((e) => e.win_rate !== null).map((e) => e.win_rate)
          : report.cycles.find((c) => c.figures.cycle === cycle).figures.agreement.filter((a) => a.rate !== null).map((a) => a.rate);
        const got = p.marks.map((m) => m.value);
        if (JSON.stringify(want) !== JSON.stringify(got)) failures.push(`cycle ${cycle} ${chart}: values ${got} differ from the JSON's ${want}`);
      }
      if (chart === 'tokens') {
        const c = report.cycles.find((x) => x.figures.cycle === cycle);
        const want = c.stages.flatMap((s) => [s.prompt_tokens, s.completion_tokens]).filter((n) => n > 0);
        const widths = p.marks.map((m) => m.w);
        for (let i = 0; i < want.length; i++) for (let j = 0; j < want.length; j++) {
          if (want[i] > want[j] && !(widths[i] > widths[j])) failures.push(`cycle ${cycle} tokens: a bar of ${want[i]} is not wider than one of ${want[j]}`);
        }
      }
      checked += p.marks.length;
    }
    await page.screenshot({ path: shot, fullPage: true });
    console.log(`${drawn.length} plots, ${checked} marks checked against ${json}; screenshot ${shot}`);
  } finally {
    await browser.close();
  }
  if (failures.length) {
    console.error(failures.join('\n'));
    process.exit(1);
  }
}

main().catch((e) => { console.error(e.stack || String(e)); process.exit(2); });
