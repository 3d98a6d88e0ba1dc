"""A checkpoint's record (train/provenance.py) and `captioning verify`: the numbers reproduce where
nothing changed, and where they do not, the part of the record that differs is named."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

import pytest
import torch
from PIL import Image

from captioning.checkpoint import CheckpointError, load_checkpoint
from captioning.cli import main
from captioning.config import load_config
from captioning.data.records import read_records
from captioning.inspection import describe
from captioning.train.loop import fit
from captioning.train.verify import report, verify


def _edited(source: Path, target: Path, edit) -> Path:
    payload = torch.load(source, map_location="cpu", weights_only=True)
    edit(payload)
    torch.save(payload, target)
    return target


def test_a_checkpoint_records_its_data_preprocessing_validation_and_versions(tiny_run) -> None:
    record = load_checkpoint(tiny_run.checkpoint)["record"]
    assert set(record) == {"data", "model", "preprocessing", "validation", "versions", "weights", "val_image_digests"}
    assert record["data"]["dataset"] == "shapes" and record["data"]["train_images"] == 24
    data = load_config(None, [f"data.root={tiny_run.data_root}"]).data
    assert record["data"]["test_images"] == len(read_records(data, "test"))
    assert record["preprocessing"]["mean"] == [0.5, 0.5, 0.5] and len(record["preprocessing"]["weights"]) == 12
    assert record["validation"]["decoding"] == "greedy"
    assert record["versions"]["torch"] == metadata.version("torch") and record["versions"]["java"].startswith(
        ("openjdk", "java"))
    lines = describe(load_checkpoint(tiny_run.checkpoint), tiny_run.checkpoint)
    assert any(line.startswith("  record versions") and "torch" in line for line in lines)


def test_the_record_names_the_commit_the_run_started_from_not_one_made_before_its_first_save(
        tiny_config, tmp_path: Path, monkeypatch) -> None:
    """git was asked at the first save, an epoch (on real data, hours) after the start: a commit made
    in between was recorded as the code that trained."""
    import captioning.train.loop as training
    from captioning.train import provenance

    head, real_metrics = ["started at"], training.validation_metrics

    def committed_during_the_epoch(*args, **kwargs):
        head[0] = "committed since"
        return real_metrics(*args, **kwargs)

    monkeypatch.setattr(provenance, "project_commit", lambda: head[0])
    monkeypatch.setattr(training, "validation_metrics", committed_during_the_epoch)
    provenance.versions.cache_clear()
    try:
        fit(tiny_config(tmp_path, "train.max_steps=8"))
    finally:
        provenance.versions.cache_clear()
    assert head[0] == "committed since"
    assert load_checkpoint(tmp_path / "last.pt")["record"]["versions"]["captioning"] == "started at"


def test_only_a_repository_whose_root_holds_the_package_names_its_commit(tmp_path: Path) -> None:
    """Installed into a virtual environment inside another repository, the package named that
    repository's commit (and its edits, as -dirty)."""
    import subprocess

    from captioning.train.provenance import project_commit

    def repository(root: Path, package: Path) -> str:
        package.mkdir(parents=True)
        (package / "__init__.py").write_text("")
        git = ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t"]
        subprocess.run(["git", "init", "-q", str(root)], check=True)
        subprocess.run([*git, "add", "-A"], check=True)
        subprocess.run([*git, "commit", "-qm", "one"], check=True)
        return subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()

    checkout = repository(tmp_path / "checkout", tmp_path / "checkout" / "captioning")
    assert project_commit(tmp_path / "checkout" / "captioning") == checkout
    repository(tmp_path / "theirs", tmp_path / "theirs" / ".venv" / "site-packages" / "captioning")
    assert project_commit(tmp_path / "theirs" / ".venv" / "site-packages" / "captioning") is None


def test_the_same_checkpoint_on_the_same_data_reproduces(tiny_run, capsys) -> None:
    verification = verify(tiny_run.checkpoint, overrides=(f"data.root={tiny_run.data_root}",))
    assert verification.reproduces and verification.differs == {}
    assert {"CIDEr", "Bleu_4", "attention_correctness"} <= set(verification.recorded)
    assert main(["verify", str(tiny_run.checkpoint), f"data.root={tiny_run.data_root}"]) == 0
    assert "reproduces: every number within 0.0001" in capsys.readouterr().out


def test_changed_weights_do_not_reproduce_and_are_named(tiny_run, tmp_path, capsys) -> None:
    from captioning.checkpoint import weights_digest

    def nudge(payload):
        payload["decoder"]["out.bias"] += 3 * torch.randn_like(payload["decoder"]["out.bias"])

    changed = _edited(tiny_run.checkpoint, tmp_path / "changed.pt", nudge)
    assert main(["verify", str(changed), f"data.root={tiny_run.data_root}"]) == 1
    out = capsys.readouterr().out
    assert "does not reproduce" in out and "  weights differs from the record: decoder " in out

    def nudged_and_recorded(payload):  # as if the weights had been saved so: only the numbers move
        nudge(payload)
        payload["record"]["weights"]["decoder"] = weights_digest(payload["decoder"])

    rerecorded = _edited(tiny_run.checkpoint, tmp_path / "rerecorded.pt", nudged_and_recorded)
    assert main(["verify", str(rerecorded), f"data.root={tiny_run.data_root}"]) == 1
    out = capsys.readouterr().out
    assert "does not reproduce" in out and "nothing recorded differs" in out


def test_what_differs_from_the_record_is_named(tiny_run, tmp_path) -> None:
    def older(payload):
        payload["record"]["versions"]["torch"] = "1.0.0"
        payload["record"]["data"]["vocabulary"] = "0000000000000000"
        payload["record"]["data"]["test_image_ids"] = "1111111111111111"  # another test split
        del payload["record"]["data"]["test_images"]  # as a record from before it held the count

    changed = _edited(tiny_run.checkpoint, tmp_path / "older.pt", older)
    verification = verify(changed, overrides=(f"data.root={tiny_run.data_root}",))
    assert set(verification.differs) == {"versions", "data"}
    assert verification.differs["versions"] == [f"torch '1.0.0' -> {metadata.version('torch')!r}"]
    assert [d.split()[0] for d in verification.differs["data"]] == ["test_image_ids", "vocabulary"]
    lines = report(verification, changed)
    assert any(line.startswith("  data differs from the record: test_image_ids '1111111111111111' -> ")
               and "vocabulary '0000000000000000' -> " in line for line in lines)


@pytest.mark.parametrize("edit, said", [
    (lambda payload: payload.pop("record"), "carries no record"),
    (lambda payload: payload["progress"].update(step=payload["progress"]["step"] + 5), "after its last validation"),
])
def test_what_cannot_be_verified_says_why_in_one_line(edit, said, tiny_run, tmp_path, capsys) -> None:
    changed = _edited(tiny_run.checkpoint, tmp_path / "x.pt", edit)
    with pytest.raises(CheckpointError, match=said):
        verify(changed, overrides=(f"data.root={tiny_run.data_root}",))
    assert main(["verify", str(changed), f"data.root={tiny_run.data_root}"]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(errors) == 1 and said in errors[0]


def _last_validation(edit):
    def change(payload):
        edit(payload["progress"]["history"][-1])
    return change


@pytest.mark.parametrize("edit, said", [
    (lambda entry: [entry.pop(k) for k in list(entry) if k not in ("step", "epoch", "lr", "seconds")],
     "holds no numbers: nothing to compare"),
    (lambda entry: entry.update({k: str(v) for k, v in entry.items() if k not in ("step", "epoch", "lr", "seconds")}),
     "holds values that are not numbers (Bleu_1, "),
])
def test_verify_refuses_a_record_with_nothing_to_compare(edit, said, tiny_run, tmp_path, capsys) -> None:
    """Metrics removed from the record, or turned to text: verify never says "reproduces" having
    compared nothing (all([]) is true); it refuses in one line, exit 2."""
    changed = _edited(tiny_run.checkpoint, tmp_path / "x.pt", _last_validation(edit))
    assert main(["verify", str(changed), f"data.root={tiny_run.data_root}"]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(errors) == 1 and said in errors[0], errors


def test_verify_compares_a_recorded_count_exactly(tiny_run, tmp_path) -> None:
    """An integer the validation recorded (the words scored for attention) is compared exactly: one
    more than now is a difference, however small against the float tolerance."""
    entry = load_checkpoint(tiny_run.checkpoint)["progress"]["history"][-1]
    counts = [name for name, value in entry.items() if type(value) is int and name not in ("step", "epoch")]
    assert counts, entry
    changed = _edited(tiny_run.checkpoint, tmp_path / "x.pt",
                      _last_validation(lambda e: e.update({counts[0]: e[counts[0]] + 1})))
    verification = verify(changed, overrides=(f"data.root={tiny_run.data_root}",), tolerance=10.0)
    assert not verification.reproduces
    assert verify(tiny_run.checkpoint, overrides=(f"data.root={tiny_run.data_root}",)).reproduces


def test_edited_references_and_changed_model_settings_are_named(tiny_run, tmp_path) -> None:
    """Two causes verify once blamed on the hardware: every val reference edited (the scores fall,
    the data's image lists do not move), and a model setting changed in the checkpoint's config."""
    import json
    import shutil

    data = tmp_path / "data"
    shutil.copytree(tiny_run.data_root, data)
    split_file = data / "dataset_shapes.json"
    entries = json.loads(split_file.read_text())
    for entry in entries["images"]:
        if entry["split"] == "val":
            for sentence in entry["sentences"]:
                sentence["raw"] = "nothing like the picture"
    split_file.write_text(json.dumps(entries))
    edited = verify(tiny_run.checkpoint, overrides=(f"data.root={data}",))
    assert [d.split()[0] for d in edited.differs["data"]] == ["val_references"]

    def warmer(payload):
        payload["config"]["model"]["extras"]["temperature"] = 2.0

    changed = _edited(tiny_run.checkpoint, tmp_path / "warmer.pt", warmer)
    verification = verify(changed, overrides=(f"data.root={tiny_run.data_root}",))
    assert not verification.reproduces
    assert set(verification.differs) == {"model"} and verification.differs["model"][0].startswith("settings ")
    lines = report(verification, changed)
    assert any(line.startswith("  model differs from the record: settings ") for line in lines)
    assert not any("nothing recorded differs" in line for line in lines)


def test_val_images_replaced_under_their_own_names_are_named_not_blamed_on_the_hardware(tiny_run, tmp_path,
                                                                                         capsys) -> None:
    """The same names and captions, other pictures: no id, file name or reference moves, only the
    images' contents, which the record digests per split."""
    import json
    import shutil

    data = tmp_path / "data"
    shutil.copytree(tiny_run.data_root, data)
    entries = json.loads((data / "dataset_shapes.json").read_text())["images"]
    val = [data / entry["filepath"] / entry["filename"] for entry in entries if entry["split"] == "val"]
    train = [data / entry["filepath"] / entry["filename"] for entry in entries if entry["split"] == "train"]
    for image, other in zip(val, train):
        image.write_bytes(other.read_bytes())
    assert main(["verify", str(tiny_run.checkpoint), f"data.root={data}"]) == 1
    out = capsys.readouterr().out
    files = [image.relative_to(data).as_posix() for image in val]
    assert (f"  data differs from the record: val_image_contents: {len(val)} images changed ({files[0]}, {files[1]}, "
            f"{files[2]}, ...)") in out.splitlines()
    assert "hardware" not in out

    def older(payload):  # a record from before records digested the images' contents
        del payload["record"]["data"]["val_image_contents"]

    verification = verify(_edited(tiny_run.checkpoint, tmp_path / "older.pt", older), overrides=(f"data.root={data}",))
    assert not verification.reproduces and verification.differs == {}
    assert report(verification, "older.pt")[-1] == (
        "  nothing recorded differs, but the record predates digests of the images' contents: val images changed "
        "under their own names, the hardware or the code's arithmetic moved the numbers")


def test_one_val_image_replaced_under_its_own_name_is_named_by_its_file(tiny_run, tmp_path, capsys) -> None:
    """The line names the file, not the split's two digests; and a record written before it kept each
    image's digest still gives the digests."""
    import json
    import shutil

    data = tmp_path / "data"
    shutil.copytree(tiny_run.data_root, data)
    entries = json.loads((data / "dataset_shapes.json").read_text())["images"]
    val = [Path(entry["filepath"], entry["filename"]).as_posix() for entry in entries if entry["split"] == "val"]
    with Image.open(data / val[1]) as picture:
        changed = picture.convert("RGB")
    changed.putpixel((0, 0), tuple(255 - v for v in changed.getpixel((0, 0))))  # one pixel: other contents
    changed.save(data / val[1])
    assert main(["verify", str(tiny_run.checkpoint), f"data.root={data}"]) in (0, 1)  # the numbers may not move
    lines = capsys.readouterr().out.splitlines()
    assert f"  data differs from the record: val_image_contents: 1 image changed ({val[1]})" in lines

    def older(payload):  # a record from before records kept each val image's digest
        del payload["record"]["val_image_digests"]

    older_file = _edited(tiny_run.checkpoint, tmp_path / "older.pt", older)
    assert main(["verify", str(older_file), f"data.root={data}"]) in (0, 1)
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("  data differs from the record: val_image_contents '") for line in lines)


def test_a_record_from_before_a_decoding_setting_is_verified_decoding_as_it_ran() -> None:
    """Runs validated before <unk> could be blocked said it (their records name no allow_unk), and
    before the n-gram block repeated at will: verify decodes so, whatever today's defaults."""
    from captioning.train.verify import as_validated

    old = as_validated(load_config(None, ["decode.no_repeat_ngram=3"]), {"decoding": "greedy", "max_length": 20})
    assert old.decode.allow_unk is True and old.decode.no_repeat_ngram == 0
    recorded = {"decoding": "greedy", "allow_unk": False, "no_repeat_ngram": 3}
    new = as_validated(load_config(None, ["decode.no_repeat_ngram=3"]), recorded)
    assert new.decode.allow_unk is False and new.decode.no_repeat_ngram == 3


def test_a_record_of_the_model_settings_in_their_old_order_still_agrees(tiny_run, tmp_path) -> None:
    """A record written before the model settings' keys were sorted took their digest in the order
    its config listed them (a plugin's section, model.local and model.cosine, before model.extras);
    verify finds it agrees, and still names a setting edited since."""
    import hashlib
    import json

    def old_record(payload, *, temperature=None):
        model = payload["config"]["model"]
        listed = ("embed_dim", "hidden_dim", "attention_dim", "dropout", "attention", "score", "gate", "deep_output",
                  "hard", "local", "cosine", "extras")  # the schema's order before plugins held their sections
        settings = {name: model[name] for name in listed}
        payload["config"]["model"] = {**settings, "fused": model["fused"]}
        payload["record"]["model"]["settings"] = hashlib.sha256(json.dumps(settings).encode()).hexdigest()[:16]
        if temperature is not None:
            payload["config"]["model"]["extras"]["temperature"] = temperature

    written = _edited(tiny_run.checkpoint, tmp_path / "old.pt", old_record)
    verification = verify(written, overrides=(f"data.root={tiny_run.data_root}",))
    assert verification.reproduces and "model" not in verification.differs
    edited = _edited(tiny_run.checkpoint, tmp_path / "edited.pt", lambda p: old_record(p, temperature=2.0))
    assert "model" in verify(edited, overrides=(f"data.root={tiny_run.data_root}",)).differs
    # the same for a released model cut from such a run: scored against its card
    from captioning.checkpoint import load_checkpoint, save_checkpoint
    from captioning.shipped import for_captioning

    for source, named in ((written, False), (edited, True)):
        released = for_captioning(load_checkpoint(source), release={"name": "old", "val": {"CIDEr": 0.0,
                                                                                         "beam_size": 1}})
        save_checkpoint(tmp_path / "released.pt", released)
        checked = verify(tmp_path / "released.pt", overrides=(f"data.root={tiny_run.data_root}",))
        assert checked.release is not None and ("model" in checked.differs) == named
