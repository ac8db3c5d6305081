// The assistant (seed 000's ai_chat widget): talks only to the chat endpoint and the conversation
// list, as the signed-in person (the session cookie, and the CSRF token for the POST).
//
//   POST /api/ai/chat                {conversationId?, message} → {conversationId, reply, action?}
//   GET  /api/ai/conversations       → {conversations: [{id, title?}]}
//   GET  /api/ai/conversations/{id}  → {id, messages: [{role, content}]}
//
// A reply with an `action` navigates to its path (a page of this site only) with its queryParams
// (aiAction, aiPreview …), which the proposal page shows as a banner. 404 or 503: "unavailable".
(function () {
  "use strict";

  var STATE = "knecht.chat";
  var FOLLOW_UP_MS = 10000;

  function csrf() {
    var meta = document.querySelector('meta[name="csrf-token"]');
    return meta ? meta.getAttribute("content") : "";
  }

  function load() {
    try { return JSON.parse(window.sessionStorage.getItem(STATE) || "{}"); } catch (e) { return {}; }
  }

  function save(state) {
    try { window.sessionStorage.setItem(STATE, JSON.stringify(state)); } catch (e) { /* private mode */ }
  }

  function localPath(path) {
    return typeof path === "string" && path.charAt(0) === "/" && path.charAt(1) !== "/" && path.indexOf("\\") < 0;
  }

  document.addEventListener("DOMContentLoaded", function () {
    var panel = document.getElementById("chat");
    if (!panel) return;
    var chatUrl = panel.getAttribute("data-chat");
    var listUrl = panel.getAttribute("data-conversations");
    var status = document.getElementById("chat-status");
    var log = document.getElementById("chat-log");
    var picker = document.getElementById("chat-conversation");
    var form = document.getElementById("chat-form");
    var input = document.getElementById("chat-message");
    var send = document.getElementById("chat-send");
    var state = load();
    var shown = 0;
    var loaded = false;
    var timer = null;

    function say(text, info) {
      status.textContent = text || "";
      status.classList.toggle("info", !!info);
    }

    function unavailable() {
      say("The assistant is unavailable right now.");
      input.disabled = true;
      send.disabled = true;
      picker.disabled = true;
    }

    function request(url, options) {
      options = options || {};
      options.credentials = "same-origin";
      options.headers = Object.assign({ Accept: "application/json" }, options.headers || {});
      return fetch(url, options).then(function (response) {
        return response.json().catch(function () { return {}; }).then(function (body) {
          return { status: response.status, ok: response.ok, body: body };
        });
      });
    }

    function add(role, text) {
      // "note": Knecht's follow-up after a decision on a proposal of this conversation (followUp: true).
      var item = document.createElement("li");
      item.className = role === "user" || role === "note" ? role : "assistant";
      var who = document.createElement("span");
      who.className = "visually-hidden";
      who.textContent = role === "user" ? "You: " : role === "note" ? "Knecht: " : "Assistant: ";
      item.appendChild(who);
      item.appendChild(document.createTextNode(text));
      log.appendChild(item);
      log.scrollTop = log.scrollHeight;
    }

    function render(messages) {
      if (messages.length === shown) return;
      log.textContent = "";
      messages.forEach(function (m) { add(m.followUp ? "note" : m.role, String(m.content || m.text || "")); });
      shown = messages.length;
    }

    function remember() {
      state.open = panel.open;
      save(state);
    }

    function option(id, title) {
      for (var i = 0; i < picker.options.length; i++) {
        if (picker.options[i].value === id) return picker.options[i];
      }
      var created = document.createElement("option");
      created.value = id;
      created.textContent = title || "Conversation " + id.slice(0, 8);
      picker.appendChild(created);
      return created;
    }

    function openConversation(id) {
      state.conversationId = id || null;
      remember();
      picker.value = id || "";
      shown = 0;
      log.textContent = "";
      if (!id) return Promise.resolve();
      return request(listUrl + "/" + encodeURIComponent(id)).then(function (answer) {
        if (answer.status === 404) { state.conversationId = null; remember(); picker.value = ""; return; }
        if (answer.ok) render(answer.body.messages || []);
      });
    }

    function followUps() {
      window.clearTimeout(timer);
      timer = window.setTimeout(function () {
        if (!panel.open || !state.conversationId) return followUps();
        request(listUrl + "/" + encodeURIComponent(state.conversationId)).then(function (answer) {
          if (answer.ok) render(answer.body.messages || []);
        }).catch(function () { /* next time */ }).then(followUps);
      }, FOLLOW_UP_MS);
    }

    function start() {
      if (loaded) return;
      loaded = true;
      say("Loading…", true);
      request(listUrl).then(function (answer) {
        if (answer.status === 404 || answer.status === 503 || answer.status >= 500) return unavailable();
        if (answer.status === 401) return say("Your session ended: sign in again.");
        say("");
        (answer.body.conversations || []).forEach(function (c) { option(String(c.id), c.title); });
        if (state.conversationId) option(state.conversationId);
        return openConversation(state.conversationId).then(followUps);
      }).catch(unavailable);
    }

    panel.addEventListener("toggle", function () {
      remember();
      if (panel.open) start();
    });

    picker.addEventListener("change", function () { openConversation(picker.value); });

    form.addEventListener("submit", function (event) {
      event.preventDefault();
      var message = input.value.trim();
      if (!message) return say("Write a message first.");
      var body = { message: message };
      if (state.conversationId) body.conversationId = state.conversationId;
      send.disabled = true;
      say("The assistant is thinking…", true);
      add("user", message);
      input.value = "";
      request(chatUrl, {
        method: "POST",
        headers: { "Content-Type": "application/json", "X-CSRF-Token": csrf() },
        body: JSON.stringify(body)
      }).then(function (answer) {
        if (answer.status === 404 && state.conversationId) {
          state.conversationId = null;
          remember();
          return say("That conversation is gone; your next message starts a new one.");
        }
        if (answer.status === 404 || answer.status === 503) return unavailable();
        if (answer.status === 401) return say("Your session ended: sign in again.");
        if (!answer.ok) {
          var error = answer.body && answer.body.error;
          return say("The assistant could not answer" + (error && error.message ? ": " + error.message : "."));
        }
        say("");
        var reply = answer.body;
        state.conversationId = reply.conversationId;
        option(String(reply.conversationId), message.slice(0, 40)).selected = true;
        add("assistant", String(reply.reply || ""));
        shown += 2;
        remember();
        var action = reply.action;
        if (action && localPath(action.path)) {
          var query = new URLSearchParams();
          Object.keys(action.queryParams || {}).forEach(function (key) {
            query.set(key, String(action.queryParams[key]));
          });
          state.open = true;
          save(state);
          window.location.assign(action.path + (query.toString() ? "?" + query.toString() : ""));
        }
      }).catch(function () {
        say("The assistant could not be reached.");
      }).then(function () {
        if (!input.disabled) send.disabled = false;
      });
    });

    if (state.open) {
      panel.open = true;
      start();
    }
  });
})();
