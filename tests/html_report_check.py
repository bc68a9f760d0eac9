#!/usr/bin/env python3
"""duet's HTML report and comparison pages in a real browser: headless Chromium driven through the
DevTools protocol (over a pipe: no extra packages).

  python3 tests/html_report_check.py SOURCE_DIR DUET_BINARY OUT_DIR

Profiles two short synthetic training runs (one with a probe of this machine's ceilings in its
cache, one without), writes `duet report --html` of each and `duet compare --html` of both, loads
each page and requires: no console error, no uncaught exception, no request leaving the file
(no network); every section present; the numbers in the tables equal to the report's JSON (op and
layer tables, step breakdown, memory peak op, roofline points and ceilings; for the comparison the
values, ratios and run figures); a definition on every header and number; sorting by a header
click. One screenshot per section and of the whole page is kept in OUT_DIR/screens.
Without Chromium the test is skipped (exit 77), unless DUET_REQUIRE_BROWSER=1 (CI installs it).
"""
import base64
import fcntl
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time

SKIP = 77
src, duet, out = sys.argv[1], sys.argv[2], os.path.abspath(sys.argv[3])

browser = next((shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)
if not browser:
    msg = "html_report_check: no chromium on PATH (apt-get install chromium; .ci/run installs it)"
    if os.environ.get("DUET_REQUIRE_BROWSER") == "1":
        sys.exit(msg + "; DUET_REQUIRE_BROWSER=1, so this is a failure")
    print(msg + ": SKIPPED")
    sys.exit(SKIP)

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def close(a, b, rel=1e-9):
    if a is None or b is None:
        return a is None and b is None
    return math.isclose(float(a), float(b), rel_tol=rel, abs_tol=1e-12)


def run(args, env=None):
    r = subprocess.run([duet, "--threads", "1"] + args, cwd=out, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, env=env)
    if r.returncode != 0:
        print(r.stdout)
        sys.exit(f"html_report_check: duet {' '.join(args)} exited with {r.returncode}")
    return r.stdout


# ---- the pages -------------------------------------------------------------------------------------
os.makedirs(os.path.join(out, "screens"), exist_ok=True)
for f in os.listdir(os.path.join(out, "screens")):
    os.remove(os.path.join(out, "screens", f))
with_probe = dict(os.environ, DUET_CACHE_DIR=os.path.join(out, "cache"))
no_probe = dict(os.environ, DUET_CACHE_DIR=os.path.join(out, "empty-cache"))
shutil.rmtree(no_probe["DUET_CACHE_DIR"], ignore_errors=True)
run(["probe", "--size", "256", "--copy-mib", "16", "--repeats", "1", "--thread-counts", "1"], env=with_probe)
train = ["train", "--model", "small_cnn", "--dataset", "synthetic", "--epochs", "1", "--train-size", "192",
         "--test-size", "32", "--batch", "32"]
run(train + ["--profile", "a.json"], env=with_probe)
run(train + ["--memory-format", "nchw", "--profile", "b.json"], env=no_probe)
run(["report", "a.json", "--html", "a.html"])
run(["report", "b.json", "--html", "b.html"])
run(["compare", "a.json", "b.json", "--html", "cmp.html", "--json", "cmp.json"])
A, B, C = (json.load(open(os.path.join(out, f))) for f in ("a.json", "b.json", "cmp.json"))
sizes = {f: os.path.getsize(os.path.join(out, f)) for f in ("a.html", "b.html", "cmp.html")}
print("pages: " + ", ".join(f"{f} {s / 1024:.0f} KiB" for f, s in sizes.items()))
check(all(s < 400 * 1024 for s in sizes.values()), f"a page is larger than 400 KiB: {sizes}")


# ---- Chromium over the DevTools protocol ------------------------------------------------------------------
class Browser:
    """Chromium with --remote-debugging-pipe: commands go to its fd 3, answers come from its fd 4,
    each a JSON message ended by a NUL byte."""

    def __init__(self):
        cmd_r, cmd_w = os.pipe()
        res_r, res_w = os.pipe()
        # Above 10, so that the dup2 onto 3 and 4 in the child cannot clobber one of them.
        self.cmd_r, self.res_w = (fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in (cmd_r, res_w))
        os.close(cmd_r)
        os.close(res_w)
        self.w, self.r = cmd_w, res_r
        self.profile = tempfile.mkdtemp(prefix="duet-chromium-")

        def fds():  # in the child: the pipe ends become its fds 3 and 4 (dup2 leaves them open on exec)
            os.dup2(self.cmd_r, 3)
            os.dup2(self.res_w, 4)

        self.proc = subprocess.Popen(
            [browser, "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe", "--no-first-run",
             "--no-default-browser-check", "--disable-extensions", "--disable-background-networking",
             f"--user-data-dir={self.profile}", "about:blank"],
            preexec_fn=fds, close_fds=False, stdout=subprocess.DEVNULL, stderr=open(os.path.join(out, "chromium.log"), "w"))
        os.close(self.cmd_r)
        os.close(self.res_w)
        self.buf, self.next_id, self.events = b"", 0, []

    def _read(self, timeout=60):
        deadline = time.time() + timeout
        while b"\0" not in self.buf:
            if time.time() > deadline:
                raise TimeoutError("no answer from chromium")
            chunk = os.read(self.r, 1 << 20)
            if not chunk:
                raise RuntimeError("chromium closed the pipe (see chromium.log)")
            self.buf += chunk
        msg, self.buf = self.buf.split(b"\0", 1)
        return json.loads(msg)

    def send(self, method, params=None, session=None):
        self.next_id += 1
        m = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            m["sessionId"] = session
        os.write(self.w, json.dumps(m).encode() + b"\0")
        while True:
            msg = self._read()
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self.events.append(msg)

    def wait_event(self, method, timeout=60):
        deadline = time.time() + timeout
        while True:
            for i, e in enumerate(self.events):
                if e.get("method") == method:
                    return self.events.pop(i)
            if time.time() > deadline:
                raise TimeoutError(f"no {method} event")
            self.events.append(self._read(timeout))

    def close(self):
        try:
            self.send("Browser.close")
        except Exception:
            pass
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.profile, ignore_errors=True)


def load(b, name):
    """Opens out/<name> in a new tab; returns (session, problems): console errors, exceptions, requests."""
    target = b.send("Target.createTarget", {"url": "about:blank"})["targetId"]
    s = b.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
    for domain in ("Runtime", "Log", "Page", "Network"):
        b.send(domain + ".enable", session=s)
    b.send("Emulation.setDeviceMetricsOverride", {"width": 1280, "height": 900, "deviceScaleFactor": 1, "mobile": False},
           session=s)
    b.events.clear()
    url = "file://" + os.path.join(out, name)
    b.send("Page.navigate", {"url": url}, session=s)
    b.wait_event("Page.loadEventFired")
    time.sleep(0.3)  # let late console messages arrive
    b.send("Runtime.evaluate", {"expression": "1"}, session=s)
    problems = []
    for e in b.events:
        m, p = e.get("method"), e.get("params", {})
        if m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            problems.append("console error: " + " ".join(str(a.get("value", a.get("description"))) for a in p["args"]))
        elif m == "Runtime.exceptionThrown":
            problems.append("exception: " + json.dumps(p["exceptionDetails"])[:500])
        elif m == "Log.entryAdded" and p["entry"]["level"] == "error":
            problems.append("log error: " + p["entry"]["text"])
        elif m == "Network.requestWillBeSent" and not p["request"]["url"].startswith(("file:", "data:")):
            problems.append("network request: " + p["request"]["url"])
    return s, problems


def js(b, s, expr):
    r = b.send("Runtime.evaluate", {"expression": expr, "returnByValue": True, "awaitPromise": True}, session=s)
    if "exceptionDetails" in r:
        raise RuntimeError(f"{expr[:80]}: {r['exceptionDetails']}")
    return r["result"].get("value")


# Every table of the page: {name: {"cols": [...], "titles": [...], "rows": {key: {col: value}}, "td_titles": n}}
TABLES = """JSON.stringify(Object.fromEntries([...document.querySelectorAll('table[data-table]')].map(t => [t.dataset.table, {
  cols: [...t.tHead.rows[0].cells].map(c => c.dataset.col),
  labels: [...t.tHead.rows[0].cells].map(c => c.textContent),
  titled: [...t.querySelectorAll('th')].every(c => c.title.length > 10),
  untitled_numbers: [...t.querySelectorAll('td.num')].filter(c => c.title.length < 10).length,
  rows: [...t.tBodies[0].rows].map(r => [r.dataset.key, [...r.cells].map(c => c.dataset.value)])}])))"""


def tables(b, s):
    return json.loads(js(b, s, TABLES))


def shoot(b, s, name):
    """One PNG per section and one of the whole page."""
    ids = js(b, s, "[...document.querySelectorAll('section[id]')].map(e => e.id)")
    shots = []
    for sid in ["summary"] + ids:
        rect = js(b, s, f"(() => {{ const r = document.getElementById('{sid}').getBoundingClientRect(); "
                        "return {x: r.left + scrollX, y: r.top + scrollY, width: r.width, height: r.height}; })()")
        if not rect or rect["height"] <= 0:
            check(False, f"{name}: section {sid} has no height")
            continue
        rect["scale"] = 1
        png = b.send("Page.captureScreenshot", {"format": "png", "clip": rect, "captureBeyondViewport": True}, session=s)
        path = os.path.join(out, "screens", f"{name}.{sid}.png")
        open(path, "wb").write(base64.b64decode(png["data"]))
        shots.append(path)
    size = b.send("Page.getLayoutMetrics", session=s)["cssContentSize"]
    png = b.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True, "clip": {
        "x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}}, session=s)
    path = os.path.join(out, "screens", f"{name}.full.png")
    open(path, "wb").write(base64.b64decode(png["data"]))
    shots.append(path)
    return ids, shots


def check_table_rows(page, t, name, rows, key, fields):
    """The table's cells (by column id) equal the JSON rows (by key) for each (column, function of row)."""
    got = dict((k, dict(zip(t["cols"], v))) for k, v in t["rows"])
    check(len(got) == len(rows), f"{page}: table {name} has {len(got)} rows, the JSON {len(rows)}")
    bad = 0
    for r in rows:
        cells = got.get(key(r))
        if cells is None:
            check(False, f"{page}: table {name} has no row {key(r)}")
            continue
        for col, want in fields.items():
            w, g = want(r), cells.get(col)
            g = None if g in ("", None) else float(g)
            if not close(g, w):
                bad += 1
                if bad <= 5:
                    check(False, f"{page}: {name} {key(r)} {col}: page {g}, JSON {w}")
    return len(rows) * len(fields) - bad


def check_report_page(b, name, rep, probe):
    s, problems = load(b, name)
    check(not problems, f"{name}: {problems}")
    t = tables(b, s)
    ids, shots = shoot(b, s, name.replace(".html", ""))
    want = ["steps", "ops", "memory", "roofline", "layers"]
    check(ids == want, f"{name}: sections {ids}, expected {want}")
    for tn, tab in t.items():
        check(tab["titled"] and tab["untitled_numbers"] == 0, f"{name}: table {tn} has headers or numbers without a definition")
    n = 0
    ms = lambda ns: ns / 1e6  # noqa: E731
    n += check_table_rows(name, t["ops"], "ops", rep["op_table"], lambda r: f"{r['key']}|{r['phase']}|{r['backend']}", {
        "calls": lambda r: r["calls"], "self_ms": lambda r: ms(r["self_ns"]), "pct": lambda r: r["pct"],
        "gflops": lambda r: r["gflops"] if r["flops"] > 0 else None, "roof": lambda r: r["roof_pct"],
        "alloc_mib": lambda r: r["bytes_allocated"] / 2**20})
    impl = {k: dict(zip(t["ops"]["cols"], v))["impl"] for k, v in t["ops"]["rows"]}
    check(all(impl.get(f"{r['key']}|{r['phase']}|{r['backend']}") == r["impl"] for r in rep["op_table"]),
          f"{name}: implementations differ from the report")
    n += check_table_rows(name, t["layers"], "layers", rep["layer_table"], lambda r: f"{r['key']}|{r['phase']}", {
        "calls": lambda r: r["calls"], "self_ms": lambda r: ms(r["self_ns"]), "pct": lambda r: r["pct"]})
    ph = rep["phases"]
    phase_rows = [{"phase": p, "ops": ms(v)} for p, v in ph["mean_ops_ns"].items()
                  if v > 0 or (ph["mean_wall_ns"] or {}).get(p, 0) > 0]
    phase_rows.append({"phase": "untracked", "ops": ms(ph["mean_untracked_ns"])})
    n += check_table_rows(name, t["phases"], "phases", phase_rows, lambda r: r["phase"], {"ops_ms": lambda r: r["ops"]})
    dev = [d for d in rep["memory"]["devices"] if d["device"] == rep["totals"]["device"]][0]
    peak_text = js(b, s, "document.getElementById('peak-op').textContent")
    po = dev["peak_op"]
    check(f"op #{po['index']} {po['name']}" in peak_text and "peak" in js(b, s, "document.getElementById('peak-label').textContent"),
          f"{name}: the peak op is not named: {peak_text!r}")
    n_circles = js(b, s, "document.querySelectorAll('#memory-curve circle').length")
    check(n_circles == 2 * len(rep["steps"]), f"{name}: memory curve has {n_circles} points for {len(rep['steps'])} steps")
    pts = [r for r in rep["op_table"] if r["flops"] > 0 and r["bytes"] > 0 and r["gflops"] > 0]
    n_pts = js(b, s, "document.querySelectorAll('#roofline-chart circle[data-op]').length")
    check(n_pts == len(pts), f"{name}: roofline has {n_pts} points, the op table {len(pts)} ops with FLOPs and bytes")
    roof = js(b, s, "document.querySelectorAll('#roofline-chart .roof').length")
    note = js(b, s, "document.getElementById('roofline').textContent")
    drawn = js(b, s, "(c => [c.dataset.gemmGflops, c.dataset.copyGbs])(document.getElementById('roofline-chart'))")
    if probe:
        rf = rep["roofline"]
        check(roof >= 1 and "Ceilings measured on this machine" in note and drawn[0] is not None and
              close(float(drawn[0]), rf["gemm_gflops"]) and close(float(drawn[1]), rf["copy_gbs"]),
              f"{name}: the roof drawn ({roof} lines, ceilings {drawn}) is not the probe's ({rf})")
    else:
        check(roof == 0 and drawn[0] is None and js(b, s, "!!document.getElementById('no-probe')") and "No probe data" in note,
              f"{name}: the page does not say the probe is absent")
    # Sorting: a click on "calls" sorts descending, a second ascending.
    order = js(b, s, """(() => { const t = document.querySelector('table[data-table=ops]');
        const i = [...t.tHead.rows[0].cells].findIndex(c => c.dataset.col === 'calls');
        const vals = () => [...t.tBodies[0].rows].map(r => parseFloat(r.cells[i].dataset.value));
        t.tHead.rows[0].cells[i].click(); const d = vals(); t.tHead.rows[0].cells[i].click(); const a = vals();
        return [d, a, t.tHead.rows[0].cells[i].getAttribute('aria-sort')]; })()""")
    check(order[0] == sorted(order[0], reverse=True) and order[1] == sorted(order[1]) and order[2] == "ascending",
          f"{name}: sorting by calls failed: {order}")
    print(f"{name}: {len(problems)} console errors, exceptions or network requests; sections {ids}; {n} table numbers equal to "
          f"{name.replace('.html', '.json')}; peak op {po['name']!r} named; {n_pts} roofline points"
          f"{', roof from the probe' if probe else ', no probe said so'}; sorting works; {len(shots)} screenshots")


def check_compare_page(b, name, cmp):
    s, problems = load(b, name)
    check(not problems, f"{name}: {problems}")
    t = tables(b, s)
    ids, shots = shoot(b, s, "compare")
    want = ["figures", "steps", "ops", "shifts", "layers"]
    check(ids == want, f"{name}: sections {ids}, expected {want}")
    for tn, tab in t.items():
        check(tab["titled"] and tab["untitled_numbers"] == 0, f"{name}: table {tn} has headers or numbers without a definition")
    n = 0
    for tn, rows, key in (("phases", cmp["phases"], lambda r: r["phase"]),
                          ("ops", cmp["ops"], lambda r: f"{r['op']}|{r['phase']}"),
                          ("layers", cmp["layers"], lambda r: f"{r['layer']}|{r['phase']}")):
        got = {k: v for k, v in t[tn]["rows"]}
        cols = t[tn]["cols"]
        check(len(got) == len(rows), f"{name}: {tn} has {len(got)} rows, the JSON {len(rows)}")
        for r in rows:
            cells = got.get(key(r), [])
            values = [float(v) if v != "" else None for c, v in zip(cols, cells) if c == "value"]
            ratios = [float(v) if v != "" else None for c, v in zip(cols, cells) if c == "ratio"]
            ok = len(values) == len(r["value"]) and all(close(a, b) for a, b in zip(values, r["value"])) and \
                all(close(a, b) for a, b in zip(ratios, r["ratio"][1:]))
            check(ok, f"{name}: {tn} {key(r)}: page {values} {ratios}, JSON {r['value']} {r['ratio']}")
            n += len(values) + len(ratios)
    figs = {k: v for k, v in t["figures"]["rows"]}
    ips = [float(v) for c, v in zip(t["figures"]["cols"], figs["images/s"]) if c == "value"]
    check(all(close(a, b) for a, b in zip(ips, [A["totals"]["images_per_s"], B["totals"]["images_per_s"]])),
          f"{name}: images/s {ips}")
    n += len(ips)
    print(f"{name}: {len(problems)} console errors, exceptions or network requests; sections {ids}; {n} values and ratios equal to "
          f"cmp.json; the two runs side by side; {len(shots)} screenshots")


b = Browser()
try:
    check_report_page(b, "a.html", A, probe=True)
    check_report_page(b, "b.html", B, probe=False)
    check_compare_page(b, "cmp.html", C)
finally:
    b.close()
print(f"screenshots: {os.path.join(out, 'screens')} ({len(os.listdir(os.path.join(out, 'screens')))} PNG files)")
if failures:
    sys.exit(f"html_report_check: {len(failures)} failure(s)")
print("html_report_check: ok")
