// The site's search, read from file:// without a server and without the network.
//
// Material runs its search in a Web Worker, which a browser refuses to start from a file://
// page. Its offline plugin then loads a stand-in from a CDN (unpkg's iframe-worker) — a request
// that leaves the machine, and fails without a network. This is the stand-in, kept with the
// site: on a file:// page only, `Worker` runs the worker's script in a hidden same-origin
// iframe, and the messages each way are events, as a real worker's are. (Its name holds
// "iframe-worker" so that the offline plugin sees a stand-in is there and adds none of its own.)
(function () {
  "use strict";
  if (location.protocol !== "file:") {
    return;
  }

  class IframeWorker extends EventTarget {
    constructor(url) {
      super();
      this.onmessage = null;
      this.onerror = null;
      this._pending = []; // Messages sent before the worker's script has loaded.
      this._frame = document.createElement("iframe");
      this._frame.hidden = true;
      (document.body || document.documentElement).appendChild(this._frame);
      const scope = this._frame.contentWindow;
      this._scope = scope;
      // What the worker posts comes out here, as a message event of this object.
      scope.postMessage = (data) => {
        setTimeout(() => this._deliver(data));
      };
      // A worker loads scripts with importScripts: here, script elements in the frame, in
      // order; the promise it returns is what Material's search awaits.
      scope.importScripts = (...urls) =>
        urls.reduce(
          (loaded, source) => loaded.then(() => this._load(new URL(source, url).href)),
          Promise.resolve(),
        );
      this._load(new URL(url, location.href).href).then(
        () => {
          const pending = this._pending;
          this._pending = null;
          pending.forEach((data) => this.postMessage(data));
        },
        (error) => this._fail(error),
      );
    }

    _load(source) {
      return new Promise((resolve, reject) => {
        const script = this._scope.document.createElement("script");
        script.src = source;
        script.onload = () => resolve();
        script.onerror = () => reject(new Error(`the worker's script ${source} did not load`));
        this._scope.document.head.appendChild(script);
      });
    }

    _deliver(data) {
      const event = new MessageEvent("message", { data: data });
      if (typeof this.onmessage === "function") {
        this.onmessage(event);
      }
      this.dispatchEvent(event);
    }

    _fail(error) {
      const event = new ErrorEvent("error", { error: error, message: String(error) });
      if (typeof this.onerror === "function") {
        this.onerror(event);
      }
      this.dispatchEvent(event);
    }

    postMessage(data) {
      if (this._pending !== null) {
        this._pending.push(data);
        return;
      }
      const scope = this._scope;
      setTimeout(() => scope.dispatchEvent(new scope.MessageEvent("message", { data: data })));
    }

    terminate() {
      this._frame.remove();
    }
  }

  window.Worker = IframeWorker;
})();
