"""benchmarks/gpu/gpu.py, the first GPU run in one command, cannot rot: without CUDA the same command
runs every part at tiny sizes (the smoke) and every case must pass; its runner turns a part that
outlasts its time or dies into rows that say so; the wheels it installs are re-packed and installed
as they will be on the GPU machine, without a network."""

from __future__ import annotations

import base64
import hashlib
import importlib
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from tests.tiny import REPO

pytestmark = pytest.mark.usefixtures("benchmarks_importable")

# Rows that the smoke reports as not run, and why: on a developer's machine nothing is installed,
# and torchrun over several GPUs needs them.
EXPECTED_NOT_RUN = {("setup", "wheels"), ("setup", "the project"),
                    ("torchrun", "torchrun --nproc_per_node N (gloo), N GPUs")}


@pytest.fixture
def benchmarks_importable(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks" / "gpu"))  # as `python benchmarks/gpu/gpu.py` has it


def _wheel(folder: Path, *, name: str, files: dict[str, bytes]) -> Path:
    """A minimal wheel of `files` (a module and whatever else), with its METADATA, WHEEL and RECORD."""
    info = f"{name}-1.0.dist-info"
    contents = {**files, f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n".encode(),
                f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
                f"{info}/top_level.txt": f"{name}\n".encode()}
    record = "".join(f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},"
                     f"{len(data)}\n" for path, data in contents.items()) + f"{info}/RECORD,,\n"
    path = folder / f"{name}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for member, data in {**contents, f"{info}/RECORD": record.encode()}.items():
            archive.writestr(member, data)
    return path


# ----------------------------------------------------------------------------------------------- the smoke

# The port part's code stands in here for sgrvinod's models.py (which is never committed, and which the
# GPU run imports from its clone): the same class, arguments and returns, so that the part's plumbing
# (the import from a folder, its train.py's step, the ratios) is what the smoke proves.
STAND_IN_PORT = """
import torch
from torch import nn


class DecoderWithAttention(nn.Module):
    def __init__(self, attention_dim, embed_dim, decoder_dim, vocab_size, encoder_dim=2048, dropout=0.5):
        super().__init__()
        self.vocab_size = vocab_size
        self.embedding = nn.Embedding(vocab_size, embed_dim)
        self.score = nn.Linear(encoder_dim + decoder_dim, 1)
        self.cell = nn.LSTMCell(embed_dim + encoder_dim, decoder_dim)
        self.fc = nn.Linear(decoder_dim, vocab_size)
        self.dropout = nn.Dropout(dropout)

    def forward(self, encoder_out, encoded_captions, caption_lengths):
        batch, dim = encoder_out.size(0), encoder_out.size(-1)
        encoder_out = encoder_out.view(batch, -1, dim)
        caption_lengths, sort_ind = caption_lengths.squeeze(1).sort(dim=0, descending=True)
        encoder_out, encoded_captions = encoder_out[sort_ind], encoded_captions[sort_ind]
        embeddings = self.embedding(encoded_captions)
        h = c = encoder_out.new_zeros(batch, self.cell.hidden_size)
        decode_lengths = (caption_lengths - 1).tolist()
        predictions = encoder_out.new_zeros(batch, max(decode_lengths), self.vocab_size)
        alphas = encoder_out.new_zeros(batch, max(decode_lengths), encoder_out.size(1))
        for t in range(max(decode_lengths)):
            n = sum(length > t for length in decode_lengths)
            query = h[:n].unsqueeze(1).expand(-1, encoder_out.size(1), -1)
            alpha = self.score(torch.cat([encoder_out[:n], query], dim=2)).squeeze(2).softmax(dim=1)
            context = (encoder_out[:n] * alpha.unsqueeze(2)).sum(dim=1)
            h, c = self.cell(torch.cat([embeddings[:n, t], context], dim=1), (h[:n], c[:n]))
            predictions[:n, t] = self.fc(self.dropout(h))
            alphas[:n, t] = alpha
        return predictions, encoded_captions, decode_lengths, alphas, sort_ind
"""


@pytest.mark.slow
def test_the_smoke_runs_every_part_and_every_case_passes(tmp_path: Path):
    """`python benchmarks/gpu/gpu.py --out DIR` on a machine without CUDA: every part of the GPU plan at
    tiny sizes, each case a row of gpu.json and gpu.md, none failed."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "CAPTIONING_QUIET": "1"}
    out, port = tmp_path / "out", tmp_path / "port"
    port.mkdir()
    (port / "models.py").write_text(STAND_IN_PORT)
    start = time.monotonic()
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu" / "gpu.py"), "--out", str(out), "--smoke",
                           "--wheels", str(tmp_path / "no_wheels"), "--minutes", "15", "--port", str(port)], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=960)
    seconds = time.monotonic() - start
    report = json.loads((out / "gpu.json").read_text())
    failed = [f"{row['part']} / {row['case']}: {row['cause']}" for row in report["rows"] if row["status"] != "ok"
              and (row["part"], row["case"]) not in EXPECTED_NOT_RUN]
    assert done.returncode == 0 and not failed, "\n".join(failed) + "\n" + (out / "gpu.log").read_text()[-3000:]
    gpu = importlib.import_module("gpu")
    rows = {(row["part"], row["case"]): row["values"] for row in report["rows"]}
    assert len(rows) == len(report["rows"])  # one row per case, each case named once
    assert {part for part, _ in rows} == {"setup", *gpu.PARTS}
    assert rows.keys() >= EXPECTED_NOT_RUN
    table = (out / "gpu.md").read_text()
    assert table.count("\n| ") == len(report["rows"]) + 1  # a line per row, under the header's
    assert list(report["parts_s"]) == ["setup", *gpu.PARTS]  # each part's seconds, in the order run
    assert all(seconds > 0 for seconds in report["parts_s"].values())
    # each part's own seconds, not the run's so far: together no more than the whole (each rounded to 0.1 s)
    assert sum(report["parts_s"].values()) <= report["elapsed_s"] + 0.05 * (len(report["parts_s"]) + 1)
    assert f"parts: setup {report['parts_s']['setup']:.0f} s, paths " in table
    by_part = {part: [values for (p, _), values in rows.items() if p == part] for part in gpu.PARTS}
    assert len(by_part["train"]) == 9  # soft fused, soft step-by-step and hard, in fp32, bf16 and fp16
    for values in by_part["train"]:  # an epoch of Karpathy's train + restval, of train2014
        assert values["captions_per_s"] > 0 and values["coco_epoch_min"] == pytest.approx(
            566_747 / values["captions_per_s"] / 60) and values["train2014_epoch_min"] < values["coco_epoch_min"]
    assert all(v["images_per_s"] > 0 for part in ("beam", "encoders") for v in by_part[part])
    assert rows[("paths", "checkpoint: cpu -> cpu -> cpu")]["legs"] == ["cpu:2", "cpu:4", "cpu:6"]
    assert rows[("paths", "fp16 with the scaler, an overflow skipped")] == {"scale_after_finite": 2.0**16,
                                                                           "scale_after_overflow": 2.0**15}
    stopped = rows[("torchrun", "torchrun --nproc_per_node 1 (gloo): steps, SIGTERM, checkpoint")]
    resumed = rows[("torchrun", "torchrun --nproc_per_node 1 (gloo): --resume")]
    assert resumed["resumed_from"] == stopped["stopped_at_step"] >= 3 and resumed["ended_at"] == stopped[
        "stopped_at_step"] + 4
    for device in ("on the device (cpu)", "on the CPU", "on the device (cpu), train.seed=1 (the seeds' spread)",
                   "on the device (cpu), train.graph"):  # case names are unique: the smoke's device is the CPU
        trained = rows[("training", f"train 1 epoch {device}")]
        assert len(trained["epoch_s"]) == len(trained["CIDEr"]) == len(trained["Bleu_4"]) == 1
    graph_run = rows[("training", "train 1 epoch on the device (cpu), train.graph")]
    assert {"CIDEr_gap", "CIDEr_seed_gap", "Bleu_4_gap", "Bleu_4_seed_gap"} <= graph_run.keys()
    compiled = rows[("compile", "compiled (eager): soft fused 3x3x8 bf16 B=4, one caption length")]
    assert {"graphs", "graph_breaks"} <= compiled.keys()
    profiled = rows[("profile", "profile soft fused 3x3x8 bf16 B=4")]
    assert profiled["launches_per_step"] > 0 and profiled["step_ms"] > 0
    kept = (out / "profile.md").read_text()  # beside gpu.md: the heaviest kernels of each batch size
    assert "## soft fused 3x3x8 bf16 B=4" in kept and kept.count("\n| `") == 10
    theirs = rows[("port", "sgrvinod/a-PyTorch-Tutorial-to-Image-Captioning DecoderWithAttention 3x3x8 fp32 B=4")]
    for key, ours in (("ratio", "graphed 3x3x8 bf16"), ("ratio_eager", "fused 3x3x8 bf16"),
                      ("ratio_fp32", "fused 3x3x8 fp32")):  # the graph's, the package's fastest step, as `ratio`
        assert theirs[key] == pytest.approx(rows[("port", f"ours soft {ours} B=4")]["captions_per_s"]
                                            / theirs["captions_per_s"])
    graphed = rows[("graph", "soft graphed 3x3x8 bf16 B=4")]
    eager = rows[("graph", "soft fused 3x3x8 bf16 B=4, eager beside the graph")]
    assert graphed["ratio_eager"] == pytest.approx(graphed["captions_per_s"] / eager["captions_per_s"])
    assert graphed["graphs"] == graphed["graphs_after_rate_change"] == 0  # off CUDA the step runs eagerly
    assert graphed["capture_s"] > 0
    assert 0 <= graphed["loss_gap"] < 2.0**-8  # bf16's rounding, not another loss
    for precision in ("bf16", "fp32"):  # the whole search as one graph (eager off CUDA), beside the eager search
        whole = rows[("beam", f"beam 3 3x3x8 fused {precision} 2 images, one CUDA graph")]
        assert whole["graphs"] == 0  # off CUDA the search runs eagerly (its capture: below, on the stand-in)
        assert whole["ratio_eager"] == pytest.approx(
            whole["images_per_s"] / rows[("beam", f"beam 3 3x3x8 fused {precision} 2 images")]["images_per_s"])
    unfused = rows[("graph", "soft graphed 3x3x8 bf16 B=4, the score in PyTorch (no Triton kernels)")]
    assert unfused["ratio_kernels"] == pytest.approx(graphed["captions_per_s"] / unfused["captions_per_s"])
    print(f"smoke: {seconds:.0f} s, {len(report['rows'])} rows")


# ----------------------------------------------------------------------------------------------- the runner

FAKE_PART = '''
import json, os, sys, time
rows = sys.argv[sys.argv.index("--rows") + 1]
with open(rows, "a") as f:
    f.write(json.dumps({"plan": ["first", "second", "third"]}) + "\\n")
    f.write(json.dumps({"row": {"part": "train", "case": "first", "status": "ok", "cause": "",
                                "values": {"captions_per_s": 10.0}}}) + "\\n")
print("CUDA error: an illegal memory access was encountered", flush=True)
time.sleep(float(os.environ["FAKE_PART_SLEEP"]))
raise SystemExit(3)
'''


def _captured_on_the_cpu(tmp_path: Path, monkeypatch):
    """The CPU's stand-in for CUDA graphs (tests/cuda_graphs.py) in place, and a part's context of the
    smoke's plan on the CPU: (the stand-in, the context)."""
    import torch

    from tests.cuda_graphs import cpu_cuda_graphs

    plan = importlib.import_module("plan")
    context = plan.Context(plan=plan.SMOKE, device=torch.device("cpu"), work=tmp_path, cases=None)
    return cpu_cuda_graphs(monkeypatch), context


def test_the_graph_part_times_replays_of_one_captured_graph_and_captures_again_after_a_new_rate(
        tmp_path: Path, monkeypatch):
    """The graph part where the step is captured, as on CUDA: here on the test suite's CPU stand-in
    for CUDA graphs (tests/cuda_graphs.py), which the smoke's own process does not have. Its warm-up
    ends in one capture, the timed steps are that graph's replays, the halved rate captures it
    again, and the loss gap is measured on a replay."""
    import functools

    stand_in, context = _captured_on_the_cpu(tmp_path, monkeypatch)
    graphs, plan = importlib.import_module("graphs"), importlib.import_module("plan")
    monkeypatch.setattr(graphs, "GraphedStep", functools.partial(graphs.GraphedStep, capture=True))
    values = graphs.graphed_case(context, batch=4, precision="bf16")
    assert values["graphs"] == values["graphs_after_rate_change"] == 1 and values["skipped_steps"] == 0
    # the capture's own replay and the timed steps; after the new rate, a capture and one replay
    assert stand_in.replays == [1 + values["timed_steps"], 2]
    assert values["timed_steps"] == plan.SMOKE.timed_steps
    assert 0 <= graphs.loss_gap(context, batch=4, precision="bf16") < 2.0**-8
    assert stand_in.replays[2:] == [2]  # the probe's step was the second replay of its graph


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_beam_part_times_replays_of_the_whole_search_captured_once(tmp_path: Path, monkeypatch,
                                                                       precision: str):
    """The beam part's "one CUDA graph" rows where the search is captured, as on CUDA: on the CPU's
    stand-in (tests/cuda_graphs.py), the fused search of fixed length, under bf16 autocast too,
    records without a read on the host, and every timed search is a replay of it."""
    stand_in, context = _captured_on_the_cpu(tmp_path, monkeypatch)
    speed, plan = importlib.import_module("speed"), importlib.import_module("plan")
    values = speed.beam_case(context, plan.SMOKE.grids[0], plan.SMOKE.beam_batches[-1], precision, True,
                             graphed=True, capture=True)
    assert values["graphs"] == 1 and values["images_per_s"] > 0
    assert stand_in.replays == [plan.SMOKE.timed_steps]  # the timed searches, each a replay


@pytest.mark.parametrize("sleep, second, third", [
    (60, ("not run", "the part was stopped at its time limit (3 s) while this case ran"),
     ("not run", "the part was stopped at its time limit (3 s) before this case")),
    (0, ("failed", "the part's process ended with exit code 3: CUDA error: an illegal memory access was encountered"),
     ("not run", "the part's process ended with exit code 3 before this case")),
], ids=["stopped", "died"])
def test_a_part_stopped_at_its_limit_or_dead_leaves_its_rows_and_a_row_for_each_case_it_did_not_reach(
        tmp_path: Path, monkeypatch, sleep: int, second: tuple[str, str], third: tuple[str, str]):
    import argparse

    gpu = importlib.import_module("gpu")
    from report import Report

    script = tmp_path / "fake_part.py"
    script.write_text(FAKE_PART)
    monkeypatch.setattr(gpu, "SCRIPT", script)
    monkeypatch.setattr(gpu, "GRACE_SECONDS", 0)
    args = argparse.Namespace(out=tmp_path / "out", smoke=False)
    args.out.mkdir()
    (args.out / "gpu.log").write_text("")
    report = Report(args.out, {"plan": "test"})
    gpu.run_in_process("train", args=args, seconds=3, report=report, env={**os.environ, "FAKE_PART_SLEEP": str(sleep)},
                       work=tmp_path)
    saved = json.loads((args.out / "gpu.json").read_text())["rows"]
    assert [(row["case"], row["status"], row["cause"]) for row in saved] == [
        ("first", "ok", ""), ("second", *second), ("third", *third)]
    assert "10 captions/s" in (args.out / "gpu.md").read_text()


def test_each_part_gets_its_seconds_and_the_last_one_named_what_is_left_of_the_minutes(tmp_path: Path,
                                                                                       monkeypatch):
    """`--parts train,compile --minutes 10`: train is held to its planned seconds, compile (last)
    may use the rest, so a slow compile is not stopped at its 60 s while minutes go unused."""
    import argparse

    gpu = importlib.import_module("gpu")
    import install
    from plan import SMOKE

    given: dict[str, float] = {}
    monkeypatch.setattr(install, "set_up", lambda **_: ([], {}))
    monkeypatch.setattr(gpu, "run_in_process", lambda part, *, seconds, **_: given.setdefault(part, seconds))
    args = argparse.Namespace(out=tmp_path / "out", minutes=10.0, wheels=tmp_path, smoke=True, keep_work=False,
                              argv=[], port=tmp_path)
    gpu.run(args, ["train", "compile"])
    assert given["train"] == pytest.approx(SMOKE.budgets["train"], abs=2)
    assert given["compile"] == pytest.approx(600 - gpu.STOP_RESERVE, abs=2)  # train took none of its own


def test_cases_give_each_outcome_its_row(tmp_path: Path):
    from report import Cases, NotRun, read_rows

    rows = tmp_path / "rows.jsonl"
    cleaned = []
    cases = Cases("paths", rows, deadline=time.monotonic() + 60, cleanup=lambda: cleaned.append(True))
    cases.plan(["a", "b", "c", "d"])

    def broken() -> dict:
        raise ZeroDivisionError("the step divided by zero")

    def absent() -> dict:
        raise NotRun("one GPU here")

    assert cases.run("a", lambda: {"seconds": 1.5}) == {"seconds": 1.5}
    assert cases.run("b", broken) is None and cleaned == [True]
    assert cases.run("c", absent) is None
    cases.deadline = time.monotonic() - 1
    assert cases.run("d", lambda: pytest.fail("a case past the deadline ran")) is None
    entries, seen = read_rows(rows)
    assert seen == 5 and entries[0] == {"plan": ["a", "b", "c", "d"]}
    outcomes = [(e["row"]["case"], e["row"]["status"], e["row"]["cause"]) for e in entries[1:]]
    assert outcomes[0] == ("a", "ok", "")
    assert outcomes[1][:2] == ("b", "failed") and outcomes[1][2].startswith("ZeroDivisionError: the step divided by "
                                                                             "zero (test_gpu_benchmark.py:")
    assert outcomes[2:] == [("c", "not run", "one GPU here"), ("d", "not run", "the part's time was spent before "
                                                                               "this case")]


def test_the_report_holds_every_row_so_far_after_each_one(tmp_path: Path):
    from report import Report, Row

    report = Report(tmp_path, {"gpu": "none"})
    report.add(Row("train", "soft fused 14x14x512 bf16 B=64", "ok", values={"captions_per_s": 20_500.0,
                                                                             "peak_gpu_mib": 1234.0}))
    assert [row["case"] for row in json.loads((tmp_path / "gpu.json").read_text())["rows"]] == [
        "soft fused 14x14x512 bf16 B=64"]
    report.add(Row("beam", "beam 3", "failed", "OutOfMemoryError: CUDA out of memory"))
    saved = json.loads((tmp_path / "gpu.json").read_text())
    assert saved["counts"] == {"ok": 1, "failed": 1, "not run": 0} and len(saved["rows"]) == 2
    table = (tmp_path / "gpu.md").read_text()
    assert "| train | soft fused 14x14x512 bf16 B=64 | ok | 20,500 captions/s; peak GPU 1,234 MiB |  |" in table
    assert "| beam | beam 3 | failed |  | OutOfMemoryError: CUDA out of memory |" in table


# ----------------------------------------------------------------------------------------------- the wheels

def test_pycocoevalcap_is_repacked_without_its_java_parts_and_installs_without_a_network(tmp_path: Path):
    from wheels import NO_JAVA_TAG, without_java

    original = _wheel(tmp_path, name="evalcap", files={"evalcap/__init__.py": b"SCORE = 1\n",
                                                       "evalcap/meteor/meteor-1.5.jar": b"\0" * 5000,
                                                       "evalcap/meteor/data/paraphrase-en.gz": b"\1" * 5000})
    repacked = without_java(original)
    assert repacked.name == f"evalcap-1.0-{NO_JAVA_TAG}-py3-none-any.whl" and not original.exists()
    with zipfile.ZipFile(repacked) as archive:
        names = archive.namelist()
        assert not [n for n in names if n.endswith((".jar", ".gz"))]
        assert f"Build: {NO_JAVA_TAG}" in archive.read("evalcap-1.0.dist-info/WHEEL").decode()
        record = archive.read("evalcap-1.0.dist-info/RECORD").decode().splitlines()
        for line in record[:-1]:
            path, digest, size = line.split(",")
            data = archive.read(path)
            assert digest == "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert int(size) == len(data)
        assert sorted(line.split(",")[0] for line in record) == sorted(names)
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target", str(site),
                    str(repacked)], check=True, env={**os.environ, "PIP_NO_INDEX": "1"})
    assert (site / "evalcap" / "__init__.py").exists() and not (site / "evalcap" / "meteor").exists()


def test_make_gpu_wheels_fetches_through_the_commands_one_entry_point(tmp_path: Path, monkeypatch, capsys):
    """`make gpu-wheels` is `benchmarks/gpu/gpu.py --fetch-wheels`: the folder emptied, each pinned
    wheel downloaded into it for the GPU machine's Python, pycocoevalcap's re-packed without Java,
    and what they weigh said."""
    gpu = importlib.import_module("gpu")
    import wheels

    asked = []

    def download(requirement: str, *, dest: Path, python_version: str) -> None:  # the index, without a network
        asked.append((requirement, python_version))
        name = requirement.split("==")[0].replace("-", "_")
        _wheel(dest, name=name, files={f"{name}/__init__.py": b"", f"{name}/meteor/meteor.jar": b"\0" * 100})

    monkeypatch.setattr(wheels, "download", download)
    folder = tmp_path / "gpu-wheels"
    folder.mkdir()
    (folder / "stale-0.1-py3-none-any.whl").write_bytes(b"")
    assert gpu.main(["--fetch-wheels", "--wheels", str(folder), "--python-version", "3.11", "--limit-mib", "1000"]) == 0
    assert asked == [(requirement, "3.11") for requirement in wheels.WHEELS]
    names = sorted(path.name for path in folder.iterdir())
    assert len(names) == len(wheels.WHEELS) and "stale-0.1-py3-none-any.whl" not in names
    repacked = [name for name in names if wheels.NO_JAVA_TAG in name]
    assert repacked == [f"pycocoevalcap-1.0-{wheels.NO_JAVA_TAG}-py3-none-any.whl"]
    printed = capsys.readouterr().out
    assert f"({len(wheels.WHEELS)} wheels)" in printed
    # the stand-ins weigh nothing: each pinned wheel's recorded size is said to be out of date
    assert printed.count("write this size there") == len(wheels.WHEELS)


def test_set_up_installs_the_wheels_of_what_does_not_import_and_nothing_else(tmp_path: Path):
    from install import project_modules, requirements, set_up
    from wheels import LEFT_OUT

    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _wheel(wheels, name="gpu_run_probe", files={"gpu_run_probe/__init__.py": b"ANSWER = 42\n"})
    _wheel(wheels, name="yaml", files={"yaml/__init__.py": b"raise ImportError('not this one')\n"})  # imports already
    rows, env = set_up(wheels=wheels, site=tmp_path / "site")
    installed = {row.case: row for row in rows}
    assert installed["wheels"].status == "ok"
    assert installed["wheels"].values["installed"] == ["gpu_run_probe-1.0-py3-none-any.whl"]
    assert installed["the project"].status == "not run"  # the tree's captioning imports already
    assert installed["imports"].status == "ok"
    assert installed["imports"].values["of"] == len(requirements()) - len(LEFT_OUT) + len(project_modules())
    probe = subprocess.run([sys.executable, "-c", "import gpu_run_probe, yaml; print(gpu_run_probe.ANSWER)"], env=env,
                           capture_output=True, text=True, check=True)
    assert probe.stdout.strip() == "42"


def test_the_wheels_are_setup_cfgs_requirements_and_their_own():
    from install import requirements
    from wheels import LEFT_OUT, WHEELS

    needed = {name.lower() for name in requirements()}
    assert {"pillow": "PIL", "PyYAML": "yaml"}.items() <= requirements().items()
    pinned = {requirement.split("==")[0] for requirement in WHEELS}
    assert all("==" in requirement for requirement in WHEELS)  # one version of each, the same on every run
    assert pinned - needed == {"defusedxml"}  # nltk's own need
    assert LEFT_OUT.keys() <= needed and not LEFT_OUT.keys() & pinned


def test_the_wheels_and_the_tracked_tree_fit_what_the_machine_holds():
    """What `make gpu-wheels` fetches, at the MiB each pinned wheel weighs, and every tracked file
    must travel to the GPU machine together, within its limit: a tree that grows (a shipped model)
    fails here, not at the first lease."""
    from wheels import LIMIT_MIB, WHEELS, tracked_bytes

    tree = tracked_bytes() / 2**20
    if not tree:  # git lists nothing: a copy of the tree outside its checkout (mutation testing's)
        pytest.skip("not a git checkout: no tracked tree to weigh")
    assert tree + sum(WHEELS.values()) <= LIMIT_MIB - 4, (tree, WHEELS)  # room for the port's files and the run


def test_the_import_check_imports_every_module_of_the_installed_project_not_the_trees(tmp_path: Path):
    from install import import_check, project_modules

    site = tmp_path / "site"  # an install that left a subpackage out (as a folder without __init__.py was)
    shutil.copytree(REPO / "captioning", site / "captioning",
                    ignore=shutil.ignore_patterns("__pycache__", "runtime", "*.pt"))
    env = {**os.environ, "PYTHONPATH": str(site)}
    rows = {row.case: row for row in import_check(env, cwd=tmp_path)}
    assert rows["imports"].status == "failed"
    assert rows["imports"].values["captioning from"] == str(site / "captioning")
    broken = rows["import the project's modules"]
    assert broken.status == "failed" and f" of {len(project_modules())} do not import: " in broken.cause
    assert {"captioning.runtime", "captioning.runtime.precision"} <= set(broken.values["modules"])
    assert "captioning" not in broken.values["modules"]


# ----------------------------------------------------------------------------------------------- the kept runs

RESULTS = REPO / "benchmarks" / "results"


def _section(title: str) -> str:
    text = (REPO / "docs" / "benchmarks.md").read_text()
    return text.split(f"### {title}", 1)[1].split("\n### ", 1)[0]


def _table_rows(section: str, *, key: int = 3) -> dict[tuple[str, ...], list[str]]:
    """The section's table rows by their first `key` cells."""
    rows = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) > key and not set(cells[0]) <= {"-"}:
            rows[tuple(cells[:key])] = cells[key:]
    return rows


def _kept(name: str) -> tuple[dict[str, dict], dict[str, int]]:
    """A kept gpu.json: its measured rows' values by case, and its counts."""
    report = json.loads((RESULTS / name).read_text())
    return {row["case"]: row["values"] for row in report["rows"] if row["status"] == "ok"}, report["counts"]


def _rate(values: dict) -> str:  # as gpu.md rounds it
    return f"{values.get('captions_per_s', values.get('images_per_s')):,.0f}"


def _training_row(run: dict[str, dict], path: str, grid: str, batch: int) -> list[str]:
    """A training table's cells after its first three: captions/s in fp32, bf16 and fp16, then bf16's
    ms/step, peak MiB and COCO epoch."""
    bf16 = run[f"{path} {grid} bf16 B={batch}"]
    return [*(_rate(run[f"{path} {grid} {p} B={batch}"]) for p in ("fp32", "bf16", "fp16")),
            f"{bf16['step_ms']:.1f}", f"{bf16['peak_gpu_mib']:,.0f}", f"{bf16['coco_epoch_min']:.1f}"]


def _epochs(values: dict) -> list[str]:
    """A trained row's cells: its epochs' seconds, CIDEr and BLEU-4, as the docs print them."""
    return [" / ".join(f"{v:.{digits}f}" for v in values[key]) for key, digits in
            (("epoch_s", 1), ("CIDEr", 3), ("Bleu_4", 3))]


def test_the_h200_numbers_in_the_docs_are_the_kept_runs():
    """Each number in the H200's tables is its kept run's, as gpu.md rounds it, in its own row and
    column (the H100's beside it, from its run 2): a number typed by hand, or put in the wrong
    cell, fails here."""
    section = _section("Measured: one H200 (2026-11-28)")
    table = _table_rows(section)
    run4, counts4 = _kept("gpu-h200-2026-11-28.json")
    run5, counts5 = _kept("gpu-h200-2026-11-28-paths-beam-encoders-training.json")
    run6, counts6 = _kept("gpu-h200-2026-11-28-compile.json")
    h100, _ = _kept("gpu-h100-2026-11-28.json")
    assert (counts4, counts5, counts6) == ({"ok": 57, "failed": 0, "not run": 1}, {"ok": 32, "failed": 0, "not run": 0},
                                           {"ok": 10, "failed": 0, "not run": 0})
    checked = 0
    for label, path, batches in (("soft, fused", "soft fused", (64, 128, 256, 512)),
                                 ("soft, step by step", "soft step-by-step", (64, 256)), ("hard", "hard", (64, 256))):
        for grid in ("14x14x512", "7x7x2048"):
            for batch in batches:
                assert table[(label, grid, str(batch))] == _training_row(run4, path, grid, batch)
                checked += 1
    for grid in ("14x14x512", "7x7x2048"):
        for images in (32, 256):
            cases = [f"beam 3 {grid} fused {p} {images} images" for p in ("fp32", "bf16")]
            assert table[(grid, "fused", str(images))] == [*(_rate(run5[c]) for c in cases),
                                                           *(_rate(h100[c]) for c in cases),
                                                           f"{run5[cases[0]]['peak_gpu_mib']:,.0f}"]
            checked += 1
    step_by_step = "beam 3 14x14x512 step-by-step fp32 256 images"
    assert table[("14x14x512", "step by step", "256")] == [_rate(run5[step_by_step]), "–", _rate(h100[step_by_step]),
                                                           "–", f"{run5[step_by_step]['peak_gpu_mib']:,.0f}"]
    for label, case in (("VGG-19 to stride16", "vgg19 stride16 224²"),
                        ("ResNet-101 to stride32", "resnet101 stride32 224²"),
                        ("ResNet-101 to stride32", "resnet101 stride32 448²"),
                        ("EfficientNet-Lite2 to stride32", "efficientnet_lite2 stride32 224²")):
        cases = [f"{case} fp32 (as the cache) B=64", f"{case} bf16 channels-last B=64"]
        row = table[(label, case.rsplit(" ", 1)[1], run5[cases[0]]["annotations"])]
        assert row[:4] == [*(_rate(run5[c]) for c in cases), *(_rate(h100[c]) for c in cases)]
        checked += 1
    assert checked == 16 + 4 + 4

    by_first = _table_rows(section, key=1)  # the compile and trained tables, by their first cell
    train = "soft fused 14x14x512 bf16 B={}, one caption length"
    beam = "beam 3 14x14x512 fp32 256 images"

    def both(case: str, key: str = "rate") -> str:  # run 4 / run 6
        values = [run[case] for run in (run4, run6)]
        return " / ".join(_rate(v) if key == "rate" else f"{v[key]:.1f}" for v in values)

    assert by_first[("training step, B=256, captions/s",)] == [
        both(f"eager: {train.format(256)}"), both(f"compiled (inductor): {train.format(256)}"), "–",
        both(f"compiled (inductor): {train.format(256)}", "first_step_s")]
    b512 = {mode: run6[f"{mode}: {train.format(512)}"] for mode in
            ("eager", "compiled (inductor)", "compiled (inductor, reduce-overhead)")}
    assert by_first[("training step, B=512, captions/s",)] == [
        *(_rate(v) for v in b512.values()), f"{b512['compiled (inductor)']['first_step_s']:.1f}; CUDA graphs "
                                            f"{b512['compiled (inductor, reduce-overhead)']['first_step_s']:.1f}"]
    assert by_first[("beam 3, 256 images, fp32, images/s",)] == [
        both(f"eager: {beam}"), both(f"compiled (inductor): {beam}"), "–",
        both(f"compiled (inductor): {beam}", "first_search_s")]

    h100_run3, _ = _kept("gpu-h100-2026-11-28-paths-training.json")
    on_gpu, on_h100 = run5["train 3 epochs on the device (cuda)"], h100_run3["train 3 epochs on the device (cuda)"]
    assert by_first[("the H200, epochs 1 / 2 / 3",)] == _epochs(on_gpu)
    assert by_first[("the H100 (run 3), epochs 1 / 2 / 3",)] == _epochs(on_h100)
    assert by_first[("the H200 machine's 16 CPU cores, epoch 1",)] == _epochs(run5["train 1 epoch on the CPU"])
    assert (on_gpu["CIDEr"], on_gpu["Bleu_4"]) == (on_h100["CIDEr"], on_h100["Bleu_4"])  # "the same numbers"


def test_the_h100_numbers_in_the_docs_are_the_kept_runs():
    """The H100's own table (the step-by-step path and hard attention of its run 2) is its kept run's."""
    table = _table_rows(_section("Measured: one H100 (2026-11-28)"))
    run2, _ = _kept("gpu-h100-2026-11-28.json")
    for label, path in (("soft, step by step", "soft step-by-step"), ("hard", "hard")):
        for grid in ("14x14x512", "7x7x2048"):
            for batch in (64, 256):
                assert table[(label, grid, str(batch))] == _training_row(run2, path, grid, batch)
    _, counts3 = _kept("gpu-h100-2026-11-28-paths-training.json")
    assert counts3 == {"ok": 15, "failed": 0, "not run": 0}
