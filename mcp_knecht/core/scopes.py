"""The scope catalogue and named token profiles, read from `scopes/` in the config dir."""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec

from mcp_knecht.errors import ConfigError

CATALOGUE_FILE = "catalogue.toml"
PROFILES_FILE = "profiles.toml"


class Profile(msgspec.Struct, frozen=True):
    """A named set of scopes tokens are minted from (`--profile`)."""
    name: str
    description: str
    scopes: tuple[str, ...]


class ScopeCatalogue(msgspec.Struct, frozen=True):
    """Every scope with its description, and the profiles built from them."""
    scopes: Mapping[str, str]
    profiles: Mapping[str, Profile]

    def profile(self, name: str) -> Profile:
        try:
            return self.profiles[name]
        except KeyError:
            known = ", ".join(sorted(self.profiles)) or "none"
            raise ConfigError(f"No token profile named {name!r}; profiles: {known}.") from None

    def check_known(self, scopes: list[str] | tuple[str, ...], where: str) -> None:
        unknown = [s for s in scopes if s not in self.scopes]
        if unknown:
            raise ConfigError(
                f"{where}: unknown scope(s) {', '.join(map(repr, unknown))}; "
                f"the catalogue has: {', '.join(sorted(self.scopes))}."
            )


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError:
        raise ConfigError(f"{path} is missing.") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: syntax error: {exc}") from None


def load_scopes(scopes_dir: Path) -> ScopeCatalogue:
    catalogue_path = scopes_dir / CATALOGUE_FILE
    raw = _read_toml(catalogue_path).get("scopes")
    if not isinstance(raw, dict) or not all(isinstance(v, str) for v in raw.values()):
        raise ConfigError(f"{catalogue_path}: expected a [scopes] table of \"scope\" = \"description\".")
    profiles_path = scopes_dir / PROFILES_FILE
    raw_profiles = _read_toml(profiles_path).get("profiles", {}) if profiles_path.exists() else {}
    catalogue = ScopeCatalogue(scopes=dict(raw), profiles={})
    profiles: dict[str, Profile] = {}
    for name, body in raw_profiles.items():
        scopes = body.get("scopes") if isinstance(body, dict) else None
        if not isinstance(scopes, list) or not all(isinstance(s, str) for s in scopes):
            raise ConfigError(f"{profiles_path}: profiles.{name}.scopes must be a list of scope names.")
        catalogue.check_known(scopes, f"{profiles_path}: profiles.{name}")
        profiles[name] = Profile(name, str(body.get("description", "")), tuple(scopes))
    return ScopeCatalogue(scopes=dict(raw), profiles=profiles)
