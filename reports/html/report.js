// duet's HTML report: draws the page from the JSON embedded in it (the element "duet-data"), either
// one profile report (kind "report": a duet.profile/1 report without its op records) or a
// comparison (kind "compare": duet.compare/1 plus a summary of each report). Plain DOM and SVG, no
// library, nothing fetched. Every table can be sorted by a click on its header, and every header
// and number carries its definition as a tooltip (DEF below).
"use strict";

const DATA = JSON.parse(document.getElementById("duet-data").textContent);

// ---- definitions: the tooltip of each column and number ----------------------------------------
const DEF = {
  op: "the op's name as dispatched; backward ops are named after their forward op (conv2d.backward_data)",
  layer: "the module path of the op's forward (backward ops carry their forward's module); (no module): ops outside any module",
  phase: "the phase the op ran in: data, copy, forward, backward, optimizer, comm, other",
  backend: "the backend whose kernel ran (reference: plain loops, or a window that is no kernel such as data.wait)",
  impl: "the implementation that ran: the oneDNN kernel, the cuDNN algorithm, or duet's own loop, and why it was chosen",
  ops: "the op names summed into this layer row",
  calls: "number of calls in the profiled steps",
  self_ms: "time in the op minus ops nested in it (same thread), summed over the profiled steps, ms",
  ms_step: "self time per step, ms (self ms over the number of steps)",
  pct: "self time over the sum of step times (over all op time when no steps were marked)",
  mean_us: "total time per call, microseconds",
  gflops: "FLOPs from the op's cost formula over its self time, GFLOP/s",
  gbs: "minimum bytes (inputs read once, outputs written once) over self time, GB/s: a lower bound on real traffic",
  fpb: "arithmetic intensity: FLOPs over minimum bytes (FLOP/byte)",
  bound: "memory when FLOP/byte is below the probe's ridge point, compute above it; empty without a probe",
  roof: "achieved speed over the roof at this FLOP/byte: the fraction of this machine's measured ceiling reached",
  alloc_mib: "bytes the op's own thread allocated inside the op (outputs, workspace, temporaries), MiB",
  ops_ms: "mean self time per step of the ops that ran in the phase, ms",
  ops_pct: "ops time of the phase over the mean step time",
  wall_ms: "mean time per step the thread spent in the phase (phase marks), inside ops or not, ms",
  wall_pct: "wall time of the phase over the mean step time",
  value: "the run's value: ms per step for times (per-op timing), images/s for images/s",
  ratio: "this run's value over the first run's (the baseline)",
  share: "the op's self time over the run's step time",
  delta_pp: "change of the share of step time against the first run, percentage points",
  tag: "allocator tag: what the bytes hold",
  current_mib: "bytes held at the end of the run, MiB",
  peak_mib: "the highest value during the profiled steps, MiB (per-tag peaks happen at different times)",
  metric: "a run-level figure",
  step: "step number (global step index of the run)",
  step_ms: "the step's wall time, ms",
};

// ---- small helpers ------------------------------------------------------------------------------
const SVGNS = "http://www.w3.org/2000/svg";
function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) if (v !== null && v !== undefined) e.setAttribute(k, v);
  for (const k of kids.flat()) if (k !== null && k !== undefined) e.append(k instanceof Node ? k : String(k));
  return e;
}
function svg(tag, attrs, ...kids) {
  const e = document.createElementNS(SVGNS, tag);
  for (const [k, v] of Object.entries(attrs || {})) if (v !== null && v !== undefined) e.setAttribute(k, v);
  for (const k of kids.flat()) if (k !== null && k !== undefined) e.append(k instanceof Node ? k : String(k));
  return e;
}
// Three significant digits, as duet's text tables print rates.
function num(x) {
  if (x === null || x === undefined || !isFinite(x)) return "-";
  const a = Math.abs(x);
  if (a >= 1000) return Math.round(x).toLocaleString("en-US");
  if (a >= 100) return x.toFixed(0);
  if (a >= 10) return x.toFixed(1);
  if (a >= 1) return x.toFixed(2);
  return a === 0 ? "0" : x.toPrecision(3);
}
const pct = (x) => (x === null || x === undefined || !isFinite(x) ? "-" : (100 * x).toFixed(1) + "%");
const ms = (ns) => (ns === null || ns === undefined ? null : ns / 1e6);
const mib = (b) => (b === null || b === undefined ? null : b / 1048576);
// Bytes in the unit that reads best: 512 B, 12.0 KiB, 3.50 MiB.
const bytes = (b) => (b < 1024 ? `${b} B` : b < 1048576 ? `${num(b / 1024)} KiB` : `${num(b / 1048576)} MiB`);
const ratio = (x) => (x === null || x === undefined ? "-" : x.toFixed(2) + "x");
const PHASE_COLOR = { data: "#8c8c8c", copy: "#bcbd22", forward: "#1f77b4", backward: "#ff7f0e", optimizer: "#2ca02c",
                      comm: "#9467bd", other: "#c7c7c7", untracked: "#d62728" };
const RUN_COLOR = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2"];

function section(id, title, ...kids) {
  return el("section", { id }, el("h2", {}, title), ...kids);
}
function legend(entries) {
  return el("div", { class: "legend" }, entries.map(([name, c]) => el("span", { style: `--c:${c}` }, name)));
}

// ---- sortable tables ----------------------------------------------------------------------------
// columns: [{id, label, get(row) -> raw value, show(raw) -> text, num: bool, cls}]
function table(name, columns, rows, keyOf) {
  const head = el("tr", {}, columns.map((c, i) => {
    const th = el("th", { class: c.num ? "num" : null, title: DEF[c.id] || c.label, "data-col": c.id }, c.label);
    th.addEventListener("click", () => sortBy(t, i, c.num));
    return th;
  }));
  const body = el("tbody", {}, rows.map((r) => el("tr", { "data-key": keyOf ? keyOf(r) : null }, columns.map((c) => {
    const v = c.get(r);
    const text = c.show ? c.show(v) : v === null || v === undefined ? "" : String(v);
    const exact = typeof v === "number" ? ` (${v})` : v ? `: ${v}` : "";
    return el("td", { class: [c.num ? "num" : "", c.cls || ""].join(" ").trim() || null, "data-col": c.id,
                      "data-value": typeof v === "number" ? String(v) : v ?? "",
                      title: (DEF[c.id] || c.label) + exact }, text);
  }))));
  const t = el("table", { "data-table": name }, el("thead", {}, head), body);
  return el("div", { class: "scroll" }, t);
}
function sortBy(t, col, numeric) {
  const th = t.tHead.rows[0].cells[col];
  const dir = th.getAttribute("aria-sort") === "descending" ? "ascending" : "descending";
  for (const h of t.tHead.rows[0].cells) h.removeAttribute("aria-sort");
  th.setAttribute("aria-sort", dir);
  const rows = [...t.tBodies[0].rows];
  const key = (r) => r.cells[col].dataset.value;
  rows.sort((a, b) => {
    const x = key(a), y = key(b);
    const c = numeric ? (parseFloat(x) || 0) - (parseFloat(y) || 0) : x.localeCompare(y);
    return dir === "ascending" ? c : -c;
  });
  t.tBodies[0].append(...rows);
}

// ---- charts -------------------------------------------------------------------------------------
// One horizontal bar split into parts [{name, value, color}], with its total on the right.
function stackedBar(parts, width, label) {
  const total = parts.reduce((s, p) => s + p.value, 0) || 1;
  const g = svg("svg", { width: width + 160, height: 28, role: "img", "aria-label": label });
  let x = 0;
  for (const p of parts) {
    const w = (p.value / total) * width;
    g.append(svg("rect", { x, y: 4, width: Math.max(w, 0), height: 20, fill: p.color },
                 svg("title", {}, `${p.name}: ${num(p.value)} ms (${pct(p.value / total)})`)));
    x += w;
  }
  g.append(svg("text", { x: width + 8, y: 18 }, label));
  return g;
}

// Axes for a chart of size w x h inside margins m; x and y map data to pixels.
function axes(g, x, y, w, h, m, xticks, yticks, xlabel, ylabel, fx, fy) {
  const ax = svg("g", { class: "axis" });
  for (const t of yticks) {
    ax.append(svg("line", { class: "grid", x1: m.l, x2: m.l + w, y1: y(t), y2: y(t) }));
    ax.append(svg("text", { x: m.l - 4, y: y(t) + 4, "text-anchor": "end" }, fy(t)));
  }
  for (const t of xticks) ax.append(svg("text", { x: x(t), y: m.t + h + 14, "text-anchor": "middle" }, fx(t)));
  ax.append(svg("path", { d: `M${m.l},${m.t}V${m.t + h}H${m.l + w}`, fill: "none" }));
  ax.append(svg("text", { x: m.l + w / 2, y: m.t + h + 30, "text-anchor": "middle" }, xlabel));
  ax.append(svg("text", { x: 12, y: m.t + h / 2, transform: `rotate(-90 12 ${m.t + h / 2})`, "text-anchor": "middle" }, ylabel));
  g.append(ax);
}
function niceTicks(max, n) {
  if (!(max > 0)) return [0];
  const step = Math.pow(10, Math.floor(Math.log10(max / n)));
  const s = [1, 2, 5, 10].map((f) => f * step).find((v) => max / v <= n) || step * 10;
  const out = [];
  for (let v = 0; v <= max * 1.0001; v += s) out.push(v);
  return out;
}
function logTicks(lo, hi) {
  const out = [];
  for (let e = Math.floor(Math.log10(lo)); e <= Math.ceil(Math.log10(hi)); e++) out.push(Math.pow(10, e));
  return out;
}

// ---- the report page ----------------------------------------------------------------------------
const PHASES = ["data", "copy", "forward", "backward", "optimizer", "comm", "other"];

function reportHeader(r) {
  const rc = r.run_config || {};
  const m = r.machine || {};
  const t = r.totals || {};
  const ph = r.phases || {};
  const dev = deviceMemory(r);
  document.getElementById("subtitle").textContent =
    `${r.schema}, created ${r.created}; timing ${r.timing_mode}` +
    (r.timing_mode === "per-op" ? " (every op timed: op times add up to the step)" : " (steps and phases only: undisturbed speed)") +
    `; ${m.cpu_model || "?"}, ${m.logical_cpus || "?"} logical CPUs, ${m.threads_used || "?"} threads used`;
  const card = (k, v, def) => el("div", { class: "card", title: def }, el("div", { class: "v" }, v), el("div", { class: "k" }, k));
  return el("div", { id: "summary" },
    el("div", { class: "chips" }, Object.entries(rc).map(([k, v]) => el("span", { class: "chip" }, `${k}=${typeof v === "object" ? JSON.stringify(v) : v}`))),
    el("div", { class: "cards" },
      card("steps", String(t.steps ?? 0), "steps marked in the profile"),
      card("mean step", num(ms(ph.mean_step_ns)) + " ms", "mean wall time of a step"),
      card("median step", num(ms(ph.median_step_ns)) + " ms", "median wall time of a step: the number to quote on a busy machine"),
      card("images/s", num(t.images_per_s), "all images over all step time"),
      card("peak memory", dev ? num(mib(dev.peak)) + " MiB" : "-", "the allocator's high-water mark on the run's device during the profiled steps"),
      card("ops in steps", t.pct_basis === "step" && t.step_ns ? pct(t.op_self_ns / t.step_ns) : "-", "op self time over step time; the rest is untracked (autograd, module calls)")));
}

function deviceMemory(r) {
  const devs = (r.memory && r.memory.devices) || [];
  return devs.find((d) => d.device === (r.totals || {}).device) || devs[0] || null;
}

function stepSection(r) {
  const ph = r.phases || {};
  if (!ph.steps) return section("steps", "Step breakdown", el("p", { class: "note" }, "No steps were marked in this profile."));
  const step = ms(ph.mean_step_ns);
  const perOp = r.timing_mode === "per-op";
  const rows = PHASES.filter((p) => (ph.mean_ops_ns || {})[p] > 0 || ((ph.mean_wall_ns || {})[p] || 0) > 0)
    .map((p) => ({ phase: p, ops: perOp ? ms(ph.mean_ops_ns[p]) : null, wall: ph.mean_wall_ns ? ms(ph.mean_wall_ns[p]) : null }));
  if (perOp) rows.push({ phase: "untracked", ops: ms(ph.mean_untracked_ns), wall: null });
  const bar = (getter, label) => stackedBar(rows.filter((x) => getter(x) > 0).map((x) => ({ name: x.phase, value: getter(x), color: PHASE_COLOR[x.phase] })), 640, label);
  const cols = [
    { id: "phase", label: "phase", get: (x) => x.phase },
    { id: "ops_ms", label: "ops ms", num: true, get: (x) => x.ops, show: num },
    { id: "ops_pct", label: "% step", num: true, get: (x) => (x.ops === null ? null : x.ops / step), show: pct },
    { id: "wall_ms", label: "wall ms", num: true, get: (x) => x.wall, show: num },
    { id: "wall_pct", label: "% step", num: true, get: (x) => (x.wall === null ? null : x.wall / step), show: pct },
  ];
  return section("steps", "Step breakdown",
    el("p", {}, `Mean of ${ph.steps} steps: ${num(step)} ms a step (median ${num(ms(ph.median_step_ns))}, min ${num(ms(ph.min_step_ns))}, max ${num(ms(ph.max_step_ns))}); ${num(ph.images_per_s)} images/s.`),
    perOp ? bar((x) => x.ops, `ops + untracked: ${num(step)} ms`) : null,
    ph.mean_wall_ns ? bar((x) => x.wall, `wall: ${num(step)} ms`) : null,
    legend(rows.map((x) => [x.phase, PHASE_COLOR[x.phase]])),
    el("div", { class: "row" }, table("phases", cols, rows, (x) => x.phase), perStepChart(r.steps || [], perOp)));
}

// One stacked column per step: op time per phase plus untracked (per-op), or wall time per phase.
function perStepChart(steps, perOp) {
  if (!steps.length) return null;
  const m = { l: 56, r: 10, t: 10, b: 40 }, w = Math.min(900, Math.max(240, steps.length * 14)), h = 180;
  const total = (s) => ms(s.dur_ns);
  const max = Math.max(...steps.map(total));
  const y = (v) => m.t + h - (v / max) * h;
  const bw = w / steps.length;
  const g = svg("svg", { width: w + m.l + m.r, height: h + m.t + m.b, id: "per-step", role: "img", "aria-label": "time per step by phase" });
  const ticks = niceTicks(max, 4);
  const every = Math.ceil(28 / bw);  // a label every 28 px at least
  axes(g, (i) => m.l + (i + 0.5) * bw, y, w, h, m, steps.map((_, i) => i).filter((i) => i % every === 0), ticks,
       "step", "ms", (i) => String(steps[i].step), (v) => num(v));
  steps.forEach((s, i) => {
    let top = 0;
    const parts = PHASES.map((p) => [p, ms((perOp ? s.ops_ns : s.wall_ns || {})[p] || 0)]);
    if (perOp) parts.push(["untracked", ms(s.untracked_ns)]);
    for (const [p, v] of parts) {
      if (!(v > 0)) continue;
      g.append(svg("rect", { x: m.l + i * bw + 1, y: y(top + v), width: Math.max(bw - 2, 1), height: y(top) - y(top + v), fill: PHASE_COLOR[p] },
                   svg("title", {}, `step ${s.step}: ${p} ${num(v)} ms of ${num(total(s))} ms`)));
      top += v;
    }
  });
  return g;
}

function opColumns(withLayer, basis) {
  const cols = [
    withLayer ? { id: "layer", label: "layer", get: (x) => x.key } : { id: "op", label: "op", get: (x) => x.key },
    { id: "phase", label: "phase", get: (x) => x.phase },
  ];
  if (withLayer) cols.push({ id: "ops", label: "ops", get: (x) => x.ops, cls: "impl" });
  else cols.push({ id: "backend", label: "backend", get: (x) => x.backend }, { id: "impl", label: "implementation", get: (x) => x.impl, cls: "impl" });
  cols.push(
    { id: "calls", label: "calls", num: true, get: (x) => x.calls, show: (v) => String(v) },
    { id: "self_ms", label: "self ms", num: true, get: (x) => ms(x.self_ns), show: num },
    { id: "ms_step", label: "ms/step", num: true, get: (x) => (x.per_step_ns ? ms(x.per_step_ns) : null), show: num },
    { id: "pct", label: basis === "step" ? "% step" : "% ops", num: true, get: (x) => x.pct, show: pct },
    { id: "mean_us", label: "mean µs", num: true, get: (x) => x.mean_ns / 1e3, show: num },
    { id: "gflops", label: "GFLOP/s", num: true, get: (x) => (x.flops > 0 ? x.gflops : null), show: num },
    { id: "gbs", label: "GB/s", num: true, get: (x) => (x.bytes > 0 ? x.gbs : null), show: num },
    { id: "fpb", label: "FLOP/B", num: true, get: (x) => (x.flops > 0 && x.bytes > 0 ? x.flop_per_byte : null), show: num },
    { id: "bound", label: "bound", get: (x) => x.bound || "" },
    { id: "roof", label: "roof", num: true, get: (x) => x.roof_pct, show: pct },
    { id: "alloc_mib", label: "alloc MiB", num: true, get: (x) => mib(x.bytes_allocated), show: num });
  return cols;
}

function opsSection(r) {
  const rows = r.op_table || [];
  if (!rows.length)
    return section("ops", "Top ops", el("p", { class: "note" }, "No op table: a throughput-mode profile records steps and phases only. Profile in per-op mode for op tables."));
  return section("ops", "Top ops",
    el("p", {}, `${rows.length} rows (op, phase, backend), sorted by self time; ${r.totals.ops} op calls in the profiled steps. `,
       r.roofline && r.roofline.probe ? "The roof column is the fraction of this machine's measured ceiling reached." : "No probe: the bound and roof columns are empty."),
    table("ops", opColumns(false, r.totals.pct_basis), rows, (x) => `${x.key}|${x.phase}|${x.backend}`));
}

function layersSection(r) {
  const rows = r.layer_table || [];
  if (!rows.length) return section("layers", "Per-layer table", el("p", { class: "note" }, "No layer table (throughput mode, or no module ran ops)."));
  return section("layers", "Per-layer table",
    el("p", {}, `${rows.length} rows (module path, phase) in execution order; backward ops carry their forward's module.`),
    table("layers", opColumns(true, r.totals.pct_basis), rows, (x) => `${x.key}|${x.phase}`));
}

function memorySection(r) {
  const dev = deviceMemory(r);
  if (!dev) return section("memory", "Memory", el("p", { class: "note" }, "No memory counters in this report."));
  const steps = (r.steps || []).map((s) => ({ step: s.step, m: (s.memory || []).find((x) => x.device === dev.device) })).filter((s) => s.m);
  const po = dev.peak_op;
  const peakText = po
    ? `peak ${num(mib(dev.peak))} MiB ${po.inside ? "reached at" : "reached before"} op #${po.index} ${po.name} (${po.phase}, ${po.scope || "no module"}, ${po.shapes}) in step ${po.step}: ${bytes(po.live_bytes_after)} live after it, ${bytes(po.bytes_allocated)} allocated by it`
    : `peak ${num(mib(dev.peak))} MiB${dev.peak_note ? ": " + dev.peak_note : ""}`;
  const kids = [el("p", { id: "peak-op" }, `${dev.device}: ${peakText}.`)];
  const curve = [];
  if (steps.length) {
    const m = { l: 56, r: 10, t: 14, b: 40 }, w = Math.min(900, Math.max(300, steps.length * 16)), h = 180;
    const max = Math.max(dev.peak, ...steps.map((s) => s.m.peak)) / 1048576;
    const x = (i) => m.l + (steps.length === 1 ? w / 2 : (i / (steps.length - 1)) * w);
    const y = (v) => m.t + h - (v / max) * h;
    const g = svg("svg", { width: w + m.l + m.r + 40, height: h + m.t + m.b, id: "memory-curve", role: "img", "aria-label": "memory per step" });
    const every = Math.ceil((28 * steps.length) / w);
    axes(g, x, y, w, h, m, steps.map((_, i) => i).filter((i) => i % every === 0), niceTicks(max, 4), "step", "MiB",
         (i) => String(steps[i].step), (v) => num(v));
    const line = (get, color, name) => {
      g.append(svg("polyline", { points: steps.map((s, i) => `${x(i)},${y(mib(get(s)))}`).join(" "), fill: "none", stroke: color, "stroke-width": 2 }));
      steps.forEach((s, i) => g.append(svg("circle", { cx: x(i), cy: y(mib(get(s))), r: 3, fill: color },
                                          svg("title", {}, `step ${s.step}: ${name} ${num(mib(get(s)))} MiB`))));
    };
    line((s) => s.m.peak, "#d62728", "peak during the step");
    line((s) => s.m.current, "#1f77b4", "live at the step's end");
    if (po) {
      const i = steps.findIndex((s) => s.step === po.step);
      if (i >= 0) {
        g.append(svg("line", { x1: x(i), x2: x(i), y1: y(mib(dev.peak)), y2: m.t + h, stroke: "#d62728", "stroke-dasharray": "3 3" }));
        g.append(svg("text", { x: Math.min(x(i) + 4, m.l + w - 120), y: y(mib(dev.peak)) + 12, id: "peak-label" }, `peak: ${po.name} (${po.scope || po.phase})`));
      }
    }
    curve.push(g, legend([["peak during the step", "#d62728"], ["live at the step's end", "#1f77b4"]]));
  }
  const tags = Object.keys(dev.peak_by_tag || {}).map((t) => ({ tag: t, current: dev.by_tag[t], peak: dev.peak_by_tag[t] }));
  kids.push(el("div", { class: "row" }, el("div", {}, curve), table("memory_tags", [
    { id: "tag", label: "tag", get: (x) => x.tag },
    { id: "current_mib", label: "current MiB", num: true, get: (x) => mib(x.current), show: num },
    { id: "peak_mib", label: "peak MiB", num: true, get: (x) => mib(x.peak), show: num },
  ], tags, (x) => x.tag)));
  const p = (r.memory || {}).process;
  if (p) kids.push(el("p", { class: "note" }, `process: RSS ${num(mib(p.rss_bytes))} MiB now, ${num(mib(p.hwm_bytes))} MiB at most (includes code, libraries and caches the allocator does not see).`));
  return section("memory", "Memory", ...kids);
}

function rooflineSection(r) {
  const rf = r.roofline || {};
  const probe = rf.probe && rf.gemm_gflops > 0 && rf.copy_gbs > 0;
  const pts = (r.op_table || []).filter((x) => x.flops > 0 && x.bytes > 0 && x.gflops > 0);
  const note = probe
    ? el("p", {}, `Ceilings measured on this machine by duet probe (${rf.created}, ${rf.device}, ${rf.threads} threads): GEMM ${num(rf.gemm_gflops)} GFLOP/s` +
        (rf.gemm_bf16_gflops ? `, bf16 GEMM ${num(rf.gemm_bf16_gflops)} GFLOP/s` : "") +
        `, copy ${num(rf.copy_gbs)} GB/s, ridge ${num(rf.ridge_flop_per_byte)} FLOP/byte. Each point is a row of the op table; its area is its share of the step.`)
    : el("p", { class: "warning", id: "no-probe" }, `No probe data in this report${rf.note ? " (" + rf.note + ")" : ""}: the roof is not drawn. Run \`duet probe\` on the machine that ran the profile, then \`duet report --probe\` or re-run the profile.`);
  if (!pts.length) return section("roofline", "Roofline", note, el("p", { class: "note" }, "No op with both FLOPs and bytes to place (throughput mode records no ops)."));
  const xs = pts.map((p) => p.flop_per_byte), ys = pts.map((p) => p.gflops);
  const ceil = probe ? [rf.gemm_gflops, rf.gemm_bf16_gflops || 0] : [];
  const lo = { x: Math.min(...xs) / 2, y: Math.min(...ys) / 2 };
  const hi = { x: Math.max(...xs, probe ? rf.ridge_flop_per_byte : 0) * 2, y: Math.max(...ys, ...ceil) * 2 };
  const m = { l: 64, r: 20, t: 10, b: 44 }, w = 640, h = 360;
  const x = (v) => m.l + ((Math.log10(v) - Math.log10(lo.x)) / (Math.log10(hi.x) - Math.log10(lo.x))) * w;
  const y = (v) => m.t + h - ((Math.log10(v) - Math.log10(lo.y)) / (Math.log10(hi.y) - Math.log10(lo.y))) * h;
  const g = svg("svg", { width: w + m.l + m.r + 140, height: h + m.t + m.b, id: "roofline-chart", role: "img", "aria-label": "roofline",
                         "data-gemm-gflops": probe ? rf.gemm_gflops : null, "data-copy-gbs": probe ? rf.copy_gbs : null });
  const inside = (t, a, b) => t >= a && t <= b;
  axes(g, x, y, w, h, m, logTicks(lo.x, hi.x).filter((t) => inside(t, lo.x, hi.x)), logTicks(lo.y, hi.y).filter((t) => inside(t, lo.y, hi.y)),
       "FLOP per byte (arithmetic intensity)", "GFLOP/s achieved", num, num);
  if (probe) {
    const roof = (gemm, dash, label) => {
      const ridge = gemm / rf.copy_gbs;
      const x0 = Math.max(lo.x, lo.y / rf.copy_gbs);
      g.append(svg("polyline", { points: `${x(x0)},${y(x0 * rf.copy_gbs)} ${x(ridge)},${y(gemm)} ${x(hi.x)},${y(gemm)}`,
                                 fill: "none", stroke: "#000", "stroke-width": 1.5, "stroke-dasharray": dash, class: "roof" }));
      g.append(svg("text", { x: x(hi.x) + 4, y: y(gemm) + 4 }, label));
    };
    roof(rf.gemm_gflops, null, `GEMM ${num(rf.gemm_gflops)}`);
    if (rf.gemm_bf16_gflops > rf.gemm_gflops) roof(rf.gemm_bf16_gflops, "4 3", `bf16 ${num(rf.gemm_bf16_gflops)}`);
  }
  const top = [...pts].sort((a, b) => b.self_ns - a.self_ns).slice(0, 6);
  const placed = [];  // label boxes so far: a label that would overlap one moves down a line
  const labelY = (lx, ly, width) => {
    while (placed.some((q) => Math.abs(q.y - ly) < 12 && lx < q.x + q.w && q.x < lx + width)) ly += 12;
    placed.push({ x: lx, y: ly, w: width });
    return ly;
  };
  for (const p of pts) {
    const rr = 3 + 18 * Math.sqrt(p.pct || 0);
    g.append(svg("circle", { cx: x(p.flop_per_byte), cy: y(p.gflops), r: rr, fill: PHASE_COLOR[p.phase] || "#777", "fill-opacity": 0.6,
                             stroke: "#333", "data-op": `${p.key}|${p.phase}` },
                 svg("title", {}, `${p.key} (${p.phase}): ${num(p.flop_per_byte)} FLOP/byte, ${num(p.gflops)} GFLOP/s, ` +
                     `${pct(p.pct)} of the step${p.roof_pct ? ", " + pct(p.roof_pct) + " of the roof" : ""}`)));
    if (top.includes(p)) {
      const lx = x(p.flop_per_byte) + rr + 2;
      g.append(svg("text", { x: lx, y: labelY(lx, y(p.gflops) + 4, 6.5 * p.key.length) }, p.key));
    }
  }
  return section("roofline", "Roofline", note, g, legend(PHASES.filter((ph) => pts.some((p) => p.phase === ph)).map((ph) => [ph, PHASE_COLOR[ph]])));
}

function renderReport(d) {
  const r = d.report;
  const app = document.getElementById("app");
  app.replaceChildren(reportHeader(r), stepSection(r), opsSection(r), memorySection(r), rooflineSection(r), layersSection(r));
}

// ---- the comparison page ------------------------------------------------------------------------
function compareColumns(names, keyCol, withShare) {
  const cols = [{ id: keyCol, label: keyCol, get: (x) => x[keyCol] ?? x.phase }];
  if (keyCol !== "phase") cols.push({ id: "phase", label: "phase", get: (x) => x.phase });
  names.forEach((n, i) => {
    cols.push({ id: "value", label: `[${i}] ms/step`, num: true, get: (x) => x.value[i], show: num });
    if (i > 0) cols.push({ id: "ratio", label: `[${i}]/[0]`, num: true, get: (x) => x.ratio[i], show: ratio });
  });
  if (withShare) names.forEach((n, i) => cols.push({ id: "share", label: `[${i}] share`, num: true, get: (x) => (x.share ? x.share[i] : null), show: pct }));
  return cols;
}

function renderCompare(d) {
  const c = d.compare;
  const names = c.reports.map((r) => r.name);
  const app = document.getElementById("app");
  const keys = [...new Set(c.reports.flatMap((r) => Object.keys(r.run_config || {})))];
  const differs = (k) => new Set(c.reports.map((r) => JSON.stringify((r.run_config || {})[k]))).size > 1;
  const head = el("div", { id: "summary" },
    c.warnings.map((w) => el("p", { class: "warning" }, "Warning: " + w)),
    c.notes.map((n) => el("p", { class: "note" }, "Note: " + n)),
    c.reports.map((r, i) => el("div", {},
      el("p", {}, el("b", { style: `color:${RUN_COLOR[i % RUN_COLOR.length]}` }, `[${i}] ${r.name}`),
         `: model ${r.model ?? "(unknown)"}, timing ${r.timing_mode}, ${r.cpu_model}`),
      el("div", { class: "chips" }, keys.map((k) => el("span", { class: differs(k) ? "chip differs" : "chip", title: differs(k) ? "differs between the runs" : null },
                                                          `${k}=${JSON.stringify((r.run_config || {})[k])}`))))));
  document.getElementById("subtitle").textContent =
    `${c.schema}: ${names.length} runs side by side, each value with its ratio to [0] (${names[0]})` + (c.per_step ? "; times are ms per step." : "; times are totals (a report had no steps).");

  // Run-level figures from each report's summary.
  const S = d.runs;
  const metric = (name, get) => {
    const v = S.map(get);
    return { metric: name, value: v, ratio: v.map((x) => (v[0] > 0 && x !== null ? x / v[0] : null)) };
  };
  const figures = [
    metric("images/s", (s) => s.totals.images_per_s ?? null),
    metric("mean step ms", (s) => ms(s.phases.mean_step_ns) ?? null),
    metric("median step ms", (s) => ms(s.phases.median_step_ns) ?? null),
    metric("peak memory MiB", (s) => (deviceMemory(s) ? mib(deviceMemory(s).peak) : null)),
    metric("steps", (s) => s.totals.steps ?? null),
  ];
  const figCols = [{ id: "metric", label: "figure", get: (x) => x.metric }];
  names.forEach((n, i) => {
    figCols.push({ id: "value", label: `[${i}]`, num: true, get: (x) => x.value[i], show: (v) => (Number.isInteger(v) ? String(v) : num(v)) });
    if (i > 0) figCols.push({ id: "ratio", label: `[${i}]/[0]`, num: true, get: (x) => x.ratio[i], show: ratio });
  });

  // Side-by-side step bars from the (ops) rows, or the (wall) rows when there are none.
  const opsRows = c.phases.filter((p) => p.phase.endsWith(" (ops)") || p.phase === "untracked");
  const rowsForBars = opsRows.some((p) => p.value.some((v) => v > 0)) ? opsRows : c.phases.filter((p) => p.phase.endsWith(" (wall)"));
  const totals = names.map((_, i) => rowsForBars.reduce((sum, p) => sum + (p.value[i] || 0), 0));
  const widest = Math.max(...totals) || 1;
  const parts = (i) => rowsForBars.filter((p) => p.value[i] > 0).map((p) => {
    const ph = p.phase.replace(/ \((ops|wall)\)$/, "");
    return { name: ph, value: p.value[i], color: PHASE_COLOR[ph] || "#777" };
  });
  const bars = names.map((n, i) => stackedBar(parts(i), (520 * totals[i]) / widest, `[${i}] ${num(totals[i])} ms`));

  const phaseCols = compareColumns(names, "phase", false);
  phaseCols.forEach((col) => { if (col.id === "value") col.label = col.label.replace(" ms/step", ""); });
  app.replaceChildren(head,
    section("figures", "The runs side by side", table("figures", figCols, figures, (x) => x.metric)),
    section("steps", "Step breakdown", el("p", {}, "Phase times per step (images/s in its own unit); the bars are drawn to scale against each other."),
      ...bars, legend(PHASES.concat(["untracked"]).map((p) => [p, PHASE_COLOR[p]])), table("phases", phaseCols, c.phases, (x) => x.phase)),
    section("ops", "Ops", c.ops ? table("ops", compareColumns(names, "op", true), c.ops, (x) => `${x.op}|${x.phase}`)
                                : el("p", { class: "note" }, "Op comparison skipped (a report has no op table).")),
    section("shifts", "Share of step time that moved most", c.share_shifts && c.share_shifts.length
      ? table("shifts", [{ id: "op", label: "op", get: (x) => x.op }, { id: "phase", label: "phase", get: (x) => x.phase },
          ...names.map((n, i) => ({ id: "share", label: `[${i}] share`, num: true, get: (x) => x.share[i], show: pct })),
          ...names.slice(1).map((n, i) => ({ id: "delta_pp", label: `[${i + 1}] change pp`, num: true, get: (x) => x.delta_pp[i + 1], show: (v) => (v > 0 ? "+" : "") + num(v) }))],
          c.share_shifts, (x) => `${x.op}|${x.phase}`)
      : el("p", { class: "note" }, "No shares to compare.")),
    section("layers", "Layers", c.layers ? table("layers", compareColumns(names, "layer", true), c.layers, (x) => `${x.layer}|${x.phase}`)
                                         : el("p", { class: "note" }, "Per-layer comparison skipped (see the notes above).")));
}

if (DATA.kind === "compare") renderCompare(DATA);
else renderReport(DATA);
