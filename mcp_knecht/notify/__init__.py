"""Notifications: tell approvers of waiting proposals and proposers of outcomes, through apprise
channels and a signed webhook, from an outbox written with each state change.

    events.py    which change is told, the snapshot each event carries
    config.py    `[notify]` in knecht.toml and KNECHT_WEBHOOK_URL / KNECHT_WEBHOOK_SECRET
    outbox.py    the outbox and delivery rows in SQL: write, route, claim, record, status
    messages.py  the text for people and the JSON body for machines
    channels.py  apprise and Standard Webhooks destinations
    worker.py    the background delivery loop (retries, backoff, leases)
    service.py   the worker as a task of a running server
"""

from mcp_knecht.notify.config import NotifyConfig, load_notify_config, notify_environment
from mcp_knecht.notify.events import EVENT_FOR_STATUS, EVENTS
from mcp_knecht.notify.outbox import OutboxWriter
from mcp_knecht.notify.service import notification_worker, notify_config
from mcp_knecht.notify.worker import NotifyWorker

__all__ = [
    "EVENTS",
    "EVENT_FOR_STATUS",
    "NotifyConfig",
    "NotifyWorker",
    "OutboxWriter",
    "load_notify_config",
    "notification_worker",
    "notify_config",
    "notify_environment",
]
