"""Real-dataset paths on a tiny fake COCO and Flickr8k made here: readers, prepare, the feature cache
(cached = on the fly, resume after an interruption, unreadable images), on-the-fly training with a
fine-tuned encoder, and evaluation of its checkpoint.

The encoder is torchvision's ResNet-18 with random weights from a local file (never a download):
at 64² its stride-32 layer4 gives a 2x2 grid of 512 channels.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from captioning.cli import main
from captioning.config import ConfigError, load_config
from captioning.data.encoded_images import EncodedImages
from captioning.data.features import read_cache, write_cache
from captioning.data.formats.coco_official import read_coco_captions
from captioning.data.formats.karpathy import read_split
from captioning.data.prepare import build_vocabulary, prepare_vocabulary
from captioning.data.records import DatasetError, read_records
from captioning.data.splits import features_dir, load_splits
from captioning.data.tokenized import Tokenized
from captioning.data.vocab import tokenize
from captioning.model.encoder import Encoder
from captioning.train.loop import fit
from captioning.train.objective import TrainingError
from tests.tiny import REPO

# Captions as people type them: curly quotes, stray spaces, capitals, punctuation.
MESSY = [
    "A Dog  runs on the GRASS. ",
    "the dog’s “ball” is red!",
    "  a DOG, running\t on grass ",
    "A dog plays with a ball...",
    "dog on the grass",
]
VAL_ONLY_WORD = "zebra"  # appears in val and test captions only: must not enter the vocabulary


def _image(kind: str, seed: int) -> Image.Image:
    pixels = np.random.default_rng(seed).integers(0, 256, size=(40, 52, 3), dtype=np.uint8)
    image = Image.fromarray(pixels)
    if kind == "gray":
        return image.convert("L")
    if kind == "cmyk":
        return image.convert("CMYK")
    return image


def _write_images(folder: Path, names: list[str], kinds: list[str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for i, (name, kind) in enumerate(zip(names, kinds)):
        _image(kind, i).save(folder / name, quality=90)


def _captions(split: str, index: int) -> list[str]:
    if split in ("val", "test"):
        return [f"a {VAL_ONLY_WORD} stands on the grass", *MESSY[1:]]
    return MESSY[index % 5:] + MESSY[: index % 5]


@pytest.fixture(scope="module")
def fake_coco(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ROOT/{train2014,val2014}/COCO_*.jpg, ROOT/dataset_coco.json (Karpathy) and the official
    ROOT/annotations/captions_{train,val}2014.json and instances_{train,val}2014.json. Karpathy: 6
    train + 2 restval (in train2014), 3 val + 3 test (in val2014); the last train image is corrupt."""
    root = tmp_path_factory.mktemp("coco")
    kinds = ["rgb", "gray", "cmyk", "rgb", "rgb", "gray", "rgb", "rgb"]
    train_names = [f"COCO_train2014_{i:012d}.jpg" for i in range(1, 9)]
    val_names = [f"COCO_val2014_{i:012d}.jpg" for i in range(101, 107)]
    _write_images(root / "train2014", train_names, kinds)
    _write_images(root / "val2014", val_names, ["rgb", "cmyk", "gray", "rgb", "rgb", "rgb"])
    (root / "train2014" / train_names[5]).write_bytes(b"\xff\xd8 not really a jpeg")  # corrupt
    entries, official = [], {"train": {"images": [], "annotations": []}, "val": {"images": [], "annotations": []}}
    sentence = 0
    for folder, names, splits in (("train2014", train_names, ["train"] * 6 + ["restval"] * 2),
                                  ("val2014", val_names, ["val"] * 3 + ["test"] * 3)):
        for index, (name, split) in enumerate(zip(names, splits)):
            cocoid = int(name[-16:-4])
            captions = _captions(split, index)
            entries.append({"filepath": folder, "filename": name, "cocoid": cocoid, "split": split,
                            "sentences": [{"raw": c, "tokens": tokenize(c)} for c in captions]})
            part = official["train" if folder == "train2014" else "val"]
            part["images"].append({"id": cocoid, "file_name": name, "width": 52, "height": 40})
            for caption in captions:
                part["annotations"].append({"id": sentence, "image_id": cocoid, "caption": caption})
                sentence += 1
    (root / "dataset_coco.json").write_text(json.dumps({"dataset": "coco", "images": entries}))
    (root / "annotations").mkdir()
    for part, values in official.items():
        (root / "annotations" / f"captions_{part}2014.json").write_text(json.dumps(values))
        (root / "annotations" / f"instances_{part}2014.json").write_text(json.dumps(_instances(values["images"])))
    return root


# The instances files' objects: a dog over the left 20 of the 52 columns, and in the first val image
# also a person over the right half.
DOG = [0, 0, 20, 0, 20, 40, 0, 40]
PERSON = [26, 0, 52, 0, 52, 40, 26, 40]


def _instances(images: list[dict]) -> dict:
    """COCO's instances layout for these images: their objects, as polygons."""
    annotations = []
    for image in images:
        objects = [(18, DOG), (1, PERSON)] if image["id"] == 101 else [(18, DOG)]
        for category, polygon in objects:
            annotations.append({"id": len(annotations) + 1, "image_id": image["id"], "category_id": category,
                                "segmentation": [polygon], "area": 0.0, "bbox": [0, 0, 0, 0], "iscrowd": 0})
    return {"images": images, "annotations": annotations,
            "categories": [{"id": 1, "name": "person", "supercategory": "person"},
                           {"id": 18, "name": "dog", "supercategory": "animal"}]}


@pytest.fixture(scope="module")
def fake_flickr8k(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Flickr8k's layout: one image folder, Karpathy entries with `filename` only; a 16-bit PNG too."""
    root = tmp_path_factory.mktemp("flickr8k")
    names = [f"{1000 + i}_abc.jpg" for i in range(5)]
    _write_images(root / "Flicker8k_Dataset", names, ["rgb", "gray", "cmyk", "rgb", "rgb"])
    deep = (np.arange(40 * 52, dtype=np.uint16).reshape(40, 52) * 30).astype(np.uint16)  # values up to 62k
    Image.fromarray(deep).save(root / "Flicker8k_Dataset" / "2000_deep.png")
    names.append("2000_deep.png")
    splits = ["train", "train", "train", "val", "test", "train"]
    entries = [{"filename": n, "imgid": i, "split": s, "sentences": [{"raw": c} for c in _captions(s, i)]}
               for i, (n, s) in enumerate(zip(names, splits))]
    (root / "dataset_flickr8k.json").write_text(json.dumps({"dataset": "flickr8k", "images": entries}))
    return root




def _coco_config(root: Path, out: Path, resnet18_file: Path, *overrides: str, recipe: str = "coco_resnet101_soft"):
    return load_config(REPO / "configs" / f"{recipe}.yaml", [
        f"data.root={root}", "data.image_size=64", "data.min_word_count=2", "encoder.name=resnet18",
        f"encoder.weights_path={resnet18_file}", "encoder.layer=stride32", "encoder.batch_size=4",
        "model.embed_dim=16", "model.hidden_dim=16", "model.attention_dim=16", "train.batch_size=8",
        f"train.out_dir={out}", "train.log_images=2", "decode.max_length=8", "train.num_workers=0",
        "train.amp=false", "data.max_bad_images=0.2",  # the fake data has one corrupt image of 8
        # greedy validation on the project's tokenizer (the COCO configs score as eval.py reports, which
        # these tests of reading COCO do not need, and on 3 val images it keeps a checkpoint too early)
        "train.val_beam_size=1", "train.val_tokenizer=own", *overrides])




# readers ------------------------------------------------------------------------------------------


def test_coco_karpathy_splits_train_takes_restval(fake_coco: Path, tmp_path: Path, resnet18_file: Path) -> None:
    data = _coco_config(fake_coco, tmp_path, resnet18_file).data
    sizes = {split: len(read_records(data, split)) for split in ("train", "val", "test")}
    assert sizes == {"train": 8, "val": 3, "test": 3}
    train = read_records(data, "train")
    assert train[0].path == fake_coco / "train2014" / "COCO_train2014_000000000001.jpg"
    assert train[0].image_id == 1 and train[0].captions == tuple(MESSY)  # raw: references stay as written
    assert read_records(data, "test")[0].path.parent == fake_coco / "val2014"


def test_coco_official_captions_files_through_pycocotools(fake_coco: Path, tmp_path: Path,
                                                          resnet18_file: Path) -> None:
    data = _coco_config(fake_coco, tmp_path, resnet18_file, "data.dataset=coco_official").data
    train, val = read_records(data, "train"), read_records(data, "val")
    assert [r.image_id for r in train] == list(range(1, 9)) and len(val) == 6
    assert train[2].path == fake_coco / "train2014" / "COCO_train2014_000000000003.jpg"
    assert len(train[2].captions) == 5 and set(train[2].captions) == set(MESSY)
    assert read_records(data, "test") == val  # val2014 serves as val and test


def test_flickr8k_entries_have_a_filename_only(fake_flickr8k: Path) -> None:
    config = load_config(REPO / "configs" / "flickr8k_vgg19_soft.yaml", [f"data.root={fake_flickr8k}"])
    train = read_records(config.data, "train")
    assert [r.path for r in train[:2]] == [fake_flickr8k / "Flicker8k_Dataset" / "1000_abc.jpg",
                                           fake_flickr8k / "Flicker8k_Dataset" / "1001_abc.jpg"]
    assert all(r.path.is_file() for r in train) and len(train) == 4


def test_flickr30k_reads_its_karpathy_file_and_image_folder(tmp_path: Path) -> None:
    """Karpathy's dataset_flickr30k.json as published: entries with a filename, imgid and split, no
    filepath and no cocoid; the images in flickr30k-images/."""
    names = ["1000092795.jpg", "10002456.jpg", "1000268201.jpg", "1000344755.jpg"]
    _write_images(tmp_path / "flickr30k-images", names, ["rgb"] * 4)
    entries = [{"filename": n, "imgid": i, "split": s, "sentids": [i], "sentences": [
        {"raw": f"Two young guys {i} with shaggy hair .", "tokens": [], "imgid": i, "sentid": i}]}
        for i, (n, s) in enumerate(zip(names, ["train", "train", "val", "test"]))]
    (tmp_path / "dataset_flickr30k.json").write_text(json.dumps({"dataset": "flickr30k", "images": entries}))
    config = load_config(REPO / "configs" / "flickr30k_vgg19_soft.yaml", [f"data.root={tmp_path}"])
    assert config.train.optimizer == "adam" and config.data.dataset == "flickr30k"
    train = read_records(config.data, "train")
    assert [(r.image_id, r.path) for r in train] == [(0, tmp_path / "flickr30k-images" / names[0]),
                                                     (1, tmp_path / "flickr30k-images" / names[1])]
    assert [r.captions for r in read_records(config.data, "test")] == [("Two young guys 3 with shaggy hair .",)]


@pytest.mark.parametrize("content", [None, "{not json", '{"images": 3}', '["a list"]'])
def test_missing_or_malformed_coco_files_are_one_error_naming_them(fake_coco: Path, tmp_path: Path,
                                                                   content: str | None) -> None:
    path = tmp_path / "captions_train2014.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(DatasetError) as error:
        read_coco_captions(path, fake_coco / "train2014")
    assert str(path) in str(error.value) and "\n" not in str(error.value)


def test_cli_prepare_with_a_missing_split_file_is_one_stderr_line(tmp_path: Path, capsys) -> None:
    code = main(["prepare", "--config", str(REPO / "configs" / "coco_vgg19_soft.yaml"), f"data.root={tmp_path}",
                 f"train.out_dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and str(tmp_path / "dataset_coco.json") in err


# prepare: the vocabulary ---------------------------------------------------------------------------


def test_vocabulary_from_training_captions_only_normalized(fake_coco: Path, tmp_path: Path,
                                                           resnet18_file: Path) -> None:
    config = _coco_config(fake_coco, tmp_path, resnet18_file)
    vocab, stats = build_vocabulary(config)
    assert VAL_ONLY_WORD not in vocab.index  # val/test captions never reach the vocabulary
    for word in ("dog", "grass", "ball", "running", "red"):
        assert word in vocab.index, word
    # normalized: lower case, no punctuation or quotes, curly quotes like straight ones ("dog 's")
    assert all(w == w.lower() and w.strip() == w and not set(w) & set(".,!\"“”’") for w in vocab.words[4:])
    assert tokenize("the dog’s “ball” is red!") == tokenize("The dog's \"ball\" is  red") == \
        ["the", "dog", "'s", "ball", "is", "red"]
    assert stats["captions"] == 40
    rare = build_vocabulary(_coco_config(fake_coco, tmp_path, resnet18_file, "data.min_word_count=100"))[0]
    assert len(rare) == 4  # every word rarer than 100: only the specials, the rest is <unk>


def test_cli_prepare_writes_the_vocabulary_that_training_uses(fake_coco: Path, tmp_path: Path,
                                                              resnet18_file: Path, capsys) -> None:
    config = _coco_config(fake_coco, tmp_path / "run", resnet18_file)
    code = main(["prepare", "--config", str(REPO / "configs" / "coco_resnet101_soft.yaml"),
                 f"data.root={fake_coco}", "data.min_word_count=2", f"train.out_dir={tmp_path / 'run'}"])
    assert code == 0 and "vocabulary of" in capsys.readouterr().out
    saved = json.loads((tmp_path / "run" / "vocab.json").read_text())
    assert saved == prepare_vocabulary(config)[0].words


# the feature cache ---------------------------------------------------------------------------------


def test_prepare_features_grayscale_cmyk_and_a_corrupt_image(fake_coco: Path, tmp_path: Path,
                                                             resnet18_file: Path, capsys) -> None:
    overrides = [f"data.root={fake_coco}", "data.image_size=64", "encoder.name=resnet18",
                 f"encoder.weights_path={resnet18_file}", "encoder.layer=stride32", "encoder.batch_size=3",
                 "train.num_workers=0"]
    code = main(["prepare-features", "--config", str(REPO / "configs" / "coco_resnet101_soft.yaml"),
                 "--splits", "train,val", *overrides])  # 1 of 8 bad is more than data.max_bad_images (1%)
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    (error,) = [line for line in err.splitlines() if line.strip()]
    assert error.startswith("error: train: 1 of 8 images cannot be read (")
    assert "COCO_train2014_000000000006.jpg" in error
    overrides.append("data.max_bad_images=0.2")
    code = main(["prepare-features", "--config", str(REPO / "configs" / "coco_resnet101_soft.yaml"),
                 "--splits", "train,val", *overrides])
    out, err = capsys.readouterr()
    assert code == 0, err
    warnings = [line for line in err.splitlines() if "cannot be read" in line]
    assert len(warnings) == 1  # named once, not once per batch or per epoch
    assert "train: 7 images, annotations [7, 4, 512] (grid 2x2), 1 unreadable image left out" in out
    assert "COCO_train2014_000000000006.jpg" in err  # the warning names the file
    config = load_config(REPO / "configs" / "coco_resnet101_soft.yaml", overrides)
    splits = load_splits(config, ("train",))
    train = splits["train"]
    assert train.unreadable == 1 and 6 not in train.image_ids
    annotations = np.asarray(train.annotations, dtype=np.float32)  # [7, 4, 512]
    assert np.isfinite(annotations).all() and (np.abs(annotations).reshape(7, -1).max(axis=1) > 0).all()
    # gray (id 2) and CMYK (id 3) images went through as RGB and give their own features
    assert not np.allclose(annotations[1], annotations[2])


def test_cached_and_on_the_fly_annotations_agree(fake_coco: Path, tmp_path: Path, resnet18_file: Path) -> None:
    config = _coco_config(fake_coco, tmp_path, resnet18_file)
    val = load_splits(config, ("val",))["val"]
    encoder = Encoder.from_config(config.encoder)
    live = EncodedImages(encoder, val.records, image_size=64)[0:3]  # [3, 4, 512] float32
    cached = np.asarray(val.annotations[0:3], dtype=np.float32)
    np.testing.assert_allclose(cached, live, rtol=2e-3, atol=2e-3 * float(np.abs(live).max()))
    assert float(np.abs(live).max()) > 0.1


def test_a_part_encoded_on_the_fly_counts_its_rows_from_its_start_and_names_each_image_once(
        fake_coco: Path, tmp_path: Path, resnet18_file: Path, capsys) -> None:
    """Under torchrun each process validates its own part of the images (validation.py): a part that
    does not start at 0 must report an unreadable image at its own row and at the whole split's."""
    import dataclasses

    config = _coco_config(fake_coco, tmp_path, resnet18_file)
    records = read_records(config.data, "val")  # 3 images
    broken = tmp_path / "broken.jpg"
    broken.write_bytes(b"\xff\xd8 not a jpeg")
    records[2] = dataclasses.replace(records[2], path=broken)
    whole = EncodedImages(Encoder.from_config(config.encoder), records, image_size=64)
    part = whole.part(1, 3)
    annotations = part[0:2]  # [2, 4, 512]: the split's images 1 and 2
    assert part.unreadable == {1} and whole.unreadable == {2}
    assert float(np.abs(annotations[0]).max()) > 0 and not annotations[1].any()
    again = whole[0:3]  # the whole split later (another validation): the image is not named again
    np.testing.assert_allclose(again[1], annotations[0], rtol=1e-5, atol=1e-5)
    assert not again[2].any() and whole.unreadable == {2}
    warnings = [line for line in capsys.readouterr().err.splitlines() if "broken.jpg" in line]
    assert len(warnings) == 1


def test_an_interrupted_cache_resumes_where_it_stopped(fake_coco: Path, tmp_path: Path, resnet18_file: Path) -> None:
    config = _coco_config(fake_coco, tmp_path, resnet18_file)
    records = read_records(config.data, "train")
    encoder = Encoder.from_config(config.encoder)
    whole = write_cache(tmp_path / "whole", "train", records, encoder=encoder, image_size=64, batch_size=2)

    seen: list[int] = []
    real_forward = encoder.forward

    def dying_forward(images):
        seen.append(images.shape[0])
        if len(seen) == 4:  # the first call sizes the cache on a blank image, then two batches
            raise KeyboardInterrupt("killed")
        return real_forward(images)

    encoder.forward = dying_forward
    with pytest.raises(KeyboardInterrupt):
        write_cache(tmp_path / "cut", "train", records, encoder=encoder, image_size=64, batch_size=2)
    progress = json.loads((tmp_path / "cut" / ".train.progress.json").read_text())
    assert progress["done"] == 4 and read_cache(tmp_path / "cut", "train", records) is None  # 2 batches of 2
    seen.clear()
    encoder.forward = real_forward
    counted: list[int] = []

    def counting_forward(images):
        counted.append(images.shape[0])
        return real_forward(images)

    encoder.forward = counting_forward
    resumed = write_cache(tmp_path / "cut", "train", records, encoder=encoder, image_size=64, batch_size=2)
    assert sum(counted) == len(records) - 4 - 1  # only the rest was encoded (one of them is corrupt)
    assert resumed.unreadable == whole.unreadable == [5]
    np.testing.assert_array_equal(np.asarray(resumed.annotations), np.asarray(whole.annotations))
    assert sorted(p.name for p in (tmp_path / "cut").iterdir()) == ["train.json", "train.npy"]


def test_a_cache_the_disk_cannot_hold_is_refused_in_one_line_before_any_image_is_read(
        fake_coco: Path, tmp_path: Path, resnet18_file: Path, monkeypatch) -> None:
    from captioning.data import features

    config = _coco_config(fake_coco, tmp_path, resnet18_file)
    records = read_records(config.data, "train")
    encoder = Encoder.from_config(config.encoder)
    blank, _ = encoder.eval()(torch.zeros(1, 3, 64, 64))  # [1, L, D]
    need = len(records) * blank.shape[1] * blank.shape[2] * 2  # fp16
    monkeypatch.setattr(features.shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**12, 10**12 - need + 1,
                                                                                          need - 1))
    monkeypatch.setattr(features.ImageFiles, "__getitem__", lambda self, index: pytest.fail("an image was read"))
    with pytest.raises(DatasetError) as refused:
        write_cache(tmp_path / "small", "train", records, encoder=encoder, image_size=64, batch_size=2)
    assert str(refused.value) == (f"{tmp_path / 'small'}: the train feature cache needs {need / 1e6:.1f} MB "
                                  f"({len(records)} images x {blank.shape[1]} cells x {blank.shape[2]} channels x 2 "
                                  f"bytes) and {(need - 1) / 1e6:.1f} MB is free there; free some space, or set "
                                  "data.cache_root to a disk with room")
    assert list((tmp_path / "small").iterdir()) == []  # nothing written
    monkeypatch.undo()  # the disk as it is: the cache is written
    assert write_cache(tmp_path / "small", "train", records, encoder=encoder, image_size=64, batch_size=2).grid


def test_an_interrupted_cache_of_another_image_list_starts_over(fake_coco: Path, tmp_path: Path,
                                                                resnet18_file: Path) -> None:
    """The rows written before an interruption belong to their list of images: a run over another
    list (here the first image dropped) encodes everything again, never serving the old rows."""
    config = _coco_config(fake_coco, tmp_path, resnet18_file)
    records = read_records(config.data, "train")
    encoder = Encoder.from_config(config.encoder)
    whole = write_cache(tmp_path / "whole", "train", records, encoder=encoder, image_size=64, batch_size=2)
    real_forward, counted = encoder.forward, []

    def dying_forward(images):
        counted.append(images.shape[0])
        if len(counted) == 3:
            raise KeyboardInterrupt("killed")
        return real_forward(images)

    encoder.forward = dying_forward
    with pytest.raises(KeyboardInterrupt):
        write_cache(tmp_path / "cut", "train", records, encoder=encoder, image_size=64, batch_size=2)
    encoder.forward, counted = lambda images: counted.append(images.shape[0]) or real_forward(images), []
    other = write_cache(tmp_path / "cut", "train", records[1:], encoder=encoder, image_size=64, batch_size=2)
    # a fresh cache: the blank image that sizes it, then all of it (one image is corrupt)
    assert sum(counted) == 1 + len(records) - 1 - 1 and other.unreadable == [4]
    expected = np.asarray(whole.annotations, dtype=np.float32)[1:]  # batched otherwise: float16 rounding apart
    np.testing.assert_allclose(np.asarray(other.annotations, dtype=np.float32), expected, rtol=2e-3, atol=2e-3)


# training on the fake COCO ---------------------------------------------------------------------------


def test_train_on_cached_features_with_bf16_autocast(fake_coco: Path, tmp_path: Path, resnet18_file: Path) -> None:
    out = tmp_path / "cached"
    summary = fit(_coco_config(fake_coco, out, resnet18_file, "train.max_steps=4", "train.log_every_steps=1",
                               "train.amp=true"))  # bf16 autocast, on the CPU here
    assert summary["steps"] == 4 and math.isfinite(summary["best_metric"])
    payload = torch.load(out / "last.pt", map_location="cpu", weights_only=True)
    assert "encoder" not in payload and payload["grid"] == [2, 2] and payload["annotation_dim"] == 512
    assert VAL_ONLY_WORD not in payload["vocab"] and payload["vocab"] == json.loads((out / "vocab.json").read_text())
    logged = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert [e["step"] for e in logged if "loss" in e] == [1, 2, 3, 4]
    assert all(math.isfinite(e["loss"]) for e in logged if "loss" in e)


def test_the_two_stage_recipe_frozen_then_fine_tuned_from_the_first_stages_best(fake_coco: Path, tmp_path: Path,
                                                                                 resnet18_file: Path) -> None:
    """Stage 1 on cached annotations, stage 2 (configs/coco_resnet101_finetune.yaml) fine-tunes layer4
    from stage 1's best.pt: it starts at stage 1's decoder, with stage 1's vocabulary, from step 0."""
    first = tmp_path / "frozen"
    fit(_coco_config(fake_coco, first, resnet18_file, "train.max_steps=3"))
    stage1 = torch.load(first / "best.pt", map_location="cpu", weights_only=True)
    second = tmp_path / "tuned"
    config = _coco_config(fake_coco, second, resnet18_file, f"train.init_from={first / 'best.pt'}",
                          "train.max_steps=2", "train.seed=7", recipe="coco_resnet101_finetune")
    assert config.encoder.fine_tune_from == "layer4" and config.train.lr == 0.0001
    assert fit(config)["steps"] == 2
    stage2 = torch.load(second / "last.pt", map_location="cpu", weights_only=True)
    assert "encoder" in stage2 and stage2["vocab"] == stage1["vocab"] and stage2["progress"]["step"] == 2
    moved = max((stage2["decoder"][k] - stage1["decoder"][k]).abs().max().item() for k in stage1["decoder"])
    assert moved < 0.01  # two steps at 1e-4 from stage 1's weights; seed 7's own initialization is far off
    original = torch.load(resnet18_file, map_location="cpu", weights_only=True)
    assert not torch.equal(stage2["encoder"]["body.layer4.0.conv1.weight"], original["layer4.0.conv1.weight"])
    assert torch.equal(stage2["encoder"]["body.layer3.0.conv1.weight"], original["layer3.0.conv1.weight"])


def test_fine_tuning_runs_the_encoder_on_the_fly_with_its_own_rate(fake_coco: Path, tmp_path: Path,
                                                                   resnet18_file: Path, capsys) -> None:
    out = tmp_path / "tuned"
    config = _coco_config(fake_coco, out, resnet18_file, "encoder.fine_tune_from=layer4", "encoder.lr=0.001",
                          "train.epochs=1", "train.log_every_steps=1", "data.feature_cache=false",
                          "train.num_workers=2")  # images decoded in worker processes
    summary = fit(config)
    assert summary["steps"] == 5  # 8 images x 5 captions in batches of 8: one epoch
    assert summary["skipped_images"] == 5  # the corrupt image's 5 pairs: skipped and counted, not fatal
    payload = torch.load(out / "last.pt", map_location="cpu", weights_only=True)
    original = torch.load(resnet18_file, map_location="cpu", weights_only=True)
    tuned = payload["encoder"]
    assert not torch.equal(tuned["body.layer4.0.conv1.weight"], original["layer4.0.conv1.weight"])  # trained
    assert torch.equal(tuned["body.layer3.0.conv1.weight"], original["layer3.0.conv1.weight"])  # frozen
    assert torch.equal(tuned["body.bn1.running_mean"], original["bn1.running_mean"])  # frozen BN stayed in eval
    assert [g["lr"] for g in payload["optimizer"]["param_groups"]] == [config.train.lr, 0.001]
    logged = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines() if "loss" in line]
    assert logged[-1]["skipped_images"] == summary["skipped_images"]
    code = main(["evaluate", "--checkpoint", str(out / "last.pt"), "--split", "val"])
    assert code == 0 and "on val (3 images" in capsys.readouterr().out


def test_evaluation_on_coco_with_instances_files_scores_hallucination_and_attention_correctness(
        fake_coco: Path, tmp_path: Path, resnet18_file: Path, capsys) -> None:
    """eval.py on the fake COCO's val split: CHAIR and attention correctness beside the caption metrics,
    in the printout and the metrics file; without the instances files, the caption metrics alone and
    one line that says so. The dog's mask (columns 0-19 of 52) covers 14 of the 40 columns of the
    centre square (columns 6-45) that the encoder saw: chance 0.35 (of the whole image: 20/52)."""
    out = tmp_path / "run"
    fit(_coco_config(fake_coco, out, resnet18_file, "train.epochs=6", "train.lr=0.01"))  # long enough to say "dog"
    capsys.readouterr()
    validated = [json.loads(line)["validation"] for line in (out / "log.jsonl").read_text().splitlines()
                 if "validation" in line]
    assert validated and all("CHAIR_i" in v and "attention_correctness" in v for v in validated)  # validation too
    code = main(["evaluate", "--checkpoint", str(out / "best.pt"), "--split", "val", "--out",
                 str(tmp_path / "metrics.json")])
    printed, err = capsys.readouterr()
    assert code == 0 and "no COCO instances file" not in err
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    for name in ("CHAIR_i", "CHAIR_s", "CHAIR_objects", "attention_correctness", "attention_correctness_chance",
                 "attention_words"):
        assert name in metrics and f"  {name} " in printed, name
    captions = [r["caption"].split() for r in json.loads((tmp_path / "metrics_captions.json").read_text())]
    dogs = sum(words.count("dog") for words in captions)
    assert dogs > 0 and metrics["attention_words"] == dogs  # every "dog" is a word on an annotated object
    assert metrics["attention_correctness_chance"] == pytest.approx(14 / 40)
    assert 0 <= metrics["attention_correctness"] <= 1 and 0 <= metrics["CHAIR_s"] <= 1
    code = main(["evaluate", "--checkpoint", str(out / "best.pt"), "--split", "val", "--out",
                 str(tmp_path / "without.json"), "data.val_instances=none.json", "data.train_instances=none.json"])
    printed, err = capsys.readouterr()
    assert code == 0 and "CHAIR" not in printed and "attention_correctness" not in printed
    assert [line for line in err.splitlines() if "instances" in line] == [
        f"note: no COCO instances file ({fake_coco / 'none.json'}, {fake_coco / 'none.json'}): evaluating "
        "without CHAIR and attention correctness"]
    assert "Bleu_4" in json.loads((tmp_path / "without.json").read_text())


def test_training_writes_overlays_to_tensorboard(fake_coco: Path, tmp_path: Path, resnet18_file: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "tb"
    fit(_coco_config(fake_coco, out, resnet18_file, "train.max_steps=2", "train.log_every_steps=1"))
    events = EventAccumulator(str(out / "tensorboard"), size_guidance={"images": 0}).Reload()
    tags = events.Tags()
    assert {"val_overlays/0", "val_overlays/1"} <= set(tags["images"])
    assert {"train/loss", "train/lr", "val/CIDEr", "val/Bleu_4"} <= set(tags["scalars"])
    image = events.Images("val_overlays/0")[-1]
    assert image.step == 2 and image.width > 0 and image.height > 0


# configs -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["soft", "hard"])
@pytest.mark.parametrize("base", ["coco_vgg19", "coco_resnet101", "flickr8k_vgg19"])
def test_paper_configs_load_and_validate(base: str, kind: str) -> None:
    name = f"{base}_{kind}"
    config = load_config(REPO / "configs" / f"{name}.yaml")
    assert config.train.batch_size == 64 and config.data.min_word_count == 5
    assert config.model.attention == kind and config.model.dropout > 0
    assert config.train.out_dir == f"runs/{name}"
    assert config.encoder.name == name.split("_")[1]
    if config.encoder.name == "vgg19":
        assert (config.encoder.layer, config.data.image_size) == ("stride16", 224)  # conv5_4, 14x14
    else:
        assert (config.encoder.layer, config.data.image_size) == ("stride32", 448)  # layer4, 14x14


@pytest.mark.parametrize("override, key", [("data.dataset=imagenet", "data.dataset"),
                                           ("encoder.name=vgg16", "encoder.name"),
                                           ("train.batch_size=0", "train.batch_size"),
                                           ("data.val_instances=[a.json]", "data.val_instances"),
                                           ("data.train_instance=a.json", "data.train_instances")])
def test_invalid_values_are_config_errors(override: str, key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        load_config(REPO / "configs" / "coco_vgg19_soft.yaml", [override])


def test_features_dir_depends_on_the_encoder(tmp_path: Path, resnet18_file: Path, fake_coco: Path) -> None:
    a = features_dir(_coco_config(fake_coco, tmp_path, resnet18_file))
    b = features_dir(_coco_config(fake_coco, tmp_path, resnet18_file, "data.image_size=96"))
    assert a != b and a.parent == b.parent == fake_coco / "features"


# augmentation -------------------------------------------------------------------------------------


def test_augment_is_a_random_square_crop_with_colour_jitter_and_no_flip() -> None:
    from captioning.data.images import augment

    pixels = np.zeros((60, 90, 3), dtype=np.uint8)
    pixels[:, :45] = (200, 40, 40)  # red on the left half, blue on the right
    pixels[:, 45:] = (40, 40, 200)
    image = Image.fromarray(pixels)
    draws = [augment(image, generator=torch.Generator().manual_seed(seed)) for seed in range(8)]
    sides = {d.size for d in draws}
    assert all(w == h and 48 <= w <= 60 for w, h in sides)  # square, 80-100% of the shorter side
    assert len(sides) > 1
    again = augment(image, generator=torch.Generator().manual_seed(3))
    assert np.array_equal(np.asarray(again), np.asarray(draws[3]))  # a function of the generator
    assert len({np.asarray(d).tobytes() for d in draws}) == len(draws)
    for picture in draws:  # never mirrored: whatever red is left lies left of whatever blue is left
        red = np.asarray(picture)[:, :, 0].astype(int) - np.asarray(picture)[:, :, 2]
        columns = np.flatnonzero(red.mean(0) > 0)
        others = np.flatnonzero(red.mean(0) < 0)
        if len(columns) and len(others):
            assert columns.max() < others.min()


def test_augmented_training_reads_differ_and_evaluation_reads_do_not(fake_coco: Path, tmp_path: Path,
                                                                    resnet18_file: Path) -> None:
    from captioning.data.dataset import ImageCaptionPairs
    from captioning.data.vocab import Vocabulary

    config = _coco_config(fake_coco, tmp_path, resnet18_file)
    records = [r for r in read_records(config.data, "train") if r.path.name.endswith(".jpg")][:2]
    vocab = Vocabulary(["<pad>", "<start>", "<end>", "<unk>"])
    common = {"image_size": 32, "mean": (0.5, 0.5, 0.5), "std": (0.5, 0.5, 0.5)}
    plain = ImageCaptionPairs(records, Tokenized.of([r.captions for r in records]), vocab, **common)
    varied = ImageCaptionPairs(records, Tokenized.of([r.captions for r in records]), vocab, augmented=True, **common)
    torch.manual_seed(0)
    assert torch.equal(plain[0][0], plain[0][0])
    first, second = varied[0][0], varied[0][0]
    assert first.shape == second.shape == plain[0][0].shape == (3, 32, 32)
    assert not torch.equal(first, second)


def test_augmentation_with_cached_annotations_is_a_config_error(fake_coco: Path, tmp_path: Path,
                                                                 resnet18_file: Path) -> None:
    with pytest.raises(ConfigError, match="data.augment"):
        _coco_config(fake_coco, tmp_path, resnet18_file, "data.augment=true")
    config = _coco_config(fake_coco, tmp_path, resnet18_file, "data.augment=true", "data.feature_cache=false")
    assert config.data.augment


def test_unreadable_training_images_on_the_fly_are_named_once_and_too_many_stop_the_run(
        fake_coco: Path, tmp_path: Path, resnet18_file: Path, capsys) -> None:
    common = ("encoder.fine_tune_from=layer4", "data.feature_cache=false", "train.epochs=2", "train.max_steps=12")
    fit(_coco_config(fake_coco, tmp_path / "ok", resnet18_file, *common))  # 1 of 8 bad: under 20%
    warnings = [line for line in capsys.readouterr().err.splitlines() if "unreadable image" in line]
    assert len(warnings) == 1 and "COCO_train2014_000000000006.jpg" in warnings[0]  # two epochs, named once
    with pytest.raises(TrainingError, match=r"train: 1 of 8 images cannot be read .*data.max_bad_images=0.01"):
        fit(_coco_config(fake_coco, tmp_path / "strict", resnet18_file, *common, "data.max_bad_images=0.01"))


def test_empty_and_non_text_captions_are_dropped_and_counted(tmp_path: Path, capsys) -> None:
    entries = [{"filename": "a.jpg", "split": "train", "sentences": [{"raw": "a dog"}, {"raw": "  "}, {"raw": None}]},
               {"filename": "b.jpg", "split": "train", "sentences": [{"raw": ""}, {"raw": 17}]},
               {"filename": "c.jpg", "split": "train", "sentences": [{"raw": "a cat on a mat"}]}]
    (tmp_path / "split.json").write_text(json.dumps({"images": entries}))
    records = read_split(tmp_path / "split.json", "train")
    assert [(r.path.name, r.captions) for r in records] == [("a.jpg", ("a dog",)), ("c.jpg", ("a cat on a mat",))]
    (note,) = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert "4 empty or non-text captions dropped" in note and "1 image had none left, left out" in note


def test_an_unreadable_image_encoded_on_the_fly_is_named_once_and_left_out_of_the_metrics(
        fake_coco: Path, tmp_path: Path, resnet18_file: Path, capsys) -> None:
    import dataclasses

    from captioning.data.vocab import Vocabulary
    from captioning.eval.evaluate import evaluate_split
    from captioning.model.encoder_decoder import build_decoder

    config = _coco_config(fake_coco, tmp_path, resnet18_file)
    records = read_records(config.data, "val")
    broken = tmp_path / "broken.jpg"
    broken.write_bytes(b"\xff\xd8 not a jpeg")
    records[1] = dataclasses.replace(records[1], path=broken)
    encoded = EncodedImages(Encoder.from_config(config.encoder), records, image_size=64)
    vocab = Vocabulary.build([["a", "dog"], ["a", "cat"]], min_count=1)
    decoder = build_decoder(config.model, vocab_size=len(vocab), annotation_dim=512, grid=(2, 2)).eval()
    ids, references = [r.image_id for r in records], [list(r.captions) for r in records]
    for _ in range(2):  # two validations: the image is named once
        metrics, results = evaluate_split(decoder, encoded, image_ids=ids, references=references, vocab=vocab,
                                          grid=(2, 2), batch_size=2, full=False)
        assert [r["image_id"] for r in results] == [ids[0], *ids[2:]]  # not decoded from zeros and scored
    assert encoded.unreadable == {1}
    warnings = [line for line in capsys.readouterr().err.splitlines() if "unreadable" in line]
    assert len(warnings) == 1 and "broken.jpg" in warnings[0]


def test_validation_on_the_fly_encodes_a_batch_at_a_time_and_stops_when_too_many_are_bad(
        fake_coco: Path, tmp_path: Path, resnet18_file: Path) -> None:
    import dataclasses

    from captioning.data.splits import load_splits as splits_of
    from captioning.data.vocab import Vocabulary
    from captioning.model.encoder_decoder import build_decoder
    from captioning.train.validation import validation_metrics

    config = _coco_config(fake_coco, tmp_path, resnet18_file, "train.val_images=3", "data.max_bad_images=0.5")
    val = splits_of(config, ("val",), features=False)["val"]
    val.grid = (2, 2)
    broken = tmp_path / "broken.jpg"
    broken.write_bytes(b"\xff\xd8 not a jpeg")
    val.records[1] = dataclasses.replace(val.records[1], path=broken)
    encoder = Encoder.from_config(config.encoder)
    batches = []
    forward = encoder.forward
    encoder.forward = lambda images: batches.append(images.shape[0]) or forward(images)
    encoded = EncodedImages(encoder, val.records, image_size=64)
    vocab = Vocabulary.build([["a", "dog"]], min_count=1)
    decoder = build_decoder(config.model, vocab_size=len(vocab), annotation_dim=512, grid=(2, 2)).eval()
    metrics = validation_metrics(decoder, val, vocab, config, device="cpu", annotations=encoded)  # 1 of 3 bad: < 50%
    assert "CIDEr" in metrics and encoded.unreadable == {1} and sum(batches) == 2  # only the first 3, read lazily
    strict = _coco_config(fake_coco, tmp_path, resnet18_file, "train.val_images=3", "data.max_bad_images=0.2")
    with pytest.raises(DatasetError, match="1 of 3 images cannot be read"):
        validation_metrics(decoder, val, vocab, strict, device="cpu", annotations=encoded)
