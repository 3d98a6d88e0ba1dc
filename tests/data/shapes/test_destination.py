"""Where the shapes data may be written: never into a folder of someone's files, whether the embedded
default draws it (`captioning prepare data.root=MY_PHOTOS`) or `captioning make-shapes --out` does;
a new, empty or half-made shapes folder is filled. And an empty config file is refused before any of it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from captioning.cli import main
from captioning.data.formats import shapes as shapes_format

SMALL = ["--train", "2", "--val", "1", "--test", "1", "--image-size", "32"]


@pytest.fixture
def photos(tmp_path: Path) -> Path:
    """A user's photo folder: photos, a captions file, a subfolder."""
    folder = tmp_path / "MY_PHOTOS"
    (folder / "holiday").mkdir(parents=True)
    (folder / "cat.jpg").write_bytes(b"\xff\xd8 not really a jpeg")
    (folder / "holiday" / "beach.jpg").write_bytes(b"\xff\xd8 nor this")
    (folder / "captions.csv").write_text("image,caption\ncat.jpg,a cat\n")
    return folder


@pytest.fixture(autouse=True)
def few_scenes(monkeypatch):
    """The embedded default's data, a few small scenes: where a refusal fails, the test fails fast."""
    monkeypatch.setattr(shapes_format, "SHAPES_DEFAULT_COUNTS", {"train": 2, "val": 1, "test": 1})


def contents(folder: Path) -> dict[str, bytes | None]:
    """Every entry under `folder`: a file's bytes, None for a folder."""
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else None for p in sorted(folder.rglob("*"))}


def one_line(capsys) -> str:
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert len(lines) == 1, captured.err
    return lines[0]


@pytest.mark.parametrize("text", ["", "\n\n", "# my settings, to come\n\n# more later\n", "---\n"])
def test_an_empty_config_file_is_refused_in_one_line_and_nothing_is_written(tmp_path, photos, capsys, text):
    config = tmp_path / "empty.yaml"
    config.write_text(text)
    before = contents(photos)
    code = main(["prepare", "--config", str(config), f"data.root={photos}", "data.image_size=32",
                 f"train.out_dir={tmp_path / 'run'}"])
    assert (code, one_line(capsys)) == (2, f"error: {config}: the config file is empty (no settings, only blank "
                                           "lines or comments); write the settings it is for, or run without a "
                                           "config file for the embedded default")
    assert contents(photos) == before


def test_an_empty_base_file_is_refused_naming_it(tmp_path, capsys):
    (tmp_path / "base.yaml").write_text("# nothing yet\n")
    (tmp_path / "run.yaml").write_text("base: base.yaml\nmodel:\n  hidden_dim: 32\n")
    code = main(["prepare", "--config", str(tmp_path / "run.yaml"), f"data.root={tmp_path / 'data'}",
                 f"train.out_dir={tmp_path / 'run'}"])
    assert code == 2 and one_line(capsys).startswith(f"error: {tmp_path / 'base.yaml'}: the config file is empty")
    assert not (tmp_path / "data").exists()


def test_the_embedded_default_does_not_draw_its_data_into_a_folder_of_photos(photos, capsys):
    before = contents(photos)
    code = main(["prepare", f"data.root={photos}", "data.image_size=32", f"train.out_dir={photos.parent / 'run'}"])
    assert (code, one_line(capsys)) == (2, f"error: {photos}: the shapes data (data.dataset=shapes, the embedded "
                                           "default) is not there, and the folder holds other files (captions.csv, "
                                           "cat.jpg, holiday/); nothing written: for your own photos set "
                                           "data.dataset=folder (docs/data.md), else set data.root to a new or "
                                           "empty folder")
    assert contents(photos) == before


@pytest.mark.parametrize("what, args", [("the shapes data", SMALL), ("shapes photos", ["--folder", "3",
                                                                                        "--image-size", "32"])])
def test_make_shapes_refuses_a_folder_of_other_files_in_one_line(photos, capsys, what, args):
    before = contents(photos)
    code = main(["make-shapes", "--out", str(photos), *args])
    named = "captions.csv, cat.jpg, holiday/" if what == "the shapes data" else "cat.jpg, holiday/"  # its own file
    assert (code, one_line(capsys)) == (2, f"captioning make-shapes: {photos}: holds files that are not {what} "
                                           f"({named}); nothing written: the shapes generator writes only into a "
                                           "new or empty folder, or one it wrote before")
    assert contents(photos) == before


def test_a_long_list_of_other_files_is_named_by_its_first_few(tmp_path, capsys):
    folder = tmp_path / "many"
    folder.mkdir()
    for index in range(7):
        (folder / f"photo{index}.jpg").write_bytes(b"x")
    assert main(["make-shapes", "--out", str(folder), *SMALL]) == 2
    assert "(photo0.jpg, photo1.jpg, photo2.jpg and 4 more)" in one_line(capsys)


def test_a_link_is_not_the_generators_own_even_under_its_own_name(tmp_path, photos, capsys):
    """images/ linked to the photo folder: writing through it would fill the photos' folder."""
    out = tmp_path / "shapes"
    out.mkdir()
    (out / "images").symlink_to(photos, target_is_directory=True)
    before = contents(photos)
    assert main(["make-shapes", "--out", str(out), *SMALL]) == 2
    assert "holds files that are not the shapes data (images/)" in one_line(capsys)
    assert contents(photos) == before


def test_a_new_an_empty_and_a_half_made_folder_are_filled(tmp_path, capsys):
    for out in (tmp_path / "new" / "shapes", tmp_path / "empty"):
        if out.name == "empty":
            out.mkdir()
        assert main(["make-shapes", "--out", str(out), *SMALL]) == 0
        assert len(json.loads((out / "dataset_shapes.json").read_text())["images"]) == 4
    # stopped half way (its images, no split file yet), with the caches of an earlier run beside it:
    # made again, in full
    half = tmp_path / "empty"
    for name in ("dataset_shapes.json", "objects.json", "captions_test.json"):
        (half / name).unlink()
    (half / "features" / "efficientnet_lite0-stride16-32-wabc").mkdir(parents=True)
    (half / "features" / "efficientnet_lite0-stride16-32-wabc" / "train.json").write_text("{}")
    assert main(["make-shapes", "--out", str(half), "--train", "3", "--val", "1", "--test", "1",
                 "--image-size", "32"]) == 0
    assert len(json.loads((half / "dataset_shapes.json").read_text())["images"]) == 5
    # a folder of the generator's photos is made again too
    photos = tmp_path / "scenes"
    for count in ("3", "4"):
        assert main(["make-shapes", "--out", str(photos), "--folder", count, "--image-size", "32"]) == 0
    assert len(list((photos / "images").iterdir())) == 4
    # but neither kind into the other's folder
    assert main(["make-shapes", "--out", str(photos), *SMALL]) == 2
    assert main(["make-shapes", "--out", str(half), "--folder", "3", "--image-size", "32"]) == 2
    capsys.readouterr()


def test_the_embedded_default_fills_an_empty_data_root(tmp_path, capsys):
    root = tmp_path / "data"
    root.mkdir()
    code = main(["prepare", f"data.root={root}", "data.image_size=32", f"train.out_dir={tmp_path / 'run'}"])
    assert code == 0, capsys.readouterr().err
    assert "generating the shapes dataset there" in capsys.readouterr().err
    assert len(json.loads((root / "dataset_shapes.json").read_text())["images"]) == 4
