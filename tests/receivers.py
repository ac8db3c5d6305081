"""Local receivers for notification tests (loopback only, no network): a webhook endpoint that
verifies Standard Webhooks signatures with the `standardwebhooks` package and counts what it
took, and an SMTP server (aiosmtpd) for apprise's mailto://."""

from __future__ import annotations

import base64
import contextlib
import json
import secrets
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from email import message_from_bytes
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import anyio
import pytest
from standardwebhooks import Webhook, WebhookVerificationError

from tests.servers import free_port


class _Server(ThreadingHTTPServer):
    request_queue_size = 256  # the default 5 drops concurrent connects (a 1 s SYN retry each)
    daemon_threads = True


def new_webhook_secret() -> str:
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


@dataclass
class Delivery:
    webhook_id: str
    body: str
    payload: dict[str, Any]


@dataclass
class WebhookReceiver:
    """`mode`: "up" answers 200 and records; "down" answers 503; "gone" answers 410; "hang"
    holds the request until `release()` (then 503), as an endpoint that never answers."""

    secret: str
    url: str = ""
    mode: str = "up"
    delivered: list[Delivery] = field(default_factory=list)
    refused: int = 0
    bad_signatures: int = 0
    hanging: int = 0
    _release: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def release(self) -> None:
        self._release.set()

    def ids(self) -> Counter[str]:
        with self._lock:
            return Counter(d.webhook_id for d in self.delivered)

    def events(self) -> list[dict[str, Any]]:
        with self._lock:
            return [d.payload for d in self.delivered]

    async def wait_for(self, count: int, timeout: float = 20.0) -> list[Delivery]:
        """Until `count` deliveries were taken (the event loop keeps running meanwhile)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if len(self.delivered) >= count:
                    return list(self.delivered)
            await anyio.sleep(0.02)
        raise AssertionError(f"only {len(self.delivered)} of {count} webhook deliveries arrived in {timeout}s")

    def _handle(self, handler: BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("content-length") or 0)
        body = handler.rfile.read(length).decode()
        headers = {name: value for name, value in handler.headers.items()}
        try:
            payload = Webhook(self.secret).verify(body, headers)
        except WebhookVerificationError:
            with self._lock:
                self.bad_signatures += 1
            handler.send_response(401)
            handler.end_headers()
            return
        mode = self.mode
        if mode == "hang":
            with self._lock:
                self.hanging += 1
            self._release.wait(120)
            mode = "down"
        if mode == "up":
            with self._lock:
                self.delivered.append(Delivery(headers.get("webhook-id") or headers.get("Webhook-Id", ""),
                                               body, payload))
            handler.send_response(200)
        else:
            with self._lock:
                self.refused += 1
            handler.send_response(410 if mode == "gone" else 503)
        handler.send_header("content-length", "0")
        handler.end_headers()


def _handler_for(receiver: WebhookReceiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the sender was killed
                receiver._handle(self)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


@pytest.fixture
def webhook_receiver() -> Iterator[WebhookReceiver]:
    receiver = WebhookReceiver(secret=new_webhook_secret())
    server = _Server(("127.0.0.1", 0), _handler_for(receiver))
    server.daemon_threads = True
    receiver.url = f"http://127.0.0.1:{server.server_address[1]}/hooks/knecht"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        receiver.release()
        server.shutdown()
        server.server_close()


@dataclass
class Mailbox:
    port: int
    messages: list[Message] = field(default_factory=list)

    def url(self, to: str = "ops@example.com") -> str:
        return f"mailto://127.0.0.1:{self.port}?from=knecht@example.com&to={to}&mode=insecure"

    async def wait_for(self, count: int, timeout: float = 20.0) -> list[Message]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if len(self.messages) >= count:
                return list(self.messages)
            await anyio.sleep(0.02)
        raise AssertionError(f"only {len(self.messages)} of {count} mails arrived in {timeout}s")


def text_of(mail: Message) -> str:
    """Subject and every text part, decoded."""
    parts = [str(mail["Subject"])]
    for part in mail.walk():
        if part.get_content_maintype() == "text":
            payload = part.get_payload(decode=True)
            if isinstance(payload, bytes):
                parts.append(payload.decode(part.get_content_charset() or "utf-8"))
    return "\n".join(parts)


@pytest.fixture
def mailbox() -> Iterator[Mailbox]:
    from aiosmtpd.controller import Controller

    box = Mailbox(port=free_port())

    class Collect:
        async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
            box.messages.append(message_from_bytes(envelope.content))
            return "250 OK"

    controller = Controller(Collect(), hostname="127.0.0.1", port=box.port)
    controller.start()
    try:
        yield box
    finally:
        controller.stop()


def webhook_payloads(receiver: WebhookReceiver) -> list[str]:
    return [json.dumps(event) for event in receiver.events()]
