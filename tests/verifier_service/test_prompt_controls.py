"""Negative control for the chat template's tool rendering: the guarding check fails on its
planted bug (tests/planted_bugs.py); it passes on the real code in test_prompt.py."""

from __future__ import annotations

import planted_bugs as bug
import pytest
from test_prompt import check_the_shipped_template_shows_the_tools_the_call_and_the_tool_result

from splitspec.modelio import load_tokenizer


def test_the_template_check_fails_when_tool_calls_do_not_reach_the_template(
        monkeypatch, target_model_dir):
    bug.template_drops_tool_calls(monkeypatch)
    with pytest.raises(AssertionError):
        check_the_shipped_template_shows_the_tools_the_call_and_the_tool_result(
            load_tokenizer(target_model_dir, False))
