"""CPU tests of examples/train_hyena.py (a tiny training run through `main`, and its task) and of
examples/train_ddp.py's settings (its distributed runs: tests/test_distributed.py)."""
import gc
import importlib.util
import json
import math
import os
import sys

import pytest
import torch

from helpers import is_png

_EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
# One key-value pair, so that a tiny model learns in seconds; the value still lies 62 tokens
# back, past a blank stretch, so only the long convolution can bring it to the last position.
TINY = ["--device", "cpu", "--seq-len", "64", "--width", "32", "--layers", "2", "--batch", "16",
        "--steps", "150", "--pairs", "1", "--lr", "3e-3", "--seed", "0", "--impls", "torch.fft,fp32"]


def _load_example(name: str):
    """examples/<name>.py as a module (the examples are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(_EXAMPLES, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def train_hyena():
    return _load_example("train_hyena")


@pytest.fixture(scope="module")
def tiny_run(train_hyena, tmp_path_factory):
    """The package's runs go through the Monarch engine (on CPU they would take torch.fft,
    which would make the comparison with the torch.fft run trivial)."""
    out = tmp_path_factory.mktemp("train_hyena")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MONARCH_FFTCONV_BACKEND", "portable")
        return train_hyena.main([*TINY, "--out", str(out)]), out


def test_tiny_run_learns(tiny_run):
    results, _ = tiny_run
    for impl, run in results["runs"].items():
        first, last = sum(run["loss"][:10]) / 10, sum(run["loss"][-10:]) / 10
        # Below log(16): it has learnt more than "the answer is some value token".
        assert last < min(0.6 * first, math.log(16) - 0.5), (impl, first, last)
        assert run["final_accuracy"] > 0.4, (impl, run["final_accuracy"])  # chance: 1/16


def test_tiny_run_writes_json_and_png(tiny_run):
    results, out = tiny_run
    assert results["json"] == str(out / "results.json") and results["png"] == str(out / "loss.png")
    with open(results["json"]) as f:
        saved = json.load(f)
    assert set(saved["runs"]) == {"torch.fft", "fp32"}
    assert len(saved["runs"]["fp32"]["loss"]) == len(saved["runs"]["fp32"]["accuracy"]) == 150
    assert saved["config"]["pairs"] == 1 and saved["runs"]["fp32"]["seconds_per_step"] > 0
    assert is_png(results["png"])


def test_package_run_matches_torch_fft_run_at_first_steps(tiny_run):
    """Same initialisation and batches, the same convolution computed two ways."""
    runs = tiny_run[0]["runs"]
    for step in range(5):
        reference, ours = runs["torch.fft"]["loss"][step], runs["fp32"]["loss"][step]
        assert abs(ours - reference) / reference < 1e-3, (step, reference, ours)


def test_recall_batch_is_deterministic_and_answers_the_query(train_hyena):
    config = {"batch": 64, "seq_len": 32, "pairs": 5, "vocab": 32, "device": "cpu"}
    tokens, targets = train_hyena.recall_batch(config, train_hyena.seeded_generator("cpu", 3))
    again, _ = train_hyena.recall_batch(config, train_hyena.seeded_generator("cpu", 3))
    assert torch.equal(tokens, again) and tokens.shape == (64, 32) and targets.shape == (64,)
    keys, values = tokens[:, 0:10:2], tokens[:, 1:10:2]
    assert (keys >= 1).all() and (keys <= 15).all() and (values >= 16).all() and (values < 32).all()
    assert all(len(set(row.tolist())) == 5 for row in keys)  # distinct keys per sequence
    assert (tokens[:, 10:-1] == train_hyena.BLANK).all()
    position = (keys == tokens[:, -1:]).int().argmax(dim=1, keepdim=True)
    assert (keys == tokens[:, -1:]).sum(dim=1).eq(1).all()
    assert torch.equal(values.gather(1, position).squeeze(1), targets)


def test_bad_arguments_are_refused(train_hyena):
    with pytest.raises(SystemExit):
        train_hyena.main(["--device", "cpu", "--impls", "torch.fft,fp64"])
    with pytest.raises(SystemExit):
        train_hyena.main(["--device", "cpu", "--seq-len", "8", "--pairs", "4"])


@pytest.fixture(scope="module")
def train_ddp():
    return _load_example("train_ddp")


def test_ddp_sizes_default_to_the_device(train_ddp):
    """Small on a CPU (the GPU sizes took ~20 s a step there), the larger ones on a GPU; sizes
    given on the command line stand on either."""
    config = train_ddp.configure(train_ddp.parse_args([]), "cpu")
    assert {name: config[name] for name in train_ddp.CPU_DEFAULTS} == train_ddp.CPU_DEFAULTS
    config = train_ddp.configure(train_ddp.parse_args([]), "cuda:1")
    assert {name: config[name] for name in train_ddp.GPU_DEFAULTS} == train_ddp.GPU_DEFAULTS
    cpu, gpu = train_ddp.CPU_DEFAULTS, train_ddp.GPU_DEFAULTS
    assert cpu["batch"] * cpu["seq_len"] * cpu["width"] ** 2 * 100 < gpu["batch"] * gpu["seq_len"] * gpu["width"] ** 2
    config = train_ddp.configure(train_ddp.parse_args(["--seq-len", "128", "--steps", "0"]), "cpu")
    assert config["seq_len"] == 128 and config["steps"] == 0 and config["device"] == "cpu"


def test_ddp_check_states_its_tolerance_and_why(train_ddp):
    for mode in train_ddp.MODES:
        line = train_ddp.check_line(mode, 8.6e-6, 1e-5)
        assert "8.60e-06" in line and "tolerance 1e-05" in line
        assert "fp32 sums in another order" in line and train_ddp.SUMMATION_ORDER[mode] in line


def test_progress_prints_each_step_without_tqdm(train_hyena, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tqdm", None)   # `from tqdm import tqdm` raises ImportError
    progress = train_hyena.Progress(3, "ddp")
    for step in range(3):
        progress.update(ms=f"{step}.0")
    progress.close()
    assert capsys.readouterr().err.splitlines() == [f"ddp: step {i + 1}/3 ms {i}.0" for i in range(3)]


@pytest.fixture(scope="module")
def generate_hyena():
    return _load_example("generate_hyena")


def test_generation_example_methods_agree_and_are_timed(generate_hyena, capsys):
    """The three methods give the same logits (greedy tokens from prefill/step, fed to the
    others); every generated token is timed; the table names each method."""
    results = generate_hyena.main(["--seq-len", "48", "--prompt", "5", "--width", "16", "--vocab", "32", "--batch", "2"])
    printed = capsys.readouterr().out
    for method in generate_hyena.METHODS:
        r = results["methods"][method]
        assert r["tokens"] == r["timed"] == 43 and 0 < r["median_ms"] <= r["p99_ms"] <= r["max_ms"]
        assert r["max_logit_diff"] < 1e-5, (method, r["max_logit_diff"])
        assert f"| {method} |" in printed
    assert results["state_bytes"] > 0


def test_generation_example_times_each_strided_position_after_an_untimed_call(generate_hyena, monkeypatch, capsys):
    """UNTIMED_FIRST: every position a baseline is timed at (a history length for the naive dot
    product) ran once untimed before, so a one-off cost is not counted stride times."""
    calls, timing = [], [False]
    history_dot, timed = generate_hyena.history_dot, generate_hyena.timed

    def recorded_dot(history, reversed_filter):
        calls.append((history.shape[-1], timing[0]))
        return history_dot(history, reversed_filter)

    def recorded_timed(fn, device):
        timing[0] = True
        try:
            return timed(fn, device)
        finally:
            timing[0] = False

    monkeypatch.setattr(generate_hyena, "history_dot", recorded_dot)
    monkeypatch.setattr(generate_hyena, "timed", recorded_timed)
    generate_hyena.main(["--layer", "--seq-len", "61", "--channels", "3", "--baseline-stride", "9"])
    capsys.readouterr()
    timed_lengths = [length for length, in_timing in calls if in_timing]
    assert timed_lengths[:7] == [1, 10, 19, 28, 37, 46, 55]  # the strided positions, timed
    for length in timed_lengths:
        first = calls.index((length, True))
        assert (length, False) in calls[:first], length


def test_generation_example_layer_mode_with_a_stride(generate_hyena, capsys):
    results = generate_hyena.main(["--layer", "--seq-len", "130", "--channels", "6", "--baseline-stride", "7"])
    for method in generate_hyena.METHODS:
        r = results["methods"][method]
        assert r["tokens"] == 130 and r["timed"] == (130 if method == "prefill/step" else 19)
        assert r["max_rel_diff"] < 1e-5, (method, r["max_rel_diff"])
    for method in ("naive", "prefill/step"):  # the back-to-back rerun: its own total, the same bits
        r = results["methods"][method]
        assert r["streamed_total_s"] > 0 and r["streamed_equal"], (method, r)
    assert "streamed_total_s" not in results["methods"]["recompute"]
    assert "(est.)" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        generate_hyena.main(["--seq-len", "8", "--prompt", "8"])
    capsys.readouterr()
    with pytest.raises(SystemExit):
        generate_hyena.main(["--layer", "--seq-len", "8", "--cuda-graph"])  # CUDA graphs on the CPU
    assert "--cuda-graph needs --device cuda" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        generate_hyena.main(["--layer", "--seq-len", "8", "--fused-step"])  # the fused step is a graphs' option
    assert "--fused-step needs --cuda-graph" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        generate_hyena.main(["--layer", "--seq-len", "8", "--no-fused-step"])
    assert "--fused-step needs --cuda-graph" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        generate_hyena.main(["--layer", "--seq-len", "8", "--mid-levels-in-kernel"])
    assert "--mid-levels-in-kernel needs --cuda-graph" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        generate_hyena.main(["--layer", "--seq-len", "8", "--direct-step"])
    assert "--direct-step needs --cuda-graph" in capsys.readouterr().err


def test_generation_example_plots_each_token_at_its_position(generate_hyena, tmp_path, capsys):
    """--plot: each method's timed positions are the tokens it timed (every one for prefill/step,
    every k-th for the strided baselines; the LM's prompt untimed), one latency each, and the PNG
    is written."""
    pytest.importorskip("matplotlib")
    png = tmp_path / "tokens.png"
    results = generate_hyena.main(["--layer", "--seq-len", "70", "--prompt", "3", "--channels", "5",
                                   "--baseline-stride", "4", "--plot", str(png)])
    expected = {"prefill/step": list(range(3, 70)), "naive": list(range(3, 70, 4)), "recompute": list(range(3, 70, 4))}
    for method, positions in expected.items():
        timed_at, seconds = results["methods"][method]["per_token"]
        assert list(timed_at) == positions and len(seconds) == len(positions) and min(seconds) > 0
    assert is_png(png) and f"per-token plot: {png}" in capsys.readouterr().out
    results = generate_hyena.main(["--seq-len", "20", "--prompt", "6", "--width", "8", "--vocab", "16",
                                   "--baseline-stride", "3"])
    assert list(results["methods"]["naive"]["per_token"][0]) == list(range(6, 20))
    assert list(results["methods"]["recompute"]["per_token"][0]) == list(range(6, 20, 3))


@pytest.mark.parametrize("flags, paused", [([], True), (["--python-gc"], False)])
def test_generation_example_pauses_pythons_collector_during_the_run(generate_hyena, monkeypatch, capsys, flags, paused):
    """No full collection lands inside a timed token: the collector is off while the methods
    run (unless --python-gc), and afterwards as it was (on, nothing left frozen)."""
    seen = []
    generate_layer = generate_hyena.generate_layer

    def observed(config):
        seen.append((gc.isenabled(), gc.get_freeze_count() > 0))
        return generate_layer(config)

    monkeypatch.setattr(generate_hyena, "generate_layer", observed)
    assert gc.isenabled()
    generate_hyena.main(["--layer", "--seq-len", "17", "--channels", "3", *flags])
    assert seen == [(not paused, paused)]
    assert gc.isenabled() and gc.get_freeze_count() == 0
    assert f"Python's GC {'paused' if paused else 'on'}" in capsys.readouterr().out
