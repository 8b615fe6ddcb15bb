// A large drawing of the engine's (a plan of thousands of boxes), drawn a tile at a time: the
// page carries the drawing as text, each element's bounds are read from it here, and only the
// elements of the tiles in view (and one tile around) are put in the page, as it is scrolled. Parsing and
// laying out every box of a 10,000-node plan takes the browser seconds; the few hundred in view
// take milliseconds. The markup is the engine's drawing, escaped by it and by the server, as
// when the drawing is inlined whole. Used by a run's page and by the offline report.
"use strict";
window.somaTiles = function (container, svg, onDrawn) {
  const TILE = 1024;
  // The engine writes its drawing an element a line: the opening tag, the elements, the end.
  const lines = svg.split("\n");
  while (lines.length && lines[lines.length - 1] === "") lines.pop();
  container.innerHTML = lines[0] + "<g class=tiles-back></g><g class=tiles-front></g></svg>";
  const back = container.querySelector(".tiles-back");
  const front = container.querySelector(".tiles-front");
  const items = lines.slice(1, -1);
  const RECT = /<rect [^>]*?x="([-\d.]+)" y="([-\d.]+)" width="([-\d.]+)" height="([-\d.]+)"/;
  const PATH = / d="([^"]*)"/g;
  const NUMBER = /-?\d+(?:\.\d+)?/g;
  // Each tile's elements, by "column,row": an element is in every tile its bounds touch (its
  // first rectangle, a box's or a wave's, and its paths' points, an arrow's).
  const grid = new Map();
  for (let i = 0; i < items.length; i++) {
    const line = items[i];
    let x0 = Infinity, y0 = Infinity, x1 = -Infinity, y1 = -Infinity;
    const rect = RECT.exec(line);
    if (rect) {
      x0 = +rect[1]; y0 = +rect[2]; x1 = x0 + +rect[3]; y1 = y0 + +rect[4];
    }
    for (const path of line.matchAll(PATH)) {
      const numbers = path[1].match(NUMBER) || [];
      for (let k = 0; k + 1 < numbers.length; k += 2) {
        const x = +numbers[k], y = +numbers[k + 1];
        if (x < x0) x0 = x; if (x > x1) x1 = x; if (y < y0) y0 = y; if (y > y1) y1 = y;
      }
    }
    if (x0 === Infinity) { x0 = 0; y0 = 0; x1 = 0; y1 = 0; } // no bounds read: the first tile
    for (let cx = Math.floor(x0 / TILE); cx <= Math.floor(x1 / TILE); cx++) {
      for (let cy = Math.floor(y0 / TILE); cy <= Math.floor(y1 / TILE); cy++) {
        const key = cx + "," + cy;
        const list = grid.get(key);
        if (list) list.push(i); else grid.set(key, [i]);
      }
    }
  }
  const drawn = new Uint8Array(items.length);
  const tilesDrawn = new Set();
  let pending = false;

  function draw() {
    pending = false;
    // What is in view, in the drawing's units (it is drawn at its own size), a tile around.
    const box = container.getBoundingClientRect();
    const left = container.scrollLeft - Math.min(0, box.left);
    const top = container.scrollTop - Math.min(0, box.top);
    const width = Math.min(container.clientWidth || innerWidth, innerWidth);
    const height = Math.min(container.clientHeight || innerHeight, innerHeight);
    let behind = "", above = "";
    for (let cx = Math.floor(left / TILE) - 1; cx <= Math.floor((left + width) / TILE) + 1; cx++) {
      for (let cy = Math.floor(top / TILE) - 1; cy <= Math.floor((top + height) / TILE) + 1; cy++) {
        const key = cx + "," + cy;
        if (tilesDrawn.has(key)) continue;
        tilesDrawn.add(key);
        for (const i of grid.get(key) || []) {
          if (drawn[i]) continue;
          drawn[i] = 1;
          if (items[i].startsWith('<g class="node')) above += items[i]; else behind += items[i];
        }
      }
    }
    if (behind) back.insertAdjacentHTML("beforeend", behind);
    if (above) {
      const first = front.childElementCount;
      front.insertAdjacentHTML("beforeend", above);
      const added = Array.prototype.slice.call(front.children, first);
      if (onDrawn) onDrawn(added);
    }
    container.dataset.drawn = String(tilesDrawn.size);
  }

  function later() {
    if (!pending) { pending = true; requestAnimationFrame(draw); }
  }
  container.addEventListener("scroll", later, { passive: true });
  addEventListener("scroll", later, { passive: true });
  addEventListener("resize", later);
  draw();
};
