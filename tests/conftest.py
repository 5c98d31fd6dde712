import compileall
import contextlib
import importlib.util
import json
import os
import resource
import shutil
import sys
import sysconfig
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

# Nothing downloads at test time: the Hugging Face libraries fail at once instead of retrying
# (set before any test module imports them; subprocesses inherit it). Every run is eager
# (torch.compile is a no-op; parallel.compile auto means eager): compiling costs seconds per
# process. Tests of compilation turn it back on with the `compiling` fixture. HLAT_TESTING=1 lets
# HLAT_FAULT inject faults (hlat.faults), here and in every process the tests start.
os.environ.update(
    HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TORCH_COMPILE_DISABLE="1", HLAT_TESTING="1"
)

import torch._dynamo.config  # noqa: E402  (reads TORCH_COMPILE_DISABLE at import)

import runs  # noqa: E402
from compiling import compiling  # noqa: E402, F401  (the fixture, for every test module)
from flex_on_cpu import flex_on_cpu  # noqa: E402, F401  (the fixture, for every test module)
from runs import Scenario, ScenarioResults, SharedLaunch  # noqa: E402

pytest_plugins = ["pytester"]  # tests/project/test_compiling.py runs a pytest session of its own
_SCENARIOS = pytest.StashKey[list[Scenario]]()
_LAUNCH = pytest.StashKey[SharedLaunch]()
torch._dynamo.config.disable = True  # also if something imported torch before this file
# One intra-op thread in this process: its tests run tiny models beside the shared launch's
# processes, and two threads on two shared cores spin at each parallel region's barrier (3x the
# time and 2x the CPU of one thread, measured on test_trainer.py under load). The processes the
# tests start set their own (OMP_NUM_THREADS=1: tests/runs.py).
torch.set_num_threads(1)


def pytest_sessionstart(session: pytest.Session) -> None:
    """Where Python writes no bytecode (PYTHONDONTWRITEBYTECODE), each of the ~150 processes the
    suite starts would compile hlat's modules and the tests' again: 0.3 CPU-seconds a process that
    imports the trainer (3.51 against 3.83, 8 interleaved runs). Compiled once here instead (0.5 s),
    as Python itself would; a tree it cannot write to keeps compiling per process."""
    if sys.dont_write_bytecode:
        for tree in (Path(importlib.util.find_spec("hlat").origin).parent, Path(__file__).parent):
            with contextlib.suppress(OSError):
                compileall.compile_dir(tree, quiet=2)


def _waits_for_processes(item: pytest.Item) -> bool:
    """Whether a test reads scenarios (asks for the `scenarios` fixture) or its module starts
    processes of its own (through tests/runs.py). The other tests of a module that lists scenarios
    run beside the shared launch, as single-process tests."""
    module = getattr(item, "module", None)
    return "scenarios" in getattr(item, "fixturenames", ()) or any(
        getattr(module, name, None) in (runs, runs.torchrun, runs.launch, runs.start_torchrun)
        for name in ("runs", "torchrun", "launch", "start_torchrun")
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Single-process tests first: they run while the shared launch works in the background; the
    tests that wait for it, or for processes of their own, after them (order otherwise kept)."""
    items.sort(key=_waits_for_processes)


def pytest_collection_finish(session: pytest.Session) -> None:
    """The scenarios of every module with a selected test, in collection order (tests/runs.py), as
    `_launch_order` arranges them; a scenario two modules list (one reads the other's results) runs once."""
    modules = dict.fromkeys(item.module for item in session.items if isinstance(item, pytest.Function))
    by_name: dict[str, Scenario] = {}
    for scenario in (s for m in modules for s in getattr(m, "SCENARIOS", ())):
        assert by_name.setdefault(scenario.name, scenario) == scenario, f"two scenarios named {scenario.name!r}"
    session.stash[_SCENARIOS] = _launch_order(list(by_name.values()))


def _launch_order(scenarios: list[Scenario]) -> list[Scenario]:
    """The waiting scenarios first; then the single-process ones that read no multi-process one's
    files, while the single-process tests keep the other core busy; the multi-process ones last, on
    both cores once the tests have run out (in collection order, 31 s of single-process scenarios
    ran after that with a core idle). A scenario reads another's files only through that one's
    name in its kwargs (start_from, "{root}/NAME"), so every such read stays after the scenario it
    reads (a name that merely contains another only holds it back)."""
    early: set[str] = set()
    for scenario in scenarios:
        kwargs = json.dumps(scenario.kwargs)
        needs = {s.name for s in scenarios if s is not scenario and s.name in kwargs}
        if scenario.waiting or (scenario.world == 1 and needs <= early):
            early.add(scenario.name)
    return sorted(scenarios, key=lambda s: (not s.waiting, s.name not in early))


@pytest.fixture(autouse=True, scope="session")
def _shared_launch(request, tmp_path_factory, small_corpus, _isolated_cache) -> Iterator[SharedLaunch]:
    """Every collected scenario in one torchrun launch, started in the background at once (tests/runs.py)."""
    launch = SharedLaunch(request.session.stash[_SCENARIOS], tmp_path_factory.mktemp("scenarios"), small_corpus)
    request.config.stash[_LAUNCH] = launch
    # The launch is the suite's longest path: its processes take the cores first, and the tests here
    # (and the processes they start) have what is left. With both at one priority, 4 or 8 ranks
    # and this process shared 2 cores and the scenarios took 14% more CPU (737 s against 647 s in
    # one clean run each; the suite: 600 s against 529 s).
    os.nice(10)
    yield launch
    launch.stop()


_TEST_CPU: dict[str, float] = {}  # each test's CPU seconds in this process (not in processes it starts)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    start = time.process_time()
    try:
        return (yield)
    finally:
        _TEST_CPU[item.nodeid] = time.process_time() - start


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    """Where the shared launch's time went (it runs beside the tests, so --durations misses it):
    its wall time, how long tests waited for it, and its slowest scenarios with their CPU time over
    every rank (the suite is bound by CPU: a scenario's CPU is what cutting it gives back)."""
    launch = config.stash.get(_LAUNCH, None)
    if launch is None or launch.process is None:
        return
    seconds = launch.scenario_seconds()
    wall = f"{launch.seconds:.1f} s" if launch.seconds is not None else "did not end"
    terminalreporter.write_sep("=", f"shared launch: {len(seconds)} of {len(launch.worlds)} scenarios")
    terminalreporter.write_line(
        f"wall {wall}, tests waited {launch.waited:.1f} s, scenarios {sum(seconds.values()):.1f} s (rank 0)"
    )
    cpu = {name: launch.scenario_cpu(name) for name in seconds}
    own, children = (resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    terminalreporter.write_line(
        f"CPU: scenarios {sum(cpu.values()):.1f} s; the tests' process {own.ru_utime + own.ru_stime:.1f} s, "
        f"what it started and waited for (the launch too) {children.ru_utime + children.ru_stime:.1f} s"
    )
    for name, s in sorted(seconds.items(), key=lambda item: -item[1])[:25]:
        terminalreporter.write_line(f"{s:8.1f} s {cpu[name]:8.1f} s CPU  {name}")
    terminalreporter.write_sep("=", "the tests that used most CPU in this process, and their files")
    for name, s in sorted(_TEST_CPU.items(), key=lambda item: -item[1])[:15]:
        terminalreporter.write_line(f"{s:8.1f} s CPU  {name}")
    files: Counter[str] = Counter()  # a cut is often a file's many small tests, none of them in the list above
    for name, s in _TEST_CPU.items():
        files[name.split("::")[0]] += s
    for name, s in files.most_common(10):
        terminalreporter.write_line(f"{s:8.1f} s CPU  {name}")


@pytest.fixture(scope="session")
def scenarios(_shared_launch: SharedLaunch) -> ScenarioResults:
    """The shared launch's results, once it has ended."""
    return _shared_launch.results()


@pytest.fixture(autouse=True, scope="session")
def _isolated_cache(tmp_path_factory):
    """Tokenizer caches go to a temporary directory, never the user's ~/.cache."""
    mp = pytest.MonkeyPatch()
    mp.setenv("HLAT_CACHE", str(tmp_path_factory.mktemp("hlat-cache")))
    yield
    mp.undo()


@pytest.fixture(scope="session")
def small_corpus(tmp_path_factory) -> Path:
    """A directory of 60 real documents (standard-library modules) for fast end-to-end runs."""
    root = tmp_path_factory.mktemp("corpus")
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in stdlib.glob("*.py") if 2_000 < p.stat().st_size < 40_000)[:60]
    for i, path in enumerate(files):
        shutil.copy(path, root / f"{i:03d}_{path.stem}.py")
    return root
