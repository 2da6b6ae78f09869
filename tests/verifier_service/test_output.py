from splitspec.params import StoppingCriteria
from verifier_service.output import OutputTracker


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
