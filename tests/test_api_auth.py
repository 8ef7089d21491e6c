"""API keys as the server loads them (api.auth.load_keys): from the env var named in the server YAML
(``SHOTLOOM_API_KEYS`` by default) and a key file, told apart by name, never shown."""

from __future__ import annotations

import pytest
import yaml

from api.auth import load_keys
from settings.api import AuthConfig


def test_keys_from_the_env_var_named_or_bare_and_beside_a_key_file(monkeypatch, tmp_path):
    monkeypatch.setenv(
        "SHOTLOOM_API_KEYS", " studio-a:sk-aaaa-1111 , sk-bare-22222222,, studio-c : sk-cccc-3333 "
    )
    ring = load_keys(AuthConfig())
    assert ring.enabled
    assert [k.name for k in ring.keys] == ["studio-a", "key-1", "studio-c"]  # a bare key: key-<n>
    assert ring.name_of("Bearer sk-aaaa-1111") == "studio-a"
    assert ring.name_of("bearer sk-bare-22222222") == "key-1"  # the scheme in any case
    assert ring.name_of("Bearer  sk-cccc-3333 ") == "studio-c"  # spaces around the key trimmed
    for refused in ("Bearer sk-wrong-0000", "sk-aaaa-1111", "Basic sk-aaaa-1111", "Bearer ", None):
        assert ring.name_of(refused) is None, refused
    assert "sk-" not in repr(ring.keys)  # a key never shows in a log line

    keys = tmp_path / "keys.yaml"
    keys.write_text(yaml.safe_dump({"studio-f": "sk-file-4444"}))
    ring = load_keys(AuthConfig(key_file=keys))
    assert [k.name for k in ring.keys] == ["studio-a", "key-1", "studio-c", "studio-f"]
    assert ring.name_of("Bearer sk-file-4444") == "studio-f"


def test_the_env_var_is_the_one_the_server_yaml_names_and_unset_means_no_keys(monkeypatch):
    monkeypatch.delenv("SHOTLOOM_API_KEYS", raising=False)
    monkeypatch.setenv("OTHER_KEYS", "ops:sk-ops-55555555")
    assert not load_keys(AuthConfig()).enabled  # nothing in SHOTLOOM_API_KEYS: every route open
    ring = load_keys(AuthConfig(keys_env="OTHER_KEYS"))
    assert ring.name_of("Bearer sk-ops-55555555") == "ops"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("studio-a:short", "at least 8 characters"),
        (":sk-noname-1234", "a name"),
        ("a:sk-one-11111111,a:sk-two-22222222", "unique"),
    ],
)
def test_bad_keys_in_the_env_var_stop_the_server(monkeypatch, value, message):
    monkeypatch.setenv("SHOTLOOM_API_KEYS", value)
    with pytest.raises(ValueError, match=message):
        load_keys(AuthConfig())


def _asgi_post(app, path: str, body_size: int, headers: list[tuple[bytes, bytes]], chunked: bool = False):
    """POST ``body_size`` bytes straight to the ASGI app, counting what the app pulled of the body:
    (status, response body, bytes read)."""
    import asyncio
    import json

    chunk = b" " * 65536
    pulled = {"bytes": 0, "left": body_size}
    sent: list[dict] = []

    async def receive():
        if pulled["left"] <= 0:
            return {"type": "http.disconnect"}
        n = min(len(chunk), pulled["left"])
        pulled["left"] -= n
        pulled["bytes"] += n
        return {"type": "http.request", "body": chunk[:n], "more_body": pulled["left"] > 0}

    async def send(message):
        sent.append(message)

    length = [] if chunked else [(b"content-length", str(body_size).encode())]
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": path, "raw_path": path.encode(), "root_path": "", "query_string": b"",
        "headers": [(b"content-type", b"application/json"), *length, *headers],
        "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 8221),
    }  # fmt: skip
    asyncio.run(app(scope, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], json.loads(body), pulled["bytes"]


def test_a_body_without_a_key_or_past_the_limit_is_refused_before_it_is_read(tmp_path):
    """FastAPI parses a JSON body before any dependency runs: without the gate a client with no key
    made the API read (and hold) a body of any size before its 401."""
    from bare_api import bare_app

    from api.auth import ApiKey, KeyRing
    from settings.api import ApiConfig

    key = [(b"authorization", b"Bearer k3y-of-studio")]
    client, _ = bare_app(
        tmp_path, api=ApiConfig(max_body_bytes=1 << 20), keys=KeyRing([ApiKey("studio", "k3y-of-studio")])
    )
    app = client.app
    for path in ("/r2v", "/merge", "/queue/rerender"):
        status, body, read = _asgi_post(app, path, 8 << 20, [])
        assert (status, read) == (401, 0) and body["error"].startswith("a valid API key"), (path, body)
    status, body, read = _asgi_post(app, "/r2v", 8 << 20, key)  # a key, a declared length past the limit
    assert (status, read) == (413, 0) and "at most 1048576" in body["error"]
    status, body, read = _asgi_post(app, "/r2v", 8 << 20, key, chunked=True)  # no length: cut at the limit
    assert status == 413 and "passed 1048576" in body["error"] and read <= (1 << 20) + 65536
    status, body, _ = _asgi_post(app, "/r2v", 10, key)  # within: on to the route (not JSON: 422)
    assert status == 422
    # /v1 guards its own body, its own way (the OpenAI envelope): not the gate's answer.
    status, body, _ = _asgi_post(app, "/v1/videos", 10, [])
    assert status == 401 and body["error"]["type"] == "authentication_error"
