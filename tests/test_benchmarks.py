"""Every benchmark script imports and answers --help (they run as scripts: `python benchmarks/run.py`,
each importing its siblings), so that a renamed function in the package cannot break them unseen.
What they measure is checked elsewhere: tests/model/test_fused.py holds the fused path against the
package's step-by-step one, and benchmarks/reference.py and benchmarks/port_style.py to the same model."""

from __future__ import annotations

import importlib
import sys

import pytest

from captioning.checkpoint import load_checkpoint
from captioning.shipped import pretrained_path
from tests.tiny import REPO

SCRIPTS = ("run", "ab", "scale", "scale_probe", "content_digest", "gpu", "gpu_wheels")


@pytest.mark.parametrize("name", SCRIPTS)
def test_a_benchmark_script_imports_and_answers_help(name, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))  # as `python benchmarks/NAME.py` has it
    module = importlib.import_module(name)
    monkeypatch.setattr(sys, "argv", [f"{name}.py", "--help"])
    with pytest.raises(SystemExit) as stopped:
        module.main()
    assert stopped.value.code == 0
    assert "usage:" in capsys.readouterr().out


def test_the_caption_case_runs_through_the_api(monkeypatch, capsys, tmp_path):
    """A few photos through `benchmarks/run.py --cases caption`'s own process: the three ways of
    captioning agree and every stage is timed."""
    import json
    import tempfile

    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
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

    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
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

    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
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

    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
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
