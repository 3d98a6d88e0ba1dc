"""Every benchmark script imports and answers --help (they run as scripts: `python benchmarks/run.py`,
each importing what lies under its own folder), so that a renamed function in the package cannot
break them unseen; benchmarks/ shows its few commands at the top and groups the rest, and every
benchmark file a page or a command names is there. What they measure is checked elsewhere:
tests/model/test_fused.py holds the fused path against the package's step-by-step one, and
benchmarks/implementations/ to the same model."""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

import pytest

from captioning.checkpoint import load_checkpoint
from captioning.shipped import pretrained_path
from tests.tiny import REPO

BENCHMARKS = REPO / "benchmarks"
# Every runnable script, by its path under benchmarks/: the four commands at the top, the probe that
# scale.py starts in each stage's process, and the GPU command's one entry point.
SCRIPTS = ("run.py", "ab.py", "scale.py", "content_digest.py", "probes/scale_stage.py", "gpu/gpu.py")


def _runnable(folder: Path) -> set[str]:
    """The scripts of `folder` (not below it): the files that run something when started."""
    return {path.name for path in folder.glob("*.py") if 'if __name__ == "__main__":' in path.read_text()}


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_benchmark_script_imports_and_answers_help(script, monkeypatch, capsys):
    path = BENCHMARKS / script
    monkeypatch.syspath_prepend(str(path.parent))  # as `python benchmarks/SCRIPT` has it
    module = importlib.import_module(path.stem)
    monkeypatch.setattr(sys, "argv", [path.name, "--help"])
    with pytest.raises(SystemExit) as stopped:
        module.main()
    assert stopped.value.code == 0
    assert "usage:" in capsys.readouterr().out


def test_benchmarks_shows_at_most_four_commands_and_the_gpu_command_has_one_entry_point():
    """A reader of benchmarks/ sees its commands, not their parts: at most four scripts at the top,
    the libraries in folders named for what they hold, and the GPU command's tooling in gpu/,
    started from gpu/gpu.py alone (`make gpu-wheels` included)."""
    top = _runnable(BENCHMARKS)
    assert len(top) <= 4, f"benchmarks/ has {len(top)} scripts at its top: {sorted(top)}"
    assert {script for script in SCRIPTS if "/" not in script} == top  # each one answers --help above
    assert not list(BENCHMARKS.glob("gpu_*.py")), "the GPU command's parts belong in benchmarks/gpu/"
    assert _runnable(BENCHMARKS / "gpu") == {"gpu.py"}
    every_script = {str(path.relative_to(BENCHMARKS)) for path in BENCHMARKS.rglob("*.py")
                    if 'if __name__ == "__main__":' in path.read_text()}
    assert every_script == set(SCRIPTS)


# A script named in a paragraph that runs it from an older commit (`git archive COMMIT`, "as of
# commit"): it is not in the tree any more, and need not be.
OLDER_COMMIT = re.compile(r"as of\s+commit|git archive|/tmp/captioning-[0-9a-f]{7}|from commit [0-9a-f]{7}")


def _named_benchmark_files() -> list[tuple[str, str, bool]]:
    """(file, the path it names, whether its paragraph runs an older commit) for every benchmarks/...
    path that the pages, the Makefile, the studies, the package and the benchmarks themselves name."""
    files = [REPO / "README.md", REPO / "Makefile", *sorted((REPO / "docs").glob("*.md")),
             *sorted((REPO / "studies").rglob("*.md")), *sorted((REPO / "studies").rglob("*.py")),
             *sorted(BENCHMARKS.rglob("*.py")), *sorted((REPO / "captioning").rglob("*.py"))]
    named = []
    for file in files:
        for paragraph in re.split(r"\n\s*\n", file.read_text()):
            older = bool(OLDER_COMMIT.search(paragraph))
            named += [(str(file.relative_to(REPO)), match.group(0), older)
                      for match in re.finditer(r"benchmarks/[\w/-]+\.(?:py|json)", paragraph)]
    return named


def test_every_benchmark_file_a_page_or_command_names_is_there():
    """`python benchmarks/...` in a page runs; a script since moved, named where it was, fails here
    (the scripts that only an older commit has are run from that commit, and say so)."""
    named = _named_benchmark_files()
    assert len(named) > 40  # the pages name them: the search finds them
    missing = [f"{file}: {path}" for file, path, older in named if not (REPO / path).is_file() and not older]
    assert not missing, "\n".join(missing)


def test_the_caption_case_runs_through_the_api(monkeypatch, capsys, tmp_path):
    """A few photos through `benchmarks/run.py --cases caption`'s own process: the three ways of
    captioning agree and every stage is timed."""
    import json
    import tempfile

    monkeypatch.syspath_prepend(str(BENCHMARKS))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the photos are made here
    run = importlib.import_module("run")
    monkeypatch.setattr(sys, "argv", ["run.py", "--one-case", "caption", "--photos", "3", "--caption-words", "2",
                                      "--caption-batch", "2", "--threads", "1"])
    run.main()
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["images"] == 3 and result["same_captions"] is True
    assert set(result["stage_seconds"]) == {"read", "encode", "decode", "overlays", "batched_total"}
    assert len(list((tmp_path / "captioning_benchmark_photos").glob("*.jpg"))) == 3


def test_the_scale_stand_in_has_cocos_splits_and_reads_as_a_coco_split_file(monkeypatch, tmp_path):
    """benchmarks/scale.py at 1 000 images: Karpathy's splits in COCO's proportions, five to seven
    captions an image, and files the project's own reader finds."""
    from captioning.config import load_config
    from captioning.data.records import read_records

    monkeypatch.syspath_prepend(str(BENCHMARKS))
    scale = importlib.import_module("scale")
    assert scale.split_counts(123_287) == scale.FULL  # COCO's own counts at full size
    assert scale.split_counts(1_000) == {"train": 673, "restval": 247, "val": 40, "test": 40}
    scale.write(tmp_path, 1_000)
    data = load_config(REPO / "configs" / "coco_vgg19_soft.yaml", [f"data.root={tmp_path}"]).data
    train, test = read_records(data, "train"), read_records(data, "test")
    assert (len(train), len(test)) == (673 + 247, 40)  # restval trains
    assert all(5 <= len(record.captions) <= 7 for record in train) and all(r.path.is_file() for r in test)
    official = load_config(REPO / "configs" / "coco_vgg19_soft.yaml",
                           [f"data.root={tmp_path}", "data.dataset=coco_official"]).data
    official_train, val2014 = read_records(official, "train"), read_records(official, "val")
    assert (len(official_train), len(val2014)) == (673, 247 + 40 + 40)  # as COCO: restval, val, test in val2014
    assert {r.image_id: r.captions for r in official_train} == {r.image_id: r.captions for r in train[:673]}


def test_the_encoder_case_times_both_layouts_at_each_batch(monkeypatch, capsys):
    """`benchmarks/run.py --cases encoder`: images/s for every batch size, NCHW and channels-last."""
    import json

    monkeypatch.syspath_prepend(str(BENCHMARKS))
    run = importlib.import_module("run")
    monkeypatch.setattr(sys, "argv", ["run.py", "--one-case", "encoder", "--encoder-batches", "1,2",
                                      "--encoder-seconds", "0.01", "--threads", "1"])
    run.main()
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert {layout: set(rates) for layout, rates in result["images_per_s_by_batch"].items()} == {
        "nchw": {"1", "2"}, "channels_last": {"1", "2"}}
    assert result["images_per_s"] == max(max(rates.values()) for rates in result["images_per_s_by_batch"].values())


def test_the_shipped_case_times_the_shipped_file_against_its_first_decoder(monkeypatch, capsys, tmp_path):
    """`benchmarks/run.py --cases shipped`: the package's file and its first decoder alone, each
    timed whole and by stage; the cost is the ratio of their times."""
    import json
    import tempfile

    monkeypatch.syspath_prepend(str(BENCHMARKS))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    run = importlib.import_module("run")
    monkeypatch.setattr(sys, "argv", ["run.py", "--one-case", "shipped", "--photos", "2", "--caption-batch", "2",
                                      "--repeats", "1", "--threads", "1"])
    run.main()
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (result["images"], result["repeats"]) == (2, 1)
    assert result["cost"] == pytest.approx(result["alone_images_per_s"] / result["images_per_s"])
    assert set(result["stage_seconds"]) == {"encode", "encode_alone", "decode_shipped", "decode_alone"}
    assert result["decoders"] == len(load_checkpoint(pretrained_path())["members"]) + 1


def test_two_commands_in_turns_are_measured_run_by_run_and_their_ratio_pair_by_pair(monkeypatch, capsys):
    """`python benchmarks/ab.py --commands A B`: every run of each measured on its own (the process's
    own CPU time and memory, not its children's), the medians and A / B taken pair by pair, the
    warm-up run of each not counted."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    ab = importlib.import_module("ab")
    a = [{"wall_s": 2.0, "cpu_s": 1.0, "peak_mib": 100.0}, {"wall_s": 4.0, "cpu_s": 3.0, "peak_mib": 300.0},
         {"wall_s": 3.0, "cpu_s": 2.0, "peak_mib": 200.0}]
    b = [{"wall_s": 1.0, "cpu_s": 1.0, "peak_mib": 50.0}, {"wall_s": 1.0, "cpu_s": 1.0, "peak_mib": 100.0},
         {"wall_s": 2.0, "cpu_s": 1.0, "peak_mib": 100.0}]
    table = ab.spreads(a, b)
    assert table["A wall_s"] == {"min": 2.0, "median": 3.0, "max": 4.0}
    assert table["A/B wall_s"] == {"min": 1.5, "median": 2.0, "max": 4.0}  # 2/1, 4/1, 3/2: not 3.0 / 1.0
    assert table["A/B peak_mib"]["median"] == 2.0
    big = "import sys; sys.stdout.write('x' * 100); bytearray(200 * 2**20)"  # 200 MiB held, then let go
    run = ab.run_command([sys.executable, "-c", big])
    assert run["peak_mib"] > 200 and run["cpu_s"] > 0 and run["wall_s"] > 0
    with pytest.raises(SystemExit, match="exited with 3"):
        ab.run_command([sys.executable, "-c", "raise SystemExit(3)"])
    started = []
    monkeypatch.setattr(ab, "run_command", lambda command: started.append(command[-1]) or
                        {"wall_s": 1.0, "cpu_s": 1.0, "peak_mib": 1.0})
    monkeypatch.setattr(ab, "machine", lambda: {"date": "d", "cpu": "c", "load_average": "0"})
    ab.commands_in_turns(["true a", "true b"], rounds=3)
    assert started == ["a", "b"] * 4  # the warm-up pair, then three in turns
    assert "3 runs of each, in turns" in capsys.readouterr().out
