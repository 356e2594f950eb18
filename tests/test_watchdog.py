"""The watchdog that keeps a hanging kernel from stalling the suite (conftest.py's
`watchdog(seconds)` marker, helpers.run_child), shown on the CPU with children that sleep
forever: a hang is a failure with a message within seconds, and a test that passes, fails or
skips in the child does the same in the parent."""

import os
import re
import sys
import textwrap
from pathlib import Path

from helpers import WATCHDOG_CHILD_ENV, run_child, run_python

TESTS = Path(__file__).resolve().parent


def test_a_hanging_child_is_killed_at_the_limit():
    run = run_python("print('started', flush=True); import time; time.sleep(3600)", timeout=2)
    assert run.timed_out and run.seconds < 10
    assert "started" in run.output  # what it wrote before the limit comes back


def test_a_child_that_ends_reports_its_exit_and_output():
    run = run_python("import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)", timeout=60)
    assert run.returncode == 3 and not run.timed_out
    assert "out" in run.output and "err" in run.output


def test_a_watched_test_that_hangs_fails_with_a_message(tmp_path):
    """A suite of four watched tests, run by a child pytest with this directory's conftest:
    the one that hangs (after it started: it leaves a file) fails at its limit naming the
    hang, and the others keep their outcomes."""
    (tmp_path / "conftest.py").write_text((TESTS / "conftest.py").read_text())
    (tmp_path / "test_watched.py").write_text(textwrap.dedent(f"""
        import time
        from pathlib import Path
        import pytest

        pytestmark = pytest.mark.watchdog(60)

        @pytest.mark.watchdog({HANG_LIMIT})
        def test_hangs():
            Path("entered").touch()
            time.sleep(3600)

        def test_passes():
            pass

        def test_fails():
            assert 1 == 2, "wrong in the child"

        def test_skips():
            pytest.skip("no GPU in the child")
        """))
    env = {key: value for key, value in os.environ.items() if key != WATCHDOG_CHILD_ENV}
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), str(TESTS.parent)])  # helpers, and the package it imports
    run = run_child([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "test_watched.py"],
                    timeout=600, env=env, cwd=tmp_path)
    assert not run.timed_out, run.tail()
    assert "2 failed, 1 passed, 1 skipped" in run.output, run.tail()
    assert f"watchdog: still running after {HANG_LIMIT} s in a child process, killed" in run.output
    assert (tmp_path / "entered").exists(), "killed before the test began: the limit measured the start, not the hang"
    assert "wrong in the child" in run.output
    assert re.search(r"in the watchdog's child process: test_watched.py:\d+: no GPU in the child", run.output)
    assert run.seconds < 300, run.seconds  # the hang cost its limit, not an hour


HANG_LIMIT = 20  # s: a child pytest's start (torch's import) with room, and the hang
