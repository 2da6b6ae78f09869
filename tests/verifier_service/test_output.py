from splitspec.params import StoppingCriteria
from verifier_service.batching.output import OutputTracker


class CharTokenizer:
    """One character per token id (ord), enough to test detokenization and stops."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids if i != 0)


def track(stop=(), max_new=100, eos=frozenset({0}), ignore_eos=False):
    return OutputTracker(CharTokenizer(), [ord("p")], StoppingCriteria(
        max_tokens=max_new, stop=tuple(stop), ignore_eos=ignore_eos), set(eos), max_new)


def ids(s):
    return [ord(c) for c in s]


def test_stop_string_split_over_steps_is_never_partly_sent():
    t = track(stop=["END"])
    a = t.append(ids("abcE"))
    assert a.text == "ab" and a.finish_reason is None  # "cE" could start "END": held back
    b = t.append(ids("Nx"))
    assert b.text == "cE" and b.finish_reason is None  # "Nx" cannot start "END" but is held
    t = track(stop=["END"])
    a = t.append(ids("abcE"))
    c = t.append(ids("ND!!"))
    assert c.finish_reason == "stop" and a.text + c.text == "abc"
    assert c.token_ids == ids("ND")  # tokens after the stop are dropped


def test_eos_max_tokens_and_ignore_eos():
    t = track(max_new=3)
    out = t.append(ids("ab") + [0, 99])
    assert out.finish_reason == "stop" and out.token_ids == ids("ab") + [0] and out.text == "ab"
    t = track(max_new=3)
    out = t.append(ids("abcd"))
    assert out.finish_reason == "length" and out.text == "abc"
    t = track(max_new=3, ignore_eos=True)
    assert t.append([0, 0]).finish_reason is None


def test_multibyte_characters_split_over_tokens_and_steps_with_the_shipped_tokenizer(
        target_model_dir):
    """Byte-level BPE splits most non-ASCII characters over several tokens (and a step may end
    inside one): no piece ever carries a replacement character, and the pieces add up to the
    text, for every way of grouping the tokens into steps; a stop string made of multi-byte
    characters is never partly sent."""
    import random

    from splitspec.modelio import load_tokenizer

    tok = load_tokenizer(target_model_dir)
    text = "print('Grüße, 世界 🐍')\n# ñ → € ∑ ✓ 🐍🐍\n"
    token_ids = tok.encode(text, add_special_tokens=False)
    partial = [i for i in range(1, len(token_ids))
               if tok.decode(token_ids[:i]).endswith("\ufffd")]
    assert len(partial) >= 10  # the replacement-character branch has work to do
    rng = random.Random(0)
    for trial in range(20):
        t = OutputTracker(tok, tok.encode("x = ", add_special_tokens=False),
                          StoppingCriteria(max_tokens=1000), {tok.eos_token_id}, 1000)
        pieces, i = [], 0
        while i < len(token_ids):
            n = 1 if trial == 0 else rng.randint(1, 6)  # one token per step, or accepted drafts
            pieces.append(t.append(token_ids[i:i + n]).text)
            i += n
        assert all("\ufffd" not in p for p in pieces), pieces
        assert "".join(pieces) == text
    t = OutputTracker(tok, [], StoppingCriteria(max_tokens=1000, stop=("世界",)),
                      {tok.eos_token_id}, 1000)
    sent = ""
    for tid in token_ids:
        out = t.append([tid])
        assert not out.text.endswith(("世", "\ufffd"))
        sent += out.text
        if out.finish_reason:
            break
    assert out.finish_reason == "stop" and sent == "print('Grüße, "
