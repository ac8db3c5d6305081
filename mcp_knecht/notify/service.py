"""Notifications in a running server: the configuration checked against what is served, and the
worker with its HTTP client, as one task for the server's task group."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from functools import partial
from typing import TYPE_CHECKING, Any

from mcp_knecht.notify.channels import check_apprise_url, destinations
from mcp_knecht.notify.config import NotifyConfig, load_notify_config, served_calls
from mcp_knecht.notify.worker import NotifyWorker, WakeupSource
from mcp_knecht.store.database import Database

if TYPE_CHECKING:
    from mcp_knecht.app import App
    from mcp_knecht.config import Settings
    from mcp_knecht.core.registry import Registry


def notify_config(settings: Settings, registry: Registry) -> NotifyConfig:
    """`[notify]` and the webhook as the server will use them; `ConfigError` names what is wrong."""
    return load_notify_config(settings.config_dir, settings.env, check_channel=check_apprise_url,
                              check_call=served_calls(list(registry)))


async def serve_notifications(db: Database, config: NotifyConfig, *, scrub: Callable[[str], str],
                              expire: Callable[[str], Awaitable[int]] | None,
                              wakeups: WakeupSource | None) -> None:
    """Run the delivery worker until cancelled."""
    import httpx2

    async with httpx2.AsyncClient(follow_redirects=False) as client:
        worker = NotifyWorker(db, config, destinations(config, client), scrub=scrub, expire=expire,
                              wakeups=wakeups)
        await worker.run()


def _store_wakeups(db: Database) -> WakeupSource | None:
    """PostgreSQL announces every proposal change (the outbox is written in the same transaction)."""
    if db.dialect != "postgresql":
        return None
    from mcp_knecht.store.notify import decision_notifier

    notifier = decision_notifier(db)
    return lambda: notifier.watching(None)


def notification_worker(app: App) -> Callable[[], Coroutine[Any, Any, None]]:
    """The worker for `app`'s task group. Reads and checks the configuration now, so a bad one
    stops the server at start; the configured secrets join the scrubber."""
    config = notify_config(app.settings, app.registry)
    app.secrets.add(config.secrets)
    return partial(serve_notifications, app.db, config, scrub=app.secrets, expire=app.proposals.expire_overdue,
                   wakeups=_store_wakeups(app.db))
