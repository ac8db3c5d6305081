"""Database URLs: `sqlite:///PATH`, a bare path, or `postgresql://…`."""

from __future__ import annotations

from pathlib import Path

from mcp_knecht.errors import ConfigError


def sqlite_path(url: str) -> Path:
    """The file path of a SQLite URL (or of a bare path)."""
    if url.startswith("sqlite:///"):
        return Path(url.removeprefix("sqlite:///")).expanduser()
    if url.startswith("sqlite://"):
        raise ConfigError(f"SQLite URL {url!r} needs three slashes: sqlite:///path/to/file.db")
    return Path(url).expanduser()


def dialect_of(url: str) -> str:
    if url.startswith(("postgresql://", "postgres://")):
        return "postgresql"
    if url.startswith("sqlite:") or "://" not in url:
        return "sqlite"
    scheme = url.split("://", 1)[0]
    raise ConfigError(f"Unsupported database URL scheme {scheme!r}: use sqlite:///PATH or postgresql://…")


def normalise(url: str) -> str:
    """A bare path becomes a sqlite URL with an absolute path."""
    if dialect_of(url) == "sqlite":
        return "sqlite:///" + str(sqlite_path(url).resolve())
    return url
