"""Files replaced whole, also when two processes write the same one at once."""

import json
import os
import stat

import pytest

from captioning.runtime import files
from captioning.runtime.files import replace_text


def test_two_writers_at_once_both_finish_and_leave_a_whole_file(tmp_path, monkeypatch):
    # A second process's whole write lands between the first's writing and its rename: with one
    # temporary name for both, the second rename takes the first's file away and the first fails
    # (as two runs sharing a feature cache did).
    path = tmp_path / "train.json"
    real_replace, interleaved = os.replace, []

    def other_process_first(source, target):
        if not interleaved:
            interleaved.append(True)
            replace_text(path, json.dumps({"writer": "second"}))
        real_replace(source, target)

    monkeypatch.setattr(files.os, "replace", other_process_first)
    replace_text(path, json.dumps({"writer": "first"}))
    assert interleaved
    assert json.loads(path.read_text()) == {"writer": "first"}  # the last rename wins, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.json"]  # no temporary left behind


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "vocab.json"
    path.write_text("old")

    def full_disk(source, target):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(files.os, "replace", full_disk)
    with pytest.raises(OSError):
        replace_text(path, "new")
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["vocab.json"]


def test_the_file_is_as_readable_as_the_umask_allows(tmp_path):
    # Other users of a shared cache read what one of them wrote (a tempfile-module file is 0600).
    previous = os.umask(0o022)
    try:
        replace_text(tmp_path / "meta.json", "{}")
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "meta.json").stat().st_mode) == 0o644
