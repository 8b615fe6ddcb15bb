// The runs page, kept live: the server sends every run at first ("runs"), then the rows that
// changed ("update"), at most once a tick. Every text is set as text, never as markup.
"use strict";
(function () {
  const token = new URLSearchParams(location.search).get("token");
  const withToken = (path) => token === null ? path : path + (path.includes("?") ? "&" : "?") + "token=" + encodeURIComponent(token);
  const body = document.querySelector("#runs tbody");
  const filter = document.getElementById("status");
  const live = document.getElementById("live");
  const rows = new Map();
  // At most as many rows as the recorder keeps finished runs: a process that runs thousands of
  // runs a second leaves the page the newest, never a table that grows without bound.
  const kept = Number(document.getElementById("runs").dataset.kept || 0);

  function cell(tr, text, className) {
    const td = document.createElement("td");
    td.textContent = text;
    if (className) td.className = className;
    tr.appendChild(td);
    return td;
  }

  function render(run) {
    const tr = document.createElement("tr");
    tr.dataset.run = run.id;
    tr.dataset.status = run.status;
    const first = document.createElement("td");
    const a = document.createElement("a");
    a.href = withToken("/runs/" + encodeURIComponent(run.id));
    a.textContent = run.id;
    first.appendChild(a);
    if (run.item !== null) first.appendChild(document.createTextNode(" item " + run.item));
    tr.appendChild(first);
    cell(tr, run.graph);
    cell(tr, run.status, "status status-" + run.status);
    cell(tr, new Date(run.started * 1000).toLocaleString());
    cell(tr, run.seconds.toFixed(3) + " s");
    cell(tr, run.progress);
    cell(tr, run.error || "", "error");
    tr.classList.toggle("hidden", filter.value !== "" && filter.value !== run.status);
    return tr;
  }

  function put(run) {
    const old = rows.get(run.id) || body.querySelector('tr[data-run="' + CSS.escape(run.id) + '"]');
    const tr = render(run);
    if (old) old.replaceWith(tr);
    else body.insertBefore(tr, body.firstChild); // newest first
    rows.set(run.id, tr);
    while (kept > 0 && body.rows.length > kept) {
      const oldest = body.lastElementChild;
      rows.delete(oldest.dataset.run);
      oldest.remove();
    }
  }

  function all(runs) {
    body.textContent = "";
    rows.clear();
    // The server sends newest first: appended in that order.
    for (const run of runs) { const tr = render(run); body.appendChild(tr); rows.set(run.id, tr); }
  }

  filter.addEventListener("change", () => {
    for (const tr of body.rows) tr.classList.toggle("hidden", filter.value !== "" && filter.value !== tr.dataset.status);
    const url = new URL(location.href);
    if (filter.value) url.searchParams.set("status", filter.value); else url.searchParams.delete("status");
    history.replaceState(null, "", url);
  });

  window.somaLive(withToken("/api/runs/events"), live, {
    runs: (e) => all(JSON.parse(e.data)),
    update: (e) => { for (const run of JSON.parse(e.data)) put(run); },
  });
})();
