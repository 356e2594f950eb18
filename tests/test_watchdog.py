"""The watchdog that keeps a hanging kernel from stalling the suite (conftest.py's
`watchdog(seconds)` marker, helpers.Child and run_child), shown on the CPU with children that
sleep forever: the watched tests of a module run in one child pytest; a hang fails at its own
limit with a message within seconds, and the tests after it run in a new child; a test that
passes, fails or skips in the child does the same in the parent."""

import os
import re
import sys
import textwrap
from pathlib import Path

import pytest

from helpers import WATCHDOG_CHILD_ENV, ChildRun, run_child, run_python

TESTS = Path(__file__).resolve().parent
HANG_LIMIT = 3  # s: the limit starts at the test's start, after the child's (torch's import)
SEED = 1234     # the parent's MONARCH_FFTCONV_TEST_SEED, which the child must honour

# Each generated test leaves "<module>::<test> <pid>" in a file: which process ran it.
RECORD = """
import os, time
from pathlib import Path
import pytest

watched = pytest.mark.watchdog(60)

def record(name):
    with open(Path(__file__).parent / "pids", "a") as f:
        f.write(f"{Path(__file__).name}::{name} {os.getpid()}\\n")
"""

MODULES = {
    "test_steady.py": """
        @watched
        def test_passes():
            record("test_passes")

        @watched
        def test_fails(gen):
            record("test_fails")
            assert 1 == 2, "wrong in the child"

        @watched
        def test_skips():
            record("test_skips")
            pytest.skip("no GPU in the child")
        """,
    "test_hang.py": f"""
        @watched
        def test_before():
            record("test_before")

        @pytest.mark.watchdog({HANG_LIMIT})
        def test_hangs():
            record("test_hangs")
            time.sleep(3600)

        @watched
        def test_passes_after():
            record("test_passes_after")

        def test_unmarked():
            record("test_unmarked")
            assert "{WATCHDOG_CHILD_ENV}" not in os.environ

        @watched
        def test_skips_after():
            record("test_skips_after")
            pytest.skip("skipped after the hang")

        @watched
        def test_fails_after():
            record("test_fails_after")
            assert 1 == 2, "failed after the hang"
        """,
    # The first test's fixture sets a variable in the parent before its child starts: the child
    # must not inherit it, or the second test runs under the first one's settings.
    "test_env.py": """
        @pytest.fixture
        def setting(monkeypatch):
            monkeypatch.setenv("MONARCH_FFTCONV_TEST_SETTING", "first")

        @watched
        def test_sets(setting):
            record("test_sets")
            assert os.environ["MONARCH_FFTCONV_TEST_SETTING"] == "first"

        @watched
        def test_starts_clean():
            record("test_starts_clean")
            assert "MONARCH_FFTCONV_TEST_SETTING" not in os.environ, "the first test's fixture leaked"
        """,
    "test_crash.py": """
        @watched
        def test_passes():
            record("test_passes")

        @watched
        def test_crashes():
            record("test_crashes")
            os._exit(3)

        @watched
        def test_never_reached():
            record("test_never_reached")
        """,
}


def run_suite(directory: Path, modules: dict[str, str], **env_extra: str) -> ChildRun:
    """`modules` (with RECORD's lines) run by a child pytest in `directory` with this conftest."""
    (directory / "conftest.py").write_text((TESTS / "conftest.py").read_text())
    for name, body in modules.items():
        (directory / name).write_text(RECORD + textwrap.dedent(body))
    env = {key: value for key, value in os.environ.items() if key != WATCHDOG_CHILD_ENV}
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), str(TESTS.parent)])  # helpers, and the package it imports
    env.update(env_extra)
    return run_child([sys.executable, "-m", "pytest", "-v", "-rs", "-p", "no:cacheprovider", *modules],
                     timeout=300, env=env, cwd=directory)


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    """One run of MODULES: its outcome per nodeid, the pids per nodeid, the run."""
    directory = tmp_path_factory.mktemp("watched")
    run = run_suite(directory, MODULES, MONARCH_FFTCONV_TEST_SEED=str(SEED))
    assert not run.timed_out, run.tail()
    outcomes = dict(re.findall(r"^(\S+::\S+) (PASSED|FAILED|SKIPPED|ERROR)", run.output, re.MULTILINE))
    pids = dict(line.split() for line in (directory / "pids").read_text().splitlines())
    return outcomes, {nodeid: int(pid) for nodeid, pid in pids.items()}, run


def test_a_hanging_child_is_killed_at_the_limit():
    run = run_python("print('started', flush=True); import time; time.sleep(3600)", timeout=2)
    assert run.timed_out and run.seconds < 10
    assert "started" in run.output  # what it wrote before the limit comes back


def test_a_child_that_ends_reports_its_exit_and_output():
    run = run_python("import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)", timeout=60)
    assert run.returncode == 3 and not run.timed_out
    assert "out" in run.output and "err" in run.output


def test_each_watched_test_keeps_its_outcome(suite):
    outcomes, _, run = suite
    assert outcomes == {
        "test_steady.py::test_passes": "PASSED", "test_steady.py::test_fails": "FAILED",
        "test_steady.py::test_skips": "SKIPPED",
        "test_hang.py::test_before": "PASSED", "test_hang.py::test_hangs": "FAILED",
        "test_hang.py::test_passes_after": "PASSED", "test_hang.py::test_unmarked": "PASSED",
        "test_hang.py::test_skips_after": "SKIPPED", "test_hang.py::test_fails_after": "FAILED",
        "test_env.py::test_sets": "PASSED", "test_env.py::test_starts_clean": "PASSED",
        "test_crash.py::test_passes": "PASSED", "test_crash.py::test_crashes": "FAILED",
        "test_crash.py::test_never_reached": "FAILED",
    }, run.tail()


def test_a_hang_is_killed_at_its_own_limit_and_the_tests_after_it_run(suite):
    outcomes, pids, run = suite
    assert f"watchdog: still running after {HANG_LIMIT} s in a child process, killed (a hang?)" in run.output
    assert "test_hang.py::test_hangs" in pids, "killed before the test began: the limit measured the start"
    assert "failed after the hang" in run.output  # the real outcome of a test after the hang
    assert re.search(r"in the watchdog's child process: test_hang.py:\d+: skipped after the hang", run.output)
    assert run.seconds < 120, run.seconds  # the hang cost its limit, not an hour


def test_a_module_runs_in_one_child_and_a_hang_starts_a_second(suite):
    _, pids, _ = suite
    steady = {pids[f"test_steady.py::{name}"] for name in ("test_passes", "test_fails", "test_skips")}
    before = {pids[f"test_hang.py::{name}"] for name in ("test_before", "test_hangs")}
    after = {pids[f"test_hang.py::{name}"] for name in ("test_passes_after", "test_skips_after", "test_fails_after")}
    assert len(steady) == len(before) == len(after) == 1 and len(steady | before | after) == 3, pids
    # An unmarked test runs in the parent, not in a child.
    assert pids["test_hang.py::test_unmarked"] not in steady | before | after | {os.getpid()}


def test_a_failure_shows_the_childs_assertion_and_seed(suite):
    _, _, run = suite
    assert "wrong in the child" in run.output
    assert f"failed in the watchdog's child process (seed={SEED}, replay: MONARCH_FFTCONV_TEST_SEED={SEED})" \
        in run.output


def test_a_crashed_child_fails_the_tests_it_did_not_finish(suite):
    _, pids, run = suite
    assert "the watchdog's child process exited (code 3) before this test's end" in run.output
    assert "test_crash.py::test_never_reached" not in pids  # failed for the crash, not run again


def test_a_child_that_never_starts_a_test_is_killed(tmp_path):
    """A child stuck in its start (here: the module's import, in the child only) is killed after
    the idle limit, and its tests fail saying so."""
    stuck = """
        if os.environ.get("MONARCH_FFTCONV_WATCHDOG_CHILD"):
            time.sleep(3600)

        @watched
        def test_one():
            pass

        @watched
        def test_two():
            pass
        """
    run = run_suite(tmp_path, {"test_stuck.py": stuck}, MONARCH_FFTCONV_WATCHDOG_IDLE_S="2")
    assert "2 failed" in run.output, run.tail()
    assert run.output.count("watchdog: the child pytest ran no test for 2 s (its start?), killed") >= 2
