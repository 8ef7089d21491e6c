"""Dependencies the routers share."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from fastapi import Depends
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from api.auth import ANONYMOUS, KEY_REQUIRED, KeyRing

_bearer = HTTPBearer(auto_error=False, description="An API key, when the server has keys set.")


def submitter_dependency(keys: KeyRing, unauthorized: Callable[[str], Exception]) -> Callable[..., str]:
    """A dependency answering the caller's key name (``api`` on a server without keys), or raising
    the dialect's 401 for a missing or unknown key."""

    # async: checked on the event loop, so a cached GET costs no threadpool hop.
    async def submitter(credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> str:
        if not keys.enabled:
            return ANONYMOUS
        header = f"{credentials.scheme} {credentials.credentials}" if credentials else None
        name = keys.name_of(header)
        if name is None:
            raise unauthorized(KEY_REQUIRED)
        return name

    return submitter
