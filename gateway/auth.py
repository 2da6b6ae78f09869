"""Optional API keys: a request must carry one of them as `Authorization: Bearer KEY` (REST) or
`authorization: Bearer KEY` metadata (gRPC). Keys come from --api-key-file (one per line; blank
lines and lines starting with # are skipped) and the SPLITSPEC_API_KEYS environment variable
(comma-separated). No keys configured: every request is let in.

With keys on, each request's prefix-cache salt (GenerateRequest.cache_salt) defaults to one
derived from its key (request_salt), so requests under different keys never share KV blocks in
a verifier: a tenant cannot time another's prompts through the cache (the side channel of
CVE-2025-46570). The derived salt is a keyed hash of the key, never the key itself."""

from __future__ import annotations

import hashlib
import hmac
import os
from pathlib import Path

from splitspec.errors import Unauthenticated

API_KEYS_ENV = "SPLITSPEC_API_KEYS"
# domain separation of the salts derived from API keys (the same on every gateway, so the
# replicas behind several gateways see one salt per key)
_SALT_CONTEXT = b"splitspec prefix-cache salt v1"


def request_salt(own: str | None, key: str) -> str | None:
    """The cache salt a request is sent with: its own when it gives one; else, with API keys
    on (key non-empty), one derived from its key; else none (all keyless requests share)."""
    if own is not None or not key:
        return own
    return "key:" + hmac.new(_SALT_CONTEXT, key.encode(), hashlib.sha256).hexdigest()


class ApiKeys:
    def __init__(self, keys: frozenset[str] = frozenset()):
        self._keys = keys

    @classmethod
    def load(cls, key_file: str = "", environ: dict[str, str] | None = None) -> "ApiKeys":
        keys = set()
        if key_file:
            for line in Path(key_file).read_text().splitlines():
                if line.strip() and not line.lstrip().startswith("#"):
                    keys.add(line.strip())
        env = (os.environ if environ is None else environ).get(API_KEYS_ENV, "")
        keys.update(k.strip() for k in env.split(",") if k.strip())
        return cls(frozenset(keys))

    @property
    def enabled(self) -> bool:
        return bool(self._keys)

    def check(self, authorization: str | None) -> str:
        """The key the request presents (its header value); raises when keys are on and it
        presents none of them. Returns "" when keys are off."""
        if not self._keys:
            return ""
        scheme, _, key = (authorization or "").partition(" ")
        key = key.strip()
        # compare against every key, in constant time per key
        if scheme.lower() != "bearer" or not any(
                [hmac.compare_digest(key.encode(), k.encode()) for k in self._keys]):
            raise Unauthenticated("authorization: a valid API key is required "
                                  "(Authorization: Bearer KEY)", "authorization")
        return key
