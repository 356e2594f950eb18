"""benchmarks/readme_tables.py: the performance tables written from one benchmark run's JSON.

A quick CPU run of bench_cufft.py (forward with a short and a long shape, and a training step)
is the run; the tables are parsed back and held to the JSON's numbers."""
import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import is_png, load_script
from monarch_fftconv.planner import plan_for

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "benchmarks" / "bench_cufft.py"
SCRIPT = REPO / "benchmarks" / "readme_tables.py"
FORWARD_SHAPES = "1x2x8192,1x1x8193"   # the last L of the forward table, the first of the long one
TRAINING_SHAPES = "1x2x256"
COMMITTED_FIGURE = REPO / "docs" / "img" / "readme_times.png"   # README.md's figure of the tables' run


@pytest.fixture(scope="module")
def tables():
    return load_script("readme_tables", SCRIPT)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """One quick CPU run, its JSON laid out as benchmarks/run_gpu.sh keeps it."""
    root = tmp_path_factory.mktemp("run")
    (root / "bench_json").mkdir()
    for name, extra in (("fwd", ["--shapes", FORWARD_SHAPES]), ("bwd", ["--backward", "--shapes", TRAINING_SHAPES])):
        subprocess.run([sys.executable, str(BENCH), "--quick", "--device", "cpu", "--no-plots", "--out",
                        str(root / name), *extra], check=True, capture_output=True, timeout=300)
        shutil.copy(root / name / "results.json", root / "bench_json" / f"{name}.json")
    return root / "bench_json"


def run_rows(run_dir: Path) -> list[dict]:
    return [row for path in sorted(run_dir.glob("*.json")) for row in json.loads(path.read_text())["results"]]


BEFORE = "# A project\n\nText before the tables.\n\n"
AFTER = "\n\nText after the tables, which the script must leave alone.\n"


def readme_like(path: Path, between: str = "tables of an earlier run") -> Path:
    path.write_text(f"{BEFORE}<!-- tables:begin -->\n{between}\n<!-- tables:end -->{AFTER}")
    return path


def parsed_tables(text: str) -> dict[str, list[dict[str, str]]]:
    """{#### heading: [row as {column: cell}]} of the block between the markers."""
    block = text[text.index("<!-- tables:begin -->"): text.index("<!-- tables:end -->")]
    found: dict[str, list[dict[str, str]]] = {}
    for part in re.split(r"^#### ", block, flags=re.MULTILINE)[1:]:
        heading, *lines = part.splitlines()
        rows = [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in lines if line.startswith("|")]
        if rows:
            found[heading] = [dict(zip(rows[0], cells)) for cells in rows[2:]]
    return found


def table(text: str, starts: str) -> list[dict[str, str]]:
    (rows,) = [rows for heading, rows in parsed_tables(text).items() if heading.startswith(starts)]
    return rows


def key(row: dict) -> tuple[str, str]:
    return row["B×C×L"].replace("×", "x"), row["method"].strip("`")


def close_ms(cell: str, value: float) -> bool:
    """A time written with 4 significant digits holds `value`: off by half a unit of the 4th digit at most."""
    return abs(float(cell) - value) <= 0.51e-3 * abs(value)


def close_ratio(cell: str, value: float) -> bool:
    """A ratio written with 2 decimals ("1.23x") holds `value`."""
    return abs(float(cell.removesuffix("x")) - value) <= 0.0051


def assert_holds(cells: dict[str, str], row: dict, errors: dict[str, str]) -> None:
    assert close_ms(cells["b2b ms"], row["median_ms"]), (cells, row["median_ms"])
    if "latency ms" in cells:
        assert close_ms(cells["latency ms"], row["latency_median_ms"])
    if "vs reference, b2b / latency" in cells:
        speedup = cells["vs reference, b2b / latency"]
        if row.get("validity") == "NOISY":  # untrusted: no speedup, the verdict instead
            assert speedup.startswith("NOISY") and row["speedup_vs_reference"] is None
        else:  # a ratio, or "—" where the benchmark gave none (e.g. its reference was NOISY)
            for cell, value in zip(speedup.split(" / "), (row["speedup_vs_reference"], row["latency_speedup_vs_reference"])):
                assert cell == "—" if value is None else close_ratio(cell, value)
    if "vs reference, b2b" in cells:
        if row["speedup_vs_reference"] is None:  # NOISY or INVALID: no speedup
            assert cells["vs reference, b2b"] == "—"
        else:
            assert close_ratio(cells["vs reference, b2b"], row["speedup_vs_reference"])
    for column, field in errors.items():
        written = cells[column].split(" / ")
        fields = field.split(",")
        assert len(written) == len(fields)
        for cell, name in zip(written, fields):
            assert float(cell) == pytest.approx(row[name], rel=0.051)


def ours_or_reference(row: dict) -> bool:
    return row["family"] in ("monarch", "reference")


def test_tables_hold_the_runs_numbers(tables, run_dir, tmp_path):
    readme, perf = readme_like(tmp_path / "README.md"), readme_like(tmp_path / "performance.md")
    assert tables.main([str(run_dir), "--files", str(readme), str(perf)]) == 0
    text = readme.read_text()
    assert perf.read_text() == text  # the same block in both files
    assert text.startswith(BEFORE) and text.endswith(AFTER) and "an earlier run" not in text
    rows = run_rows(run_dir)

    forward = {key(c): c for c in table(text, "Forward")}
    expected = [r for r in rows if r["pass"] == "fwd" and ours_or_reference(r) and r["L"] <= 8192]
    assert expected and sorted(forward) == sorted((r["shape"], r["method"]) for r in expected)
    for r in expected:
        assert_holds(forward[r["shape"], r["method"]], r, {"rel. L2 error": "rel_err"})

    training = {key(c): c for c in table(text, "Training step")}
    expected = [r for r in rows if r["pass"] == "fwd+bwd" and ours_or_reference(r) and r["train_step"] == "autograd.grad"]
    assert expected and sorted(training) == sorted((r["shape"], r["method"]) for r in expected)
    for r in expected:
        assert_holds(training[r["shape"], r["method"]], r,
                     {"rel. L2 error y / du / dk": "rel_err,grad_u_rel_err,grad_k_rel_err"})

    long = {key(c): c for c in table(text, "Long sequences")}
    expected = [r for r in rows if r["pass"] == "fwd" and ours_or_reference(r) and r["L"] > 8192]
    assert expected and sorted(long) == sorted((r["shape"], r["method"]) for r in expected)
    for r in expected:
        assert_holds(long[r["shape"], r["method"]], r, {"rel. L2 error": "rel_err"})
        assert int(long[r["shape"], r["method"]]["N"]) == plan_for(r["L"]).fft_size

    peers = table(text, "Peers")
    expected = [r for r in rows if not ours_or_reference(r) and r["train_step"] in (None, "autograd.grad")]
    assert expected and sorted((key(c), c["pass"]) for c in peers) == sorted(((r["shape"], r["method"]), r["pass"]) for r in expected)
    for cells in peers:
        peer = next(r for r in expected if (r["shape"], r["method"], r["pass"]) == (*key(cells), cells["pass"]))
        ours = next(r for r in rows if (r["shape"], r["method"], r["pass"]) == (peer["shape"], "monarch[fp32]", peer["pass"]))
        assert_holds(cells, peer, {})
        assert close_ms(cells["`monarch[fp32]` b2b ms"], ours["median_ms"])
        faster = cells["`monarch[fp32]` vs this, b2b"]
        if {peer.get("validity"), ours.get("validity")} & {"NOISY", "INVALID"}:  # no ratio on an untrusted row
            assert faster == "—"
        else:
            assert close_ratio(faster, peer["median_ms"] / ours["median_ms"])


def test_header_names_the_runs_date_device_and_commands(tables, run_dir, tmp_path):
    readme = readme_like(tmp_path / "README.md")
    assert tables.main([str(run_dir), "--files", str(readme)]) == 0
    text = readme.read_text()
    metas = [json.loads(p.read_text()) for p in sorted(run_dir.glob("*.json"))]
    (heading,) = re.findall(r"^### .*$", text, re.MULTILINE)
    assert "CPU" in heading
    for meta in metas:
        assert meta["timestamp_utc"][:10] in heading
        assert meta["source_digest"] in text and "CPU FIGURES, NOT GPU ONES" in text
    commands = re.findall(r"^- `(python benchmarks/bench_cufft.py [^`]*)`", text, re.MULTILINE)
    assert len(commands) == len(metas)
    # each command line parses back to the arguments its JSON recorded
    sys.path.insert(0, str(REPO / "benchmarks"))
    from fftconv_bench.cli import parse_args
    recorded = sorted(json.dumps({k: v for k, v in m["args"].items()}, sort_keys=True) for m in metas)
    reparsed = sorted(json.dumps(json.loads(json.dumps(vars(parse_args(shlex.split(c)[2:])))), sort_keys=True)
                      for c in commands)
    assert reparsed == recorded


def test_check_mode(tables, run_dir, tmp_path):
    readme = readme_like(tmp_path / "README.md")
    assert tables.main([str(run_dir), "--files", str(readme), "--check"]) == 1  # the old block differs
    assert "an earlier run" in readme.read_text()  # and --check wrote nothing
    assert tables.main([str(run_dir), "--files", str(readme)]) == 0
    assert tables.main([str(run_dir), "--files", str(readme), "--check"]) == 0
    written = readme.read_text()
    first_time = re.search(r"\| `reference` \| torch.fft \| ([0-9.]+) \|", written).group(1)
    readme.write_text(written.replace(f"| {first_time} |", f"| {float(first_time) * 2:.4g} |", 1))
    assert tables.main([str(run_dir), "--files", str(readme), "--check"]) == 1
    proc = subprocess.run([sys.executable, str(SCRIPT), str(run_dir), "--files", str(readme), "--check"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and first_time in proc.stdout  # the script, as run: the diff shows the number


@pytest.mark.parametrize("between_markers", [
    "no markers at all",
    "<!-- tables:end -->\nend before begin\n<!-- tables:begin -->",
    "<!-- tables:begin -->\n<!-- tables:end -->\na second pair\n<!-- tables:begin -->\n<!-- tables:end -->",
])
def test_markers_are_required(tables, run_dir, tmp_path, capsys, between_markers):
    path = tmp_path / "README.md"
    path.write_text(f"{BEFORE}{between_markers}{AFTER}")
    for check in ([], ["--check"]):
        assert tables.main([str(run_dir), "--files", str(path), *check]) == 2
        assert f"{path}: needs exactly one" in capsys.readouterr().err
        assert path.read_text() == f"{BEFORE}{between_markers}{AFTER}"


def test_refuses_json_of_two_runs(tables, run_dir, tmp_path, capsys):
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    shutil.copy(run_dir / "fwd.json", mixed / "fwd.json")
    other = json.loads((run_dir / "bwd.json").read_text())
    other["source_digest"] = "0" * 12  # another checkout's run
    (mixed / "bwd.json").write_text(json.dumps(other))
    readme = readme_like(tmp_path / "README.md")
    assert tables.main([str(mixed), "--files", str(readme)]) == 2
    assert "not one run" in capsys.readouterr().err and "an earlier run" in readme.read_text()


@pytest.mark.parametrize("name", ["README.md", "docs/performance.md"])
def test_the_repositorys_files_take_the_tables(tables, run_dir, tmp_path, name):
    """README.md and docs/performance.md hold one marker pair, and a run's tables replace only
    what lies between them (in a copy: the committed files keep their GPU figures)."""
    original = (REPO / name).read_text()
    copy = tmp_path / Path(name).name
    copy.write_text(original)
    assert tables.main([str(run_dir), "--files", str(copy)]) == 0
    begin, end = "<!-- tables:begin -->", "<!-- tables:end -->"
    written = copy.read_text()
    assert written.split(begin)[0] == original.split(begin)[0] and written.split(end)[1] == original.split(end)[1]
    assert parsed_tables(written) and tables.main([str(run_dir), "--files", str(copy), "--check"]) == 0


def test_cudnn_is_a_peer_and_skips_are_listed(tables, run_dir, tmp_path):
    """A cudnn row (here the run's tuned torch.fft row renamed: readme_tables reads only the
    JSON) goes into the peers table beside monarch[fp32]; the CPU run's own cudnn skip is
    listed below it with its reason."""
    data = json.loads((run_dir / "fwd.json").read_text())
    tuned = next(r for r in data["results"] if r["method"].endswith("-tuned"))
    data["results"].append({**tuned, "method": "cudnn", "family": "cudnn", "backend": "cuDNN"})
    run = tmp_path / "run"
    run.mkdir()
    (run / "fwd.json").write_text(json.dumps(data))
    readme = readme_like(tmp_path / "README.md")
    assert tables.main([str(run), "--files", str(readme)]) == 0
    text = readme.read_text()
    peers = {(key(c), c["pass"]): c for c in table(text, "Peers")}
    cells = peers[(tuned["shape"], "cudnn"), "fwd"]
    assert cells["backend"] == "cuDNN"
    assert_holds(cells, {**tuned, "method": "cudnn"}, {})
    (skip,) = [s for s in data["skipped"] if s["method"] == "cudnn"]
    assert f"- `cudnn`: {skip['reason']}" in text.split("Skipped, not measured:")[1]


def test_a_noisy_rows_reasons_are_written_once(tables):
    """A run before session 19's fix repeated the one reason once per later row of its shape."""
    why = "the same code as monarch[fp32] timed 0.0928 against 0.064 ms (the machine changed between the rows)"
    other = "an IQR above 25% of the median"
    cell = tables.speedups({"validity": "NOISY", "noisy_because": "; ".join([why, why, other, why])})
    assert cell == f"NOISY ({why}; {other})"
    assert tables.speedups({"validity": "NOISY", "noisy_because": None}) == "NOISY (spread)"


def test_the_committed_tables_are_the_newest_committed_runs():
    """README.md's and docs/performance.md's tables are what the newest run under docs/runs/
    gives: a hand edit between the markers, or a table from another run, fails."""
    newest = sorted(path for path in (REPO / "docs" / "runs").iterdir() if path.is_dir())[-1]
    check = subprocess.run([sys.executable, str(SCRIPT), str(newest), "--figure", str(COMMITTED_FIGURE), "--check"],
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


def test_the_slower_cells_are_listed_against_the_reference_and_each_peer(tables, run_dir, tmp_path):
    """Every (row of this package, clock, reference or peer of its shape, pass and training step)
    where the package took longer is a row of the slower-cells table, with both times and their
    ratio, and a NOISY side named; a run where none is slower says so in one line."""
    data = json.loads((run_dir / "fwd.json").read_text())
    rows = [r for r in data["results"] if r.get("status") == "ok"]
    for r in data["results"]:  # a quick CPU run may mark its rows NOISY: here only the peer is
        r["validity"] = "OK"
    shape_ = rows[0]["shape"]
    ref = next(r for r in rows if r["shape"] == shape_ and r["method"] == "reference")
    ours = [r for r in rows if r["shape"] == shape_ and r["family"] == "monarch"]
    # every package row clearly faster than its shape's reference, both clocks...
    refs = {r["shape"]: r for r in rows if r["method"] == "reference"}
    for r in rows:
        if r["family"] == "monarch":
            mine = refs[r["shape"]]
            r["median_ms"], r["latency_median_ms"] = 0.5 * mine["median_ms"], 0.5 * mine["latency_median_ms"]
    peer = {**ref, "method": "cudnn", "family": "cudnn", "backend": "cuDNN", "validity": "NOISY",
            "median_ms": 10 * ref["median_ms"], "latency_median_ms": 10 * ref["latency_median_ms"]}
    data["results"] = [r for r in data["results"] if r["family"] in ("monarch", "reference")] + [peer]
    run = tmp_path / "none"
    run.mkdir()
    (run / "fwd.json").write_text(json.dumps(data))
    readme = readme_like(tmp_path / "README.md")
    assert tables.main([str(run), "--files", str(readme)]) == 0
    assert "None: every row of this package is at least as fast" in readme.read_text()
    # ...then one package row slower than the reference b2b only, and than the peer at latency only
    slow = ours[0]
    slow["median_ms"] = 1.25 * ref["median_ms"]
    slow["latency_median_ms"] = 12 * ref["latency_median_ms"]
    (run / "fwd.json").write_text(json.dumps(data))
    assert tables.main([str(run), "--files", str(readme)]) == 0
    listed = table(readme.read_text(), "Where this package is slower")
    assert {(c["method"], c["clock"], c["slower than"]) for c in listed} == {
        (f"`{slow['method']}`", "b2b", "`reference`"), (f"`{slow['method']}`", "latency", "`reference`"),
        (f"`{slow['method']}`", "latency", "`cudnn`")}
    by_other = {(c["clock"], c["slower than"]): c for c in listed}
    cell = by_other["b2b", "`reference`"]
    assert close_ms(cell["ms"], slow["median_ms"]) and close_ms(cell["its ms"], ref["median_ms"])
    assert close_ratio(cell["ratio"], 1.25) and cell["note"] == ""
    assert by_other["latency", "`cudnn`"]["note"] == "NOISY: `cudnn`"
    assert close_ratio(by_other["latency", "`cudnn`"]["ratio"], 1.2)
    # an INVALID side (under its memory floor) is named too, and the peers table gives no ratio on it
    peer["validity"], slow["validity"] = "INVALID", "NOISY"
    (run / "fwd.json").write_text(json.dumps(data))
    assert tables.main([str(run), "--files", str(readme)]) == 0
    listed = table(readme.read_text(), "Where this package is slower")
    notes = {(c["clock"], c["slower than"]): c["note"] for c in listed}
    assert notes["latency", "`cudnn`"] == f"NOISY: `{slow['method']}`; INVALID: `cudnn`"
    assert notes["b2b", "`reference`"] == f"NOISY: `{slow['method']}`"
    assert tables.peers_table([peer], [{**ref, "method": tables.PEER_BASELINE}])[-1].endswith("| — |")


def test_the_figure_draws_the_tables_rows(tables, run_dir, tmp_path):
    """--figure: a PNG of the forward and the training step, one bar per (shape, method) of
    FIGURE_METHODS that the run has, its height the row's b2b median; each file's block links the
    figure by its path relative to that file; --check checks the link and writes no PNG."""
    pytest.importorskip("matplotlib")
    rows = run_rows(run_dir)
    figure = tmp_path / "img" / "times.png"
    figure.parent.mkdir()
    (tmp_path / "docs").mkdir()
    readme, perf = readme_like(tmp_path / "README.md"), readme_like(tmp_path / "docs" / "performance.md")
    assert tables.main([str(run_dir), "--files", str(readme), str(perf), "--figure", str(figure)]) == 0
    assert is_png(figure) and figure.stat().st_size > 10_000
    assert "](img/times.png)" in readme.read_text() and "](../img/times.png)" in perf.read_text()

    drawn = tables.write_figure(tables.load_run([run_dir]), tmp_path / "again.png")
    expected = {"forward": [r for r in rows if r["pass"] == "fwd"],
                "training step": [r for r in rows if r["pass"] == "fwd+bwd" and r["train_step"] == "autograd.grad"]}
    assert len(drawn) == 2
    for heading, bars in drawn.items():
        (wanted,) = [v for k, v in expected.items() if heading.startswith(k)]
        wanted = {(r["shape"], r["method"]): r["median_ms"] for r in wanted
                  if r["method"] in tables.FIGURE_METHODS and r["status"] == "ok"}
        assert wanted and bars == wanted   # no row left out, none drawn twice or from another pass
        assert {m for _, m in bars} >= {"reference", "monarch[fp32]"}

    figure.unlink()
    assert tables.main([str(run_dir), "--files", str(readme), "--figure", str(figure), "--check"]) == 0
    assert not figure.exists()
    assert tables.main([str(run_dir), "--files", str(readme), "--check"]) == 1   # the link is part of the block
