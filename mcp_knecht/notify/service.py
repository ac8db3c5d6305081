"""Notifications in a running server: the configuration checked against what is served, and the
worker with its HTTP client, as one task for the server's task group."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from functools import partial
from typing import TYPE_CHECKING, Any

from mcp_knecht.core.changes import ChangeFeed
from mcp_knecht.core.database import Database
from mcp_knecht.notify.channels import check_apprise_url, destinations
from mcp_knecht.notify.config import NotifyConfig, load_notify_config, served_calls
from mcp_knecht.notify.worker import NotifyWorker, WakeupSource

if TYPE_CHECKING:
    from mcp_knecht.app import App
    from mcp_knecht.core.registry import Registry
    from mcp_knecht.core.settings import Settings


def notify_config(settings: Settings, registry: Registry) -> NotifyConfig:
    """`[notify]` and the webhook as the server will use them; `ConfigError` names what is wrong."""
    return load_notify_config(settings, check_channel=check_apprise_url, check_call=served_calls(list(registry)))


async def serve_notifications(db: Database, config: NotifyConfig, *, scrub: Callable[[str], str],
                              wakeups: WakeupSource | None) -> None:
    """Run the delivery worker until cancelled."""
    if config.webhook is None:  # only the webhook speaks HTTP itself: no client (and its TLS set-up) without it
        await NotifyWorker(db, config, destinations(config, None), scrub=scrub, wakeups=wakeups).run()
        return
    import httpx

    async with httpx.AsyncClient(follow_redirects=False) as client:
        worker = NotifyWorker(db, config, destinations(config, client), scrub=scrub, wakeups=wakeups)
        await worker.run()


def _store_wakeups(db: Database, changes: ChangeFeed) -> WakeupSource | None:
    """On PostgreSQL every proposal change is pushed (and the outbox row commits with it); polling
    stores gain nothing from the feed over the worker's own pause."""
    if db.dialect != "postgresql":
        return None
    return lambda: changes.watching("proposals")


def notification_worker(app: App) -> Callable[[], Coroutine[Any, Any, None]]:
    """The worker for `app`'s task group. Reads and checks the configuration now, so a bad one
    stops the server at start; the configured secrets join the scrubber. (Expiry is written by
    the server's own sweep; its status hook writes `proposal.expired`.)"""
    config = notify_config(app.settings, app.registry)
    app.secrets.add(config.secrets)
    return partial(serve_notifications, app.db, config, scrub=app.secrets,
                   wakeups=_store_wakeups(app.db, app.changes))
