"""The Space this repository is: the README's front matter, checked against what the repository
pins and runs, and docs/deploy.md's ready Space for the released checkpoint against the plan.

- `python_version` is declared, and is a Python the suite runs on (scripts/test.sh on `python`,
  scripts/test_other_pythons.sh on the others);
- `sdk_version` is the pinned gradio, `app_file` exists, every pin is exact;
- every pin of requirements.txt installs on the declared Python (uv's resolver, wheels only for
  Linux x86-64, markers evaluated for that Python): skipped with one line when no registry answers;
- the ready Space's keys name the released checkpoint, and its `suggested_hardware` is a flavor
  huggingface_hub knows whose GPU holds the weights and tiles 32 requests (dgemma.plan).
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import yaml
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from app_server import ROOT

SUITE_PYTHONS = ("3.10", "3.11", "3.12", "3.13")
NO_REGISTRY = re.compile(r"dns error|Temporary failure in name resolution|Network is unreachable|Connection refused|"
                         r"tcp connect error|error sending request|timed out|No route to host")  # fmt: skip


def front_matter(text: str) -> dict:
    match = re.match(r"---\n(.*?)\n---\n", text, re.S)
    assert match, "README.md starts with no front matter"
    return yaml.safe_load(match.group(1))


def pins(name: str) -> list[Requirement]:
    """The requirements of a requirements file, following `-r` lines."""
    found = []
    for line in (ROOT / name).read_text().splitlines():
        line = re.split(r"\s+#", line, maxsplit=1)[0].strip()
        if line.startswith("-r "):
            found += pins(line[3:].strip())
        elif line and not line.startswith("#"):
            found.append(Requirement(line))
    return found


def pins_for(python_version: str, name: str = "requirements.txt") -> list[Requirement]:
    """The pins that apply on `python_version` (e.g. "3.10.13"): markers evaluated for it, not for
    the interpreter running the test (pip's --python-version does not do that)."""
    env = {**default_environment(), "python_full_version": python_version,
           "python_version": ".".join(python_version.split(".")[:2])}  # fmt: skip
    return [r for r in pins(name) if r.marker is None or r.marker.evaluate(env)]


@pytest.fixture(scope="module")
def space() -> dict:
    return front_matter((ROOT / "README.md").read_text())


def test_front_matter_declares_a_python_the_suite_runs_on(space):
    version = str(space.get("python_version", ""))
    assert re.fullmatch(r"3\.\d+\.\d+", version), f"python_version is {version!r}: give one, e.g. 3.10.13"
    assert ".".join(version.split(".")[:2]) in SUITE_PYTHONS


def test_sdk_version_is_the_pinned_gradio(space):
    (gradio,) = [r for r in pins("requirements.txt") if r.name == "gradio"]
    assert space["sdk"] == "gradio"
    assert f"=={space['sdk_version']}" == str(gradio.specifier)


def test_app_file_exists(space):
    assert (ROOT / space["app_file"]).is_file()


def test_every_requirement_is_pinned_exactly():
    for name in ("requirements.txt", "requirements-dev.txt"):
        for requirement in pins(name):
            (spec,) = requirement.specifier
            assert spec.operator == "==", f"{name}: {requirement} is not an exact pin"


def test_each_python_gets_one_transformers_pin():
    for minor in SUITE_PYTHONS:
        assert len([r for r in pins_for(f"{minor}.0") if r.name == "transformers"]) == 1, minor


@pytest.mark.server
def test_every_pin_installs_on_the_declared_python(space, tmp_path):
    version = str(space["python_version"])
    wanted = tmp_path / "requirements.txt"
    wanted.write_text("".join(f"{r.name}{r.specifier}\n" for r in pins_for(version)))
    # uv's resolver (requirements-dev.txt pins it): pip's answer for exact pins, in a fifth of the time
    command = [sys.executable, "-m", "uv", "pip", "compile", "--quiet", "--no-header", "--no-annotate",
               "--python-version", version, "--python-platform", "x86_64-manylinux_2_28", "--only-binary", ":all:",
               str(wanted)]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    output = done.stdout + done.stderr
    if done.returncode != 0 and NO_REGISTRY.search(output):
        pytest.skip("no package registry answers from here: the pins were not checked against Python " + version)
    assert done.returncode == 0, output[-3000:]
    resolved = {canonicalize_name(name): pinned for name, pinned in (line.split("==", 1) for line in done.stdout.split())}
    for requirement in pins_for(version):  # each pin resolved to exactly its version
        (spec,) = requirement.specifier
        assert resolved.get(canonicalize_name(requirement.name)) == spec.version, (requirement, resolved)


def ready_space_block() -> dict:
    """The front-matter keys docs/deploy.md's Spaces section tells a deployer to add."""
    text = (ROOT / "docs" / "deploy.md").read_text()
    section = text.split("## On Hugging Face Spaces", 1)[1]
    match = re.search(r"```yaml\n(.*?)```", section, re.S)
    assert match, "the Spaces section has no yaml block of front-matter keys"
    return yaml.safe_load(match.group(1))


def test_the_ready_space_preloads_the_released_checkpoint():
    from dgemma.gpus import RELEASED_ID

    keys = ready_space_block()
    assert keys["models"] == [RELEASED_ID]
    assert keys["preload_from_hub"] == [RELEASED_ID]


def test_the_ready_spaces_hardware_holds_the_released_model_and_tiles_32_requests():
    from huggingface_hub import SpaceHardware

    from dgemma import plan
    from dgemma.gpus import GPUS

    flavor = ready_space_block()["suggested_hardware"]
    assert flavor in {h.value for h in SpaceHardware}, f"{flavor} is not a Spaces hardware flavor"
    (gpu,) = [g for g in GPUS if g.space_flavor == flavor]
    row = plan.plan_row(gpu, 32, plan.RELEASED)
    assert row["fits_weights"] and row["tile_size"] is not None, row
