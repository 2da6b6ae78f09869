"""Optional API keys: a request must carry one of them as `Authorization: Bearer KEY` (REST) or
`authorization: Bearer KEY` metadata (gRPC). Keys come from --api-key-file (one per line; blank
lines and lines starting with # are skipped) and the SPLITSPEC_API_KEYS environment variable
(comma-separated). No keys configured: every request is let in."""

from __future__ import annotations

import hmac
import os
from pathlib import Path

from splitspec.errors import Unauthenticated

API_KEYS_ENV = "SPLITSPEC_API_KEYS"


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
