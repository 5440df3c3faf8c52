// torchcal audit report: the interactive reliability diagram of the embedded sample.
// No libraries, no network. Numbers are float64 (plain JS numbers) and follow the Python side
// (AuditReport.ece_at): bin = min(floor(c * B), B - 1), L1 ECE = sum_b |sum c - sum y| / n.
"use strict";
(function () {
  const raw = JSON.parse(document.getElementById("audit-data").textContent);
  const sample = raw.sample;
  if (!sample) return;
  // non-finite values travel as the strings "Infinity", "-Infinity", "NaN"
  const preds = Float64Array.from(sample.preds, Number);
  const target = Int32Array.from(sample.target);
  const group = Int32Array.from(sample.group);
  const C = sample.classes; // 1: binary (P(y = 1) per row), else classes per row
  const probs = sample.input === "probs";
  const N = target.length;
  const threshold = raw.threshold;

  const $ = (id) => document.getElementById(id);
  const groupSel = $("group"), binsIn = $("bins"), tempIn = $("temperature");
  const svg = $("diagram"), NS = svg.namespaceURI;

  // --- confidences and outcomes of every sample row at temperature T -------------------
  function binaryReading(T) {
    const c = new Float64Array(N), y = new Float64Array(N);
    for (let i = 0; i < N; i++) {
      const p = preds[i];
      y[i] = target[i];
      if (T === 1) { c[i] = probs ? p : 1 / (1 + Math.exp(-p)); continue; }
      const z = probs ? Math.log(p) - Math.log1p(-p) : p;
      c[i] = 1 / (1 + Math.exp(-(z / T)));
    }
    return { c, y };
  }

  function confidenceReading(T) {
    // softmax(z / T) without overflow: shift by the raw maximum first ((z - max) / T <= 0),
    // so logits near 1e308 at T < 1 stay finite (Python's ece_at does the same)
    const c = new Float64Array(N), y = new Float64Array(N), z = new Float64Array(C);
    for (let i = 0; i < N; i++) {
      const row = i * C;
      let top = -Infinity, arg = 0;
      for (let j = 0; j < C; j++) {
        const x = preds[row + j];
        z[j] = T === 1 ? x : (probs ? Math.log(x) : x);
        if (z[j] > top) { top = z[j]; arg = j; } // first maximum wins
      }
      if (T === 1 && probs) {
        c[i] = top;
      } else {
        let s = 0;
        for (let j = 0; j < C; j++) s += Math.exp((z[j] - top) / T);
        c[i] = 1 / s;
      }
      y[i] = arg === target[i] ? 1 : 0;
    }
    return { c, y };
  }

  let cache = { T: NaN, rows: null };
  function reading(T) {
    if (cache.T !== T) cache = { T, rows: C === 1 ? binaryReading(T) : confidenceReading(T) };
    return cache.rows;
  }

  // --- binning: the Python bin rule, float64 sums in row order ---------------------------
  function binStats(rows, g, B) {
    const n = new Float64Array(B), sc = new Float64Array(B), sy = new Float64Array(B);
    let total = 0, dropped = 0;
    for (let i = 0; i < N; i++) {
      if (g >= 0 && group[i] !== g) continue;
      if (!Number.isFinite(rows.c[i])) { dropped += 1; continue; } // in no bin: not in n
      const b = Math.min(Math.floor(rows.c[i] * B), B - 1);
      n[b] += 1; sc[b] += rows.c[i]; sy[b] += rows.y[i]; total += 1;
    }
    let gap = 0;
    for (let b = 0; b < B; b++) gap += Math.abs(sc[b] - sy[b]);
    return { n, sc, sy, total, dropped, ece: total > 0 ? gap / total : NaN };
  }

  // --- drawing -------------------------------------------------------------------------
  const W = 420, H = 420, M = { l: 48, r: 12, t: 12, b: 40 }, HIST = 60;
  const PW = W - M.l - M.r, PH = H - M.t - M.b - HIST - 16;
  const X = (v) => M.l + v * PW, Y = (v) => M.t + (1 - v) * PH;

  function el(name, attrs, parent, text) {
    const e = document.createElementNS(NS, name);
    for (const k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    parent.appendChild(e);
    return e;
  }

  function axes() {
    el("rect", { x: X(0), y: Y(1), width: PW, height: PH, class: "frame" }, svg);
    for (let k = 0; k <= 5; k++) {
      const v = k / 5, lab = v.toFixed(1);
      el("text", { x: X(v), y: Y(0) + 14, class: "tick", "text-anchor": "middle" }, svg, lab);
      el("text", { x: X(0) - 6, y: Y(v) + 4, class: "tick", "text-anchor": "end" }, svg, lab);
    }
    el("text", { x: X(0.5), y: H - 4, class: "label", "text-anchor": "middle" }, svg,
      "confidence");
    el("text", { x: 12, y: Y(0.5), class: "label", "text-anchor": "middle",
      transform: `rotate(-90 12 ${Y(0.5)})` }, svg, C === 1 ? "positive rate" : "accuracy");
  }

  function draw(st, B) {
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    axes();
    const maxN = Math.max(1, ...st.n), base = Y(0) + 18 + HIST;
    for (let b = 0; b < B; b++) {
      const x0 = X(b / B), w = PW / B;
      if (st.n[b] > 0) {
        const acc = st.sy[b] / st.n[b], conf = st.sc[b] / st.n[b];
        const bar = el("rect", { x: x0, y: Y(acc), width: w, height: Y(0) - Y(acc),
          class: "bar" }, svg);
        el("title", {}, bar, `bin ${b}: n=${st.n[b]}, confidence ${conf.toFixed(3)}, ` +
          `${C === 1 ? "positive rate" : "accuracy"} ${acc.toFixed(3)}`);
        el("rect", { x: x0, y: Y(Math.max(acc, conf)), width: w,
          height: Math.abs(Y(acc) - Y(conf)), class: conf > acc ? "gap over" : "gap under" }, svg);
      }
      const h = (st.n[b] / maxN) * HIST;
      el("rect", { x: x0, y: base - h, width: w, height: h, class: "count" }, svg);
    }
    el("line", { x1: X(0), y1: Y(0), x2: X(1), y2: Y(1), class: "diagonal" }, svg);
    if (typeof threshold === "number") {
      el("line", { x1: X(threshold), y1: Y(0), x2: X(threshold), y2: Y(1),
        class: "threshold" }, svg);
    }
    el("text", { x: X(0), y: base + 12, class: "tick" }, svg, `counts (max ${maxN})`);
  }

  function fill(st, B) {
    const body = $("table").tBodies[0];
    body.textContent = "";
    for (let b = 0; b < B; b++) {
      const n = st.n[b], tr = body.insertRow();
      tr.dataset.n = String(n);
      const cells = [String(b), `[${(b / B).toFixed(3)}, ${((b + 1) / B).toFixed(3)}` +
        (b === B - 1 ? "]" : ")"), String(n),
      n > 0 ? (st.sc[b] / n).toFixed(4) : "-", n > 0 ? (st.sy[b] / n).toFixed(4) : "-"];
      for (const text of cells) tr.insertCell().textContent = text;
    }
  }

  function temperature() {
    return Math.pow(10, Number(tempIn.value)); // log scale: 10^-1 .. 10^1, exactly 1 at 0
  }

  function update() {
    const T = temperature(), B = Number(binsIn.value), g = Number(groupSel.value);
    const st = binStats(reading(T), g, B);
    const tv = $("temperature-value"), bv = $("bins-value"), ece = $("ece");
    tv.dataset.value = String(T);
    tv.textContent = T.toPrecision(3);
    bv.textContent = String(B);
    ece.dataset.value = String(st.ece);
    ece.textContent = Number.isNaN(st.ece) ? "n/a (no rows)" : st.ece.toFixed(4);
    $("n").textContent = String(st.total) +
      (st.dropped ? ` (${st.dropped} rows without a finite confidence left out)` : "");
    $("n").dataset.dropped = String(st.dropped);
    draw(st, B);
    fill(st, B);
  }

  for (const input of [groupSel, binsIn, tempIn]) input.addEventListener("input", update);
  groupSel.addEventListener("change", update);
  $("reset").addEventListener("click", () => {
    tempIn.value = "0";
    binsIn.value = String(raw.n_bins);
    update();
  });
  update();
  document.body.dataset.ready = "1";
})();
