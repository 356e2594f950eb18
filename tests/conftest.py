import json
import os
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch

from helpers import WATCHDOG_CHILD_ENV, WATCHDOG_REPORT_ENV, Child

SEED_ENV = "MONARCH_FFTCONV_TEST_SEED"
# A watchdog child's time with no test running: its start (python, torch, a CUDA context, the
# extension's load: 12-15 s on an H100 machine), the gaps between tests, its exit. Each test's own
# limit starts when the test does.
WATCHDOG_IDLE_S = float(os.environ.get("MONARCH_FFTCONV_WATCHDOG_IDLE_S", 300))
POLL_S = 0.1
_OUTCOMES = pytest.StashKey[dict[str, tuple[str, str]]]()  # the parent's: nodeid -> (outcome, message)
_SESSION_ENV = pytest.StashKey[dict[str, str]]()  # the parent's environment before any fixture ran


def pytest_configure(config):
    config.addinivalue_line("markers", "watchdog(seconds): the test runs in a child pytest (one per module), "
                                       "killed past `seconds`: a kernel that hangs fails the test instead of "
                                       "stalling the suite")
    # A child starts from inside a test's call, after that test's fixtures set their variables
    # in this process (monkeypatch.setenv): it must inherit the session's environment, not those,
    # or every later test of its module runs under the first test's settings.
    config.stash[_SESSION_ENV] = dict(os.environ)
    if os.environ.get(WATCHDOG_CHILD_ENV) and os.environ.get(WATCHDOG_REPORT_ENV):
        config.pluginmanager.register(_EventWriter(os.environ[WATCHDOG_REPORT_ENV]), "watchdog-events")


def _limit(item) -> float | None:
    """The seconds a watched test may run in a child; None where it runs here (not watched, or
    this is the child)."""
    marker = item.get_closest_marker("watchdog")
    return None if marker is None or os.environ.get(WATCHDOG_CHILD_ENV) else marker.args[0]


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    """A test marked watchdog(seconds) runs in a child pytest, and the parent reports the child's
    outcome, or a failure naming the hang once the time is up. A kernel spinning on the GPU cannot
    be interrupted from inside its process (the signal waits for the synchronising call to
    return): only killing the process ends it. A child's start costs seconds, so the first
    watched test of a module starts one child for all the module's watched tests left to run."""
    if _limit(pyfuncitem) is None:
        return None
    outcomes = pyfuncitem.config.stash.setdefault(_OUTCOMES, {})
    while pyfuncitem.nodeid not in outcomes:  # a child that hung on another test ran only those before it
        module_left = [item for item in pyfuncitem.session.items
                       if item.path == pyfuncitem.path and _limit(item) is not None and item.nodeid not in outcomes]
        outcomes.update(_run_in_child(module_left, pyfuncitem.config))
    outcome, message = outcomes[pyfuncitem.nodeid]
    if outcome == "failed":
        pytest.fail(message, pytrace=False)
    if outcome == "skipped":
        pytest.skip(f"in the watchdog's child process: {message}")
    return True


def _run_in_child(items, config) -> dict[str, tuple[str, str]]:
    """The outcomes of `items` (watched tests of one module) run in one child pytest. A test that
    hangs ends the child: it fails, the tests after it get no outcome here, and the next of them
    the parent reaches starts a new child."""
    if torch.cuda.is_available():
        # The extension is built (or loaded) here, outside the limits: the child loads it from
        # the build cache, and its time is the tests', not nvcc's.
        from monarch_fftconv import _extension
        _extension.coverage()
    limits = {item.nodeid: _limit(item) for item in items}
    with tempfile.TemporaryDirectory() as tmp:
        events = Path(tmp) / "events.jsonl"
        events.touch()
        env = {**config.stash[_SESSION_ENV], WATCHDOG_CHILD_ENV: "1", WATCHDOG_REPORT_ENV: str(events)}
        argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(config.rootpath),
                *limits]
        return _watch(Child(argv, env=env, cwd=config.rootpath), events, limits)


def _watch(child: Child, events: Path, limits: dict[str, float]) -> dict[str, tuple[str, str]]:
    """Polls the child's events until it exits, or kills it: a test past its limit, or no test
    running for WATCHDOG_IDLE_S."""
    outcomes = {}
    running, since = None, child.started  # the test in progress (None: none), and since when
    lines_read = 0
    while True:
        exited = child.wait(POLL_S) is not None  # before reading: the events of an exited child are all written
        for line in events.read_text().splitlines(keepends=True)[lines_read:]:
            if not line.endswith("\n"):
                break  # still being written
            lines_read += 1
            event = json.loads(line)
            running, since = (event["nodeid"] if event["event"] == "start" else None), time.monotonic()
            if event["event"] == "outcome":
                outcomes[event["nodeid"]] = _outcome(event)
        waited = time.monotonic() - since
        limit = limits.get(running, WATCHDOG_IDLE_S)  # not one of ours (None: no test) has the idle limit
        if exited:
            why = f"the watchdog's child process exited (code {child.process.returncode}) before this test's end"
        elif running in limits and waited > limit:
            child.kill()
            return outcomes | {running: ("failed", f"watchdog: still running after {limit} s in a child process, "
                                                   f"killed (a hang?); its output:\n{child.result().tail()}")}
        elif waited > limit:
            child.kill()
            why = f"watchdog: the child pytest ran no test for {WATCHDOG_IDLE_S:g} s (its start?), killed"
        else:
            continue
        return outcomes | {nodeid: ("failed", f"{why}; its output:\n{child.result().tail()}")
                           for nodeid in limits if nodeid not in outcomes}


def _outcome(event: dict) -> tuple[str, str]:
    """(outcome, message) for the parent from a child's outcome event; a failure names its seed."""
    message = event["longrepr"]
    if event["outcome"] == "failed":
        seed = event.get("seed")
        replay = f" (seed={seed}, replay: {SEED_ENV}={seed})" if seed is not None else ""
        message = f"failed in the watchdog's child process{replay}:\n{message}"
    return event["outcome"], message


class _EventWriter:
    """In a watchdog's child: each test's start, and its outcome once its teardown is done, as
    JSON lines flushed to a file the parent polls."""

    def __init__(self, path: str):
        self._file = open(path, "a")
        self._outcomes = {}  # nodeid -> its outcome event so far

    def _write(self, event: dict) -> None:
        self._file.write(json.dumps(event) + "\n")
        self._file.flush()

    def pytest_runtest_logstart(self, nodeid, location):
        self._write({"nodeid": nodeid, "event": "start"})

    def pytest_runtest_logreport(self, report):
        # Setup, call and teardown each report: a failure in any fails the test, a skip (setup's,
        # or the call's) skips a test that has not failed.
        event = self._outcomes.setdefault(report.nodeid, {"nodeid": report.nodeid, "event": "outcome",
                                                          "outcome": "passed", "longrepr": ""})
        if (report.failed and event["outcome"] != "failed") or (report.skipped and event["outcome"] == "passed"):
            event.update(outcome=report.outcome, longrepr=_longrepr(report))
        if report.when == "teardown":
            event["seed"] = dict(report.user_properties).get("seed")
            self._write(self._outcomes.pop(report.nodeid))


def _longrepr(report) -> str:
    """A skip's place and reason; a failure's traceback and the test's captured output (its seed)."""
    if report.skipped and isinstance(report.longrepr, tuple):
        path, lineno, reason = report.longrepr
        return f"{os.path.relpath(path)}:{lineno}: {reason.removeprefix('Skipped: ')}"
    captured = "".join(f"\n{'-' * 20} {title} {'-' * 20}\n{content}" for title, content in report.sections)
    return report.longreprtext + captured


@pytest.fixture
def gen(request) -> torch.Generator:
    """A generator with a fresh seed per test, printed on failure; set
    MONARCH_FFTCONV_TEST_SEED=<seed> to replay a failing run."""
    if _limit(request.node) is not None:
        return torch.Generator()  # unused: the test runs in a watchdog's child, which draws its own seed
    seed = int(os.environ.get(SEED_ENV) or int.from_bytes(os.urandom(4), "little"))
    request.node.user_properties.append(("seed", seed))
    print(f"seed={seed} (replay: {SEED_ENV}={seed})")
    g = torch.Generator()
    g.manual_seed(seed)
    return g


@pytest.fixture
def portable_engine(monkeypatch):
    """Calls inside the test run the emulating Monarch engine (on request, as users ask)."""
    from monarch_fftconv.backends import BACKEND_ENV

    monkeypatch.setenv(BACKEND_ENV, "portable")
