"""Fake model providers on 127.0.0.1 that speak each provider's real wire format.

    with FakeProvider([Turn.call("get_run", run_id=5), Turn.answer(summary="…", actionIds=[3])]) as fake:
        env = {"ANTHROPIC_BASE_URL": fake.url, "ANTHROPIC_API_KEY": "sk-test"}
        …                                   # the real SDK, the real HTTP stack, this server
        fake.requests[0].tools              # what the model was offered in step 1

One server answers every route it knows, chosen by the request's path:

- Anthropic Messages          POST …/v1/messages                       (also Langdock's /anthropic/<region>/…)
- OpenAI Chat Completions     POST …/chat/completions                  (also Langdock's /openai/<region>/…, any
                                                                        OpenAI-compatible gateway)
- Google Gemini               POST …/models/<model>:generateContent

Replies come from a script of `Turn`s, one per request, in order; each request is recorded
(path, headers, JSON body) with accessors that read it the same way whatever the wire format:
the model asked for, the tool names offered, and the tool results sent back.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Turn:
    """What the fake model answers in one step: tool calls, or text."""

    calls: tuple[tuple[str, dict[str, Any]], ...] = ()
    text: str | None = None
    status: int = 200
    """Anything but 200 answers with that HTTP status and a provider-shaped error body."""
    delay: float = 0.0

    @classmethod
    def call(cls, name: str, /, **arguments: Any) -> Turn:
        return cls(calls=((name, arguments),))

    @classmethod
    def calls_(cls, *calls: tuple[str, dict[str, Any]]) -> Turn:
        return cls(calls=tuple(calls))

    @classmethod
    def answer(cls, **output: Any) -> Turn:
        """The structured answer, through the output tool the loop offers (`final_result`)."""
        return cls(calls=(("final_result", output),))


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]

    @property
    def wire(self) -> str:
        if ":generateContent" in self.path:
            return "google"
        if self.path.split("?")[0].endswith("/messages"):
            return "anthropic"
        return "openai"

    @property
    def model(self) -> str:
        if self.wire == "google":
            return self.path.split("/models/")[1].split(":")[0]
        return str(self.body["model"])

    @property
    def tools(self) -> list[str]:
        """The names of the tools offered in this request."""
        tools = self.body.get("tools") or []
        if self.wire == "anthropic":
            return [t["name"] for t in tools]
        if self.wire == "openai":
            return [t["function"]["name"] for t in tools]
        return [d["name"] for t in tools for d in t.get("functionDeclarations") or []]

    @property
    def tool_results(self) -> list[str]:
        """The tool results in this request's conversation, as text, oldest first."""
        found: list[str] = []
        if self.wire == "anthropic":
            for message in self.body["messages"]:
                for block in message["content"] if isinstance(message["content"], list) else []:
                    if block.get("type") == "tool_result":
                        content = block.get("content")
                        found.append(content if isinstance(content, str)
                                     else "".join(part.get("text", "") for part in content or []))
        elif self.wire == "openai":
            found = [m["content"] if isinstance(m["content"], str) else json.dumps(m["content"])
                     for m in self.body["messages"] if m["role"] == "tool"]
        else:
            for content in self.body.get("contents") or []:
                for part in content.get("parts") or []:
                    if "functionResponse" in part:
                        response = part["functionResponse"].get("response") or {}
                        value = response.get("return_value", response) if isinstance(response, dict) else response
                        found.append(value if isinstance(value, str) else json.dumps(value))
        return found

    @property
    def text(self) -> str:
        return json.dumps(self.body)


# --- Wire formats ---------------------------------------------------------------------------------


def _anthropic(turn: Turn, model: str, index: int) -> dict[str, Any]:
    content: list[dict[str, Any]] = [{"type": "text", "text": turn.text}] if turn.text else []
    content += [{"type": "tool_use", "id": f"toolu_{index}_{n}", "name": name, "input": args}
                for n, (name, args) in enumerate(turn.calls)]
    return {"id": f"msg_{index}", "type": "message", "role": "assistant", "model": model, "content": content,
            "stop_reason": "tool_use" if turn.calls else "end_turn", "stop_sequence": None,
            "usage": {"input_tokens": 100 + index, "output_tokens": 10 + index}}


def _openai(turn: Turn, model: str, index: int) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": turn.text}
    if turn.calls:
        message["tool_calls"] = [
            {"id": f"call_{index}_{n}", "type": "function",
             "function": {"name": name, "arguments": json.dumps(args)}}
            for n, (name, args) in enumerate(turn.calls)]
    return {"id": f"chatcmpl-{index}", "object": "chat.completion", "created": 1_767_225_600, "model": model,
            "choices": [{"index": 0, "message": message, "logprobs": None,
                         "finish_reason": "tool_calls" if turn.calls else "stop"}],
            "usage": {"prompt_tokens": 100 + index, "completion_tokens": 10 + index,
                      "total_tokens": 110 + 2 * index}}


def _google(turn: Turn, model: str, index: int) -> dict[str, Any]:
    parts: list[dict[str, Any]] = [{"text": turn.text}] if turn.text else []
    parts += [{"functionCall": {"name": name, "args": args}} for name, args in turn.calls]
    return {"candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": "STOP", "index": 0}],
            "usageMetadata": {"promptTokenCount": 100 + index, "candidatesTokenCount": 10 + index,
                              "totalTokenCount": 110 + 2 * index},
            "modelVersion": model, "responseId": f"resp-{index}"}


def _error(wire: str, status: int) -> dict[str, Any]:
    if wire == "anthropic":
        return {"type": "error", "error": {"type": "api_error", "message": "fake provider failure"}}
    if wire == "google":
        return {"error": {"code": status, "message": "fake provider failure", "status": "INTERNAL"}}
    return {"error": {"message": "fake provider failure", "type": "server_error", "code": None}}


_ENCODERS = {"anthropic": _anthropic, "openai": _openai, "google": _google}


class FakeProvider:
    """A scripted model provider on a free port of 127.0.0.1 (a context manager)."""

    def __init__(self, turns: Sequence[Turn] | Callable[[Received], Turn]) -> None:
        self.script = turns if callable(turns) else None
        self.turns = [] if callable(turns) else list(turns)
        self.requests: list[Received] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> FakeProvider:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def _next(self, received: Received) -> tuple[int, dict[str, Any], float]:
        with self._lock:
            self.requests.append(received)
            index = len(self.requests)
            if self.script is not None:
                turn = self.script(received)
            elif index > len(self.turns):
                return 500, {"error": {"message": f"the fake was scripted for {len(self.turns)} requests"}}, 0.0
            else:
                turn = self.turns[index - 1]
        if turn.status != 200:
            return turn.status, _error(received.wire, turn.status), turn.delay
        return 200, _ENCODERS[received.wire](turn, received.model, index), turn.delay

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b"{}"
                received = Received(self.path, {k.lower(): v for k, v in self.headers.items()}, json.loads(raw))
                status, body, delay = fake._next(received)
                if delay:
                    threading.Event().wait(delay)
                payload = json.dumps(body).encode()
                try:
                    self.send_response(status)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except OSError:
                    pass  # the client gave up (a timeout test)

        return Handler


def diagnoser(received: Received) -> Turn:
    """A scripted model for the failure diagnosis on any run: get_run, then the failed action's log,
    then an answer quoting the log's last line — whatever the wire format."""
    prompt = re.search(r"Run (\d+) failed", received.text)
    assert prompt is not None, "not a diagnosis request"
    run_id = int(prompt.group(1))
    results = received.tool_results
    if not results:
        return Turn.call("get_run", run_id=run_id)
    if len(results) == 1:
        run = json.loads(results[0])
        return Turn.call("get_action_log", run_id=run_id, action=run["failed_action"]["id"], tail=20)
    log = json.loads(results[-1])
    last = log["lines"][-1]["text"] if log.get("lines") else "no log"
    return Turn.answer(summary=f"Run {run_id} failed in {log['action']['name']}: {last[:200]}",
                       actionIds=[log["action"]["id"]])


@dataclass
class Script:
    """Turns built up step by step in a test: `Script().then(...).then(...)`."""

    turns: list[Turn] = field(default_factory=list)

    def then(self, turn: Turn) -> Script:
        self.turns.append(turn)
        return self

    def __iter__(self) -> Iterator[Turn]:
        return iter(self.turns)
