"""The shapes format: reading the shapes data never writes it; the commands that train or prepare
draw it where it is missing (ensure_shapes), and only there."""

from __future__ import annotations

import pytest

from captioning.config import load_config
from captioning.data.formats import shapes
from captioning.data.records import DatasetError, read_records


def test_reading_missing_shapes_data_writes_nothing_and_says_how_to_make_it(tmp_path):
    data = load_config(None, [f"data.root={tmp_path / 'shapes'}"]).data
    with pytest.raises(DatasetError, match=r"data.root is not a folder \(`captioning make-shapes --out .*shapes`"):
        read_records(data, "train")
    assert not (tmp_path / "shapes").exists()


def test_ensure_shapes_draws_missing_data_once_and_leaves_other_datasets_alone(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(shapes, "SHAPES_DEFAULT_COUNTS", {"train": 3, "val": 2, "test": 2})
    config = load_config(None, [f"data.root={tmp_path / 'shapes'}", "data.image_size=32"])
    shapes.ensure_shapes(config)
    assert "generating the shapes dataset" in capsys.readouterr().err
    assert [len(read_records(config.data, split)) for split in ("train", "val", "test")] == [3, 2, 2]
    made = (tmp_path / "shapes" / "dataset_shapes.json").stat().st_mtime_ns
    shapes.ensure_shapes(config)  # there now: nothing drawn again
    assert (tmp_path / "shapes" / "dataset_shapes.json").stat().st_mtime_ns == made
    assert capsys.readouterr().err == ""
    other = load_config(None, ["data.dataset=folder", f"data.root={tmp_path / 'photos'}"])
    shapes.ensure_shapes(other)
    assert not (tmp_path / "photos").exists()
