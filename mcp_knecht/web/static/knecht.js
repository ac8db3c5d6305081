// Knecht's web page: small progressive enhancement over server-rendered HTML. Every page works
// without it; with it, parts that are still changing update themselves.
//
//   [data-refresh=URL]  asks URL again every data-interval ms; replaces itself when the answer's
//                       data-version differs (or it stops changing); never while you type in it
//   [data-live=URL]     a list fed by server-sent events: rows arrive as "proposal" events
//   [data-focus]        scrolled into view and focused (the action a diagnosis points at)
//   ?aiAction=…         the assistant's parameters are dropped from the address once shown
(function () {
  "use strict";

  function announce(text) {
    var region = document.getElementById("announce");
    if (!region) return;
    region.textContent = "";
    window.setTimeout(function () { region.textContent = text; }, 60);
  }

  function parse(html) {
    var template = document.createElement("template");
    template.innerHTML = html.trim();
    return template.content.firstElementChild;
  }

  function busy(element) {
    var active = document.activeElement;
    return active && element.contains(active) && /^(TEXTAREA|INPUT|SELECT)$/.test(active.tagName) &&
      active.value !== "";
  }

  function refresh(element) {
    var url = element.getAttribute("data-refresh");
    var every = parseInt(element.getAttribute("data-interval") || "3000", 10);
    if (!url) return;
    function tick() {
      if (!element.isConnected) return;
      fetch(url, { credentials: "same-origin", headers: { Accept: "text/html" } })
        .then(function (response) {
          if (response.status === 401) return null;  // signed out: stop asking
          return response.ok ? response.text() : "";
        })
        .then(function (html) {
          if (html === null) return;
          var next = html ? parse(html) : null;
          var changed = next && (next.getAttribute("data-version") !== element.getAttribute("data-version") ||
                                 !next.hasAttribute("data-refresh"));
          if (changed && !busy(element)) {
            element.replaceWith(next);
            enhance(next);
            var label = next.querySelector("h2, .summary, .state");
            announce(label ? label.textContent.trim().slice(0, 200) : "Updated");
            return;
          }
          window.setTimeout(tick, every);
        })
        .catch(function () { window.setTimeout(tick, every * 2); });
    }
    window.setTimeout(tick, every);
  }

  function live(body) {
    var url = body.getAttribute("data-live");
    if (!url || !window.EventSource) return;
    var source = new EventSource(url);
    source.addEventListener("proposal", function (event) {
      var row = parse(event.data);
      if (!row || document.getElementById(row.id)) return;
      body.insertBefore(row, body.firstElementChild);
      var empty = document.getElementById("no-proposals");
      if (empty) empty.remove();
      var link = row.querySelector("a");
      announce("New proposal " + (link ? link.textContent : ""));
    });
    source.addEventListener("signed-out", function () { source.close(); });
    window.addEventListener("pagehide", function () { source.close(); });
  }

  function focus(target) {
    target.scrollIntoView({ block: "center" });
    var summary = target.querySelector("summary") || target;
    if (!summary.hasAttribute("tabindex") && summary.tagName !== "SUMMARY") summary.setAttribute("tabindex", "-1");
    summary.focus({ preventScroll: true });
  }

  function enhance(root) {
    if (root.matches && root.matches("[data-refresh]")) refresh(root);
    root.querySelectorAll("[data-refresh]").forEach(refresh);
  }

  function forgetAssistantParameters() {
    var url = new URL(window.location.href);
    if (!url.searchParams.has("aiAction") && !url.searchParams.has("aiPreview")) return;
    url.searchParams.delete("aiAction");
    url.searchParams.delete("aiPreview");
    window.history.replaceState(null, "", url.pathname + url.search + url.hash);
  }

  function guardDoubleSubmit() {
    document.addEventListener("submit", function (event) {
      var form = event.target;
      if (!(form instanceof HTMLFormElement) || form.id === "chat-form") return;
      var button = form.querySelector("button[type=submit]");
      if (button) window.setTimeout(function () { button.disabled = true; }, 0);
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    enhance(document);
    document.querySelectorAll("[data-live]").forEach(live);
    var target = document.querySelector("[data-focus]");
    if (target) {
      focus(target);
      // The browser's own jump to a #fragment happens at load and moves focus away again.
      window.addEventListener("load", function () { window.setTimeout(function () { focus(target); }, 0); });
    }
    forgetAssistantParameters();
    guardDoubleSubmit();
  });
})();
