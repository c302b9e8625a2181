// The fleet page's one script (SPEC O16): it follows the server's events and updates the
// matrix and the rollout in place; the page is whole without it. Every text goes in as text,
// never as HTML: a changed rollout is the server's own rendering of it, parsed inertly.
"use strict";

(function () {
  const matrix = document.getElementById("matrix");
  if (!matrix || !window.EventSource) {
    return;
  }
  const byCluster = matrix.dataset.down === "cluster";

  function ensureRow(key) {
    let tr = matrix.tBodies[0].querySelector(`tr[data-key="${CSS.escape(key)}"]`);
    if (tr) {
      return tr;
    }
    tr = document.createElement("tr");
    tr.dataset.key = key;
    const th = document.createElement("th");
    th.appendChild(link(key, byCluster ? "clusters" : "tenants"));
    tr.appendChild(th);
    for (const col of matrix.tHead.rows[0].querySelectorAll("th[data-key]")) {
      tr.appendChild(emptyCell(byCluster ? key : col.dataset.key, byCluster ? col.dataset.key : key));
    }
    matrix.tBodies[0].appendChild(tr);
    return tr;
  }

  function ensureColumn(key) {
    const head = matrix.tHead.rows[0];
    if (head.querySelector(`th[data-key="${CSS.escape(key)}"]`)) {
      return;
    }
    const th = document.createElement("th");
    th.dataset.key = key;
    th.appendChild(link(key, byCluster ? "tenants" : "clusters"));
    head.appendChild(th);
    for (const tr of matrix.tBodies[0].rows) {
      const down = tr.dataset.key;
      tr.appendChild(emptyCell(byCluster ? down : key, byCluster ? key : down));
    }
  }

  function link(key, kind) {
    const a = document.createElement("a");
    a.href = `/${kind}/${key.split("/").map(encodeURIComponent).join("/")}`;
    a.textContent = key;
    return a;
  }

  function emptyCell(cluster, tenant) {
    const td = document.createElement("td");
    td.className = "cell none";
    td.dataset.cell = `${cluster}|${tenant}`;
    return td;
  }

  function show(row) {
    const tenant = `${row.namespace}/${row.tenant}`;
    ensureColumn(byCluster ? tenant : row.cluster);
    ensureRow(byCluster ? row.cluster : tenant);
    const td = matrix.querySelector(`td[data-cell="${CSS.escape(row.cluster + "|" + tenant)}"]`);
    if (!td) {
      return;
    }
    td.className = `cell s-${row.state}`;
    td.title = row.detail || row.held;
    td.replaceChildren();
    for (const [name, text] of [["state", row.state], ["version", row.chart_version], ["ago", row.ago]]) {
      const span = document.createElement("span");
      span.className = name;
      span.textContent = text;
      td.appendChild(span);
    }
    td.dataset.updated = String(Date.now());
  }

  async function followRollout() {
    const answer = await fetch(window.location.href, { credentials: "same-origin" });
    if (!answer.ok) {
      return;
    }
    const page = new DOMParser().parseFromString(await answer.text(), "text/html");
    const now = document.getElementById("rollout");
    const then = page.getElementById("rollout");
    if (now && then) {
      now.replaceWith(document.importNode(then, true));
    } else if (then) {
      matrix.closest("main").prepend(document.importNode(then, true));
    } else if (now) {
      now.remove();
    }
  }

  const events = new EventSource(`/events${window.location.search}`);
  events.addEventListener("row", (e) => show(JSON.parse(e.data)));
  events.addEventListener("rollout", () => followRollout());
  events.addEventListener("reload", () => window.location.reload());
})();
