// The offline report of a large run (soma.report) carries its drawings, and a large run's table
// of nodes, gzipped, in base64, in each element's data-gzip: inflated here by the browser's own
// DecompressionStream. The text is the engine's drawing, escaped by it, or the table's rows,
// escaped by the report, as when they are inlined. A plan marked data-draw=tiles is drawn a tile
// at a time (tiles.js); what is marked data-draw=open, once the section holding it is opened.
"use strict";
(function () {
  function inflated(element) {
    const bytes = Uint8Array.from(atob(element.dataset.gzip), (c) => c.charCodeAt(0));
    const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
    return new Response(stream).text();
  }

  async function fill(element) {
    const text = await inflated(element);
    if (element.dataset.draw === "tiles") window.somaTiles(element, text, null);
    else element.innerHTML = text;
    element.removeAttribute("data-gzip");
  }

  for (const element of document.querySelectorAll("[data-gzip]")) {
    const details = element.closest("details");
    if (element.dataset.draw === "open" && details) {
      details.addEventListener("toggle", () => { if (element.dataset.gzip) fill(element); }, { once: true });
    } else {
      fill(element);
    }
  }
})();
