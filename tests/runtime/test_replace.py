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


@pytest.mark.parametrize("write", ["replace_text", "save_checkpoint"])
def test_the_bytes_reach_the_disk_before_the_rename_and_the_rename_before_the_write_returns(tmp_path, monkeypatch,
                                                                                          write):
    """A rename alone may reach the disk before the data it names: after a power cut, an empty
    last.pt under the real name, which no resume could read."""
    import torch

    from captioning.checkpoint import save_checkpoint

    path, events = tmp_path / "last.pt", []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(descriptor):
        target = os.readlink(f"/proc/self/fd/{descriptor}")
        events.append(("fsync", os.path.basename(target), os.fstat(descriptor).st_size))
        real_fsync(descriptor)

    def replace(source, target):
        events.append(("replace", os.path.basename(source), os.path.basename(target)))
        real_replace(source, target)

    monkeypatch.setattr(files.os, "fsync", fsync)
    monkeypatch.setattr(files.os, "replace", replace)
    if write == "replace_text":
        replace_text(path, "x" * 1000)
    else:
        save_checkpoint(path, {"weights": torch.ones(1000)})
    (synced, temporary, size), renamed, folder = events
    assert synced == "fsync" and temporary.startswith(".last.pt") and size == path.stat().st_size
    assert renamed == ("replace", temporary, "last.pt")
    assert folder[:2] == ("fsync", tmp_path.name)


def test_a_checkpoint_whose_rename_fails_is_one_line_and_leaves_no_temporary(tmp_path, monkeypatch):
    import torch

    from captioning.checkpoint import CheckpointError, save_checkpoint

    def refused(source, target):
        raise PermissionError(13, "Permission denied")

    save_checkpoint(tmp_path / "last.pt", {"step": torch.tensor(1)})
    monkeypatch.setattr(files.os, "replace", refused)
    with pytest.raises(CheckpointError, match=r"last\.pt: could not be written \(Permission denied\); the previous "
                                              r"last\.pt is intact$"):
        save_checkpoint(tmp_path / "last.pt", {"step": torch.tensor(2)})
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]


def test_a_checkpoint_of_a_newer_format_says_so_rather_than_not_ours(tmp_path):
    import torch

    from captioning.checkpoint import FORMAT_VERSION, CheckpointError, load_checkpoint

    torch.save({"format_version": FORMAT_VERSION + 1}, tmp_path / "new.pt")
    with pytest.raises(CheckpointError, match=f"new.pt: written by a newer version of captioning \\(checkpoint "
                                              f"format {FORMAT_VERSION + 1}; this one reads 1 to {FORMAT_VERSION}\\)"):
        load_checkpoint(tmp_path / "new.pt")
    torch.save({"format_version": "2"}, tmp_path / "odd.pt")
    with pytest.raises(CheckpointError, match="odd.pt: not a captioning checkpoint"):
        load_checkpoint(tmp_path / "odd.pt")


def test_a_checkpoint_that_outgrows_the_disk_names_the_systems_error_not_torchs_zip_position(tmp_path):
    """torch's writer reports a failed write as "unexpected pos 242240 vs 242132"; one byte more meets
    the system's own error. A 20 kB file-size limit stands in for a full disk, in this process: the
    limit and SIGXFSZ are put back after."""
    import resource
    import signal

    import torch

    from captioning.checkpoint import CheckpointError, save_checkpoint

    save_checkpoint(tmp_path / "last.pt", {"step": torch.tensor(1)})
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails instead of killing
    resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, hard))
    try:
        with pytest.raises(CheckpointError, match=r"last\.pt: could not be written \(File too large\); the previous "
                                                  r"last\.pt is intact$"):
            save_checkpoint(tmp_path / "last.pt", {"weights": torch.randn(50_000)})
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]
