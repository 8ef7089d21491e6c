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
