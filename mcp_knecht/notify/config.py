"""`[notify]` in `<config dir>/knecht.toml`, and the webhook from the environment.

    [notify]
    public_url = "https://knecht.example.com"  # optional: links go to /proposals/{id} there;
                                               # without it messages name `knecht-approve show ID`
    pending  = ["ops"]                         # who is told of a new pending proposal (default route)
    proposer = ["dev"]                         # who is told when one is decided, executed, failed or expired

    [notify.tools]                             # optional: pending proposals of these go here instead
    rerun_run = ["release"]                    # (most specific first: Tool.Action, then Tool)
    "project_variable.set" = ["security"]

    [notify.channels]                          # one apprise URL per channel
    ops     = "mailto://${SMTP_USER}:${SMTP_PASSWORD}@smtp.example.com?to=ops@example.com"
    release = "slack://${KNECHT_SLACK_TOKEN}/#releases"
    dev     = { url = "ntfy://${NTFY_TOPIC}" } # the same, as a table

    [notify.delivery]                          # optional; the defaults
    timeout = "10s"                            # per attempt
    max_attempts = 10                          # then the delivery is `failed` (shown by `notify status`)
    backoff = "10s"                            # first retry; doubles each time …
    max_backoff = "1h"                         # … up to this
    retention = "7d"                           # delivered and failed rows are kept this long
    concurrency = 8                            # deliveries in flight per server

Secrets never stand in the file: `${NAME}` takes the value of environment variable NAME (inserted
as it is, so URL-encode special characters), and every such value joins the scrubber. A literal
password in a URL's user part or in a `password=`/`token=`-like query parameter is refused.

Parsing fails closed, like the policy: a syntax error, an unknown key, a channel that apprise
cannot use, an unset variable, a route to an unknown channel or a tool that is not served stops
the server with a message naming the file and the key. Other top-level tables of knecht.toml
belong to other features and are not read here.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import msgspec

from mcp_knecht.core.hidden_repr import repr_without
from mcp_knecht.core.settings import WEBHOOK_SECRET, WEBHOOK_URL, Settings
from mcp_knecht.errors import ConfigError, UsageError

FILE_NAME = "knecht.toml"
WEBHOOK = "webhook"
"""The destination name of the signed webhook (reserved: no channel may take it)."""

WEBHOOK_URL_ENV = WEBHOOK_URL.name
WEBHOOK_SECRET_ENV = WEBHOOK_SECRET.name
MIN_WEBHOOK_SECRET_BYTES = 24

_KEYS = {"public_url", "pending", "proposer", "tools", "channels", "delivery"}
_CHANNEL_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,39}$")
_PLACEHOLDER = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_SECRET_QUERY = re.compile(r"^(?:pass(?:word)?|pwd|secret|\w*token|api_?key|key|auth_?key|\w*_secret)$", re.IGNORECASE)


# --- what comes from the environment (read by the settings module) -------------------------------


class NotifyEnvironment(msgspec.Struct, frozen=True):
    """What `[notify]` may take from the environment: the webhook's URL and secret, `${NAME}` values."""
    webhook_url: str | None = None
    webhook_secret: str | None = None
    values: Mapping[str, str] = msgspec.field(default_factory=dict)
    """Every variable, for `${NAME}` in channel URLs."""

    def __repr__(self) -> str:
        return repr_without(self, ("webhook_url", "webhook_secret", "values"))


def notify_environment(settings: Settings) -> NotifyEnvironment:
    """The settings notifications use: the webhook (`KNECHT_WEBHOOK_URL`, `KNECHT_WEBHOOK_SECRET`)
    and the environment for the variables channel URLs name."""
    return NotifyEnvironment(webhook_url=settings.webhook_url, webhook_secret=settings.webhook_secret,
                             values=settings.env)


# --- the configuration ---------------------------------------------------------------------------


class Delivery(msgspec.Struct, frozen=True):
    """How deliveries are attempted: timeout, retries with backoff, and how long rows are kept."""
    timeout: float = 10.0
    max_attempts: int = 10
    backoff: float = 10.0
    max_backoff: float = 3600.0
    retention: float = 7 * 86400.0
    concurrency: int = 8

    def retry_delay(self, attempts: int) -> float:
        """Seconds before attempt `attempts + 1`: exponential, bounded by `max_backoff`."""
        return float(min(self.max_backoff, self.backoff * 2 ** max(0, attempts - 1)))


class Channel(msgspec.Struct, frozen=True):
    """A named destination of messages (a chat or webhook URL)."""
    name: str
    url: str
    """With the variables filled in: secret. Never stored, logged or shown."""
    secrets: tuple[str, ...] = ()

    def __repr__(self) -> str:
        return repr_without(self, ("url", "secrets"))


class Webhook(msgspec.Struct, frozen=True):
    """The signed webhook every event goes to, when configured."""
    url: str
    secret: str

    def __repr__(self) -> str:
        return repr_without(self, ("url", "secret"))


class Route(msgspec.Struct, frozen=True):
    """Where one event goes, and the setting that sent it there."""
    destinations: tuple[str, ...]
    because: str
    """Which setting chose them, e.g. `notify.tools.rerun_run` (decisions are data)."""


class Routes(msgspec.Struct, frozen=True):
    """Which channels hear of what: pending proposals (per tool or rule, else `pending`), the rest `proposer`."""
    pending: tuple[str, ...] = ()
    proposer: tuple[str, ...] = ()
    tools: Mapping[str, tuple[str, ...]] = msgspec.field(default_factory=dict)
    rules: Mapping[str, tuple[str, ...]] = msgspec.field(default_factory=dict)
    """Per policy rule (keyed by the proposal's `rule`), the most specific route of all: the
    policy's `[[rules]]` fill it once they carry channels; nothing sets it yet."""

    def channels_for(self, event: str, facts: Mapping[str, Any]) -> Route:
        if event != "proposal.pending":
            return Route(self.proposer, "notify.proposer")
        candidates = [(self.rules, facts.get("rule"), "rule"),
                      (self.tools, facts.get("call"), "notify.tools"),
                      (self.tools, facts.get("tool"), "notify.tools")]
        for table, key, where in candidates:
            if isinstance(key, str) and key in table:
                return Route(table[key], f"{where}.{key}")
        return Route(self.pending, "notify.pending")


class NotifyConfig(msgspec.Struct, frozen=True):
    """The checked `[notify]` configuration: channels, routes and delivery settings."""
    channels: Mapping[str, Channel] = msgspec.field(default_factory=dict)
    routes: Routes = msgspec.field(default_factory=Routes)
    delivery: Delivery = msgspec.field(default_factory=Delivery)
    public_url: str | None = None
    webhook: Webhook | None = None
    source: str = "(defaults)"

    @property
    def secrets(self) -> set[str]:
        """Every secret value the configuration holds, for the scrubber."""
        values = {value for channel in self.channels.values() for value in channel.secrets}
        if self.webhook is not None:
            values.add(self.webhook.secret)
        return values

    @property
    def destinations(self) -> list[str]:
        return [*self.channels, *([WEBHOOK] if self.webhook else [])]

    def route(self, event: str, facts: Mapping[str, Any]) -> tuple[str, ...]:
        """Every destination of `event`: its channels, and the webhook (which hears everything)."""
        chosen = self.routes.channels_for(event, facts).destinations
        return (*chosen, WEBHOOK) if self.webhook is not None else chosen


# --- parsing -------------------------------------------------------------------------------------


ChannelCheck = Callable[[str], str | None]
"""`check(url) -> problem or None`: can the delivery library use this URL? (apprise, in channels.py)"""
CallCheck = Callable[[str], str | None]
"""`check("tool" or "tool.action") -> problem or None`: is this call served?"""


class _Parser:
    def __init__(self, path: Path, env: NotifyEnvironment) -> None:
        self.path = path
        self.env = env

    def fail(self, key: str, problem: str) -> ConfigError:
        return ConfigError(f"{self.path}: {key}: {problem}")

    def duration(self, key: str, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise self.fail(key, f"expected a duration such as \"10s\" or a number of seconds, not {value!r}")
        if isinstance(value, str):
            from mcp_knecht.core.durations import parse_duration

            try:
                seconds = parse_duration(value, what=key).total_seconds()
            except UsageError as exc:
                raise self.fail(key, exc.message) from None
        else:
            seconds = float(value)
        if not 0 < seconds <= timedelta(days=365).total_seconds():
            raise self.fail(key, f"{value!r} must be longer than zero and at most a year")
        return seconds

    def integer(self, key: str, value: Any, low: int, high: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise self.fail(key, f"expected a whole number from {low} to {high}, not {value!r}")
        return value

    def names(self, key: str, value: Any, channels: Mapping[str, Channel]) -> tuple[str, ...]:
        listed = [value] if isinstance(value, str) else value
        if not isinstance(listed, list) or not all(isinstance(item, str) for item in listed):
            raise self.fail(key, f"expected a list of channel names such as [\"ops\"], not {value!r}")
        for name in listed:
            if name not in channels:
                known = ", ".join(sorted(channels)) or "none are configured under [notify.channels]"
                raise self.fail(key, f"unknown channel {name!r}; channels: {known}")
        return tuple(dict.fromkeys(listed))

    def fill(self, key: str, template: str) -> tuple[str, tuple[str, ...]]:
        """`${NAME}` → the variable's value; refuses literal secrets and unset variables."""
        self.refuse_literal_secrets(key, template)
        used: list[str] = []

        def value_of(match: re.Match[str]) -> str:
            name = match[1]
            value = self.env.values.get(name)
            if not value:
                raise self.fail(key, f"environment variable {name} is not set (the URL refers to ${{{name}}})")
            used.append(value)
            return value

        return _PLACEHOLDER.sub(value_of, template), tuple(used)

    def refuse_literal_secrets(self, key: str, template: str) -> None:
        advice = "put the secret in an environment variable and write ${NAME} instead"
        parts = urlsplit(template)
        if "@" in parts.netloc:
            userinfo = parts.netloc.rsplit("@", 1)[0]
            _, colon, password = userinfo.partition(":")
            if colon and password and not _PLACEHOLDER.fullmatch(password):
                raise self.fail(key, f"the URL holds a literal password; {advice}")
        for name, value in parse_qsl(parts.query, keep_blank_values=True):
            if _SECRET_QUERY.search(name) and value and not _PLACEHOLDER.fullmatch(value):
                raise self.fail(key, f"query parameter {name!r} holds a literal secret; {advice}")

    def channel(self, name: str, value: Any, check: ChannelCheck | None) -> Channel:
        key = f"notify.channels.{name}"
        if not _CHANNEL_NAME.match(name) or name == WEBHOOK:
            raise self.fail(key, "a channel name is lower-case letters, digits, '-' and '_' (at most 40), "
                                 f"and not {WEBHOOK!r} (that is the KNECHT_WEBHOOK_URL destination)")
        if isinstance(value, dict):
            if extra := sorted(set(value) - {"url"}):
                raise self.fail(f"{key}.{extra[0]}", "unknown key; a channel has only 'url'")
            value, key = value.get("url"), f"{key}.url"
        if not isinstance(value, str) or "://" not in value:
            raise self.fail(key, f"expected an apprise URL such as \"mailto://…\" or \"slack://…\", not {value!r}")
        url, secrets = self.fill(key, value.strip())
        if check is not None and (problem := check(url)):
            for secret in secrets:
                problem = problem.replace(secret, "***")
            raise self.fail(key, f"apprise cannot use this URL: {problem}")
        return Channel(name=name, url=url, secrets=secrets)

    def delivery(self, raw: Any) -> Delivery:
        if not isinstance(raw, dict):
            raise self.fail("notify.delivery", "expected a table: [notify.delivery]")
        known = {"timeout", "max_attempts", "backoff", "max_backoff", "retention", "concurrency"}
        if extra := sorted(set(raw) - known):
            raise self.fail(f"notify.delivery.{extra[0]}", f"unknown key; known: {', '.join(sorted(known))}")
        given: dict[str, Any] = {}
        for name in ("timeout", "backoff", "max_backoff", "retention"):
            if name in raw:
                given[name] = self.duration(f"notify.delivery.{name}", raw[name])
        if "max_attempts" in raw:
            given["max_attempts"] = self.integer("notify.delivery.max_attempts", raw["max_attempts"], 1, 100)
        if "concurrency" in raw:
            given["concurrency"] = self.integer("notify.delivery.concurrency", raw["concurrency"], 1, 64)
        return Delivery(**given)

    def public_url(self, value: Any) -> str:
        parts = urlsplit(value) if isinstance(value, str) else None
        if parts is None or parts.scheme not in ("http", "https") or not parts.netloc:
            raise self.fail("notify.public_url", f"expected the web UI's base URL such as "
                                                 f"\"https://knecht.example.com\", not {value!r}")
        return str(value).rstrip("/")

    def webhook(self) -> Webhook | None:
        url, secret = self.env.webhook_url, self.env.webhook_secret
        if url is None:
            if secret is not None:
                raise ConfigError(f"{WEBHOOK_SECRET_ENV} is set but {WEBHOOK_URL_ENV} is not; set both or neither.")
            return None
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"{WEBHOOK_URL_ENV} must be an http:// or https:// URL.")
        if secret is None:
            raise ConfigError(f"{WEBHOOK_URL_ENV} is set but {WEBHOOK_SECRET_ENV} is not: webhooks are always "
                              "signed (Standard Webhooks). " + _SECRET_ADVICE)
        if len(_secret_bytes(secret)) < MIN_WEBHOOK_SECRET_BYTES:
            raise ConfigError(f"{WEBHOOK_SECRET_ENV} must be 'whsec_' and base64 of at least "
                              f"{MIN_WEBHOOK_SECRET_BYTES} random bytes. " + _SECRET_ADVICE)
        return Webhook(url=url, secret=secret)


_SECRET_ADVICE = ("Make one with: python3 -c \"import base64, secrets; "
                  "print('whsec_' + base64.b64encode(secrets.token_bytes(32)).decode())\"")


def _secret_bytes(secret: str) -> bytes:
    import base64
    import binascii

    encoded = secret.removeprefix("whsec_")
    try:
        return base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
    except (binascii.Error, ValueError):
        return b""


def parse_notify(text: str, path: Path, env: NotifyEnvironment, *, check_channel: ChannelCheck | None = None,
                 check_call: CallCheck | None = None) -> NotifyConfig:
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: syntax error: {exc}") from None
    parser = _Parser(path, env)
    section = raw.get("notify", {})
    if not isinstance(section, dict):
        raise parser.fail("notify", "expected a table: [notify]")
    if extra := sorted(set(section) - _KEYS):
        raise parser.fail(f"notify.{extra[0]}", f"unknown key; [notify] knows {', '.join(sorted(_KEYS))}")
    channels_raw = section.get("channels", {})
    if not isinstance(channels_raw, dict):
        raise parser.fail("notify.channels", "expected a table: [notify.channels]")
    channels = {name: parser.channel(name, value, check_channel) for name, value in channels_raw.items()}
    tools_raw = section.get("tools", {})
    if not isinstance(tools_raw, dict):
        raise parser.fail("notify.tools", "expected a table: [notify.tools]")
    tools: dict[str, tuple[str, ...]] = {}
    for call, value in tools_raw.items():
        if isinstance(value, dict):
            raise parser.fail(f"notify.tools.{call}", "expected a list of channels; write an action as "
                                                      "\"tool.action\" = [...] (quote the key)")
        if check_call is not None and (problem := check_call(call)):
            raise parser.fail(f"notify.tools.{call}", problem)
        tools[call] = parser.names(f"notify.tools.{call}", value, channels)
    routes = Routes(
        pending=parser.names("notify.pending", section.get("pending", []), channels),
        proposer=parser.names("notify.proposer", section.get("proposer", []), channels),
        tools=tools,
    )
    return NotifyConfig(
        channels=channels,
        routes=routes,
        delivery=parser.delivery(section.get("delivery", {})),
        public_url=parser.public_url(section["public_url"]) if "public_url" in section else None,
        webhook=parser.webhook(),
        source=str(path),
    )


def load_notify_config(settings: Settings, *, check_channel: ChannelCheck | None = None,
                       check_call: CallCheck | None = None) -> NotifyConfig:
    """`[notify]` of `<config dir>/knecht.toml` (none: no channels) and the webhook of `settings`."""
    path = settings.config_dir / FILE_NAME
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        text = ""
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    return parse_notify(text, path, notify_environment(settings), check_channel=check_channel,
                        check_call=check_call)


def served_calls(tools: Sequence[Any]) -> CallCheck:
    """A `CallCheck` over the registry's tools: `tool` or `tool.action` must be served."""
    by_name = {tool.name: tool for tool in tools}

    def check(call: str) -> str | None:
        name, _, action = call.partition(".")
        tool = by_name.get(name)
        if tool is None:
            return f"no tool named {name!r} is served"
        if action and action not in tool.actions:
            return f"{name} has no action {action!r}; actions: {', '.join(tool.actions) or 'none'}"
        return None

    return check
