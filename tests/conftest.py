import os

import pytest
import torch

SEED_ENV = "MONARCH_FFTCONV_TEST_SEED"


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
