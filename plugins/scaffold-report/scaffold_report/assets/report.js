// The trajectory browser of a scaffold report: filters, a list of trajectories, and a token-level view.
// Plain JavaScript over the JSON block #report-data; every text from the run is set as text, never as HTML.
(function () {
  "use strict";
  var DATA = JSON.parse(document.getElementById("report-data").textContent);
  var list = document.getElementById("list");
  if (!list) { return; }
  var detail = document.getElementById("detail");
  var tip = document.getElementById("tip");
  var VOCAB = DATA.vocab || {};
  var PAGE = 400;
  var rows = [], shown = [], limit = PAGE, active = -1, shade = true;

  function el(tag, cls, text) {
    var node = document.createElement(tag);
    if (cls) { node.className = cls; }
    if (text !== undefined && text !== null) { node.textContent = String(text); }
    return node;
  }
  function fmt(x, digits) {
    if (x === null || x === undefined) { return "–"; }
    if (typeof x === "number") { return Number.isInteger(x) ? String(x) : x.toFixed(digits === undefined ? 3 : digits); }
    return typeof x === "string" ? x : JSON.stringify(x);
  }
  function rewardKey(r) { return r === null || r === undefined ? "none" : String(r); }

  // A training run's episode id starts with s<step>/ (the optimizer step whose rollouts it is).
  function stepOf(id) {
    var m = /^s(\d+)\//.exec(String(id || ""));
    return m ? m[1] : "";
  }

  // -- rows: one per sample of a completed episode, one per failed episode ----------------------------------
  (DATA.episodes || []).forEach(function (ep, e) {
    if (ep.st !== "ok") {
      rows.push({e: e, s: -1, reward: "none", status: "failed", finish: "failed", branch: "–",
                 step: stepOf(ep.id), used: "failed", text: [ep.id, ep.err || ""].join(" ").toLowerCase()});
      return;
    }
    (ep.s || []).forEach(function (s, j) {
      var branch = s.b !== null && s.b !== undefined ? "branch " + s.b : "sample " + s.si;
      rows.push({e: e, s: j, reward: rewardKey(s.r), status: "ok", finish: s.f || "?", branch: branch,
                 step: s.st === undefined || s.st === null ? stepOf(ep.id) : String(s.st),
                 used: s.u === undefined || s.u === null ? "" : s.u ? "used" : "left out",
                 text: [ep.id, s.x || "", s.k || "", JSON.stringify(ep.ref === undefined ? "" : ep.ref)].join(" ").toLowerCase()});
    });
  });

  // -- filters ----------------------------------------------------------------------------------------------
  var F = {reward: byId("f-reward"), status: byId("f-status"), finish: byId("f-finish"), branch: byId("f-branch"),
           search: byId("f-search"), step: byId("f-step"), used: byId("f-used")};
  function byId(id) { return document.getElementById(id); }
  function options(select, values, label) {
    select.appendChild(new Option("any", ""));
    values.forEach(function (v) { select.appendChild(new Option(label ? label(v) : v, v)); });
  }
  function distinct(key) {
    var seen = {};
    rows.forEach(function (r) { seen[r[key]] = true; });
    return Object.keys(seen);
  }
  var rewards = distinct("reward").filter(function (r) { return r !== "none"; })
    .sort(function (a, b) { return Number(a) - Number(b); });
  var rewardValues = rewards.length <= 12 ? rewards.slice() : rewards.filter(function (r) { return r === "0"; });
  if (rewards.some(function (r) { return Number(r) > 0; })) { rewardValues.push(">0"); }
  if (rows.some(function (r) { return r.reward === "none"; })) { rewardValues.push("none"); }
  options(F.reward, rewardValues, function (v) {
    return v === ">0" ? "> 0 (rewarded)" : v === "none" ? "no reward" : v === "0" ? "0 (wrong)" : "= " + v;
  });
  options(F.status, distinct("status").sort());
  options(F.finish, distinct("finish").sort());
  options(F.branch, distinct("branch").sort(function (a, b) {
    return (parseInt(a.split(" ")[1], 10) || 0) - (parseInt(b.split(" ")[1], 10) || 0);
  }));
  if (F.step) {
    options(F.step, distinct("step").filter(function (v) { return v !== ""; })
      .sort(function (a, b) { return Number(a) - Number(b); }), function (v) { return "step " + v; });
    F.step.addEventListener("change", apply);
  }
  if (F.used) {
    options(F.used, distinct("used").filter(function (v) { return v !== ""; }).sort());
    F.used.addEventListener("change", apply);
  }
  [F.reward, F.status, F.finish, F.branch].forEach(function (s) { s.addEventListener("change", apply); });
  F.search.addEventListener("input", apply);

  function keep(r) {
    var want = F.reward.value;
    if (want === ">0" ? !(r.reward !== "none" && Number(r.reward) > 0) : want && r.reward !== want) { return false; }
    if (F.status.value && r.status !== F.status.value) { return false; }
    if (F.finish.value && r.finish !== F.finish.value) { return false; }
    if (F.branch.value && r.branch !== F.branch.value) { return false; }
    if (F.step && F.step.value && r.step !== F.step.value) { return false; }
    if (F.used && F.used.value && r.used !== F.used.value) { return false; }
    var q = F.search.value.trim().toLowerCase();
    return !q || r.text.indexOf(q) >= 0;
  }
  function apply() {
    shown = rows.filter(keep);
    limit = PAGE;
    drawList();
    if (shown.length) { select(0); } else { detail.replaceChildren(el("p", "note", "No trajectory matches these filters.")); }
  }

  // -- the list ---------------------------------------------------------------------------------------------
  function chip(r) {
    if (r.status !== "ok") { return el("span", "chip fail", "failed"); }
    if (r.reward === "none") { return el("span", "chip none", "–"); }
    return el("span", "chip " + (Number(r.reward) > 0 ? "pos" : "zero"), fmt(Number(r.reward), 2));
  }
  function drawList() {
    var frag = document.createDocumentFragment();
    shown.slice(0, limit).forEach(function (r, i) {
      var ep = DATA.episodes[r.e], s = r.s >= 0 ? ep.s[r.s] : null;
      var row = el("div", "row");
      row.setAttribute("role", "option");
      row.dataset.i = i;
      row.dataset.reward = r.reward;
      row.dataset.status = r.status;
      row.dataset.finish = r.finish;
      row.dataset.branch = r.branch;
      row.dataset.step = r.step;
      row.dataset.used = r.used;
      row.appendChild(el("span", "rid", "#" + ep.i + " · " + ep.id + (s ? " · s" + s.si : "")));
      row.appendChild(chip(r));
      var train = s && s.st !== undefined ? ["step " + s.st, s.u ? "used" : "left out", "adv " + fmt(s.adv, 2)] : [];
      var meta = s ? train.concat([r.branch, r.finish, fmt(s.g) + " tok", "answer " + fmt(s.x)]).join(" · ")
                   : (ep.ec || "failed") + ": " + String(ep.err || "").split("\n")[0];
      row.appendChild(el("span", "rmeta", meta));
      row.addEventListener("click", function () { select(i); });
      frag.appendChild(row);
    });
    if (shown.length > limit) {
      var more = el("div", "more"), button = el("button", null, "show " + Math.min(PAGE, shown.length - limit) + " more");
      button.addEventListener("click", function () { limit += PAGE; drawList(); });
      more.appendChild(button);
      frag.appendChild(more);
    }
    list.replaceChildren(frag);
    byId("f-count").textContent = shown.length.toLocaleString() + " of " + rows.length.toLocaleString() + " trajectories";
  }
  function select(i) {
    if (i < 0 || i >= shown.length) { return; }
    if (i >= limit) { limit = i + PAGE; drawList(); }
    var old = list.querySelector(".row.active");
    if (old) { old.classList.remove("active"); }
    var row = list.querySelector('.row[data-i="' + i + '"]');
    if (row) { row.classList.add("active"); keepInList(row); }
    active = i;
    showDetail(shown[i]);
  }
  // Scroll the list pane only, never the window (scrollIntoView would move the page away from its summary).
  function keepInList(row) {
    var top = row.offsetTop, bottom = top + row.offsetHeight;
    if (top < list.scrollTop) { list.scrollTop = top; }
    else if (bottom > list.scrollTop + list.clientHeight) { list.scrollTop = bottom - list.clientHeight; }
  }
  list.addEventListener("keydown", function (ev) {
    if (ev.key === "j" || ev.key === "ArrowDown") { select(active + 1); ev.preventDefault(); }
    if (ev.key === "k" || ev.key === "ArrowUp") { select(active - 1); ev.preventDefault(); }
  });

  // -- the detail of one trajectory -------------------------------------------------------------------------
  function kv(pairs) {
    var dl = el("dl", "kv");
    pairs.forEach(function (p) {
      if (p[1] === undefined) { return; }
      dl.appendChild(el("dt", null, p[0]));
      dl.appendChild(el("dd", null, fmt(p[1])));
    });
    return dl;
  }
  function showDetail(r) {
    var ep = DATA.episodes[r.e], out = document.createDocumentFragment();
    out.appendChild(el("h3", null, "episode " + ep.id + "  (#" + ep.i + ")"));
    out.appendChild(kv([["status", ep.st], ["reference", ep.ref], ["final answer", ep.fa], ["answer reward", ep.ar],
                        ["attempts", ep.att], ["wall time (s)", ep.w]]));
    var prompt = el("details", "prompt");
    prompt.appendChild(el("summary", null, "prompt (" + ep.p.length.toLocaleString() + " characters)"));
    prompt.appendChild(el("pre", null, ep.p));
    out.appendChild(prompt);
    if (ep.sp) { out.appendChild(spanView(ep.sp)); }
    if (ep.st !== "ok") {
      out.appendChild(el("h3", null, "error (" + (ep.ec || "episode") + ")"));
      out.appendChild(el("div", "error-box", ep.err || "no reason given"));
      detail.replaceChildren(out);
      return;
    }
    var nav = el("div", "samples-nav"), body = el("div");
    ep.s.forEach(function (s, j) {
      var b = el("button", s.r === null ? "" : s.r > 0 ? "pos" : "zero", "s" + s.si + " · " + fmt(s.r, 2));
      if (j === r.s) { b.classList.add("active"); }
      b.addEventListener("click", function () {
        nav.querySelectorAll("button").forEach(function (x) { x.classList.remove("active"); });
        b.classList.add("active");
        body.replaceChildren(sampleView(s));
      });
      nav.appendChild(b);
    });
    out.appendChild(nav);
    body.appendChild(sampleView(ep.s[r.s]));
    out.appendChild(body);
    detail.replaceChildren(out);
    detail.scrollTop = 0;
  }
  // Where the episode's time went: one lane per phase with each span placed on the episode's own time axis,
  // each phase's share, and the spans listed with their start and duration.
  var COLORS = DATA.phases || {};
  function seconds(x) { return x >= 1 ? x.toFixed(2) + " s" : (x * 1000).toFixed(x >= 0.01 ? 0 : 1) + " ms"; }
  function spanView(sp) {
    var box = el("div", "episode-spans"), d = sp.d > 0 ? sp.d : 1e-9;
    var parts = Object.keys(sp.parts || {}).sort(function (a, b) { return sp.parts[b] - sp.parts[a]; });
    box.appendChild(el("h4", null, "time: " + seconds(sp.d) + " (" + sp.s.length + (sp.more ? "+" + sp.more : "")
                       + " spans)"));
    var shares = el("div", "span-shares");
    parts.forEach(function (p) {
      var item = el("span", "share");
      var sw = el("span", "swatch");
      sw.style.background = COLORS[p] || "#888";
      item.appendChild(sw);
      item.appendChild(el("span", null, p + " " + (100 * sp.parts[p] / d).toFixed(1) + "% · " + seconds(sp.parts[p])));
      shares.appendChild(item);
    });
    box.appendChild(shares);
    var lanes = [], byPhase = {};
    sp.s.forEach(function (x) {
      if (!byPhase[x[0]]) { byPhase[x[0]] = []; lanes.push(x[0]); }
      byPhase[x[0]].push(x);
    });
    var chart = el("div", "span-chart");
    lanes.forEach(function (phase) {
      var lane = el("div", "span-lane");
      lane.dataset.phase = phase;
      lane.appendChild(el("span", "span-label", phase));
      var track = el("div", "span-track");
      byPhase[phase].forEach(function (x) {
        var bar = el("div", "span-bar");
        bar.style.left = (100 * x[1] / d).toFixed(3) + "%";
        bar.style.width = Math.max(0.3, 100 * (x[2] - x[1]) / d).toFixed(3) + "%";
        bar.style.background = COLORS[phase] || "#888";
        bar.title = phase + (x[3] ? " " + x[3] : "") + ": " + seconds(x[2] - x[1]) + " (from " + seconds(x[1]) + ")";
        track.appendChild(bar);
      });
      lane.appendChild(track);
      chart.appendChild(lane);
    });
    box.appendChild(chart);
    var listing = el("details", "span-list");
    listing.open = sp.s.length <= 12;
    listing.appendChild(el("summary", null, "spans, in order of their start"));
    var table = el("table", "span-table"), head = el("tr");
    ["phase", "name", "start", "duration"].forEach(function (h) { head.appendChild(el("th", null, h)); });
    table.appendChild(head);
    sp.s.forEach(function (x) {
      var tr = el("tr");
      tr.dataset.phase = x[0];
      [x[0], x[3] || "", "+" + seconds(x[1]), seconds(x[2] - x[1])].forEach(function (c) { tr.appendChild(el("td", null, c)); });
      table.appendChild(tr);
    });
    listing.appendChild(table);
    if (sp.more) { listing.appendChild(el("p", "note", sp.more + " later spans are not listed (see trace.json).")); }
    box.appendChild(listing);
    return box;
  }
  function sampleView(s) {
    var box = el("div");
    var pairs = [["reward", s.r], ["extracted", s.x], ["key", s.k], ["verdict", s.why], ["finish", s.f],
                 ["generated tokens", s.g], ["branch", s.b === null ? undefined : s.b], ["weight version", s.v],
                 ["teacher-student KL", s.kl]];
    if (s.st !== undefined) {
      pairs.push(["optimizer step", s.st], ["GRPO group", s.gid], ["advantage", s.adv],
                 ["training", s.u ? "used" : "left out (its group's rewards were all equal, or it was cut from the group)"]);
    }
    if (s.end) { pairs.push(["ended by", s.end]); }
    if (s.ba) { pairs.push(["branch answer", fmt(s.ba.x) + " (reward " + fmt(s.ba.r, 2) + ")"]); }
    box.appendChild(kv(pairs));
    if (!s.t) {
      box.appendChild(el("p", "note", "No training sequence was kept for this sample (the trajectory maker dropped it); its text:"));
      box.appendChild(el("div", "plain", s.txt));
      return box;
    }
    box.appendChild(legend());
    box.appendChild(tokenView(s));
    return box;
  }
  function legend() {
    var bar = el("div", "legend-bar");
    bar.appendChild(el("span", null, "logprob:"));
    bar.appendChild(el("span", null, "p≈1"));
    bar.appendChild(el("span", "scale"));
    bar.appendChild(el("span", null, "p→0"));
    bar.appendChild(el("span", "envkey"));
    bar.appendChild(el("span", null, "environment tokens (loss mask 0)"));
    var label = el("label"), box = el("input");
    box.type = "checkbox";
    box.checked = shade;
    box.addEventListener("change", function () {
      shade = box.checked;
      document.querySelectorAll(".tokens").forEach(function (t) { t.classList.toggle("plain-view", !shade); });
    });
    label.appendChild(box);
    label.appendChild(document.createTextNode("shade by logprob"));
    bar.appendChild(label);
    bar.appendChild(el("span", null, "hover a token for its id, logprob and weight version"));
    return bar;
  }
  function expand(runs, n) {
    var out = new Array(n), at = 0;
    for (var i = 0; i < runs.length; i += 2) {
      for (var j = 0; j < runs[i + 1] && at < n; j++) { out[at++] = runs[i]; }
    }
    return out;
  }
  function piece(id) {
    var text = VOCAB[id];
    return typeof text === "string" ? text : "⟨" + id + "⟩";
  }
  function segments(mask) {
    var segs = [], start = 0;
    for (var i = 1; i <= mask.length; i++) {
      if (i === mask.length || mask[i] !== mask[start]) { segs.push([start, i, mask[start]]); start = i; }
    }
    return segs;
  }
  function tokenSpan(s, i, mask, ver) {
    var text = piece(s.t[i]), span = el("span", "t");
    span.dataset.i = i;
    if (text.indexOf("\n") >= 0) {
      var parts = text.split("\n");
      parts.forEach(function (p, k) {
        if (p) { span.appendChild(document.createTextNode(p)); }
        if (k < parts.length - 1) { span.appendChild(el("span", "nl", "↵")); span.appendChild(document.createTextNode("\n")); }
      });
    } else if (text === "") {
      span.appendChild(el("span", "sp", "∅"));
    } else {
      span.textContent = text;
    }
    if (mask[i] && s.tlp) {  // on-policy distillation: shaded by the teacher's disagreement, |student - teacher|
      var gap = Math.min(1, Math.abs(((s.lp[i] || 0) - (s.tlp[i] || 0)) / 100) / 4) * 0.85;
      if (gap > 0.03) { span.style.background = "rgba(0,114,178," + gap.toFixed(3) + ")"; }
    } else if (mask[i]) {
      var p = Math.exp((s.lp[i] || 0) / 100), alpha = (1 - p) * 0.85;
      if (alpha > 0.03) { span.style.background = "rgba(213,94,0," + alpha.toFixed(3) + ")"; }
    }
    span._info = {s: s, i: i, mask: mask[i], ver: ver[i]};
    return span;
  }
  function callsOf(s, turn) {
    return (s.tc || []).filter(function (c) { return c.turn === turn; });
  }
  function turnAt(s, pos) {
    var found = null;
    (s.tu || []).forEach(function (t) { if (pos >= t[0] && pos < t[1]) { found = t[2]; } });
    return found;
  }
  function callSummary(calls) {
    return calls.length ? calls.map(function (c) {
      return "⚙ " + (c.n || "tool") + "(" + JSON.stringify(c.a === undefined ? {} : c.a) + ")" + (c.ok === false ? " ✗ " + (c.e || "error") : "");
    }).join("  ") : "⚙ tool call";
  }
  function modelSegment(s, a, b, mask, ver, host) {
    var turn = turnAt(s, a), calls = turn === null ? [] : callsOf(s, turn);
    var text = "", starts = [];
    for (var i = a; i < b; i++) { starts.push(text.length); text += piece(s.t[i]); }
    var match = calls.length ? /<([\w:.-]*tool_call[\w:.-]*)>[\s\S]*?<\/\1>/.exec(text) : null;
    var from = b, to = b;
    if (match) {
      for (var j = 0; j < starts.length; j++) {
        var end = j + 1 < starts.length ? starts[j + 1] : text.length;
        if (end > match.index && from === b) { from = a + j; }
        if (starts[j] < match.index + match[0].length) { to = a + j + 1; }
      }
    }
    for (var k = a; k < b; k++) {
      if (k === from) {
        var fold = el("details", "call");
        fold.appendChild(el("summary", null, callSummary(calls)));
        for (var m = from; m < to; m++) { fold.appendChild(tokenSpan(s, m, mask, ver)); }
        host.appendChild(fold);
        k = to - 1;
        continue;
      }
      host.appendChild(tokenSpan(s, k, mask, ver));
    }
    if (calls.length && !match) { host.appendChild(el("span", "call", callSummary(calls))); }
  }
  function tokenView(s) {
    var n = s.t.length, mask = expand(s.m, n), ver = expand(s.ver, n);
    var view = el("div", "tokens" + (shade ? "" : " plain-view"));
    var lastTurnCalls = [];
    segments(mask).forEach(function (seg) {
      var a = seg[0], b = seg[1];
      if (seg[2]) {
        modelSegment(s, a, b, mask, ver, view);
        var turn = turnAt(s, a);
        lastTurnCalls = turn === null ? [] : callsOf(s, turn);
        return;
      }
      var env = el("details", "env"), preview = "";
      for (var i = a; i < b && preview.length < 80; i++) { preview += piece(s.t[i]); }
      env.appendChild(el("summary", null, (lastTurnCalls.length ? "tool result" : "environment") + " · " + (b - a) +
                         " tokens: " + preview.replace(/\s+/g, " ").trim().slice(0, 80)));
      for (var j = a; j < b; j++) { env.appendChild(tokenSpan(s, j, mask, ver)); }
      env.open = !lastTurnCalls.length;
      view.appendChild(env);
    });
    view.addEventListener("mousemove", hover);
    view.addEventListener("mouseleave", function () { tip.hidden = true; });
    return view;
  }
  function hover(ev) {
    var span = ev.target.closest ? ev.target.closest(".t") : null;
    if (!span || !span._info) { tip.hidden = true; return; }
    var info = span._info, s = info.s, id = s.t[info.i];
    var lines = ["token " + JSON.stringify(piece(id)) + "   id " + id,
                 "position " + info.i + " of the output"];
    if (info.mask) {
      var lp = (s.lp[info.i] || 0) / 100;
      lines.push("logprob " + lp.toFixed(2) + "   p " + Math.exp(lp).toFixed(3));
      if (s.tlp) {
        var tlp = (s.tlp[info.i] || 0) / 100;
        lines.push("teacher logprob " + tlp.toFixed(2) + "   student - teacher " + (lp - tlp).toFixed(2));
      }
      lines.push("weight version " + info.ver + "   loss mask 1");
    } else {
      lines.push("environment token   loss mask 0");
    }
    tip.textContent = lines.join("\n");
    tip.hidden = false;
    var x = Math.min(ev.clientX + 14, window.innerWidth - tip.offsetWidth - 8);
    var y = ev.clientY + 18 + tip.offsetHeight > window.innerHeight ? ev.clientY - tip.offsetHeight - 10 : ev.clientY + 18;
    tip.style.left = x + "px";
    tip.style.top = y + "px";
  }

  apply();
})();
