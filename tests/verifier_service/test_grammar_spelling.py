"""How the grammar drafter spells forced text (verifier_service/methods/forced_spelling.py):
a token the target wrote in pieces is drafted in those pieces, after the token it followed where
that differs; a last token a longer one starts with is held back until the target is seen writing
it alone; and whatever it learned, a respelling spells the very text it was given."""

from __future__ import annotations

import planted_bugs as bug
import pytest

from verifier_service.methods.forced_spelling import Spellings

VOCAB = [b'":"', b'":', b'"', b"{", b'{"', b"[", b"a", b"ab", b"_", b"__", b"b", b'","', b'",']
ID = {t: i for i, t in enumerate(VOCAB)}


def encode(text: str) -> list[int]:
    """Longest match first, as a stand-in for the served tokenizer."""
    data, out = text.encode(), []
    while data:
        best = max((t for t in VOCAB if data.startswith(t)), key=len)
        out.append(ID[best])
        data = data[len(best):]
    return out


def spellings() -> Spellings:
    extendable = frozenset(i for i, t in enumerate(VOCAB)
                           if any(len(u) > len(t) and u.startswith(t) for u in VOCAB))
    return Spellings(VOCAB, encode, extendable)


def ids(*texts: bytes) -> list[int]:
    return [ID[t] for t in texts]


def test_a_token_written_in_pieces_is_drafted_in_them():
    s = spellings()
    assert s.spell('":"b') == (ids(b'":"', b"b"), None)
    # drafted `":"`, the target wrote `":` (and would go on with `"`)
    s.learn(ID[b"a"], ids(b'":"', b"b"), None, True, ids(b'":'), 0)
    assert s.spell('":"b') == (ids(b'":', b'"', b"b"), None)
    # pieces are respelled in turn: `__` is `_` `_` too
    s.learn(None, ids(b"__"), None, True, ids(b"_"), 0)
    assert s.spell('":"__b')[0] == ids(b'":', b'"', b"_", b"_", b"b")
    # votes for the token as it is win it back
    for _ in range(2):
        s.learn(ID[b"a"], ids(b'":"'), None, False, ids(b'":"', b"b"), 1)
    assert s.spell('":"b')[0] == ids(b'":"', b"b")


def test_the_token_before_decides_where_the_target_writes_both():
    s = spellings()
    s.learn(ID[b"a"], ids(b'{"', b"b"), None, True, ids(b"{"), 0)  # `{` `"` at the start
    assert s.spell('{"b', ID[b"["])[0] == ids(b"{", b'"', b"b")
    # after `[` the target wrote `{"` where `{` `"` was drafted: one token there
    s.learn(ID[b"["], ids(b"{", b'"', b"b"), None, True, ids(b'{"'), 0)
    assert s.spell('{"b', ID[b"["])[0] == ids(b'{"', b"b")
    assert s.spell('{"b', ID[b"a"])[0] == ids(b"{", b'"', b"b")


def test_a_last_token_a_longer_one_extends_is_held_until_seen_alone():
    s = spellings()
    assert s.spell('a":')[1] == ID[b'":']  # `":"` starts with it
    s.learn(None, ids(b"a"), ID[b'":'], True, ids(b"a", b'":'), 1)  # it came alone
    assert s.spell('a":') == (ids(b"a", b'":'), None)
    # kept, then crossed twice: held again
    for _ in range(2):
        s.learn(None, ids(b"a", b'":'), None, True, ids(b"a", b'":"'), 1)
    assert s.spell('a":')[1] == ID[b'":']


TEXTS = ['":"a', '{"a', '","ab__', 'a":', '[{"', '"__"']


def check_respellings_spell_the_text(s: Spellings) -> int:
    """Teach `s` every kind of step, then every respelling of TEXTS spells the text itself."""
    s.learn(ID[b"a"], ids(b'":"', b"a"), None, True, ids(b'":'), 0)
    s.learn(None, ids(b"__"), None, True, ids(b"_"), 0)
    s.learn(None, ids(b'","'), None, True, ids(b'",'), 0)
    s.learn(ID[b"["], ids(b"{", b'"'), None, True, ids(b'{"'), 0)
    s.learn(None, ids(b"ab"), None, True, ids(b"a"), 0)
    checked = 0
    for text in TEXTS:
        for before in (None, ID[b"a"], ID[b"["]):
            spelled, held = s.spell(text, before)
            pieces = spelled + ([held] if held is not None else [])
            assert b"".join(VOCAB[t] for t in pieces) == text.encode(), (text, pieces)
            checked += 1
    return checked


def test_a_respelling_spells_the_text_it_was_given():
    assert check_respellings_spell_the_text(spellings()) == 3 * len(TEXTS)


def test_the_check_catches_a_spelling_that_drops_the_rest(monkeypatch):
    bug.respelling_drops_the_rest(monkeypatch)
    with pytest.raises(AssertionError):
        check_respellings_spell_the_text(spellings())


def test_pairs_beyond_the_bound_vote_for_their_token_alone(monkeypatch):
    import verifier_service.methods.forced_spelling as forced_spelling

    monkeypatch.setattr(forced_spelling, "MAX_PAIRS", 1)
    s = spellings()
    s.learn(ID[b"["], ids(b'{"'), None, False, ids(b'{"', b"b"), 1)  # the one pair kept
    s.learn(ID[b"a"], ids(b'{"', b"b"), None, True, ids(b"{"), 0)  # no pair: token votes only
    s.learn(ID[b"a"], ids(b'{"', b"b"), None, True, ids(b"{"), 0)
    assert s.spell('{"b', ID[b"["])[0] == ids(b'{"', b"b")
    assert s.spell('{"b', ID[b"a"])[0] == ids(b"{", b'"', b"b")
    assert set(s._spellings) == {ID[b'{"'], (ID[b"["], ID[b'{"'])}
