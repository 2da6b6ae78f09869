"""Chat templates shipped with splitspec, for models whose own template lacks something (the
verifier's --chat-template NAME): chatml_tools, ChatML that shows the model tools and renders
tool calls and results in the Hermes format."""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).parent
SHIPPED = tuple(sorted(p.stem for p in HERE.glob("*.jinja")))


def load_chat_template(value: str) -> str:
    """--chat-template's value: a shipped template's name or a Jinja file's path -> its text.
    Raises ValueError naming what is wrong."""
    path = HERE / f"{value}.jinja" if value in SHIPPED else Path(value)
    try:
        return path.read_text()
    except OSError as exc:
        raise ValueError(f"--chat-template: cannot read {value!r} ({exc.strerror or exc}); a "
                         f"file path or one of {', '.join(SHIPPED)}") from None
