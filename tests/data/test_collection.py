"""A folder of your own images and a captions file (data.dataset=folder, data/formats/folder.py): the two
file forms, what `captioning prepare` says of a collection, the splits a seed makes, and a run from
the folder through evaluation whose references are the captions file's."""

from __future__ import annotations

import csv
import hashlib
import json
import os
import warnings
from pathlib import Path

import pytest
from PIL import Image

from captioning.cli import main
from captioning.config import load_config
from captioning.data.formats.folder import collection_of, read_collection
from captioning.data.formats.folder_report import check, describe_made, split_counts, write_splits
from captioning.data.records import DatasetError, read_records
from captioning.eval.evaluate import evaluate_checkpoint
from captioning.train.loop import fit
from tests.tiny import TINY


def _folder(root: Path, rows: list[tuple[str, ...]], *, header: tuple[str, ...] = ("image", "caption", "split"),
            images: list[str] | None = None) -> Path:
    """root/images/<name> for every image the rows name (or `images`), each a photo of its own colour
    (identical files would be one photo, kept in one split), and root/captions.csv."""
    (root / "images").mkdir(parents=True, exist_ok=True)
    for name in images if images is not None else sorted({row[0] for row in rows}):
        (root / "images" / name).parent.mkdir(parents=True, exist_ok=True)
        colour = tuple(hashlib.sha256(name.encode()).digest()[:3])
        Image.new("RGB", (40, 30), colour).save(root / "images" / name)
    with (root / "captions.csv").open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(header)
        writer.writerows(rows)
    return root / "captions.csv"


def _read(captions_file: Path, *, seed: int = 0, share: float = 0.2):
    return read_collection(captions_file, image_root=captions_file.parent / "images", seed=seed, share=share)


def test_csv_and_json_lines_read_alike_one_row_per_caption(tmp_path: Path) -> None:
    rows = [("b.jpg", "a dog on grass", "train"), ("a.jpg", "a red car", "val"), ("b.jpg", "a brown dog", "train"),
            ("c/d.png", "two cats", "test")]
    from_csv = _read(_folder(tmp_path / "csv", rows))
    lines = tmp_path / "jsonl" / "captions.jsonl"
    lines.parent.mkdir()
    lines.write_text("\n".join(json.dumps({"image": i, "caption": c, "split": s}) for i, c, s in rows) + "\n\n")
    from_jsonl = read_collection(lines, image_root=tmp_path / "csv" / "images", seed=0, share=0.2)
    for collection in (from_csv, from_jsonl):
        assert collection.images == ["b.jpg", "a.jpg", "c/d.png"]  # the order the file first names them
        assert collection.captions["b.jpg"] == ["a dog on grass", "a brown dog"]
        assert collection.splits == {"b.jpg": "train", "a.jpg": "val", "c/d.png": "test"}
        assert collection.made == {}
    train = from_csv.records("train")
    assert [(r.image_id, r.path, r.captions) for r in train] == [
        (0, tmp_path / "csv" / "images" / "b.jpg", ("a dog on grass", "a brown dog"))]
    assert [r.image_id for r in from_csv.records("test")] == [2]  # ids are the file's order, in every split


def test_an_image_in_two_splits_is_refused_in_one_line_with_the_count_and_names(tmp_path: Path) -> None:
    rows = [("a.jpg", "x", "train"), ("a.jpg", "y", "test"), ("b.jpg", "z", "train"), ("c.jpg", "w", ""),
            ("c.jpg", "v", "val"), ("b.jpg", "u", "train")]
    with pytest.raises(DatasetError) as raised:
        _read(_folder(tmp_path, rows))
    assert str(raised.value) == (f"{tmp_path / 'captions.csv'}: 1 image in two splits (a.jpg: train and "
                                 "test); give each image one split")  # c.jpg's empty split is no second one


def _draw(name: str, seed: int) -> float:
    """The seed's draw for an image, computed here as the docs state it: SHA-256 of "seed/path"."""
    return int.from_bytes(hashlib.sha256(f"{seed}/{name}".encode()).digest()[:8], "big") / 2 ** 64


def test_missing_splits_are_made_by_each_images_own_draw_so_added_photos_move_none(tmp_path: Path) -> None:
    names = [f"photo_{i:03d}.jpg" for i in range(60)]
    collection = _read(_folder(tmp_path / "a", [(n, "a photo", "") for n in names], images=[]), seed=7, share=0.2)
    expected = {n: "val" if _draw(n, 7) < 0.2 else "test" if _draw(n, 7) < 0.4 else "train" for n in names}
    assert collection.splits == expected
    assert sorted(collection.made) == ["test", "train", "val"] and len(collection.made["train"]) == list(
        expected.values()).count("train")
    more = names + [f"photo_{i:03d}.jpg" for i in range(60, 200)]
    grown = _read(_folder(tmp_path / "b", [(n, "a photo", "") for n in more], images=[]), seed=7, share=0.2)
    assert {n: grown.splits[n] for n in names} == collection.splits
    other_seed = _read(_folder(tmp_path / "c", [(n, "a photo", "") for n in names], images=[]), seed=8, share=0.2)
    assert other_seed.splits != collection.splits


def test_a_missing_test_split_is_made_from_the_training_images_when_every_image_has_a_split(tmp_path: Path) -> None:
    names = [f"{i}.jpg" for i in range(40)]
    rows = [(n, "a photo", "val" if i < 5 else "train") for i, n in enumerate(names)]
    collection = _read(_folder(tmp_path, rows, images=[]), seed=1, share=0.1)
    made = collection.made["test"]
    assert set(made) == {n for n in names[5:] if _draw(n, 1) < 0.1} and made  # test takes [0, share) of train's
    assert [n for n in names if collection.splits[n] == "val"] == names[:5]  # what the rows gave is kept
    assert "val" not in collection.made and "train" not in collection.made
    mixed = [(n, "a photo", "train" if i < 20 else "") for i, n in enumerate(names)]  # val and test from the blank ones
    collection = _read(_folder(tmp_path / "mixed", mixed, images=[]), seed=1, share=0.3)
    assert all(collection.splits[n] == "train" for n in names[:20])
    assert collection.made["train"] == [n for n in names[20:] if _draw(n, 1) >= 0.6]


def test_a_small_collection_still_gets_one_image_in_each_made_split(tmp_path: Path) -> None:
    collection = _read(_folder(tmp_path / "three", [(n, "c", "") for n in ("a.jpg", "b.jpg", "c.jpg")], images=[]),
                       share=0.01)
    assert sorted(collection.splits.values()) == ["test", "train", "val"]
    with pytest.raises(DatasetError, match="too few images to make the val and test split from"):
        _read(_folder(tmp_path / "two", [("a.jpg", "c", ""), ("b.jpg", "c", "")], images=[]))
    with pytest.raises(DatasetError, match="no training images"):
        _read(_folder(tmp_path / "none", [("a.jpg", "c", "val"), ("b.jpg", "c", "test")], images=[]))


@pytest.mark.parametrize("content, said", [
    ("file,text\na.jpg,a dog\n",
     "the first line names the columns, image and caption (split optional); it names file, text"),
    ("image,caption,split\na.jpg,a dog,validation\n", "line 2: split 'validation' is not one of train, val, test"),
    ("image,caption\n,a dog\n", "line 2 names no image"),
    ("image,caption\n", "no captions in it"),
    ("image,caption\na.jpg,a dog, a ball\n",
     "line 2 has more columns than the first line names (a caption with a comma"),
    ("image,caption\na.jpg\n", "line 2 has fewer columns than the first line names"),
    # a quote never closed: without strict csv the rest of the file was one caption, its rows gone
    ("image,caption\na.jpg,a dog\nb.jpg,\"a cat\nc.jpg,a bird\nd.jpg,a fish\n",
     "line 3: unexpected end of data (a double quote opened on this line is never closed)"),
    ('image,caption\na.jpg,"a dog" runs\n', "line 2: ',' expected after '\"'"),
    # the line the quote opens on, after blank lines the reader passes over
    ("image,caption\r\na.jpg,x\r\n\r\n\r\nb.jpg,\"open\r\nc.jpg,y\r\n", "line 5: unexpected end of data"),
    ("image,caption\n" + "a.jpg,x\n" * 3 + 'b.jpg,"' + "a dog\n" * 30_000, "line 5: field larger than field limit"),
])
def test_a_malformed_csv_is_one_error_naming_the_file_and_line(content: str, said: str, tmp_path: Path) -> None:
    (tmp_path / "captions.csv").write_text(content)
    with pytest.raises(DatasetError) as raised:
        _read(tmp_path / "captions.csv")
    assert said in str(raised.value)
    assert str(raised.value).startswith(f"{tmp_path / 'captions.csv'}: ") and "\n" not in str(raised.value)


@pytest.mark.parametrize("content, said", [
    ('{"image": "a.jpg", "caption": "x"}\nimage,caption\n', "line 2 is not JSON"),
    ('{"image": "a.jpg", "text": "x"}\n', 'line 1 is not an object with "image" and "caption"'),
    ('{"image": "a.jpg", "caption": 3}\n', 'line 1: "caption" and "split" are text'),
])
def test_a_malformed_json_lines_file_is_one_error_naming_the_line(content: str, said: str, tmp_path: Path) -> None:
    (tmp_path / "captions.jsonl").write_text(content)
    with pytest.raises(DatasetError, match=f"^{tmp_path / 'captions.jsonl'}: {said}"):
        _read(tmp_path / "captions.jsonl")


def test_check_names_missing_unreadable_uncaptioned_and_unlisted_images_and_empty_captions(tmp_path: Path) -> None:
    rows = [("a.jpg", "a dog", "train"), ("b.jpg", "   ", "train"), ("b.jpg", "", "train"),
            ("gone1.jpg", "x", "train"), ("gone2.jpg", "x", "val"), ("broken.jpg", "y", "test"),
            ("c.jpg", "a cat", "test")]
    captions_file = _folder(tmp_path, rows, images=["a.jpg", "b.jpg", "c.jpg", "extra/z.ppm", "y.jpg"])
    (tmp_path / "images" / "broken.jpg").write_bytes(b"not an image")
    (tmp_path / "images" / "notes.txt").write_text("not a picture, and not counted as one")
    lines = check(_read(captions_file), max_bad_images=0.2)
    assert lines == [
        f"2 of 6 images listed in captions.csv are not in {tmp_path / 'images'} (gone1.jpg, gone2.jpg); "
        "training leaves them out, and stops if a split has more than data.max_bad_images=0.2",
        "1 image cannot be read as images (broken.jpg); training leaves them out, and stops if a split has more "
        "than data.max_bad_images=0.2",
        f"2 images in {tmp_path / 'images'} with no caption in captions.csv, not used (extra/z.ppm, y.jpg)",
        "2 empty captions dropped (captions.csv lines 3, 4)",
        "1 image with only empty captions, not used (b.jpg)",
    ]
    collection = _read(captions_file)
    assert [r.path.name for r in collection.records("train")] == ["a.jpg", "gone1.jpg"]  # b.jpg has no caption left


@pytest.mark.filterwarnings("default:.*the old name still works:FutureWarning")  # shown, not raised (setup.cfg)
def test_cli_prepare_reads_a_setting_under_its_old_name_and_says_the_new_one_in_one_line(tmp_path: Path, capsys,
                                                                                         monkeypatch) -> None:
    """data.split_share became data.folder.split_share: the old name is an alias (README lists them).
    A warning from outside the package is left to Python to show, as it would be without the command."""
    def warns_from_elsewhere(config) -> None:
        warnings.warn("not the package's", UserWarning, stacklevel=1)  # here, in the tests

    monkeypatch.setattr("captioning.data.records.make_missing_data", warns_from_elsewhere)
    names = [f"p{i:02d}.jpg" for i in range(30)]
    _folder(tmp_path / "photos", [(n, f"a photo of thing {i % 4}", "") for i, n in enumerate(names)],
            header=("image", "caption", "split"), images=names)
    printed = {}
    for key in ("data.folder.split_share", "data.split_share"):
        assert main(["prepare", "--config", str(REPO_CONFIG), f"data.root={tmp_path / 'photos'}",
                     f"train.out_dir={tmp_path / key}", f"{key}=0.3"]) == 0
        printed[key] = capsys.readouterr()
    made = [line for line in printed["data.folder.split_share"].out.splitlines() if line.startswith("no row names")]
    assert len(made) == 2 and "data.folder.split_share=0.3" in made[0]
    assert made == [line for line in printed["data.split_share"].out.splitlines() if line.startswith("no row names")]
    assert "warning" not in printed["data.folder.split_share"].err
    assert printed["data.split_share"].err.splitlines()[0] == (
        "warning: override 'data.split_share=0.3': 'data.split_share' is now 'data.folder.split_share' (the old "
        "name still works)")
    assert "warning: not the package's" not in printed["data.split_share"].err  # not put in the package's words


def test_cli_prepare_says_what_it_found_and_made_and_writes_the_splits_down(tmp_path: Path, capsys) -> None:
    names = [f"p{i:02d}.jpg" for i in range(30)]
    rows = [(n, f"a photo of thing {i % 4}", "") for i, n in enumerate(names)] + [(names[0], "", "")]
    _folder(tmp_path / "photos", rows, header=("image", "caption", "split"), images=names + ["stray.jpg"])
    out = tmp_path / "run"
    code = main(["prepare", "--config", str(REPO_CONFIG), f"data.root={tmp_path / 'photos'}",
                 f"train.out_dir={out}", "data.folder.split_share=0.1"])
    printed = capsys.readouterr().out.splitlines()
    assert code == 0
    assert printed[0].startswith(f"1 image in {tmp_path / 'photos' / 'images'} with no caption")
    assert "stray.jpg" in printed[0]
    assert printed[1] == "1 empty caption dropped (captions.csv line 32)"
    made = {split: [n for n in names if _draw(n, 0) < 0.1] if split == "val" else
            [n for n in names if 0.1 <= _draw(n, 0) < 0.2] for split in ("val", "test")}
    val = f"{len(made['val'])} image{'s' if len(made['val']) != 1 else ''}"
    assert any(line.startswith(f"no row names a val split: made it of {val} with "
                               "data.folder.split_seed=0") for line in printed)
    written = list(csv.reader((out / "splits.csv").open()))
    assert written[0] == ["image", "split"] and len(written) == 31
    assert {n for n, s in written[1:] if s == "test"} == set(made["test"])
    assert (out / "vocab.json").exists() and printed[-2].startswith("vocabulary of ")

    rows[1] = (names[1], "a photo", "test")
    rows[2] = (names[1], "a photo", "train")
    _folder(tmp_path / "photos", rows, images=[])
    assert main(["prepare", "--config", str(REPO_CONFIG), f"data.root={tmp_path / 'photos'}",
                 f"train.out_dir={out}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: {tmp_path / 'photos' / 'captions.csv'}: 1 image in two splits (p01.jpg: train and "
                   "test); give each image one split"]


def test_a_folder_trains_and_is_evaluated_against_its_own_captions(tmp_path: Path) -> None:
    from captioning.data.shapes.scenes import write_folder

    root = tmp_path / "photos"
    write_folder(root, 30, seed=3, image_size=96)
    config = load_config(REPO_CONFIG, [f"data.root={root}", *TINY, f"train.out_dir={tmp_path / 'run'}",
                                       "train.max_steps=4", "data.folder.split_share=0.15"])
    fit(config)
    test = read_records(config.data, "test")
    evaluation = evaluate_checkpoint(tmp_path / "run" / "best.pt", split="test", overrides=[f"data.root={root}"])
    assert sorted(r["image_id"] for r in evaluation.results) == sorted(r.image_id for r in test)
    captions = {}
    for image, caption in csv.reader((root / "captions.csv").open()):
        captions.setdefault(image, []).append(caption)
    assert all(r.captions == tuple(captions[r.path.name]) for r in test)  # the references are the file's rows
    assert evaluation.metrics["CIDEr"] >= 0 and "Bleu_4" in evaluation.metrics


REPO_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "folder_soft.yaml"


def test_describe_made_names_each_made_split_then_where_the_rest_went(tmp_path: Path) -> None:
    names = [f"{i:02d}.jpg" for i in range(40)]
    collection = _read(_folder(tmp_path / "all", [(n, "a photo", "") for n in names], images=[]), seed=2, share=0.1)
    val = [n for n in names if _draw(n, 2) < 0.1]
    test = [n for n in names if 0.1 <= _draw(n, 2) < 0.2]
    train = [n for n in names if n not in val + test]
    assert list(describe_made(collection, seed=2, share=0.1)) == [
        f"no row names a val split: made it of {len(val)} images with data.folder.split_seed=2 (about "
        f"data.folder.split_share=0.1 of them; {', '.join(val[:3])}, ...)",
        f"no row names a test split: made it of {len(test)} image{'s' if len(test) != 1 else ''} with "
        f"data.folder.split_seed=2 (about data.folder.split_share=0.1 of them; {', '.join(test[:3])}"
        f"{', ...' if len(test) > 3 else ''})",
        f"{len(train)} images without a split go to train ({', '.join(train[:3])}, ...)"]
    assert split_counts(collection) == {"train": len(train), "val": len(val), "test": len(test)}
    only_test = _read(_folder(tmp_path / "test", [(n, "c", "val" if i < 3 else "train") for i, n in enumerate(names)],
                            images=[]), seed=2, share=0.1)
    assert [line.split(":")[0] for line in describe_made(only_test, seed=2, share=0.1)] == [
        "no row names a test split"]  # val was given, nothing went to train unasked


def test_more_than_three_names_end_in_dots_and_three_do_not(tmp_path: Path) -> None:
    rows = [(f"{i}.jpg", "x", split) for i in range(4) for split in ("train", "test")]
    with pytest.raises(DatasetError) as raised:
        _read(_folder(tmp_path / "four", rows, images=[]))
    assert str(raised.value).endswith(": 4 images in two splits (0.jpg: train and test; 1.jpg: train and test; "
                                      "2.jpg: train and test; ...); give each image one split")
    captions_file = _folder(tmp_path / "three", [(f"{i}.jpg", "x", "train") for i in range(3)] + [
        ("v.jpg", "x", "val"), ("t.jpg", "x", "test")], images=["v.jpg", "t.jpg"])
    assert check(_read(captions_file), max_bad_images=0.5)[0].startswith(
        "3 of 5 images listed in captions.csv are not in ")
    assert "(0.jpg, 1.jpg, 2.jpg); training" in check(_read(captions_file), max_bad_images=0.5)[0]


def test_the_closest_draw_fills_a_split_that_its_share_leaves_empty(tmp_path: Path) -> None:
    names = ["a.jpg", "b.jpg", "c.jpg", "d.jpg"]
    collection = _read(_folder(tmp_path, [(n, "c", "") for n in names], images=[]), seed=5, share=0.001)
    val = min(names, key=lambda n: abs(_draw(n, 5) - 0.0))
    test = min((n for n in names if n != val), key=lambda n: abs(_draw(n, 5) - 0.001))
    assert collection.made["val"] == [val] and collection.made["test"] == [test]


def test_errors_of_the_file_itself_name_it(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match=f"^{tmp_path / 'none.csv'}: captions file not found"):
        _read(tmp_path / "none.csv")
    (tmp_path / "latin.csv").write_bytes("image,caption\na.jpg,caf\xe9\n".encode("latin-1"))
    with pytest.raises(DatasetError, match=f"^{tmp_path / 'latin.csv'}: not UTF-8 text"):
        _read(tmp_path / "latin.csv")
    (tmp_path / "folder.csv").mkdir()
    with pytest.raises(DatasetError, match=f"^{tmp_path / 'folder.csv'}: captions file not found"):
        _read(tmp_path / "folder.csv")
    (tmp_path / "two.csv").write_text("image,caption\na.jpg,x\nb.jpg,y\n")
    with pytest.raises(DatasetError, match=f"^{tmp_path / 'two.csv'}: too few images to make the val and test split"):
        _read(tmp_path / "two.csv")
    collection = _read(_folder(tmp_path / "empty_val", [("a.jpg", "x", "train"), ("b.jpg", "", "val"),
                                                         ("c.jpg", "y", "test")], images=[]))
    with pytest.raises(DatasetError, match=r"captions.csv: no captioned images in split 'val'$"):
        collection.records("val")


def test_a_captions_file_that_cannot_be_opened_is_one_line_with_the_reason(tmp_path: Path, monkeypatch) -> None:
    """No rights to read it (which root, as tests may run, always has: so planted here), a disk error."""
    import captioning.data.formats.folder as folder

    path = _folder(tmp_path / "photos", [("a.jpg", "x", "train")], images=[])

    def refused(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(folder, "open", refused, raising=False)
    with pytest.raises(DatasetError, match=f"^{path}: cannot read the captions file \\(Permission denied\\)$"):
        _read(path)


def test_a_spreadsheets_byte_order_mark_blank_lines_and_null_captions(tmp_path: Path) -> None:
    (tmp_path / "bom.csv").write_bytes("\ufeffimage,caption,split\na.jpg,a dog,train\nb.jpg,x,val\nc.jpg,y,test\n"
                                       .encode())
    assert _read(tmp_path / "bom.csv").captions["a.jpg"] == ["a dog"]  # the mark is not part of "image"
    (tmp_path / "rows.jsonl").write_text('{"image": "a.jpg", "caption": "x", "split": "train"}\n\n'
                                         '{"image": "b.jpg", "caption": null, "split": "val"}\n'
                                         '{"image": "c.jpg", "caption": "z", "split": "test"}\n')
    collection = _read(tmp_path / "rows.jsonl")
    assert collection.images == ["a.jpg", "b.jpg", "c.jpg"] and collection.empty_captions == [3]
    (tmp_path / "bad.jsonl").write_text('{"image": "a.jpg", "caption": "x"}\n["a.jpg", "x"]\n')
    with pytest.raises(DatasetError, match=r'line 2 is not an object with "image" and "caption"'):
        _read(tmp_path / "bad.jsonl")
    (tmp_path / "split.jsonl").write_text('{"image": "a.jpg", "caption": "x", "split": "dev"}\n')
    with pytest.raises(DatasetError, match=r"split.jsonl: line 1: split 'dev' is not one of"):
        _read(tmp_path / "split.jsonl")
    for header, named in (("image\na.jpg\n", "it names image"), ("\n\n", "it names none")):
        (tmp_path / "header.csv").write_text(header)
        with pytest.raises(DatasetError, match=f"the first line names the columns.*; {named}$"):
            _read(tmp_path / "header.csv")


def test_an_edited_captions_file_is_read_again(tmp_path: Path) -> None:
    captions_file = _folder(tmp_path, [("a.jpg", "x", "train"), ("b.jpg", "y", "val"), ("c.jpg", "z", "test")],
                            images=[])
    first = collection_of(captions_file, image_root=tmp_path / "images", seed=0, share=0.2)
    assert collection_of(captions_file, image_root=tmp_path / "images", seed=0, share=0.2) is first  # read once
    with captions_file.open("a") as file:
        file.write("d.jpg,w,train\n")
    os.utime(captions_file, ns=(captions_file.stat().st_atime_ns, captions_file.stat().st_mtime_ns + 10**9))
    assert collection_of(captions_file, image_root=tmp_path / "images", seed=0, share=0.2).images[-1] == "d.jpg"


def test_the_splits_written_down_go_into_folders_made_for_them(tmp_path: Path) -> None:
    collection = _read(_folder(tmp_path, [("a.jpg", "x", "train"), ("b.jpg", "y", "val"), ("c.jpg", "z", "test")],
                               images=[]))
    path = write_splits(collection, tmp_path / "runs" / "deep" / "splits.csv")
    assert path.read_text().splitlines() == ["image,split", "a.jpg,train", "b.jpg,val", "c.jpg,test"]


def test_three_images_in_two_splits_are_all_named_without_dots(tmp_path: Path) -> None:
    rows = [(f"{i}.jpg", "x", split) for i in range(3) for split in ("val", "test")]
    with pytest.raises(DatasetError) as raised:
        _read(_folder(tmp_path, rows, images=[]))
    assert str(raised.value).endswith("(0.jpg: val and test; 1.jpg: val and test; 2.jpg: val and test); give each "
                                      "image one split")


def test_a_run_whose_captions_file_is_missing_says_so_in_one_line(tmp_path: Path) -> None:
    data = load_config(REPO_CONFIG, [f"data.root={tmp_path}"]).data
    with pytest.raises(DatasetError, match=f"^{tmp_path / 'captions.csv'}: captions file not found"):
        read_records(data, "train")


def test_captions_are_read_whole_at_line_separators_that_are_not_newlines(tmp_path: Path) -> None:
    """A quoted CSV cell may hold a line break; U+2028, U+2029, NEL and a form feed inside a caption
    are text, in CSV and in JSON Lines written with ensure_ascii=False; the line numbers that errors
    name count only real line ends."""
    odd = "a dog\u2028on a\u0085beach\u2029at\x0cdusk"
    _folder(tmp_path / "csv", [("a.jpg", "line one\nline two", "train"), ("b.jpg", odd, "val"), ("c.jpg", "x", "test")])
    csv_rows = {record.path.name: record.captions for split in ("train", "val", "test")
                for record in _read(tmp_path / "csv" / "captions.csv").records(split)}
    assert csv_rows == {"a.jpg": ("line one\nline two",), "b.jpg": (odd,), "c.jpg": ("x",)}
    root = tmp_path / "jsonl"
    _folder(root, [("a.jpg", "x", "train"), ("b.jpg", "x", "val"), ("c.jpg", "x", "test")])
    lines = [{"image": "a.jpg", "caption": odd, "split": "train"}, {"image": "b.jpg", "caption": "y", "split": "val"},
             {"image": "c.jpg", "caption": "z", "split": "test"}]
    (root / "captions.jsonl").write_text("".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines))
    assert _read(root / "captions.jsonl").records("train")[0].captions == (odd,)
    (root / "bad.jsonl").write_text(json.dumps(lines[0], ensure_ascii=False) + "\n{not json\n")
    with pytest.raises(DatasetError, match="line 2 is not JSON"):
        _read(root / "bad.jsonl")


def test_a_caption_with_no_word_is_dropped_and_a_repeated_row_named(tmp_path: Path) -> None:
    """"..." tokenizes to nothing (an empty target and reference): dropped. A row repeating an earlier
    row's image and caption, spelt alike once tokenized, weighs that caption twice: kept (annotators
    do write the same words), but no longer silently. prepare names each kind in one line with its
    count and lines; the same caption of another image is no repeat."""
    rows = [("a.jpg", "A dog runs.", "train"), ("a.jpg", "...", "train"), ("a.jpg", "a dog runs .", "train"),
            ("b.jpg", "a dog runs", "val"), ("b.jpg", "!!", "val"), ("c.jpg", "a cat", "test"),
            ("a.jpg", "A dog runs.", "train")]
    captions_file = _folder(tmp_path, rows)
    collection = _read(captions_file)
    assert collection.captions == {"a.jpg": ["A dog runs.", "a dog runs .", "A dog runs."], "b.jpg": ["a dog runs"],
                                   "c.jpg": ["a cat"]}
    assert check(collection, max_bad_images=0.0) == [
        "2 captions with no word once tokenized dropped (captions.csv lines 3, 6)",
        "2 captions repeating an earlier row's image and caption, kept (each counts in training and as a "
        "reference) (captions.csv lines 4, 8)",
    ]
