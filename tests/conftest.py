import os
import re
import sys

import pytest
import torch

from helpers import WATCHDOG_CHILD_ENV, run_child

SEED_ENV = "MONARCH_FFTCONV_TEST_SEED"


def pytest_configure(config):
    config.addinivalue_line("markers", "watchdog(seconds): the test runs in a child pytest, killed past `seconds`: "
                                       "a kernel that hangs fails the test instead of stalling the suite")


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    """A test marked watchdog(seconds) runs again, alone, in a child pytest with the parent's
    seed; the parent reports the child's outcome, or a failure naming the hang once the time
    is up. A kernel spinning on the GPU cannot be interrupted from inside its process (the
    signal waits for the synchronising call to return): only killing the process ends it."""
    marker = pyfuncitem.get_closest_marker("watchdog")
    if marker is None or os.environ.get(WATCHDOG_CHILD_ENV):
        return None
    seconds = marker.args[0]
    if torch.cuda.is_available():
        # The extension is built (or loaded) here, outside the limit: the child loads it from
        # the build cache, and its time is the test's, not nvcc's.
        from monarch_fftconv import _extension
        _extension.coverage()
    env = {**os.environ, WATCHDOG_CHILD_ENV: "1"}
    seeds = [value for key, value in pyfuncitem.user_properties if key == "seed"]
    if seeds:
        env[SEED_ENV] = str(seeds[-1])
    config = pyfuncitem.config
    run = run_child([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", pyfuncitem.nodeid],
                    seconds, env=env, cwd=config.rootpath)
    if run.timed_out:
        pytest.fail(f"watchdog: still running after {seconds} s in a child process, killed (a hang?); its output:\n"
                    f"{run.tail()}", pytrace=False)
    if run.returncode != 0:
        pytest.fail(f"failed in the watchdog's child process (exit {run.returncode}):\n{run.tail()}", pytrace=False)
    skipped = re.search(r"^SKIPPED \[\d+\] (.*)$", run.output, re.MULTILINE)
    if skipped:
        pytest.skip(f"in the watchdog's child process: {skipped.group(1)}")
    return True


@pytest.fixture
def gen(request) -> torch.Generator:
    """A generator with a fresh seed per test, printed on failure; set
    MONARCH_FFTCONV_TEST_SEED=<seed> to replay a failing run."""
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
