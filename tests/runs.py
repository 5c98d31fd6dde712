"""What the multi-process and resume tests share: the one way to start processes under torchrun,
several layouts per launch (scenarios), one tiny model's command-line settings, and checkpoint readers.

Launching processes
-------------------
`torchrun(nproc, target)` (and `start_torchrun`, which does not wait) is the only place a test
starts `python -m torch.distributed.run` (gloo on CPU, OMP_NUM_THREADS=1); `launch` runs
`hlat train` through it. Use it for what must be
a launch of its own: a command-line check, a fault that kills or freezes a rank, torchrun restarts.

Everything else runs as a *scenario*: a function `fn(ctx: ScenarioContext, **kwargs)` named
"FILE:function" (FILE relative to tests/, e.g. "train/layout_runs.py:train"). A test module lists
its scenarios in a module-level `SCENARIOS = [Scenario(...), ...]`; every scenario of every
collected module runs in ONE torchrun launch (tests/scenario_worker.py) of as many processes as
the largest scenario needs, in the order listed (tests/conftest.py runs the waiting ones first,
then single-process ones that read no multi-process one's files). Each scenario runs on ranks 0..world-1 in a
process group of its own (world 1: a plain process, no group); the other ranks skip it. Its files
go to `scenarios.path(name)` (session fixture `scenarios`, tests/conftest.py), which fails the
asking test with the scenario's traceback if it raised. A scenario may read an earlier one's files
(`ctx.root / other_name`). Launching costs ~5-10 s of imports per process; a scenario costs only
its own work.

A check that must start processes of its own but spends most of its time waiting (a collective
timeout, a lighthouse's heartbeats, a group killed and restarted) runs them from a world-1
scenario too, inside `with outside(ctx):` (the test process's environment, so they start as
they would from the test), and leaves what the test asserts in its directory: it then waits
beside the single-process tests instead of after them. Such a scenario says `waiting=True`: the
launch runs those first (tests/conftest.py).

The shared launch starts in the background when the session starts, and the single-process
tests run beside it: tests/conftest.py orders the modules that read scenarios or start processes
of their own last, and `torchrun` first waits for the shared launch to end, so no two launches
compete for the cores.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

TESTS = Path(__file__).parent
WORKER = TESTS / "scenario_worker.py"
PLAN = "plan.json"
ENV = "env.json"  # the test process's environment when the launch started (outside)
LAUNCH_TIMEOUT_S = 1200  # the shared launch, all scenarios together: a bound for hangs, not a budget
ARRIVAL_TIMEOUT_S = LAUNCH_TIMEOUT_S  # a rank waiting for the others to reach its next scenario


def tiny_args(corpus: Path, run_dir: Path, *extra: str) -> list[str]:
    return [
        "--data.source", str(corpus), "--model.vocab_size", "512", "--model.d_model", "64",
        "--model.n_layers", "2", "--model.n_heads", "4", "--model.n_kv_heads", "2", "--model.ffn_dim", "128",
        "--model.max_seq_len", "64", "--data.seq_len", "32", "--train.global_batch", "8",
        "--train.micro_batch", "2", "--train.log_every", "1", "--precision.mode", "fp32",
        "--train.tensorboard", "false", "--train.plot", "false", "--train.peak_tflops", "1", "--eval.every", "0",
        "--train.sample_prompt", "",  # the end-of-run sample: tests/eval/test_generate.py
        "--schedule.warmup_steps", "2", "--schedule.decay_steps", "6", "--train.run_dir", str(run_dir), *extra,
    ]  # fmt: skip


def _command(nproc: int, target: list[str], restarts: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        f"--max-restarts={restarts}",
        *target,
    ]


def _env(extra: dict[str, str] | None) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "HLAT_TESTING": "1", **(extra or {})}  # HLAT_FAULT works


def torchrun(
    nproc: int,
    target: list[str],
    env: dict[str, str] | None = None,
    restarts: int = 0,
    timeout: float = 600,
    check: bool = True,
) -> subprocess.CompletedProcess:
    """`torchrun --standalone --nproc_per_node NPROC TARGET` (TARGET: a script and its arguments, or
    ["-m", module, ...]) on gloo, once the shared launch has ended; with `check`, a non-zero exit
    fails the test with the output's tail."""
    wait_for_shared_launch()
    done = subprocess.run(
        _command(nproc, target, restarts), capture_output=True, text=True, env=_env(env), timeout=timeout
    )
    if check:
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return done


def start_torchrun(nproc: int, target: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """`torchrun(...)` without waiting for it (several launches at once, e.g. elastic replica
    groups), its output to `log`; the caller waits for the shared launch first."""
    with open(log, "w") as out:
        return subprocess.Popen(_command(nproc, target, 0), stdout=out, stderr=subprocess.STDOUT, env=_env(env))


def launch(
    nproc: int, args: list[str], env: dict[str, str] | None = None, restarts: int = 0
) -> subprocess.CompletedProcess:
    """`hlat train ARGS` under torchrun with `nproc` gloo processes; must succeed."""
    return torchrun(nproc, ["-m", "hlat", "train", *args], env=env, restarts=restarts)


@dataclass(frozen=True)
class Scenario:
    name: str  # unique over the suite: its directory under the launch's root
    call: str  # "FILE:function", FILE relative to tests/
    world: int = 1  # processes it runs on; 1 = a plain process without a process group
    kwargs: dict[str, Any] = field(default_factory=dict)  # JSON values
    # the device type whose torch.distributed backend the group takes (hlat.device.record), with gloo
    # beside it for host tensors; a type the call's module registers when imported (a simulated device)
    device: str = "cpu"
    # most of its time waiting (a timeout, heartbeats, holds: processes of its own, `outside`): the
    # launch runs these first, beside the single-process tests' start, and the scenarios that keep
    # the cores busy after them, so no core idles while the tests that read the launch wait for it
    waiting: bool = False


@dataclass(frozen=True)
class ScenarioContext:
    """What a scenario function receives (in the worker process)."""

    out: Path  # this scenario's own directory (created before it runs)
    root: Path  # the launch's directory: other scenarios' files are under root / name
    corpus: Path  # the session's small corpus (tests/conftest.py: small_corpus)
    rank: int
    world: int


@contextlib.contextmanager
def outside(ctx: ScenarioContext) -> Iterator[None]:
    """Within a scenario: os.environ as the test process's own while the processes a test would
    start itself are started (torchrun, hlat train): none of the shared launch's torchrun
    variables or collective timeout reach them."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(json.loads((ctx.root / ENV).read_text()))
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


class SharedLaunch:
    """The one torchrun launch of every scenario (see the module docstring), started at once in the
    background; `results()` waits for it. Its output goes to files, so nothing blocks on a pipe."""

    def __init__(self, scenarios: list[Scenario], root: Path, corpus: Path, timeout: float = LAUNCH_TIMEOUT_S):
        names = [s.name for s in scenarios]
        assert len(set(names)) == len(names), f"scenario names must be unique: {names}"
        self.root, self.worlds = root, {s.name: s.world for s in scenarios}
        self.started = time.monotonic()
        self.deadline = self.started + timeout
        self.seconds: float | None = None  # the launch's wall time, once it has ended (_time)
        self.waited = 0.0  # how long tests blocked on it: the part of its time no test ran beside
        self._results: ScenarioResults | None = None
        self.process: subprocess.Popen | None = None
        if scenarios:
            (root / ENV).write_text(json.dumps(dict(os.environ)))
            (root / PLAN).write_text(
                json.dumps({"corpus": str(corpus), "scenarios": [vars(s) for s in scenarios]}, indent=1)
            )
            nproc = max(s.world for s in scenarios)
            with open(root / "launch.out", "w") as out, open(root / "launch.err", "w") as err:
                # a scenario whose ranks fail unevenly leaves the others in a collective: bound that wait
                self.process = subprocess.Popen(
                    _command(nproc, [str(WORKER), str(root)], 0),
                    stdout=out,
                    stderr=err,
                    env=_env({"HLAT_COLLECTIVE_TIMEOUT_S": "120"}),
                    start_new_session=True,
                )
            threading.Thread(target=self._time, daemon=True).start()
        _RUNNING.append(self)

    def _time(self) -> None:
        """Note when the launch ends, whether or not a test is waiting for it then."""
        self.process.wait()
        self.seconds = time.monotonic() - self.started

    def results(self) -> ScenarioResults:
        if self._results is None:
            code, note, asked = 0, "", time.monotonic()
            if self.process is not None:
                try:
                    code = self.process.wait(timeout=max(0.0, self.deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):  # it ended just now
                        os.killpg(self.process.pid, signal.SIGKILL)
                    code, note = self.process.wait(), "the shared launch ran out of time and was killed\n"
                self.waited = time.monotonic() - asked
            output = note + "".join(
                (self.root / f).read_text()[-4000:] for f in ("launch.out", "launch.err") if (self.root / f).is_file()
            )
            self._results = ScenarioResults(self.root, self.worlds, code, output)
            _RUNNING.remove(self)
        return self._results

    def scenario_seconds(self) -> dict[str, float]:
        """Each finished scenario's seconds on rank 0, as tests/scenario_worker.py logs them."""
        log = self.root / "launch.out"
        lines = log.read_text().splitlines() if log.is_file() else []
        found = (re.fullmatch(r"scenario (\S+): ([0-9.]+) s", line) for line in lines)
        return {m[1]: float(m[2]) for m in found if m}

    def scenario_cpu(self, name: str) -> float:
        """A scenario's CPU seconds, over its ranks and the processes it started and waited for."""
        return sum(float(f.read_text()) for f in (self.root / name).glob("cpu.rank*"))

    def stop(self) -> None:
        """End of session: a launch still running (a run cut short, e.g. -x) is killed, its ranks
        first: torchrun starts each in a session of its own, which killing its group would miss."""
        if self.process is not None and self.process.poll() is None:
            for pid in _children(self.process.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):  # it ended just now
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        if self in _RUNNING:
            _RUNNING.remove(self)


def _children(pid: int) -> list[int]:
    """The processes `pid` started (Linux /proc; elsewhere none are found)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(stat.parent.name))
    return found


_RUNNING: list[SharedLaunch] = []


def wait_for_shared_launch() -> None:
    """Before a test starts processes of its own: let the shared launch finish first."""
    for launch in list(_RUNNING):
        launch.results()


class ScenarioResults:
    def __init__(self, root: Path, worlds: dict[str, int], returncode: int, output: str):
        self.root, self.worlds, self.returncode, self.output = root, worlds, returncode, output

    def path(self, name: str) -> Path:
        """The scenario's directory, once it finished on every rank; else fail with why."""
        if name not in self.worlds:
            raise AssertionError(f"no scenario {name!r} was collected (a module's SCENARIOS lists it)")
        out = self.root / name
        errors = sorted(out.glob("error.rank*.txt"))
        if errors:
            raise AssertionError(f"scenario {name} failed:\n" + "\n".join(e.read_text() for e in errors))
        missing = [r for r in range(self.worlds[name]) if not (out / f"done.rank{r}").is_file()]
        if missing:
            raise AssertionError(
                f"scenario {name} did not finish on ranks {missing} (launch exit {self.returncode}):\n" + self.output
            )
        return out

    def json(self, name: str, file: str) -> Any:
        return json.loads((self.path(name) / file).read_text())


# Two layouts that sum the same gradients in another order train weights that differ where AdamW
# amplifies it: each element steps by lr * g / (|g| + eps), so the nearer a gradient is to 0 the
# larger a last-ulp difference of its sum becomes. Measured on the tiny model (fp32, peak LR 3e-3,
# step 1 at half of it, 2-8 steps): every element within 1.5e-6 (5e-4 of the peak LR) but one of
# the token embedding's 32,768, whose gradient had nearly cancelled to 0 (|g| ~ eps): 1.6e-4. So a few elements per tensor may differ up to a third of a peak
# step. A lost, doubled or misplaced share of the data moves most weights by about the learning rate.
ORDER_OF_SUMMATION_ATOL = 3e-6
AMPLIFIED_ELEMENTS, AMPLIFIED_ATOL = 4, 1e-3


def assert_weights_match(
    got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], atol: float = ORDER_OF_SUMMATION_ATOL
) -> None:
    """`got` holds `want`'s tensors, each element within `atol` of it but for at most
    AMPLIFIED_ELEMENTS per tensor, which are within AMPLIFIED_ATOL (a NaN is never)."""
    assert got.keys() == want.keys(), sorted(got.keys() ^ want.keys())
    for key, value in got.items():
        error = (value.double() - want[key].double()).abs().flatten()
        far = (~(error <= atol)).nonzero().flatten()  # NaN is far
        worst = error[far].nan_to_num(nan=float("inf")).max().item() if len(far) else 0.0
        assert len(far) <= AMPLIFIED_ELEMENTS and worst <= AMPLIFIED_ATOL, (
            f"{key}: {len(far)} of {error.numel()} elements differ by more than {atol:g} "
            f"(at most {AMPLIFIED_ELEMENTS} may, by up to {AMPLIFIED_ATOL:g}); the largest by {worst:.3g}"
        )


def checkpoint_tensors(checkpoint: Path, scratch: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint's DCP data as full tensors, flattened to dotted keys."""
    file = scratch / f"{hashlib.sha256(str(checkpoint.resolve()).encode()).hexdigest()[:16]}.pt"  # one per checkpoint
    dcp_to_torch_save(checkpoint / "dcp", file)
    out: dict[str, torch.Tensor] = {}

    def walk(prefix: str, value: object) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        elif isinstance(value, torch.Tensor):
            out[prefix] = value

    walk("", torch.load(file, weights_only=True))
    return out


def assert_same_tensors(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
