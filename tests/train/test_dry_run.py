"""`train.py --dry-run`: the real config in miniature, in seconds, touching nothing of the real run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from captioning.cli import train_main
from captioning.config import load_config
from captioning.data.records import read_records
from tests.tiny import REPO


@pytest.fixture
def partial_coco(tmp_path: Path) -> Path:
    """A Karpathy COCO split file of 2 000 images of which 12 are on disk (a partial download)."""
    from PIL import Image

    root = tmp_path / "coco"
    entries = []
    for i in range(2000):
        folder, split = ("train2014", "train") if i < 1600 else ("val2014", "val" if i < 1800 else "test")
        name = f"COCO_{folder}_{i:012d}.jpg"
        entries.append({"filepath": folder, "filename": name, "cocoid": i, "split": split,
                        "sentences": [{"raw": f"a photo of thing {i % 7} on a table"},
                                      {"raw": f"thing {i % 7} sits on a wooden table"}]})
        if i % 200 < 2 or (i >= 1600 and i % 100 < 2):
            (root / folder).mkdir(parents=True, exist_ok=True)
            Image.new("RGB", (80, 60), (i % 255, 90, 30)).save(root / folder / name)
    (root / "dataset_coco.json").write_text(json.dumps({"dataset": "coco", "images": entries}))
    return root


def test_max_images_takes_the_first_images_on_disk(partial_coco: Path) -> None:
    config = load_config(REPO / "configs" / "coco_vgg19_soft.yaml", [f"data.root={partial_coco}", "data.max_images=3"])
    records = read_records(config.data, "train")
    assert [r.image_id for r in records] == [0, 1, 200]
    assert all(r.path.is_file() for r in records)


def test_dry_run_of_a_coco_config_on_a_partial_download(partial_coco: Path, resnet18_file: Path, tmp_path: Path,
                                                        capsys) -> None:
    out = tmp_path / "run"
    code = train_main(["--config", str(REPO / "configs" / "coco_resnet101_soft.yaml"), "--dry-run",
                       f"data.root={partial_coco}", "encoder.name=resnet18", f"encoder.weights_path={resnet18_file}",
                       "data.image_size=64", f"train.out_dir={out}", "train.amp=false"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "dry run passed" in captured.out and "2 steps" in captured.out
    assert "checkpoint written and read" in captured.out
    assert not out.exists()  # the real run's folder is not touched
    assert not (partial_coco / "features").exists() and sorted(p.name for p in partial_coco.iterdir()) == [
        "dataset_coco.json", "train2014", "val2014"]  # no feature cache written


def test_dry_run_of_the_self_critical_config_caches_its_few_images_in_its_temporary_folder(
        partial_coco: Path, resnet18_file: Path, tmp_path: Path, capsys) -> None:
    """Self-critical training reads cached annotations only (a dry run otherwise runs the encoder on
    the fly): its dry run caches the few images it uses under its temporary folder, through links to
    the data, and leaves data.root as it was."""
    common = [f"data.root={partial_coco}", "encoder.name=resnet18", f"encoder.weights_path={resnet18_file}",
              "data.image_size=64", "train.amp=false"]
    first = tmp_path / "first"  # the cross-entropy stage it starts from
    assert train_main(["--config", str(REPO / "configs" / "coco_vgg19_soft.yaml"), *common, f"train.out_dir={first}",
                       "train.max_steps=1", "data.max_images=4", "data.feature_cache=false", "train.val_images=2",
                       "train.batch_size=4", "train.num_workers=0"]) == 0
    capsys.readouterr()
    code = train_main(["--config", str(REPO / "configs" / "coco_vgg19_scst.yaml"), "--dry-run", *common,
                       f"train.init_from={first / 'best.pt'}", f"train.out_dir={tmp_path / 'run'}"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "dry run passed" in captured.out and "validation CIDEr" in captured.out
    assert sorted(p.name for p in partial_coco.iterdir()) == ["dataset_coco.json", "train2014", "val2014"]


@pytest.mark.parametrize("stage", ["scst", "cache_frozen"])
def test_a_dry_run_that_caches_leaves_the_real_cache_root_as_it_was(stage: str, partial_coco: Path,
                                                                   resnet18_file: Path, tmp_path: Path,
                                                                   capsys) -> None:
    """Self-critical training and a fine-tuned encoder over its frozen stages' cache read a feature
    cache only, so their dry runs cache their few images, in their temporary folder: never in
    data.cache_root, where a cache of 8 images would take the place of the split's real one."""
    from captioning.data.splits import features_dir

    common = [f"data.root={partial_coco}", "encoder.name=resnet18", f"encoder.weights_path={resnet18_file}",
              "data.image_size=64", "train.amp=false", "train.num_workers=0"]
    first = tmp_path / "first"  # the cross-entropy stage both start from
    assert train_main(["--config", str(REPO / "configs" / "coco_vgg19_soft.yaml"), *common, f"train.out_dir={first}",
                       "train.max_steps=1", "data.max_images=4", "data.feature_cache=false", "train.val_images=2",
                       "train.batch_size=4"]) == 0
    capsys.readouterr()
    config, extra = {"scst": ("coco_vgg19_scst.yaml", []),
                     "cache_frozen": ("coco_vgg19_finetune.yaml", ["encoder.fine_tune_from=layer3",
                                                                   "encoder.cache_frozen=true"])}[stage]
    cache = tmp_path / "cache"  # the real run's cache root, its train split's cache already there
    settings = [*common, *extra, f"data.cache_root={cache}", f"train.init_from={first / 'best.pt'}"]
    real = features_dir(load_config(REPO / "configs" / config, settings))
    real.mkdir(parents=True)
    (real / "train.npy").write_bytes(b"the split's real annotations")
    (real / "train.json").write_text(json.dumps({"image_ids": list(range(1600))}))
    before = {path: path.read_bytes() for path in cache.rglob("*") if path.is_file()}
    code = train_main(["--config", str(REPO / "configs" / config), "--dry-run", *settings,
                       f"train.out_dir={tmp_path / 'run'}"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "dry run passed" in captured.out
    assert {path: path.read_bytes() for path in cache.rglob("*") if path.is_file()} == before


def test_dry_run_of_the_embedded_default_without_its_data(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # data/shapes does not exist here
    assert train_main(["--dry-run", "model.hidden_dim=32", "model.embed_dim=16", "model.attention_dim=16"]) == 0
    assert "dry run passed" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []  # neither data/ nor runs/ made


@pytest.mark.parametrize(("override", "said"), [
    ("model.extras.init=layout", None),  # a fine config passes
    ("encoder.weights_path=/nowhere/weights.pth", "/nowhere/weights.pth"),  # one line from the expected errors
    ("train.init_from=/nowhere/best.pt", "/nowhere/best.pt"),
])
def test_dry_run_says_what_is_wrong_in_one_line(override: str, said: str | None, tmp_path: Path, capsys,
                                                monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    code = train_main(["--dry-run", "model.hidden_dim=32", "model.embed_dim=16", "model.attention_dim=16", override])
    captured = capsys.readouterr()
    if said is None:
        assert code == 0, captured.err
        return
    assert code != 0
    errors = [line for line in captured.err.splitlines() if line.strip()]
    assert len(errors) == 1 and said in errors[0]


@pytest.mark.parametrize(("root", "said"), [
    ("nowhere/coco", "nowhere/coco: data.root is not a folder"),
    (".", "dataset_coco.json: split file not found"),
])
def test_a_coco_dry_run_names_missing_data_before_it_looks_for_weights(root: str, said: str, tmp_path: Path, capsys,
                                                                        monkeypatch) -> None:
    """A newcomer's first dry run: the folder or split file is named, the network never tried (the VGG
    weights used to be downloaded first, and the error spoke of the network)."""
    import captioning.model.encoder as encoder_module

    def no_weights(*args, **kwargs):
        raise AssertionError("the weights were looked for before the data")

    monkeypatch.setattr(encoder_module, "_torchvision", no_weights)
    monkeypatch.chdir(tmp_path)
    code = train_main(["--dry-run", "--config", str(REPO / "configs" / "coco_vgg19_soft.yaml"), f"data.root={root}"])
    errors = [line for line in capsys.readouterr().err.splitlines() if line.strip() and "precision" not in line]
    assert code != 0 and len(errors) == 1 and said in errors[0], errors


def test_dry_run_reports_an_unexpected_failure_in_one_line(tmp_path: Path, capsys, monkeypatch) -> None:
    import captioning.train.paper_objective as loop

    def broken(*args, **kwargs):
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied (8x512 and 256x10)\nmore detail")

    monkeypatch.setattr(loop, "paper_loss", broken)
    monkeypatch.chdir(tmp_path)
    code = train_main(["--dry-run", "model.hidden_dim=32", "model.embed_dim=16", "model.attention_dim=16"])
    errors = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 1 and len(errors) == 1
    assert errors[0].startswith("dry run failed: RuntimeError: mat1 and mat2 shapes cannot be multiplied")


def test_dry_run_command_hands_on_the_device_and_reports_in_one_line(capsys, monkeypatch) -> None:
    """The command's side alone (the dry run replaced): the device it is given, its summary line, and a
    failure whose message is empty or several lines long."""
    import captioning.train.dry_run as dry_run_module

    seen = []

    def passes(config, *, device="cpu", resume=False):
        seen.append((device, resume))
        return dry_run_module.DryRun(steps=2, metric="CIDEr", value=0.12345, seconds=3.4)

    monkeypatch.setattr(dry_run_module, "dry_run", passes)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a machine with 4 GPUs, for the device's check
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert train_main(["--dry-run", "--device", "cuda:3"]) == 0
    assert capsys.readouterr().out == ("dry run passed in 3 s: 2 steps, validation CIDEr 0.1235, checkpoint "
                                       "written and read back\n")
    assert train_main(["--dry-run", "--resume"]) == 0
    assert seen == [(torch.device("cuda", 3), False), (torch.device("cuda"), True)]
    for error, said in ((KeyError(), "dry run failed: KeyError:  (run without --dry-run for the traceback)\n"),
                        (ValueError("first\nsecond"), "dry run failed: ValueError: first (run without --dry-run "
                                                       "for the traceback)\n")):
        def fails(config, *, device="cpu", resume=False, error=error):
            raise error

        monkeypatch.setattr(dry_run_module, "dry_run", fails)
        assert train_main(["--dry-run"]) == 1
        assert capsys.readouterr().err == said


def test_a_dry_run_says_what_the_real_run_would_refuse_of_its_folder(tiny_run, tmp_path: Path, monkeypatch,
                                                                     capsys) -> None:
    """It passed runs that the real one refuses at once: a new run over a folder's checkpoints, a
    resume of another model (--resume was ignored), and a warm start whose vocabulary is not the one
    prepared in train.out_dir. Read only: nothing is written there."""
    from captioning.checkpoint import load_checkpoint

    monkeypatch.chdir(tmp_path)
    base = ["--device", "cpu", *tiny_run.overrides, "--dry-run"]
    before = sorted(p.name for p in tiny_run.run_dir.iterdir())
    assert train_main([*base, f"train.out_dir={tiny_run.run_dir}"]) == 2
    assert f"{tiny_run.run_dir}: holds a run (last.pt and best.pt)" in capsys.readouterr().err
    assert train_main([*base, "--resume", f"train.out_dir={tiny_run.run_dir}", "model.hidden_dim=48"]) == 2
    assert "--resume goes on with the model this run trained" in capsys.readouterr().err
    out = tmp_path / "run"
    out.mkdir()
    (out / "vocab.json").write_text(json.dumps([*load_checkpoint(tiny_run.checkpoint)["vocab"], "zebra"]))
    assert train_main([*base, f"train.out_dir={out}", f"train.init_from={tiny_run.checkpoint}"]) == 2
    assert "its vocabulary" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["vocab.json"]
    assert sorted(p.name for p in tiny_run.run_dir.iterdir()) == before


def test_a_dry_run_whose_metric_is_not_measured_says_so_not_minus_infinity(tiny_run, tmp_path: Path, monkeypatch,
                                                                           capsys) -> None:
    import captioning.train.loop as training

    monkeypatch.setattr(training, "validation_metrics", lambda *args, **kwargs: {"CIDEr": float("nan")})
    monkeypatch.chdir(tmp_path)
    assert train_main(["--device", "cpu", *tiny_run.overrides, "--dry-run", f"train.out_dir={tmp_path / 'run'}"]) == 0
    assert "validation CIDEr not measured (NaN), checkpoint written" in capsys.readouterr().out
