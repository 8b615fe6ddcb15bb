// A run's page, kept live: the server sends the run's state at first ("snapshot"), then what
// changed ("update"): nodes with their latest state, spans ended, values emitted, at most once
// a tick. Updates are merged as they come and drawn at most once a frame (`queue`): the page
// lays itself out no more often than it is shown, however many updates a flood brings, and a
// page whose frames are held up (a busy machine, a hidden tab) draws only the latest state when
// they resume. The plan is the engine's drawing; each box carries data-node, and its class says
// its state. A large plan is drawn a tile at a time (tiles.js): every node's state is kept
// here, and a box takes its node's as it is drawn. Every text from the run is set as text,
// never as markup.
"use strict";
(function () {
  const token = new URLSearchParams(location.search).get("token");
  const withToken = (path) => token === null ? path : path + (path.includes("?") ? "&" : "?") + "token=" + encodeURIComponent(token);
  const runId = document.body.dataset.run;
  const api = "/api/runs/" + encodeURIComponent(runId);
  const connection = document.getElementById("live");
  const boxes = new Map();
  const nodes = new Map();
  const plan = document.getElementById("plan");

  // A box's class: the drawing's own ("node", "node cached") and its node's state.
  function colour(g, state) {
    g.setAttribute("class", (g.classList.contains("cached") ? "node cached" : "node") + " state-" + state);
  }

  function drawn(list) {
    for (const g of list) {
      const id = g.dataset.node;
      if (id === undefined) continue;
      boxes.set(id, g);
      const node = nodes.get(id);
      colour(g, node ? node.state : "waiting");
    }
  }

  const tiled = document.getElementById("plan-tiles");
  if (tiled) window.somaTiles(plan, JSON.parse(tiled.textContent), drawn);
  else drawn(plan.querySelectorAll("g.node[data-node]"));
  const timeline = document.getElementById("timeline");
  const rows = new Map();
  const spans = [];
  // The latest spans drawn: the timeline is laid out again each time its scale changes.
  const SPANS_DRAWN = 500;
  const EMITS_SHOWN = 200;
  let runSeconds = 0;
  // The seconds the timeline's width stands for: every span is placed by this one scale
  // (view.css), changed only when the run goes past it, then to four times as long (and to
  // the run's time once it has ended): changing it lays out every span again, which a page
  // cannot afford at every update while a run emits.
  let shown = 0;
  let ended = false;

  function rescale() {
    const wanted = ended ? runSeconds : runSeconds > shown ? Math.max(runSeconds, 4 * shown) : shown;
    if (wanted === shown || wanted <= 0) return;
    shown = wanted;
    timeline.style.setProperty("--scale", 100 / shown);
  }

  let selected = null;

  // A node running now: a bar from its start to the run's time so far, until its span comes.
  const live = new Map();

  function liveBar(node) {
    const old = live.get(node.id);
    if (old) { old.remove(); live.delete(node.id); }
    if (node.state !== "running" || node.started === null || node.row === null) return;
    const div = document.createElement("div");
    div.className = "tl-span state-running";
    div.title = node.id + " (running)";
    div.textContent = node.id;
    div.style.setProperty("--start", node.started);
    div.style.setProperty("--end", Math.max(runSeconds, node.started));
    row(node.row).appendChild(div);
    live.set(node.id, div);
  }

  function setState(node) {
    nodes.set(node.id, node);
    liveBar(node);
    const g = boxes.get(node.id);
    if (g) colour(g, node.state);
    if (selected === node.id) detail(node.id);
  }

  function setRun(run) {
    const status = document.getElementById("status");
    status.textContent = run.status;
    status.className = "status status-" + run.status;
    document.getElementById("progress").textContent = run.progress + ", " + run.seconds.toFixed(3) + " s";
    document.getElementById("run-error").textContent = run.error || "";
    runSeconds = Math.max(runSeconds, run.seconds);
    ended = run.status !== "running";
  }

  // A timeline row: the running nodes' bars in it, which move at every update, and its ended
  // spans in a box of their own (view.css's .tl-done, contained), which the bars' moving does
  // not lay out again.
  function row(name) {
    let r = rows.get(name);
    if (!r) {
      r = document.createElement("div");
      r.className = "tl-row";
      const label = document.createElement("span");
      label.className = "tl-name";
      label.textContent = name;
      r.done = document.createElement("div");
      r.done.className = "tl-done";
      r.append(label, r.done);
      timeline.appendChild(r);
      rows.set(name, r);
    }
    return r;
  }

  function addSpans(list) {
    for (const s of list) {
      const div = document.createElement("div");
      div.className = "tl-span state-" + s.state;
      div.title = s.node + " (" + s.state + ", " + (s.end - s.start).toFixed(6) + " s)";
      div.textContent = s.node;
      div.style.setProperty("--start", s.start);
      div.style.setProperty("--end", s.end);
      row(s.row || "?").done.appendChild(div);
      spans.push(div);
      runSeconds = Math.max(runSeconds, s.end);
    }
    while (spans.length > SPANS_DRAWN) spans.shift().remove();
    rescale();
    for (const div of live.values()) div.style.setProperty("--end", runSeconds);
  }

  // The latest emitted values, newest first: nothing to scroll, so that an update never
  // makes the page lay itself out there and then.
  function addEmits(list) {
    if (list.length === 0) return;
    const ol = document.getElementById("emits");
    const added = document.createDocumentFragment();
    for (const e of list.slice(-EMITS_SHOWN).reverse()) {
      const li = document.createElement("li");
      li.textContent = e.at.toFixed(3) + " s  " + e.node + ": " + e.type + (e.size === null ? "" : " (" + e.size + ")") + " " + e.repr;
      added.appendChild(li);
    }
    ol.prepend(added);
    while (ol.childElementCount > EMITS_SHOWN) ol.lastElementChild.remove();
  }

  function field(dl, name, value) {
    if (value === null || value === undefined || value === "") return;
    const dt = document.createElement("dt"); dt.textContent = name;
    const dd = document.createElement("dd");
    if (name === "traceback") { const pre = document.createElement("pre"); pre.className = "error"; pre.textContent = value; dd.appendChild(pre); }
    else dd.textContent = String(value);
    dl.append(dt, dd);
  }

  async function detail(id) {
    selected = id;
    const aside = document.getElementById("detail");
    let node = nodes.get(id) || { id: id, state: "waiting" };
    try {
      const answer = await fetch(withToken(api + "/nodes/" + encodeURIComponent(id)));
      if (answer.ok) node = await answer.json();
    } catch (_) { /* the node's last state as streamed is shown */ }
    aside.textContent = "";
    const h = document.createElement("h2"); h.textContent = "Node " + id;
    const dl = document.createElement("dl");
    field(dl, "state", node.state);
    field(dl, "attempts", node.attempts);
    field(dl, "seconds", node.seconds === null || node.seconds === undefined ? null : node.seconds.toFixed(6));
    field(dl, "thread", node.row);
    field(dl, "device", node.device);
    field(dl, "host", node.host);
    field(dl, "parts", node.parts);
    field(dl, "output", "not shown: the observer does not see outputs");
    field(dl, "error", node.error);
    field(dl, "traceback", node.traceback);
    aside.append(h, dl);
    aside.dataset.node = id;
  }

  plan.addEventListener("click", (e) => {
    const g = e.target.closest("g.node[data-node]");
    if (g) detail(g.dataset.node);
  });

  function apply(data) {
    if (data.run) setRun(data.run);
    for (const node of data.nodes || []) setState(node);
    document.body.dataset.nodes = String(nodes.size);
    addSpans(data.spans || []);
    addEmits(data.emits || []);
  }

  // The updates come since the last frame, merged: each node's latest state, the run's, and
  // no more of the spans and emitted values than are drawn; `null` when none waits.
  let pending = null;

  function queue(data) {
    if (pending === null) {
      pending = { run: null, nodes: new Map(), spans: [], ended: 0, emits: [] };
      requestAnimationFrame(flush);
    }
    if (data.run) pending.run = data.run;
    for (const node of data.nodes || []) pending.nodes.set(node.id, node);
    for (const s of data.spans || []) {
      pending.spans.push(s);
      pending.ended = Math.max(pending.ended, s.end);
    }
    if (pending.spans.length > 2 * SPANS_DRAWN) pending.spans.splice(0, pending.spans.length - SPANS_DRAWN);
    for (const e of data.emits || []) pending.emits.push(e);
    if (pending.emits.length > 2 * EMITS_SHOWN) pending.emits.splice(0, pending.emits.length - EMITS_SHOWN);
  }

  function flush() {
    const merged = pending;
    if (merged === null) return;
    pending = null;
    // A span left out still moves the timeline's end on.
    runSeconds = Math.max(runSeconds, merged.ended);
    apply({
      run: merged.run,
      nodes: [...merged.nodes.values()],
      spans: merged.spans.slice(-SPANS_DRAWN),
      emits: merged.emits.slice(-EMITS_SHOWN),
    });
  }

  window.somaLive(withToken(api + "/events"), connection, {
    snapshot: (e) => {
      for (const g of boxes.values()) colour(g, "waiting");
      nodes.clear();
      for (const r of rows.values()) r.remove();
      rows.clear(); spans.length = 0; live.clear(); shown = 0;
      document.getElementById("emits").textContent = "";
      // What came before the snapshot is in it.
      pending = null;
      apply(JSON.parse(e.data));
    },
    update: (e) => queue(JSON.parse(e.data)),
  });
})();
