/* gpuprof report page: draws the JSON document in #gpuprof-data (gpuprof/exporters/html.py).
 * Plain DOM and SVG, no libraries. Text from the profile (op names, files) is only ever
 * set through textContent or attributes, never parsed as HTML. */
(function () {
  "use strict";

  var D = JSON.parse(document.getElementById("gpuprof-data").textContent);
  var SVGNS = "http://www.w3.org/2000/svg";
  var COLORS = { gpu_busy_ns: "#3c9a5f", comm_ns: "#7a5cc4", data_wait_ns: "#e0962d",
    sync_wait_ns: "#d4483b", idle_ns: "#c4cad4" };
  var PARTS = [["gpu_busy_ns", "GPU busy"], ["comm_ns", "communication (not overlapped)"],
    ["data_wait_ns", "data wait"], ["sync_wait_ns", "sync wait"], ["idle_ns", "GPU idle"]];

  // ---- small helpers ------------------------------------------------------------------------
  function el(tag, attrs) {
    var e = document.createElement(tag);
    setAttrs(e, attrs);
    for (var i = 2; i < arguments.length; i++) add(e, arguments[i]);
    return e;
  }
  function svg(tag, attrs) {
    var e = document.createElementNS(SVGNS, tag);
    setAttrs(e, attrs);
    for (var i = 2; i < arguments.length; i++) add(e, arguments[i]);
    return e;
  }
  function setAttrs(e, attrs) {
    if (!attrs) return;
    Object.keys(attrs).forEach(function (k) {
      var v = attrs[k];
      if (v === null || v === undefined || v === false) return;
      if (k === "text") e.textContent = v;
      else if (k === "on") Object.keys(v).forEach(function (ev) { e.addEventListener(ev, v[ev]); });
      else e.setAttribute(k, v === true ? "" : String(v));
    });
  }
  function add(parent, child) {
    if (child === null || child === undefined || child === false) return;
    if (Array.isArray(child)) { child.forEach(function (c) { add(parent, c); }); return; }
    parent.appendChild(typeof child === "object" ? child : document.createTextNode(String(child)));
  }
  // Durations as the text tables print them (gpuprof.tables.format_time).
  function fmtTime(ns) {
    var us = ns / 1e3, a = Math.abs(us);
    if (a >= 1e6) return (us / 1e6).toFixed(3) + "s";
    if (a >= 1e3) return (us / 1e3).toFixed(3) + "ms";
    return us.toFixed(3) + "us";
  }
  // Bytes in binary units (gpuprof.memory.format_bytes).
  function fmtBytes(n) {
    var sign = n < 0 ? "-" : "", v = Math.abs(n), units = ["B", "KiB", "MiB", "GiB"], u = 0;
    while (v >= 1024 && u < 3) { v /= 1024; u++; }
    if (u === 0) return sign + Math.round(v) + " B";
    return sign + v.toFixed(u === 3 ? 2 : 1) + " " + units[u];
  }
  // Axis ticks: short, with the unit of the axis' largest value.
  function axisTime(ns, maxv) {
    var u = maxv >= 1e9 ? [1e9, "s"] : maxv >= 1e6 ? [1e6, "ms"] : maxv >= 1e3 ? [1e3, "us"] : [1, "ns"];
    return +(ns / u[0]).toPrecision(4) + " " + u[1];
  }
  function fmtMs(ns) { return "+" + (ns / 1e6).toFixed(1) + " ms"; }
  function pct(x) { return (100 * x).toFixed(1) + "%"; }
  function severity(s) { return s >= 0.2 ? "high" : s >= 0.05 ? "medium" : "low"; }
  // a finding's level: a CPU hot path is where the time goes, not a fault (no red)
  function level(f) { return f.kind === "cpu_hot_path" ? "info" : severity(f.severity); }
  function niceStep(range, n) {
    var raw = range / Math.max(n, 1), mag = Math.pow(10, Math.floor(Math.log10(raw || 1)));
    var f = raw / mag;
    return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * mag;
  }
  var tip = el("div", { "class": "tip", role: "tooltip" });
  function showTip(ev, text) {
    tip.textContent = text;
    tip.style.display = "block";
    var x = ev.clientX + 14, y = ev.clientY + 14, r = tip.getBoundingClientRect();
    if (x + r.width > window.innerWidth - 8) x = Math.max(8, ev.clientX - r.width - 14);
    if (y + r.height > window.innerHeight - 8) y = Math.max(8, ev.clientY - r.height - 14);
    tip.style.left = x + "px";
    tip.style.top = y + "px";
  }
  function hideTip() { tip.style.display = "none"; }
  function section(id, title) {
    var s = el("section", { id: id }, el("h2", { text: title }));
    return s;
  }
  function chartWidth(minimum) {
    var main = document.querySelector("main");
    return Math.max(minimum || 600, (main ? main.clientWidth : 1000) - 40);
  }

  // ---- sortable, filterable table -----------------------------------------------------------
  // spec: {columns: [{title, align}], rows: [[display strings]], keys: [[number|null]],
  //        sort: column index (null: as given), tips: [string] (title of the first cell)}
  var LIMIT = 300;
  function dataTable(spec, opts) {
    opts = opts || {};
    var n = spec.rows.length, order = [], i;
    for (i = 0; i < n; i++) order.push(i);
    var state = { col: spec.sort, dir: -1, filter: "", all: false };
    var isText = spec.columns.map(function (c, j) {
      return spec.keys.length === 0 || spec.keys[0][j] === null;
    });
    if (state.col === null) state.dir = 1;  // the order the rows came in
    else state.dir = isText[state.col] ? 1 : -1;
    var wrap = el("div", { "class": "datatable", id: opts.id || null });
    var filter = el("input", { type: "search", placeholder: opts.placeholder || "filter by name",
      "aria-label": "filter rows by name" });
    var count = el("span", { "class": "muted small count" });
    var more = el("button", { type: "button", text: "show all rows" });
    var controls = el("div", { "class": "controls" }, opts.noFilter ? null : filter, count, more);
    var heads = spec.columns.map(function (c, j) {
      var b = el("button", { type: "button", text: c.title,
        title: "sort by " + c.title + (isText[j] ? "" : " (click again to reverse)") });
      var th = el("th", { scope: "col", style: "text-align:" + (c.align === "l" ? "left" : "right"),
        "data-col": j }, b);
      b.addEventListener("click", function () {
        if (state.col === j) state.dir = -state.dir;
        else { state.col = j; state.dir = isText[j] ? 1 : -1; }
        render();
      });
      return th;
    });
    var tbody = el("tbody");
    var table = el("table", { "class": "data" }, el("thead", null, el("tr", null, heads)), tbody);
    add(wrap, [controls, el("div", { "class": "table-wrap" }, table)]);
    if (spec.footer) add(wrap, el("div", { "class": "muted small", text: spec.footer }));
    filter.addEventListener("input", function () { state.filter = filter.value.toLowerCase(); render(); });
    more.addEventListener("click", function () { state.all = true; render(); });

    function cmp(a, b) {
      var c = state.col, r;
      if (c === null) return a - b;
      if (isText[c]) {
        var x = spec.rows[a][c].toLowerCase(), y = spec.rows[b][c].toLowerCase();
        r = x < y ? -1 : x > y ? 1 : 0;
      } else {
        r = spec.keys[a][c] - spec.keys[b][c];
      }
      return r * state.dir || a - b;
    }
    function render() {
      var rows = order.filter(function (i) {
        return !state.filter || spec.rows[i][0].toLowerCase().indexOf(state.filter) >= 0;
      }).sort(cmp);
      heads.forEach(function (th, j) {
        th.setAttribute("aria-sort", j === state.col ? (state.dir > 0 ? "ascending" : "descending") : "none");
      });
      var shown = state.all ? rows : rows.slice(0, LIMIT);
      var frag = document.createDocumentFragment();
      shown.forEach(function (i) {
        var tr = el("tr", { "data-row": i });
        spec.rows[i].forEach(function (cell, j) {
          var td = el("td", { "class": spec.columns[j].align === "l" ? "l" : "r", text: cell });
          if (j === 0) td.title = spec.tips ? spec.tips[i] : cell;
          tr.appendChild(td);
        });
        frag.appendChild(tr);
      });
      tbody.textContent = "";
      tbody.appendChild(frag);
      count.textContent = (shown.length < rows.length ? shown.length + " shown of " : "") +
        rows.length + (rows.length === n ? "" : " matching, of " + n) + " rows";
      more.style.display = shown.length < rows.length ? "" : "none";
    }
    render();
    return wrap;
  }

  // ---- header and summary --------------------------------------------------------------------
  function header(links) {
    var nav = el("nav", null, links.map(function (l) { return el("a", { href: "#" + l[0], text: l[1] }); }));
    return el("header", { "class": "top" }, el("h1", { text: D.title }), nav);
  }
  function fact(label, value) { return el("div", null, el("b", { text: label }), value); }

  function summarySection() {
    var s = D.summary, sec = section("summary", "Summary");
    add(sec, el("div", { "class": "facts" },
      fact("program", s.program + " (pid " + s.pid + ")"),
      fact("recorded", s.steps + " steps in " + s.windows + " window" + (s.windows > 1 ? "s" : "") +
        ", " + fmtTime(s.window_ns)),
      fact("mean step", s.steps ? fmtTime(s.step_ns_mean) : "-"),
      fact("GPU busy", D.diagnosis.summary.gpu ? pct(D.diagnosis.summary.gpu_busy_share) : "no GPU activity"),
      fact("CUDA capture", s.cuda_capture),
      fact("written", s.created + " by gpuprof " + D.version)));
    s.warnings.forEach(function (w) { add(sec, el("div", { "class": "warning", text: w })); });
    (s.notes || []).forEach(function (n) { add(sec, el("p", { "class": "muted", text: n })); });
    return sec;
  }

  // ---- diagnosis ------------------------------------------------------------------------------
  function diagnosisSection() {
    var d = D.diagnosis, sec = section("diagnosis", "Diagnosis"), sm = d.summary;
    // the lines prof.diagnose() prints above its findings (Diagnosis.headline())
    var head = d.headline.slice(), none = d.findings.length ? null : head.pop();
    add(sec, el("p", { "class": "muted", text: head.join(" ") + " Findings are ranked by the share each costs." }));
    if (none) add(sec, el("p", { "class": "finding none", text: none }));
    d.findings.forEach(function (f, i) {
      var lvl = level(f);
      var card = el("div", { "class": "finding " + lvl, "data-kind": f.kind },
        el("h3", null, el("span", { "class": "badge " + lvl, text: lvl + " \u00b7 " + pct(f.severity) + " of " + f.share_of }),
          (i + 1) + ". " + f.title, el("span", { "class": "kind", text: f.kind })),
        f.location ? el("div", { "class": "where" }, "at ", el("code", { text: f.location })) : null,
        el("dl", { "class": "evidence" }, f.evidence_text.map(function (kv) {
          return [el("dt", { text: kv[0] }), el("dd", { text: kv[1] })];
        })),
        el("p", { "class": "fix" }, el("b", { text: "Fix: " }), f.fix));
      add(sec, card);
    });
    add(sec, el("details", null, el("summary", { text: "as text (prof.diagnose())" }),
      el("pre", { "class": "text", text: d.text })));
    return sec;
  }

  // ---- steps: stacked bars ------------------------------------------------------------------
  function stepsSection() {
    var st = D.steps, b = st.breakdown, n = b.step.length, sec = section("steps", "Steps");
    add(sec, el("p", { "class": "muted", text: "Each bar is one recorded step's wall time; every nanosecond counts once, " +
      "under the first part that holds: GPU busy (kernels, copies, memsets), communication not hidden by compute, " +
      "then, while the GPU is idle: waiting for data, the bubble after a synchronization, other idle time." }));
    if (!D.diagnosis.summary.gpu) {
      PARTS = PARTS.slice();
      PARTS[4] = ["idle_ns", "other host time (no GPU activity recorded)"];
    }
    add(sec, el("div", { "class": "legend" }, PARTS.map(function (p) {
      return el("span", { style: "--c:" + COLORS[p[0]], text: p[1] });
    })));
    if (!n) { add(sec, el("p", { text: "No steps were recorded: call prof.step() once per iteration." })); return sec; }
    var W = chartWidth(500), H = 260, L = 56, R = 12, T = 26, B = 30;
    var maxv = Math.max.apply(null, b.step_ns) || 1;
    var pw = W - L - R, ph = H - T - B, bw = pw / n;
    var s = svg("svg", { width: W, height: H, "class": "steps-chart", role: "img",
      "aria-label": "stacked bar per step" });
    var unit = niceStep(maxv, 5), y;
    for (y = 0; y <= maxv + 1e-9; y += unit) {
      var yy = T + ph - ph * y / maxv;
      add(s, [svg("line", { x1: L, x2: W - R, y1: yy, y2: yy, stroke: "#e6e9ef" }),
        svg("text", { x: L - 6, y: yy + 4, "text-anchor": "end", "font-size": 11, fill: "#5d6678", text: axisTime(y, maxv) })]);
    }
    // recorded windows, behind the bars
    var idx = 0;
    st.windows.forEach(function (w, wi) {
      var first = -1, last = -1, i;
      for (i = 0; i < n; i++) if (b.window[i] === wi) { if (first < 0) first = i; last = i; }
      if (first < 0) return;
      var x0 = L + first * bw, x1 = L + (last + 1) * bw;
      add(s, svg("rect", { x: x0, y: T - 20, width: x1 - x0, height: ph + 20, fill: wi % 2 ? "#eef4ff" : "#f3f7ff",
        stroke: "#9db8e8", "stroke-dasharray": "3 2", "class": "window-band" }));
      add(s, svg("text", { x: x0 + 4, y: T - 7, "font-size": 11, fill: "#2f6fd6", "class": "window-label",
        text: "recorded window" + (st.windows.length > 1 ? " " + (wi + 1) : "") + ": steps " + w.first_step +
          "\u2013" + w.last_step + ", " + fmtTime(w.end_ns - w.start_ns) }));
      idx++;
    });
    var gap = bw > 6 ? Math.min(bw * 0.18, 6) : 0;
    for (var i = 0; i < n; i++) {
      var g = svg("g", { "class": "bar", "data-step": b.step[i] }), acc = 0, lines = ["step " + b.step[i] + ": " + fmtTime(b.step_ns[i])];
      PARTS.forEach(function (p) {
        var v = b[p[0]][i];
        if (v > 0) {
          var h = ph * v / maxv, yv = T + ph - ph * (acc + v) / maxv;
          add(g, svg("rect", { x: L + i * bw + gap / 2, y: yv, width: Math.max(bw - gap, 0.5), height: h, fill: COLORS[p[0]] }));
        }
        acc += v;
        lines.push(p[1] + ": " + fmtTime(v) + " (" + pct(v / Math.max(b.step_ns[i], 1)) + ")");
      });
      add(g, svg("title", { text: lines.join("\n") }));
      add(s, g);
      if (n <= 40 || i % Math.ceil(n / 40) === 0)
        add(s, svg("text", { x: L + (i + 0.5) * bw, y: H - B + 14, "text-anchor": "middle", "font-size": 10, fill: "#5d6678", text: b.step[i] }));
    }
    add(s, svg("text", { x: L + pw / 2, y: H - 3, "text-anchor": "middle", "font-size": 11, fill: "#5d6678", text: "step" }));
    add(sec, el("div", { "class": "chart" }, s));
    // mean of each part, over every step (st.totals), also those not drawn
    var sum = function (xs) { return xs.reduce(function (a, v) { return a + v; }, 0); };
    var totals = st.totals || {}, tot = (st.totals ? totals.step_ns : sum(b.step_ns)) || 1;
    add(sec, el("p", { "class": "small" }, "Over all recorded steps: ", PARTS.map(function (p, j) {
      var v = st.totals ? totals[p[0]] : sum(b[p[0]]);
      return (j ? ", " : "") + p[1] + " " + pct(v / tot);
    })));
    if (st.total_steps > n)
      add(sec, el("p", { "class": "muted small", text: n + " of the " + st.total_steps + " steps are drawn and listed: " +
        "the first, the last, and the fastest and the slowest of each stretch of consecutive steps; the sums above, " +
        "the tables and the diagnosis count every step (prof.step_table() lists them all)." }));
    add(sec, el("details", null, el("summary", { text: "step table (prof.step_table())" }), dataTable(st.table, { noFilter: true })));
    return sec;
  }

  // ---- op and kernel tables -------------------------------------------------------------------
  function opsSection() {
    var sec = section("ops", "Ops");
    add(sec, el("p", { "class": "muted", text: "The rows of prof.key_averages().table(): one per Python function, C function, " +
      "record_function range and CUDA API call. Click a column to sort; self columns count time while the op was innermost." }));
    add(sec, dataTable(D.ops, { id: "ops-table", placeholder: "filter ops by name" }));
    if (D.ops.idle) add(sec, el("p", { "class": "muted small", text: D.ops.idle }));  // waiting left out
    return sec;
  }
  function kernelsSection() {
    var sec = section("kernels", "Kernels");
    if (!D.kernels.rows.length) {
      add(sec, el("p", { text: "No GPU activity was recorded (" + D.summary.cuda_capture + ")." }));
      return sec;
    }
    add(sec, el("p", { "class": "muted", text: "GPU activity by name and device (prof.kernel_table()): kernels, copies and memsets." }));
    add(sec, dataTable(D.kernels, { id: "kernels-table", placeholder: "filter kernels by name" }));
    return sec;
  }

  // ---- modules: one row per torch.nn.Module instance, nested as the model is -----------------
  function modulesSection() {
    var M = D.modules, sec = section("modules", "Modules");
    add(sec, el("p", { "class": "muted", text: "One row per torch.nn.Module instance that ran (prof.module_table()), " +
      "named as in the model; forward CPU time" + (M.gpu ? ", the GPU time its forward launched and the backward " +
      "GPU time of the autograd nodes its forward made, and their share of all GPU work" : "") + ". Click a row to open it." }));
    var kids = {};
    M.rows.forEach(function (r, i) { (kids[r.parent] = kids[r.parent] || []).push(i); });
    function line(r) {
      var t = r.name + "  (" + r.cls + ")  " + r.calls + " calls, CPU " + fmtTime(r.cpu_ns);
      if (M.gpu) t += ", forward CUDA " + fmtTime(r.fwd_ns) + ", backward CUDA " + fmtTime(r.bwd_ns) +
        ", " + r.kernels + " kernels, " + (100 * r.share).toFixed(1) + "% of GPU work";
      return t;
    }
    function node(i) {
      var r = M.rows[i], below = kids[i] || [];
      if (!below.length) return el("div", { "class": "module-leaf", text: line(r) });
      var d = el("details", { "class": "module", open: r.parent < 0 ? true : null },
        el("summary", { text: line(r) }));
      below.forEach(function (k) { add(d, node(k)); });
      return d;
    }
    (kids[-1] || []).forEach(function (i) { add(sec, node(i)); });
    return sec;
  }

  // ---- flame graph ----------------------------------------------------------------------------
  var KIND_HUE = { python: 32, c: 200, user: 280, step: 280, cuda_api: 110, none: 0, thread: 220 };
  function hash(s) { var h = 0; for (var i = 0; i < s.length; i++) h = (h * 31 + s.charCodeAt(i)) | 0; return h; }
  function frameColor(kind, name) {
    var h = KIND_HUE[kind] === undefined ? 0 : KIND_HUE[kind], v = Math.abs(hash(name));
    if (kind === "root" || kind === "thread") return "hsl(220,12%," + (78 + v % 8) + "%)";
    return "hsl(" + (h + v % 24) + "," + (55 + v % 20) + "%," + (62 + v % 12) + "%)";
  }

  function flameSection() {
    var F = D.flame, sec = section("flame", "Flame graph");
    if (!F || !F.parent.length) { add(sec, el("p", { text: "No calls were recorded." })); return sec; }
    add(sec, el("p", { "class": "muted", text: "The call tree of the " + (D.summary.windows > 1 ? "last recorded window" : "recorded window") +
      ", root at the top; a frame's width is its total time, CPU time (host) or CUDA time (GPU work it launched, and its callees). " +
      "Click a frame to zoom in, click a frame above it to zoom out." }));
    // the tree
    var nodes = [], threadNodes = {}, i;
    var root = { name: "all threads", kind: "root", children: [], cpu: 0, cuda: 0, self: 0, cself: 0, calls: 0, parent: null, loc: "" };
    for (i = 0; i < F.parent.length; i++) {
      var op = F.op[i];
      var nd = { name: D.op_names[op], kind: D.op_kinds[op], loc: D.op_locations[op], children: [],
        cpu: F.total[i], cuda: F.cuda_total[i], self: F.self[i], cself: F.cuda_self[i], calls: F.calls[i], parent: null };
      nodes.push(nd);
      if (F.parent[i] >= 0) { nd.parent = nodes[F.parent[i]]; nd.parent.children.push(nd); }
      else {
        var t = F.thread[i], tn = threadNodes[t];
        if (!tn) {
          tn = threadNodes[t] = { name: F.threads[t] || ("thread " + t), kind: "thread", children: [], cpu: 0, cuda: 0, self: 0, cself: 0, calls: 0, parent: root, loc: "" };
          root.children.push(tn);
        }
        nd.parent = tn; tn.children.push(nd); tn.cpu += nd.cpu; tn.cuda += nd.cuda;
      }
    }
    root.children.forEach(function (tn) { root.cpu += tn.cpu; root.cuda += tn.cuda; });
    var hasCuda = root.cuda > 0;
    var state = { metric: "cpu", zoom: root, search: "" };

    var metricSel = el("span", { "class": "metric", role: "radiogroup", "aria-label": "frame width" },
      "width: ", radio("cpu", "CPU time", true, false), radio("cuda", "CUDA time", false, !hasCuda));
    function radio(v, label, checked, disabled) {
      var r = el("input", { type: "radio", name: "flame-metric", value: v, checked: checked, disabled: disabled, id: "flame-metric-" + v });
      r.addEventListener("change", function () { if (r.checked) { state.metric = v; render(); } });
      return el("label", { "for": "flame-metric-" + v, style: "margin-right:10px" }, r, " " + label);
    }
    var search = el("input", { type: "search", placeholder: "search frames", "aria-label": "search frames" });
    var found = el("span", { "class": "muted small search-result" });
    var reset = el("button", { type: "button", text: "reset zoom" });
    var crumbs = el("div", { "class": "crumbs" });
    add(sec, el("div", { "class": "controls" }, metricSel, search, found, reset));
    if (!hasCuda) add(sec, el("div", { "class": "muted small", text: "CUDA time: no GPU work was attributed to a call in this profile." }));
    add(sec, crumbs);
    var holder = el("div", { "class": "flame-wrap" });
    add(sec, holder);
    if (F.omitted) add(sec, el("div", { "class": "muted small", text: F.omitted + " call paths under " +
      (100 * F.omitted_share) + "% of the window's time (CPU and CUDA) are left out of the graph; the tables count them." }));
    search.addEventListener("input", function () { state.search = search.value.toLowerCase(); render(); });
    reset.addEventListener("click", function () { state.zoom = root; render(); });

    function val(nd) { return state.metric === "cpu" ? nd.cpu : nd.cuda; }
    function zoomTo(nd) { state.zoom = nd; render(); }
    var ROW = 18;
    function render() {
      var W = chartWidth(500), z = state.zoom, path = [], p;
      for (p = z; p; p = p.parent) path.unshift(p);
      var total = val(z) || 1, rows = [], maxDepth = 0;
      path.forEach(function (nd, d) { rows.push({ nd: nd, x: 0, w: W, d: d, anc: nd !== z }); });
      function lay(nd, x, d) {
        var kids = nd.children.slice().sort(function (a, b) { return val(b) - val(a); });
        var cx = x;
        kids.forEach(function (c) {
          var w = W * val(c) / total;
          if (w < 0.5) return;
          rows.push({ nd: c, x: cx, w: w, d: d, anc: false });
          if (d > maxDepth) maxDepth = d;
          lay(c, cx, d + 1);
          cx += w;
        });
      }
      lay(z, 0, path.length);
      maxDepth = Math.max(maxDepth, path.length - 1);
      var H = (maxDepth + 1) * ROW + 2;
      var s = svg("svg", { width: W, height: H, "class": "flame", role: "img", "aria-label": "flame graph" });
      var matched = 0, q = state.search;
      rows.forEach(function (r) {
        var nd = r.nd, isMatch = q && nd.name.toLowerCase().indexOf(q) >= 0;
        var g = svg("g", { "class": "frame" + (r.anc ? " ancestor" : "") + (isMatch ? " match" : "") + (q && !isMatch ? " dim" : ""),
          "data-name": nd.name, "data-depth": r.d, "data-width": r.w.toFixed(1), transform: "translate(" + r.x.toFixed(2) + "," + r.d * ROW + ")" });
        add(g, svg("rect", { width: Math.max(r.w - 0.5, 0.5).toFixed(2), height: ROW - 1, fill: frameColor(nd.kind, nd.name) }));
        var chars = Math.floor((r.w - 6) / 6.7);
        if (chars >= 3) add(g, svg("text", { x: 3, y: ROW - 5, text: nd.name.length > chars ? nd.name.slice(0, chars - 1) + "\u2026" : nd.name }));
        g.addEventListener("click", function () { zoomTo(nd === z && nd.parent ? nd.parent : nd); });
        g.addEventListener("mousemove", function (ev) { showTip(ev, describe(nd)); });
        g.addEventListener("mouseleave", hideTip);
        if (isMatch && !r.anc) {
          var under = false;
          for (var pp = nd.parent; pp && pp !== z.parent; pp = pp.parent) if (pp.name.toLowerCase().indexOf(q) >= 0) { under = true; break; }
          if (!under) matched += val(nd);
        }
        add(s, g);
      });
      holder.textContent = "";
      add(holder, s);
      found.textContent = q ? "matches: " + pct(matched / total) + " of " + (z === root ? "all" : "the zoomed frame") : "";
      crumbs.textContent = "";
      path.forEach(function (nd, j) {
        if (j) add(crumbs, " \u203a ");
        if (nd === z) add(crumbs, el("b", { text: nd.name }));
        else add(crumbs, el("a", { text: nd.name, on: { click: function () { zoomTo(nd); } } }));
      });
    }
    function describe(nd) {
      var lines = [nd.name];
      if (nd.loc) lines.push("at " + nd.loc);
      var all = val(root) || 1;
      lines.push("CPU total " + fmtTime(nd.cpu) + (nd.kind !== "thread" && nd.kind !== "root" ? ", self " + fmtTime(nd.self) : ""));
      if (hasCuda) lines.push("CUDA total " + fmtTime(nd.cuda) + (nd.kind !== "thread" && nd.kind !== "root" ? ", self " + fmtTime(nd.cself) : ""));
      if (nd.calls) lines.push(nd.calls + " calls");
      lines.push(pct(val(nd) / all) + " of all " + (state.metric === "cpu" ? "CPU" : "CUDA") + " time");
      return lines.join("\n");
    }
    render();
    window.addEventListener("resize", function () { render(); });
    return sec;
  }

  // ---- memory ---------------------------------------------------------------------------------
  function lineChart(series, opts) {
    var W = chartWidth(500), H = 230, L = 70, R = 14, T = 14, B = 30;
    var xmax = opts.xmax || 1, ymax = 1, ymin = 0;
    series.forEach(function (s) { s.y.forEach(function (v) { if (v > ymax) ymax = v; if (v < ymin) ymin = v; }); });
    ymax *= 1.08;
    var pw = W - L - R, ph = H - T - B;
    function X(t) { return L + pw * t / xmax; }
    function Y(v) { return T + ph - ph * (v - ymin) / (ymax - ymin); }
    var s = svg("svg", { width: W, height: H, "class": "memory-chart", role: "img", "aria-label": opts.label });
    var ys = niceStep(ymax - ymin, 4), v;
    for (v = Math.ceil(ymin / ys) * ys; v <= ymax; v += ys)
      add(s, [svg("line", { x1: L, x2: W - R, y1: Y(v), y2: Y(v), stroke: "#e6e9ef" }),
        svg("text", { x: L - 6, y: Y(v) + 4, "text-anchor": "end", "font-size": 11, fill: "#5d6678", text: fmtBytes(v) })]);
    var xs = niceStep(xmax, 8);
    for (v = 0; v <= xmax; v += xs)
      add(s, svg("text", { x: X(v), y: H - B + 14, "text-anchor": "middle", "font-size": 10, fill: "#5d6678", text: (v / 1e6).toFixed(v && xs < 1e6 ? 1 : 0) }));
    add(s, svg("text", { x: L + pw / 2, y: H - 3, "text-anchor": "middle", "font-size": 11, fill: "#5d6678", text: "ms since the window start" }));
    series.forEach(function (sr) {
      var d = "", k;
      for (k = 0; k < sr.t.length; k++) {
        var x = X(sr.t[k]).toFixed(1), y = Y(sr.y[k]).toFixed(1);
        if (!k) d = "M" + x + "," + y;
        else if (sr.step) d += "H" + x + "V" + y;
        else d += "L" + x + "," + y;
      }
      if (sr.step && sr.t.length) d += "H" + X(xmax).toFixed(1);
      add(s, svg("path", { d: d, fill: "none", stroke: sr.color, "stroke-width": 1.6, "stroke-dasharray": sr.dash || null }, svg("title", { text: sr.name })));
    });
    if (opts.peak) {
      var p = opts.peak, px = X(p.t_ns), py = Y(p.bytes);
      add(s, [svg("line", { x1: px, x2: px, y1: T, y2: T + ph, stroke: "#c62f2f", "stroke-dasharray": "4 3" }),
        svg("circle", { cx: px, cy: py, r: 4, fill: "#c62f2f", "class": "peak" }),
        svg("text", { x: Math.min(px + 6, W - R - 4), y: T + 10, "font-size": 11, fill: "#c62f2f", "text-anchor": px > W * 0.7 ? "end" : "start",
          text: "peak " + fmtBytes(p.bytes) + " at " + fmtMs(p.t_ns) })]);
    }
    var legend = el("div", { "class": "legend" }, series.map(function (sr) { return el("span", { style: "--c:" + sr.color, text: sr.name }); }));
    return el("div", { "class": "chart" }, legend, s);
  }
  function peakLine(p, what) {
    return el("p", null, el("b", { text: what + ": " + fmtBytes(p.bytes) }), " at " + fmtMs(p.t_ns),
      p.op ? [" by ", el("code", { text: p.op })] : null, p.location ? [" at ", el("code", { "class": "peak-location", text: p.location })] : null);
  }
  function memorySection() {
    var M = D.memory, sec = section("memory", "Memory");
    if (!M.recorded) {
      add(sec, el("p", { text: "Memory was not recorded: profile with gpuprof.profile(profile_memory=True) (or run --memory) " +
        "to see device allocations, the framework allocator and host RSS here." }));
      return sec;
    }
    if (!M.devices.length && !M.host) add(sec, el("p", { text: "No device memory and no host samples were recorded in the window." }));
    M.devices.forEach(function (d) {
      var box = el("div", { "class": "device", "data-device": d.device }, el("h3", { text: d.device + ": peak " + fmtBytes(d.peak_bytes) + " (" + d.peak_source + ")" }));
      var series = [];
      d.curves.forEach(function (c) {
        if (c.reserved) {
          series.push({ name: c.label + ": allocated", t: c.t_ns, y: c.allocated, color: "#2f6fd6" });
          series.push({ name: c.label + ": reserved", t: c.t_ns, y: c.reserved, color: "#7a5cc4", dash: "5 3" });
        } else series.push({ name: c.label, t: c.t_ns, y: c.allocated, color: "#d9822b", step: c.step });
      });
      add(box, lineChart(series, { xmax: M.window_ns, peak: d.peak, label: d.device + " memory" }));
      add(box, peakLine(d.peak, "peak"));
      if (d.driver && d.allocator) add(box, peakLine(d.driver.peak, "peak of the device allocations CUPTI saw (relative to the window start)"));
      if (d.driver) add(box, el("p", { "class": "small muted", text: d.driver.allocations + " allocations (" + fmtBytes(d.driver.allocated_bytes_total) +
        "), " + d.driver.frees + " frees (" + fmtBytes(d.driver.freed_bytes_total) + ") in the window" }));
      if (d.largest && d.largest.length) {
        add(box, el("div", { "class": "small" }, el("b", { text: "largest allocations" })));
        add(box, el("ul", { "class": "small mono" }, d.largest.map(function (x) {
          return el("li", { text: fmtBytes(x.bytes) + "  at " + fmtMs(x.t_ns) + "  " + (x.op || "?") + (x.location ? "  " + x.location : "") });
        })));
      }
      d.notes.forEach(function (n) { add(box, el("div", { "class": "warning small", text: n })); });
      add(sec, box);
    });
    if (M.host) {
      var h = M.host, box = el("div", { "class": "host" }, el("h3", { text: "host RSS: peak " + fmtBytes(h.peak.bytes) }));
      add(box, lineChart([{ name: h.rss_source === "statm" ? "RSS" : "max RSS so far (getrusage)", t: h.curve.t_ns, y: h.curve.rss, color: "#5d6678" }],
        { xmax: M.window_ns, peak: h.peak, label: "host memory" }));
      add(box, peakLine(h.peak, "peak"));
      add(box, el("p", { "class": "small muted", text: h.samples + " samples; start " + fmtBytes(h.start_bytes) + ", end " + fmtBytes(h.end_bytes) }));
      add(sec, box);
    }
    M.notes.forEach(function (n) { add(sec, el("div", { "class": "warning small", text: n })); });
    add(sec, el("details", null, el("summary", { text: "as text (prof.memory_summary())" }), el("pre", { "class": "text", text: M.text })));
    return sec;
  }

  // ---- processes and ranks --------------------------------------------------------------------
  function processesSection() {
    var P = D.processes, sec = section("processes", "Processes");
    add(sec, el("p", { "class": "muted", text: "Every profiled process (prof.processes()): the main process and its child processes." }));
    add(sec, dataTable(P.table, { id: "processes-table", noFilter: true }));
    if (P.workers_ops) {
      add(sec, el("h3", { text: "Ops of the " + P.workers + " child processes, summed" }));
      add(sec, dataTable(P.workers_ops, { id: "workers-ops-table", placeholder: "filter ops by name" }));
    }
    return sec;
  }
  function ranksSection() {
    var R = D.ranks, sec = section("ranks", "Rank " + R.rank + " of " + R.world_size);
    add(sec, el("div", { "class": "facts" }, Object.keys(R.info).map(function (k) { return fact(k, JSON.stringify(R.info[k])); })));
    add(sec, el("p", { "class": "muted", text: "GPU compute and communication (NCCL kernels) per step on this rank " +
      "(gpuprof.distributed.comm_overlap): exposed communication is what compute does not hide. " +
      "To compare ranks, merge their traces with python -m gpuprof merge (docs/distributed.md)." }));
    add(sec, dataTable(R.table, { id: "ranks-table", noFilter: true }));
    return sec;
  }

  // ---- Perfetto -----------------------------------------------------------------------------
  var PERFETTO = "https://ui.perfetto.dev";
  function openInPerfetto(buffer, fileName, status) {
    var win = window.open(PERFETTO);
    if (!win) { status.textContent = "The browser blocked the new tab: allow pop-ups for this file."; return; }
    status.textContent = "Waiting for Perfetto to load\u2026";
    var tries = 0, timer = setInterval(function () {
      if (++tries > 100) { clearInterval(timer); status.textContent = "Perfetto did not answer; drag the file into " + PERFETTO + " instead."; return; }
      win.postMessage("PING", PERFETTO);
    }, 100);
    function onMessage(ev) {
      if (ev.origin !== PERFETTO || ev.data !== "PONG") return;
      clearInterval(timer);
      window.removeEventListener("message", onMessage);
      win.postMessage({ perfetto: { buffer: buffer, title: fileName, fileName: fileName } }, PERFETTO);
      status.textContent = "Sent " + fileName + " to Perfetto.";
    }
    window.addEventListener("message", onMessage);
  }
  function traceSection() {
    var T = D.trace, sec = section("trace", "Timeline in Perfetto");
    add(sec, el("p", null, "The timeline of every call, kernel and copy is in the Chrome trace, which ",
      el("a", { href: PERFETTO, target: "_blank", rel: "noopener", text: "ui.perfetto.dev" }),
      " opens in your browser (the trace is not uploaded: Perfetto reads it locally)."));
    if (T) add(sec, el("p", null, "This profile's trace: ", el("a", { href: T.href, text: T.name, "class": "trace-link" }),
      T.exists ? " (beside this report)" : " (not found when the report was written)"));
    else add(sec, el("p", { "class": "muted", text: "Write one with prof.export_chrome_trace(\"trace.json.gz\"), or python -m gpuprof run --output DIR." }));
    var input = el("input", { type: "file", accept: ".json,.gz,.json.gz", id: "trace-file", "aria-label": "trace file" });
    var status = el("span", { "class": "muted small perfetto-status" });
    var button = el("button", { type: "button", id: "open-perfetto", text: "Open in Perfetto\u2026" });
    button.addEventListener("click", function () {
      var f = input.files && input.files[0];
      if (!f) { status.textContent = "Choose the trace file first" + (T ? " (" + T.name + ")" : "") + "."; input.click(); return; }
      f.arrayBuffer().then(function (buf) { openInPerfetto(buf, f.name, status); });
    });
    input.addEventListener("change", function () { if (input.files && input.files[0]) button.click(); });
    add(sec, el("div", { "class": "controls" }, el("label", { "for": "trace-file", text: "trace file: " }), input, button, status));
    add(sec, el("p", { "class": "small muted", text: "Only this button uses the network: it opens " + PERFETTO +
      " in a new tab and hands it the file you chose. Or drag the file onto that page yourself." }));
    return sec;
  }

  // ---- comparison page ------------------------------------------------------------------------
  function comparePage() {
    var C = D, app = document.getElementById("app");
    var links = [["compare-summary", "Summary"], ["compare-steps", "Step time"], ["compare-findings", "Findings"],
      ["compare-ops", "Ops"], ["compare-kernels", "Kernels"]];
    add(app, header(links));
    var main = el("main");
    add(app, main);
    var sec = section("compare-summary", "Summary");
    var sp = C.speedup === null ? "-" : C.speedup.toFixed(2) + "x";
    add(sec, el("p", { "class": "big" }, C.labels[0] + " " + fmtTime(C.step_before_ns) + " \u2192 " + C.labels[1] + " " +
      fmtTime(C.step_after_ns) + " per step (" + sp + ")"));
    add(sec, el("p", { "class": "muted small", text: "written " + C.created + " by gpuprof " + C.version + "; figures are per recorded step, so profiles with different step counts compare fairly." }));
    add(main, sec);
    // mean step, stacked, one bar per side
    sec = section("compare-steps", "Where a step's time goes");
    add(sec, el("div", { "class": "legend" }, PARTS.map(function (p) { return el("span", { style: "--c:" + COLORS[p[0]], text: p[1] }); })));
    var W = chartWidth(500), L = 4, R = 8, BH = 26, ROWH = BH + 24;
    var s = svg("svg", { width: W, height: 2 * ROWH + 4, "class": "compare-bars" });
    var maxv = Math.max(C.breakdown[0].step_ns || 0, C.breakdown[1].step_ns || 0) || 1;
    C.breakdown.forEach(function (b, k) {
      var y = k * ROWH + 18, x = L;
      add(s, svg("text", { x: L, y: y - 5, "font-size": 12, text: C.labels[k] + ": " + fmtTime(b.step_ns || 0) + " per step" }));
      PARTS.forEach(function (p) {
        var w = (W - L - R) * (b[p[0]] || 0) / maxv;
        if (w > 0) add(s, svg("rect", { x: x, y: y, width: w, height: BH, fill: COLORS[p[0]] }, svg("title", { text: p[1] + ": " + fmtTime(b[p[0]]) })));
        x += w;
      });
    });
    add(sec, el("div", { "class": "chart" }, s));
    add(main, sec);
    // findings
    sec = section("compare-findings", "Findings");
    var F = C.findings;
    add(sec, el("p", null, el("b", { text: "gone: " }), F.gone.length ? F.gone.map(function (k) { return el("span", { "class": "pill gone", text: k }); }) : "none"));
    add(sec, el("p", null, el("b", { text: "new: " }), F["new"].length ? F["new"].map(function (k) { return el("span", { "class": "pill new", text: k }); }) : "none"));
    add(sec, el("p", null, el("b", { text: "still present: " }), F.kept.length ? F.kept.map(function (k) { return el("span", { "class": "pill", text: k }); }) : "none"));
    var cols = el("div", { "class": "cols" });
    C.diagnoses.forEach(function (d, k) {
      var box = el("div", null, el("h3", { text: C.labels[k] }));
      if (!d.findings || !d.findings.length) add(box, el("p", { "class": "muted", text: "no findings" }));
      (d.findings || []).forEach(function (f) {
        var lvl = level(f);
        add(box, el("div", { "class": "finding " + lvl, "data-kind": f.kind }, el("h3", null, el("span", { "class": "badge " + lvl, text: pct(f.severity) }), f.title),
          f.location ? el("div", { "class": "where" }, "at ", el("code", { text: f.location })) : null));
      });
      add(cols, box);
    });
    add(sec, cols);
    add(main, sec);
    [["compare-ops", "Ops: self CPU time per step", C.ops], ["compare-kernels", "GPU activity: time per step", C.kernels]].forEach(function (x) {
      var sc = section(x[0], x[1]);
      if (!x[2].rows.length) add(sc, el("p", { "class": "muted", text: "nothing recorded" }));
      else add(sc, dataTable(x[2], { id: x[0] + "-table" }));
      add(main, sc);
    });
    sec = section("compare-text", "As text");
    add(sec, el("pre", { "class": "text", text: C.text }));
    add(main, sec);
  }

  // ---- the report page ----------------------------------------------------------------------
  function reportPage() {
    var app = document.getElementById("app");
    var links = [["diagnosis", "Diagnosis"], ["steps", "Steps"], ["ops", "Ops"], ["kernels", "Kernels"],
      ["flame", "Flame graph"], ["memory", "Memory"]];
    if (D.modules) links.splice(4, 0, ["modules", "Modules"]);
    if (D.processes) links.push(["processes", "Processes"]);
    if (D.ranks) links.push(["ranks", "Rank"]);
    links.push(["trace", "Perfetto"]);
    add(app, header(links));
    var main = el("main");
    add(app, main);
    var builders = [summarySection, diagnosisSection, stepsSection, opsSection, kernelsSection, flameSection, memorySection];
    if (D.modules) builders.splice(4, 0, modulesSection);
    if (D.processes) builders.push(processesSection);
    if (D.ranks) builders.push(ranksSection);
    builders.push(traceSection);
    builders.forEach(function (b) {
      var sec;
      try { sec = b(); } catch (e) {
        sec = el("section", null, el("div", { "class": "warning", text: "This section could not be drawn: " + e }));
        if (window.console) console.error(e);
      }
      main.appendChild(sec);
    });
  }

  document.body.appendChild(tip);
  if (D.page === "compare") comparePage(); else reportPage();
  document.documentElement.setAttribute("data-ready", "1");
})();
