"""Optional API keys (``Authorization: Bearer <key>``), from an env var and/or a key file.

Keys are compared in constant time (``hmac.compare_digest`` against every key, no early exit) and
never logged; a request is known by its key's *name*, which runs record as their submitter.
"""

from __future__ import annotations

import hmac
import os
from dataclasses import dataclass
from pathlib import Path

import yaml

from settings.api import AuthConfig

ANONYMOUS = "api"  # the submitter of requests on a server without keys
KEY_REQUIRED = "a valid API key is required: Authorization: Bearer <key>"  # every 401 says it


@dataclass(frozen=True)
class ApiKey:
    name: str
    secret: str

    def __repr__(self) -> str:  # never print a key
        return f"ApiKey(name={self.name!r})"


class KeyRing:
    def __init__(self, keys: list[ApiKey]):
        names = [k.name for k in keys]
        if len(set(names)) != len(names):
            raise ValueError("API key names must be unique")
        self.keys = keys

    @property
    def enabled(self) -> bool:
        return bool(self.keys)

    def name_of(self, authorization: str | None) -> str | None:
        """The name of the key this ``Authorization`` header carries; None if it carries none."""
        scheme, _, token = (authorization or "").partition(" ")
        token = token.strip().encode()
        if scheme.lower() != "bearer" or not token:
            return None
        found = None
        for key in self.keys:
            if hmac.compare_digest(token, key.secret.encode()):
                found = key.name
        return found


def load_keys(cfg: AuthConfig) -> KeyRing:
    keys: list[ApiKey] = []
    raw = os.environ.get(cfg.keys_env, "")
    for i, item in enumerate(x.strip() for x in raw.split(",")):
        if not item:
            continue
        name, sep, secret = item.partition(":")
        keys.append(ApiKey(name.strip(), secret.strip()) if sep else ApiKey(f"key-{i}", item))
    if cfg.key_file is not None:
        data = yaml.safe_load(Path(cfg.key_file).read_text()) or {}
        if not isinstance(data, dict):
            raise ValueError(f"{cfg.key_file}: expected a mapping of key name -> key")
        keys += [ApiKey(str(name), str(secret)) for name, secret in data.items()]
    for key in keys:
        if not key.name or len(key.secret) < 8:
            raise ValueError(f"API key {key.name!r}: a name and a key of at least 8 characters are required")
    return KeyRing(keys)
