// gorgo's live view: reads the admin API's /admin/ui/stream (a JSON
// snapshot a second) and draws the fleet, the last 15 minutes, the last
// decisions; controls go through the admin API. The token stays in memory.
"use strict";
(function () {
  let token = "";
  const hist = { t: [], ttft50: [], ttft95: [], e2e95: [], rps: [], errors: [], share: {}, rep: {}, w: { rtt: [], queue: [], decode: [], itl: [] } };
  const MAX = 900;
  const $ = (s) => document.querySelector(s);
  const esc = (s) => String(s).replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" }[c]));
  const f0 = (v) => (v == null ? "–" : Math.round(v).toLocaleString("en"));
  const f1 = (v) => (v == null ? "–" : v.toFixed(1));
  const f2 = (v) => (v == null ? "–" : Number(v.toPrecision(2)).toString());
  const pct = (v) => (v == null ? "–" : (100 * v).toFixed(0) + "%");
  const auth = () => (token ? { Authorization: "Bearer " + token } : {});

  // Charts.
  const width = () => Math.max(300, $("#charts").clientWidth - 40);
  const mk = (el, title, series) => new uPlot({ title, width: width(), height: 160, series: [{}].concat(series), scales: { x: { time: true } } },
    [[]].concat(series.map(() => [])), $(el));
  const charts = {
    latency: mk("#chart-latency", "TTFT p50 / p95, E2E p95 (ms)", [{ label: "TTFT p50", stroke: "#2a7" }, { label: "TTFT p95", stroke: "#e80" }, { label: "E2E p95", stroke: "#36c" }]),
    rate: mk("#chart-rate", "requests / s, errors / s", [{ label: "requests", stroke: "#36c" }, { label: "errors", stroke: "#c22" }]),
    weights: mk("#chart-weights", "policy weights (the tuner's incumbent)", [{ label: "rtt", stroke: "#36c" }, { label: "queue", stroke: "#2a7" }, { label: "decode", stroke: "#e80" }, { label: "itl", stroke: "#a3c" }]),
  };
  let shareChart = null, shareIDs = [], repChart = null, repIDs = [];
  window.gorgoCharts = charts;

  function push(p) {
    const t = hist.t;
    t.push(p.t);
    hist.ttft50.push(p.ttft_p50_ms); hist.ttft95.push(p.ttft_p95_ms); hist.e2e95.push(p.e2e_p95_ms);
    hist.rps.push(p.rps); hist.errors.push(p.errors);
    const w = p.weights || {};
    for (const k of ["rtt", "queue", "decode", "itl"]) hist.w[k].push(w[k] == null ? null : w[k]);
    for (const id in p.share) if (!hist.share[id]) hist.share[id] = new Array(t.length - 1).fill(null);
    for (const id in hist.share) hist.share[id].push(p.share[id] == null ? 0 : p.share[id]);
    const rt = p.ttft_p95_ms_by_replica || {};
    for (const id in rt) if (!hist.rep[id]) hist.rep[id] = new Array(t.length - 1).fill(null);
    for (const id in hist.rep) hist.rep[id].push(rt[id] == null ? null : rt[id]);
    if (t.length > MAX) {
      t.shift(); hist.ttft50.shift(); hist.ttft95.shift(); hist.e2e95.shift(); hist.rps.shift(); hist.errors.shift();
      for (const k in hist.w) hist.w[k].shift();
      for (const id in hist.share) hist.share[id].shift();
      for (const id in hist.rep) hist.rep[id].shift();
    }
    // Forget replicas that have had nothing for the whole window (a fleet
    // that churns must not grow the page's memory).
    if (t.length % 60 === 0) {
      for (const id in hist.share) if (!hist.share[id].some((v) => v)) { delete hist.share[id]; delete hist.rep[id]; }
    }
  }

  function drawCharts() {
    charts.latency.setData([hist.t, hist.ttft50, hist.ttft95, hist.e2e95]);
    charts.rate.setData([hist.t, hist.rps, hist.errors]);
    charts.weights.setData([hist.t, hist.w.rtt, hist.w.queue, hist.w.decode, hist.w.itl]);
    // Share: the 8 replicas of most traffic.
    const ids = Object.keys(hist.share).sort((a, b) => sum(hist.share[b]) - sum(hist.share[a])).slice(0, 8);
    if (ids.join() !== shareIDs.join()) {
      shareIDs = ids;
      if (shareChart) shareChart.destroy();
      const palette = ["#36c", "#2a7", "#e80", "#a3c", "#c22", "#0aa", "#886", "#555"];
      shareChart = new uPlot({ title: "share of requests (top 8 replicas)", width: width(), height: 160, scales: { x: { time: true } },
        series: [{}].concat(ids.map((id, i) => ({ label: id, stroke: palette[i] }))) }, [hist.t].concat(ids.map((id) => hist.share[id])), $("#chart-share"));
      charts.share = shareChart;
    } else if (shareChart) {
      shareChart.setData([hist.t].concat(ids.map((id) => hist.share[id])));
    }
    // TTFT p95 per replica, the same 8.
    if (ids.join() !== repIDs.join()) {
      repIDs = ids;
      if (repChart) repChart.destroy();
      const palette = ["#36c", "#2a7", "#e80", "#a3c", "#c22", "#0aa", "#886", "#555"];
      repChart = new uPlot({ title: "TTFT p95 by replica (ms)", width: width(), height: 160, scales: { x: { time: true } },
        series: [{}].concat(ids.map((id, i) => ({ label: id, stroke: palette[i], spanGaps: true }))) }, [hist.t].concat(ids.map((id) => hist.rep[id] || hist.t.map(() => null))), $("#chart-replica"));
      charts.replica = repChart;
    } else if (repChart) {
      repChart.setData([hist.t].concat(ids.map((id) => hist.rep[id] || hist.t.map(() => null))));
    }
  }
  const sum = (a) => a.reduce((x, y) => x + (y || 0), 0);

  function drawMap(summed) { // the regions, summed by the router
    const regions = {};
    for (const [name, g] of Object.entries(summed || {})) regions[name || "?"] = { share: g.share_1m, rtt: g.rtt_ms, n: g.replicas, down: g.down };
    const names = Object.keys(regions).sort(), cx = 210, cy = 150, R = 110;
    let svg = `<circle cx="${cx}" cy="${cy}" r="14" fill="#1d2733"/><text x="${cx}" y="${cy + 28}" text-anchor="middle">router</text>`;
    names.forEach((name, i) => {
      const g = regions[name], a = (2 * Math.PI * i) / names.length - Math.PI / 2;
      const x = cx + R * Math.cos(a), y = cy + R * Math.sin(a), rtt = g.rtt;
      const colour = rtt < 100 ? "#2a7" : rtt < 300 ? "#e80" : "#c22";
      svg += `<line x1="${cx}" y1="${cy}" x2="${x}" y2="${y}" stroke="${colour}" stroke-width="${1 + 14 * g.share}"/>`;
      svg += `<circle cx="${x}" cy="${y}" r="10" fill="${g.down ? "#bbb" : colour}"/>`;
      svg += `<text x="${x}" y="${y - 14}" text-anchor="middle">${esc(name)} · ${g.n} · ${Math.round(rtt)} ms · ${pct(g.share)}</text>`;
    });
    $("#map").innerHTML = svg;
  }

  function drawFleet(reps, count) {
    // Of a large fleet the router sends its busiest replicas (the map has every region).
    count = count || reps.length;
    $("#fleet-note").textContent = count > reps.length ? `(the ${reps.length} busiest of ${count})` : `(${count})`;
    $("#replicas tbody").innerHTML = reps.map((r) => `<tr data-id="${esc(r.id)}" class="${esc(r.state)}">
      <td>${esc(r.id)}</td><td class="region">${esc(r.region)}</td><td class="models">${esc(r.models || "any")}${(r.resident_adapters || []).length ? `<br><small>resident: ${esc(r.resident_adapters.join(", "))}</small>` : ""}</td><td class="state">${esc(r.state)}</td><td class="rtt">${f1(r.rtt_ms)}</td>
      <td>${r.in_flight}</td><td>${f0(r.tokens)}</td><td>${f0(r.backlog)}</td><td>${r.decoding}</td><td>${r.running}</td><td>${r.waiting}</td>
      <td>${r.kv_capacity_tokens ? pct(r.kv_used_tokens / r.kv_capacity_tokens) : "–"}</td><td>${pct(r.cache_hit_rate)}</td><td>${pct(r.share_1m)}</td>
      <td>${r.state === "draining" ? `<button class="undrain" data-id="${esc(r.id)}">undrain</button>` : `<button class="drain" data-id="${esc(r.id)}">drain</button>`}</td></tr>`).join("");
  }

  function drawDecisions(decs) {
    $("#decisions tbody").innerHTML = decs.slice().reverse().map((d) => `<tr class="decision">
      <td>${new Date(d.at).toLocaleTimeString()}</td><td>${esc(d.model || "")}</td><td>${f0(d.prompt_tokens)}</td><td>${f0(d.expected_output_tokens)}</td><td>${esc(d.chosen)}</td>
      <td class="terms">${d.candidates.map((c) => `${esc(c.id)} <small>(cached ${f0(c.cached_tokens)})</small> ${f0(c.terms.RTT)} + ${f0(c.terms.Prefill)} + ${f0(c.terms.Queue)} + ${f0(c.terms.Decode)}${c.terms.Adapter ? ` + ${f0(c.terms.Adapter)}` : ""} = <b>${f0(c.terms.Total)}</b>`).join("<br>")}</td>
      <td class="ttft">${f0(d.ttft_ms)}</td></tr>`).join("");
  }

  function drawTuner(tuner) {
    const el = $("#tuner-steps");
    if (!tuner) { el.textContent = "the policy does not tune itself (gorgo-online does)"; return; }
    const steps = tuner.steps || [];
    const acc = steps.filter((s) => s.accepted).length;
    const r = tuner.round;
    const trying = tuner.paused || !r ? "" : `trying ${Object.entries(r.candidate).map(([k, v]) => `${esc(k)}=${f2(v)}`).join(" ")}` +
      `${r.confirming ? " again" : ""} (scored ${r.scored.candidate}/${r.window}, incumbent ${r.scored.incumbent}/${r.window}) · `;
    const judged = steps.length ? `last ${steps.length} candidates: ${acc} accepted, ${steps.length - acc} rejected · ` : "no candidate judged yet";
    el.innerHTML = `tuner ${tuner.paused ? "paused" : "running"} · ${trying}${judged}` +
      steps.slice(-12).map((s) => s.accepted ? `<b title="score ${f1(s.score)} vs ${f1(s.incumbent_score)}">✓</b>` : `<span title="${esc(s.reason)}">✗</span>`).join(" ");
  }

  function apply(snap) {
    $("#policy").textContent = snap.policy;
    for (const p of snap.points || []) push(p);
    drawCharts();
    drawMap(snap.regions);
    drawFleet(snap.replicas || [], snap.replica_count);
    drawDecisions(snap.decisions || []);
    drawTuner(snap.tuner);
    window.gorgoLast = snap;
  }

  async function stream() {
    const st = $("#status");
    st.textContent = "connecting"; st.className = "";
    try {
      const resp = await fetch("/admin/ui/stream", { headers: auth() });
      if (!resp.ok) { st.textContent = "refused: " + resp.status; st.className = "err"; return; }
      st.textContent = "live"; st.className = "ok";
      const reader = resp.body.getReader(), dec = new TextDecoder();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += dec.decode(value, { stream: true });
        let i;
        while ((i = buf.indexOf("\n\n")) >= 0) {
          const ev = buf.slice(0, i); buf = buf.slice(i + 2);
          if (ev.startsWith("data: ")) apply(JSON.parse(ev.slice(6)));
        }
      }
      st.textContent = "disconnected"; st.className = "err";
    } catch (e) { st.textContent = "error: " + e; st.className = "err"; }
    setTimeout(stream, 2000);
  }

  async function admin(method, path, body) {
    const resp = await fetch(path, { method, headers: Object.assign({ "Content-Type": "application/json" }, auth()), body: body ? JSON.stringify(body) : undefined });
    const text = await resp.text();
    $("#control-result").textContent = resp.ok ? `${method} ${path}: done` : `${method} ${path}: ${resp.status} ${text}`;
    return resp.ok;
  }

  $("#login").addEventListener("submit", (e) => { e.preventDefault(); token = $("#token").value; $("#token").value = ""; stream(); });
  $("#replicas").addEventListener("click", (e) => {
    const b = e.target.closest("button");
    if (b) admin("POST", `/admin/replicas/${encodeURIComponent(b.dataset.id)}/${b.className}`);
  });
  $("#tuner-pause").addEventListener("click", () => admin("POST", "/admin/tuner/pause"));
  $("#tuner-resume").addEventListener("click", () => admin("POST", "/admin/tuner/resume"));
  $("#weights").addEventListener("submit", (e) => {
    e.preventDefault();
    const w = {};
    for (const el of e.target.elements) if (el.name && el.value !== "") w[el.name] = Number(el.value);
    admin("PUT", "/admin/weights", w);
  });
})();
