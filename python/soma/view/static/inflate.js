// The offline report of a large run (soma.report) carries its drawings gzipped, in base64, in
// each element's data-gzip: inflated here by the browser's own DecompressionStream. The text is
// the engine's drawing, escaped by it as when it is inlined.
"use strict";
for (const element of document.querySelectorAll("[data-gzip]")) {
  const bytes = Uint8Array.from(atob(element.dataset.gzip), (c) => c.charCodeAt(0));
  const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
  new Response(stream).text().then((text) => {
    element.innerHTML = text;
    element.removeAttribute("data-gzip");
  });
}
