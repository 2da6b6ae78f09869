from dataclasses import dataclass

from splitspec.config import option, parse_config


@dataclass(frozen=True)
class Demo:
    """demo"""

    name: str = option("x", "a name")
    count: int = option(3, "a count")
    ratio: float = option(0.5, "a ratio")
    flag: bool = option(False, "a flag")
    peers: tuple[str, ...] = option(("a:1",), "peers")


def test_defaults_and_overrides():
    assert parse_config(Demo, []) == Demo()
    c = parse_config(Demo, ["--name", "y", "--count", "7", "--ratio", "2", "--flag",
                            "--peers", "b:2", "--peers", "c:3"])
    assert c == Demo(name="y", count=7, ratio=2.0, flag=True, peers=("b:2", "c:3"))


def test_a_renamed_option_still_takes_its_old_flag():
    from verifier_service.config import VerifierConfig

    assert parse_config(VerifierConfig, ["--draft-ahead", "off"]).draft_ahead == "off"
    assert parse_config(VerifierConfig, ["--overlap", "on"]).draft_ahead == "on"
