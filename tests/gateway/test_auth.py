"""API keys from a file and the environment, and the Bearer check."""

from __future__ import annotations

import pytest

from gateway.auth import API_KEYS_ENV, ApiKeys
from splitspec.errors import Unauthenticated


def test_keys_from_the_file_and_the_environment(tmp_path):
    path = tmp_path / "keys"
    path.write_text("# team a\nkey-a\n\n  key-b  \n")
    keys = ApiKeys.load(str(path), {API_KEYS_ENV: "key-c, key-d,"})
    assert keys.enabled
    for k in ("key-a", "key-b", "key-c", "key-d"):
        assert keys.check(f"Bearer {k}") == k
    assert keys.check("bearer key-a") == "key-a"
    for header in (None, "", "Bearer", "Bearer key-z", "Basic key-a", "key-a", "Bearer # team a"):
        with pytest.raises(Unauthenticated) as e:
            keys.check(header)
        assert e.value.field == "authorization" and e.value.http_status == 401


def test_no_keys_let_everyone_in():
    keys = ApiKeys.load("", {})
    assert not keys.enabled and keys.check(None) == ""
