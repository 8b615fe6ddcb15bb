// A page's live stream from the server (server-sent events), shared by the runs page and a
// run's page: opened as the page shows, closed as it goes. A page left is closed at once, not
// when the browser drops it: a browser keeps pages gone back from in memory (its back-forward
// cache), and each kept one held its stream — a browser opens at most six connections to one
// server, so the seventh page of a view opened in one tab waited until one of them timed out
// (28 to 40 s in headless Chromium). A page shown again from that cache opens a new stream,
// whose first message is the whole state again.
"use strict";
window.somaLive = function (url, indicator, handlers) {
  let events = null;
  function open() {
    events = new EventSource(url);
    events.addEventListener("open", () => { indicator.textContent = "live"; indicator.classList.add("on"); });
    events.addEventListener("error", () => { indicator.textContent = "disconnected"; indicator.classList.remove("on"); });
    for (const [name, handle] of Object.entries(handlers)) events.addEventListener(name, handle);
  }
  window.addEventListener("pagehide", () => {
    if (events !== null) events.close();
    events = null;
    indicator.textContent = "disconnected";
    indicator.classList.remove("on");
  });
  window.addEventListener("pageshow", (e) => { if (e.persisted && events === null) open(); });
  open();
};
