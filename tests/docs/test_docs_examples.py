"""Every code block of the README and docs/ (but the generated reference) runs or is checked:

- `curl` blocks, `python` blocks (the openai client) and JSON request bodies are sent to one
  stack started for this module (`splitspec serve models/target` under the documented model name,
  the n-gram and suffix proposers and the verifier's EAGLE head and lookahead), its URL put in
  place of http://127.0.0.1:8000; every answer must be a success;
- commands that start long-running servers or benchmarks are parsed, not run: `splitspec ...`
  and the services' own commands by their argparse parsers, `make TARGET` against the Makefile's
  targets (with `ARGS` parsed as `splitspec serve`'s flags and Spec-Bench's `BENCH_ARGS` by its
  parser), scripts and modules by existence;
- a JSON block marked `<!-- response: usage.speculation, ... -->` names only fields a live answer
  has; the start-up output shown is what the launcher prints; PromQL parses; chart values exist;
- every `"method"` named anywhere is one a request or --speculative-config accepts.

A block that needs a GPU, a cluster or a long run says so in `<!-- skip: REASON -->` on the line
before it, and is skipped with that reason; any other command is an error."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml
from docs_testlib import GEN_REFERENCE, REPO, Block, code_blocks, command_word, hand_written_pages
from docs_testlib import shell_commands as commands_of

from splitspec.launcher.cli import build_parser
from splitspec.launcher.serve import up_namespace
from splitspec.launcher.speculative_config import VLLM_METHODS
from splitspec.launcher.stack import Stack
from splitspec.launcher.up import serving_banner, stack_config
from splitspec.methods import is_method
from splitspec.net import free_port

sys.path.insert(0, str(REPO / "tests" / "integration"))
from procs_testlib import proposer_port_flags, stop_launcher  # noqa: E402

DOCUMENTED_URL = "http://127.0.0.1:8000"
DOCUMENTED_MODEL = "smollm2-135m-instruct"
SHELL = {"bash", "sh", "shell"}
# a block without a language is a diagram or sample output, like `text`
CHECKED = SHELL | {"python", "json", "text", "", "promql", "yaml"}
BLOCKS = [b for page in hand_written_pages() for b in code_blocks(page)]


def blocks(*langs: str) -> list:
    return [pytest.param(b, id=b.where) for b in BLOCKS if b.lang in langs]


def sends_requests(block: Block) -> bool:
    if block.skip:
        return False
    if block.lang in SHELL:
        return any(command_word(w)[1][:1] == ["curl"] for w in commands_of(block.body))
    if block.lang == "python":
        return DOCUMENTED_URL in block.body
    if block.lang == "json" and block.response is None:
        body = json.loads(block.body)
        return isinstance(body, dict) and ("prompt" in body or "messages" in body)
    return False


# -- the stack ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def stack_url(tmp_path_factory):
    """One stack for the module: the toy target under the documented model name."""
    if not Path("/proc").is_dir():
        pytest.skip("needs /proc")
    port = free_port()
    argv = [sys.executable, "-m", "splitspec.launcher", "serve", "models/target",
            "--served-model-name", DOCUMENTED_MODEL, "--device", "cpu", "--port", str(port),
            "--grpc-port", str(free_port()), "--verifier-port", str(free_port()),
            *proposer_port_flags(), "--no-draft", "--no-mlp", "--metrics-port", "0",
            "--verifier-args", "--threads 1", "--log-dir", str(tmp_path_factory.mktemp("logs"))]
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    url = f"http://127.0.0.1:{port}"
    lines = []
    try:
        while not any("Ctrl-C stops everything" in line for line in lines[-1:]):
            line = proc.stdout.readline()
            assert line, "the stack exited early:\n" + "".join(lines)
            lines.append(line)
        yield url
    finally:
        stop_launcher(proc)


def answers(output: str) -> list:
    """The JSON documents curl printed one after the other."""
    decoder, out, i = json.JSONDecoder(), [], 0
    while i < len(output):
        if output[i].isspace():
            i += 1
            continue
        doc, i = decoder.raw_decode(output, i)
        out.append(doc)
    return out


@pytest.mark.integration
@pytest.mark.parametrize("block", [p for p in blocks(*SHELL, "python", "json")
                                   if sends_requests(p.values[0])])
def test_the_documented_request_is_answered(block, stack_url):
    if block.lang in SHELL:
        if shutil.which("curl") is None:
            pytest.skip("curl is not installed")
        for words in commands_of(block.body):
            assert command_word(words)[1][0] in ("curl", "for", "do", "done"), (
                f"{block.where}: a block that sends requests runs nothing else: {words}")
        done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c",
                               block.body.replace(DOCUMENTED_URL, stack_url)],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"{block.where}: {done.stderr}"
        got = answers(done.stdout)
        assert got, f"{block.where}: no answer"
        for answer in got:
            assert "error" not in answer, f"{block.where}: {answer}"
    elif block.lang == "python":
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            # run as a user runs it: without this file's `from __future__ import annotations`
            # (pydantic models in an example resolve their annotations at once)
            exec(compile(block.body.replace(DOCUMENTED_URL, stack_url), block.where, "exec",
                         dont_inherit=True), {"__name__": "__doc_example__"})
        assert printed.getvalue().strip(), f"{block.where}: printed nothing"
    else:
        body = json.loads(block.body)
        path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
        r = httpx.post(stack_url + path, json=body, timeout=120)
        assert r.status_code == 200, f"{block.where}: {r.status_code} {r.text}"


@pytest.mark.integration
@pytest.mark.parametrize("block", [p for p in blocks("json") if p.values[0].response])
def test_a_documented_answer_names_only_fields_the_answer_has(block, stack_url):
    assert block.response.startswith("usage.speculation"), block.response
    documented = json.loads(block.body)
    r = httpx.post(stack_url + "/v1/completions", timeout=120, json={
        "prompt": "def add(a, b):\n    return a + b\n\ndef add(", "max_tokens": 16,
        "temperature": 0, "speculation": {"mode": "on", "method": documented["method"],
                                          "num_speculative_tokens": 3, "details": True}})
    assert r.status_code == 200, r.text
    live = r.json()["usage"]["speculation"]
    assert set(documented) <= set(live), (block.where, set(documented) - set(live))


# -- commands that are parsed, not run ---------------------------------------------------------


def makefile_targets() -> set[str]:
    return set(re.findall(r"^([A-Za-z0-9_.-]+):", (REPO / "Makefile").read_text(), re.M))


def parse(parser, argv: list[str], where: str) -> None:
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            parser.parse_args(argv)
    except SystemExit as exc:
        raise AssertionError(f"{where}: {shlex.join(argv)} does not parse: "
                             f"{err.getvalue().strip()}") from exc


def specbench():
    sys.path.insert(0, str(REPO / "bench"))
    import specbench
    import specbench_configs

    return specbench, specbench_configs


def check_specbench_args(argv: list[str], where: str) -> None:
    bench, configs = specbench()
    parse(bench.parser(), argv, where)
    for config in bench.parse_args(argv).config or []:
        speculation = configs.parse_extra(config).speculation
        assert is_method(speculation.get("method", "ngram")), (where, config)


def check_command(words: list[str], where: str) -> None:
    env, words = command_word(words)
    program, args = Path(words[0]).name, words[1:]
    parsers = GEN_REFERENCE.entry_points()
    if program in parsers:
        parse(parsers[program], args, where)
    elif program == "make":
        variables = dict(a.split("=", 1) for a in args if "=" in a)
        targets = [a for a in args if "=" not in a] or ["help"]
        assert set(targets) <= makefile_targets(), (where, targets)
        if "ARGS" in variables and "run" in targets:
            parse(build_parser(), ["serve", "models/target", *shlex.split(variables["ARGS"])],
                  where)
        if "BENCH_ARGS" in variables and "bench-specbench" in targets:
            check_specbench_args(shlex.split(variables["BENCH_ARGS"]), where)
    elif program in ("python", "python3"):
        if args[:1] == ["-m"]:
            import importlib.util

            assert importlib.util.find_spec(args[1]) is not None, (where, args[1])
        else:
            script = REPO / args[0]
            assert script.is_file(), (where, args[0])
            if script.name == "specbench.py":
                check_specbench_args(args[1:], where)
    else:
        raise AssertionError(f"{where}: `{shlex.join(words)}` is neither run nor parsed by this "
                             "test; mark the block `<!-- skip: REASON -->` if it needs a GPU, a "
                             "cluster or a long run")
    del env


@pytest.mark.parametrize("block", [p for p in blocks(*SHELL) if not sends_requests(p.values[0])])
def test_the_documented_command_parses(block):
    if block.skip:
        pytest.skip(block.skip)
    for words in commands_of(block.body):
        check_command(words, block.where)


# -- blocks that show things -------------------------------------------------------------------


def check_start_up_output(block: Block) -> None:
    """A block showing the launcher's start-up output shows what it prints for that model."""
    first = block.body.splitlines()[0]
    if not first.startswith("splitspec is serving "):
        return
    model = first.split()[3]
    shown_dir = model if (REPO / model).is_dir() else "models/target"
    args = up_namespace(build_parser().parse_args(["serve", shown_dir]))
    stack = Stack(stack_config(args))
    args.model = model
    printed = serving_banner(args, stack)
    assert block.body.rstrip("\n") == printed, (
        f"{block.where} shows:\n{block.body}\nthe launcher prints:\n{printed}")


@pytest.mark.parametrize("block", blocks("text"))
def test_the_documented_start_up_output_is_what_the_launcher_prints(block):
    check_start_up_output(block)


@pytest.mark.parametrize("block", blocks("promql"))
def test_the_documented_queries_parse(block):
    import promql_parser

    queries, current = [], []
    for line in block.body.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        if not line[0].isspace() and current:
            queries.append("\n".join(current))
            current = []
        current.append(line)
    queries.append("\n".join(current))
    for query in queries:
        promql_parser.parse(query)


@pytest.mark.parametrize("block", blocks("yaml"))
def test_the_documented_chart_values_exist(block):
    """Each key is a value of the chart; under a component's `flags`, each is a flag its service
    parses (the chart passes them as --key=value)."""
    values = yaml.safe_load((REPO / "k8s/splitspec/values.yaml").read_text())
    parsers = GEN_REFERENCE.entry_points()

    def walk(snippet: dict, known: dict, path: str) -> None:
        for key, value in snippet.items():
            assert key in known, f"{block.where}: {path}{key} is not a value of the chart"
            if key == "flags":
                service = "gateway" if path.startswith("gateway") else (
                    "verifier" if path.startswith("verifier") else "proposer")
                parse(parsers[f"splitspec-{service}"],
                      [f"--{flag}={v}" for flag, v in value.items()], block.where)
            elif isinstance(value, dict) and isinstance(known[key], dict) and known[key]:
                walk(value, known[key], f"{path}{key}.")

    walk(yaml.safe_load(block.body), values, "")


# -- every block -------------------------------------------------------------------------------


@pytest.mark.parametrize("block", [pytest.param(b, id=b.where) for b in BLOCKS])
def test_every_block_has_a_language_this_test_checks(block):
    assert block.lang in CHECKED, (f"{block.where}: a ```{block.lang} block; give it one of "
                                   f"{sorted(CHECKED)}")
    if block.lang == "json":
        json.loads(block.body)
    if block.lang == "python":  # a skipped one too
        compile(block.body, block.where, "exec")


def wrong_methods(blocks: list[Block]) -> list[tuple[str, str]]:
    named = [(b.where, m) for b in blocks for m in re.findall(r'"method":\s*"([^"]+)"', b.body)]
    assert named
    return [(where, m) for where, m in named if not (is_method(m) or m in VLLM_METHODS)]


def test_every_method_named_is_one_a_request_accepts():
    wrong = wrong_methods(BLOCKS)
    assert not wrong, wrong


def test_the_docs_have_runnable_examples():
    """The test above runs something: requests in the getting-started page and the README."""
    pages = {b.page.name for b in BLOCKS if sends_requests(b) and not b.skip}
    assert {"README.md", "getting-started.md"} <= pages, pages
    assert os.path.exists(REPO / "models/target/config.json")
