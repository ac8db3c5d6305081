"""Destinations: apprise for people's channels, a Standard Webhooks POST for machines.

Each `send` takes a rendered, scrubbed `Message` and returns when the destination accepted it,
or raises `DeliveryError` (with a message safe to store: no URL secrets, no query strings).
Foreign exceptions (httpx's, apprise's) are translated here, where they enter.

apprise is synchronous (requests, smtplib): a send runs in a worker thread, bounded by a
capacity limiter and by the per-attempt timeout, so a dead channel holds a thread for at most
that long and never the event loop. apprise is imported only when a channel is configured.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

import anyio
import anyio.to_thread

from mcp_knecht.errors import DeliveryError
from mcp_knecht.notify.config import WEBHOOK, Channel, NotifyConfig, Webhook
from mcp_knecht.notify.messages import Message

USER_AGENT = "mcp-knecht-notify/1"
_SEVERITY = {"info": "info", "success": "success", "warning": "warning", "failure": "failure"}


class Destination(Protocol):
    name: str

    async def send(self, message: Message) -> None: ...


@contextmanager
def _apprise_quietly() -> Iterator[Any]:
    """apprise, imported on first use; its import of `imghdr` warns on Python 3.11+."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import apprise

        yield apprise


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def check_apprise_url(url: str) -> str | None:
    """None if apprise can use `url`, else what it said (apprise masks URL secrets in its logs)."""
    collect = _Collect()
    logger = logging.getLogger("apprise")
    logger.addHandler(collect)
    try:
        with _apprise_quietly() as apprise:
            instance = apprise.Apprise.instantiate(url, asset=_asset(apprise))
    finally:
        logger.removeHandler(collect)
    if instance is not None:
        return None
    return "; ".join(collect.lines[-2:]) or "unknown scheme or malformed URL"


def _asset(apprise: Any) -> Any:
    # No files of apprise's own on disk (its persistent store); we keep state in the outbox.
    return apprise.AppriseAsset(storage_mode="memory")


class AppriseDestination:
    def __init__(self, channel: Channel, *, timeout: float, limiter: anyio.CapacityLimiter) -> None:
        self.name = channel.name
        self._url = channel.url
        self._timeout = timeout
        self._limiter = limiter

    def _send_blocking(self, message: Message) -> None:
        with _apprise_quietly() as apprise:
            sender = apprise.Apprise(asset=_asset(apprise))
            if not sender.add(self._url):
                raise DeliveryError(f"{self.name}: apprise cannot use the channel's URL", permanent=True)
            with sender.notify(body=message.body, title=message.title, notify_type=_SEVERITY[message.severity],
                               body_format="text", timeout=self._timeout) as result:
                if result:
                    return
                said = [entry.message for entry in result.logs if entry.level in ("ERROR", "WARNING")]
                status = getattr(result.status, "name", str(result.status)).lower()
        raise DeliveryError(f"{self.name}: {status}" + (f": {said[-1]}" if said else ""))

    async def send(self, message: Message) -> None:
        # The thread is abandoned on cancellation (shutdown); apprise's own timeout ends it.
        await anyio.to_thread.run_sync(self._send_blocking, message, limiter=self._limiter, abandon_on_cancel=True)


def redact_url(url: str) -> str:
    """scheme://host[:port]/path: what an error message may say about where it went."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


class WebhookDestination:
    """POST the event as JSON, signed per Standard Webhooks (`webhook-id`, `webhook-timestamp`,
    `webhook-signature: v1,<base64 HMAC-SHA256>`). 2xx is success; 410 Gone fails for good;
    anything else is retried."""

    name = WEBHOOK

    def __init__(self, webhook: Webhook, client: Any, *, timeout: float) -> None:
        import standardwebhooks

        self._url = webhook.url
        self._where = redact_url(webhook.url)
        self._signer = standardwebhooks.Webhook(webhook.secret)
        self._client = client
        self._timeout = timeout

    def headers(self, message: Message, now: datetime | None = None) -> dict[str, str]:
        moment = (now or datetime.now(UTC)).astimezone(UTC)
        return {
            "content-type": "application/json",
            "user-agent": USER_AGENT,
            "webhook-id": message.uid,
            "webhook-timestamp": str(int(moment.timestamp())),
            "webhook-signature": self._signer.sign(message.uid, moment, message.json_body),
        }

    async def send(self, message: Message) -> None:
        import httpx

        try:
            response = await self._client.post(self._url, content=message.json_body.encode(),
                                               headers=self.headers(message), timeout=self._timeout)
        except httpx.TimeoutException:
            raise DeliveryError(f"webhook: no answer from {self._where} within {self._timeout:g}s") from None
        except httpx.HTTPError as exc:
            raise DeliveryError(f"webhook: {type(exc).__name__} reaching {self._where}") from None
        if 200 <= response.status_code < 300:
            return
        raise DeliveryError(f"webhook: HTTP {response.status_code} from {self._where}",
                            permanent=response.status_code == 410)


def destinations(config: NotifyConfig, http_client: Any) -> dict[str, Destination]:
    """Every configured destination by name (channels and, if set, the webhook)."""
    limiter = anyio.CapacityLimiter(max(1, config.delivery.concurrency))
    found: dict[str, Destination] = {
        name: AppriseDestination(channel, timeout=config.delivery.timeout, limiter=limiter)
        for name, channel in config.channels.items()
    }
    if config.webhook is not None:
        found[WEBHOOK] = WebhookDestination(config.webhook, http_client, timeout=config.delivery.timeout)
    return found
