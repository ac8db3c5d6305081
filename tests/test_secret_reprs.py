"""No repr shows a secret: settings, keys and notification targets end up in logs and tracebacks.

Value objects are msgspec Structs, which have no per-field `repr=False`; each class holding a
secret writes its own `__repr__` (`core/hidden_repr.py`). These tests hold every one of them to it.
"""

from __future__ import annotations

from pathlib import Path

from mcp_knecht.core.keys import ServerKeys
from mcp_knecht.core.settings import VARIABLES, load_settings
from mcp_knecht.notify.config import Channel, NotifyEnvironment, Webhook

# The settings that carry a secret, named by their `Settings` attribute.
SECRET_SETTINGS = ("token", "jwt_secret", "server_key", "operator_token", "entities_key", "metrics_token",
                   "openai_compatible_api_key", "webhook_url", "webhook_secret")


def test_the_settings_repr_shows_no_secret_and_not_the_environment(tmp_path: Path) -> None:
    by_field = {variable.field: variable.name for variable in VARIABLES}
    secrets = {by_field[field]: f"secret-{field}-Zq8sK2vY7pLm" for field in SECRET_SETTINGS}
    env = {**secrets, "KNECHT_DATA_DIR": str(tmp_path), "UNRELATED_PASSWORD": "secret-env-Hw3nB8xQ"}
    settings = load_settings(env=env)
    assert [getattr(settings, field) for field in SECRET_SETTINGS] == list(secrets.values())
    shown = repr(settings)
    assert shown.startswith("Settings(data_dir=") and "jwt_issuer=" in shown
    assert "secret-" not in shown, shown


def test_keys_and_notification_targets_show_no_secret() -> None:
    secret = "secret-value-Zq8sK2vY7pLmW4rT9xB5nH2"  # a server key is at least 32 bytes
    shown = [
        repr(ServerKeys(secret.encode())),
        repr(NotifyEnvironment(webhook_url=f"https://hooks.example/{secret}", webhook_secret=secret,
                               values={"TOKEN": secret})),
        repr(Channel("ops", f"https://chat.example/{secret}", secrets=(secret,))),
        repr(Webhook(f"https://hooks.example/{secret}", secret)),
    ]
    assert shown[2] == "Channel(name='ops')"
    assert not [text for text in shown if secret in text], shown
