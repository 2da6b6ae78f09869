"""A streamed chat completion's server-sent events, read the same way for every server
(bench/load_locustfile.py). Standard library only."""

from __future__ import annotations

import json


def parse_stream(lines, on_first=None) -> tuple[int, int | None, str | None]:
    """(content chunks, usage's completion_tokens or None, an error or None) of a streamed
    chat completion's server-sent events; `on_first()` is called at the first chunk that
    carries text (the time to the first token)."""
    chunks, tokens = 0, None
    for raw in lines:
        line = raw.decode() if isinstance(raw, bytes) else raw
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            break
        msg = json.loads(data)
        if "error" in msg:
            return chunks, tokens, str(msg["error"])
        if (msg.get("usage") or {}).get("completion_tokens") is not None:
            tokens = int(msg["usage"]["completion_tokens"])
        for choice in msg.get("choices") or []:
            if (choice.get("delta") or {}).get("content"):
                if chunks == 0 and on_first is not None:
                    on_first()
                chunks += 1
    return chunks, tokens, None
