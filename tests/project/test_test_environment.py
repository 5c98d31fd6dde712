"""The test environment a newcomer builds is the one CI checks: `.ci/run` runs the README's test
command, and that command installs from a lock that pins every package hlat and its test extra
ask for, at versions their floors admit."""

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "requirements" / "test.lock"


def readme_test_command() -> str:
    """The README quick start's command 2 (the line after its '# 2.' comment)."""
    lines = (ROOT / "README.md").read_text().splitlines()
    return next(lines[i + 1] for i, line in enumerate(lines) if line.startswith("# 2. "))


def locked() -> dict[str, list[Requirement]]:
    pins: dict[str, list[Requirement]] = {}
    for line in LOCK.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            req = Requirement(line)
            pins.setdefault(req.name.lower().replace("_", "-"), []).append(req)
    return pins


def test_ci_runs_the_readme_test_command() -> None:
    command = readme_test_command()
    assert "-c requirements/test.lock" in command and command.endswith("&& python -m pytest"), command
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(rf"^\s*locked\) {re.escape(command)} ;;$", ci, re.MULTILINE), (
        f".ci/run's locked mode must run README command 2 verbatim: {command}"
    )


def test_lock_pins_every_dependency_within_its_floor() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = [Requirement(r) for r in project["dependencies"] + project["optional-dependencies"]["test"]]
    pins = locked()
    assert all(
        len(req.specifier) == 1 and next(iter(req.specifier)).operator == "==" for reqs in pins.values() for req in reqs
    ), "every line of the lock is an exact pin"
    for req in wanted:
        name = req.name.lower().replace("_", "-")
        assert name in pins, f"{req.name} is not in {LOCK.name}; refresh it (CONTRIBUTING.md)"
        for pin in pins[name]:
            version = next(iter(pin.specifier)).version
            assert req.specifier.contains(version, prereleases=True), f"{LOCK.name} pins {pin}, outside {req}"
    assert [str(pin.specifier) for pin in pins["torch"]] == ["==2.13.0"], "the CPU build the README installs"
