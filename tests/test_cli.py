"""The command line on real image files, good and bad: caption, overlays, make-shapes, train."""

from __future__ import annotations

import argparse
import html
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import types
from pathlib import Path
from urllib.parse import unquote

import numpy as np
import pytest
import torch
from PIL import Image

import captioning.train.loop as training
from captioning.checkpoint import load_trained
from captioning.cli import eval_main, main, train_main
from captioning.cli.caption import split_overrides as _split_overrides
from captioning.cli.common import guarded as _guarded
from captioning.data.shapes.scenes import make_shapes
from captioning.model.extras.glimpses import TwoGlimpses
from captioning.model.extras.layout import LayoutSummary
from tests.tiny import REPO


@pytest.fixture(scope="module")
def images(tiny_run, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Real files in the formats people have: PNG, JPEG, grayscale, an odd size; plus bad ones."""
    folder = tmp_path_factory.mktemp("images")
    scenes = [Image.open(p).convert("RGB") for p in sorted((tiny_run.data_root / "images" / "test").glob("*.png"))]
    paths = {
        "png": folder / "scene.png",
        "jpeg": folder / "photo.jpg",
        "gray": folder / "gray.png",
        "odd": folder / "odd.png",
        "twin": folder / "other" / "scene.png",  # same stem as "png", another folder
    }
    paths["twin"].parent.mkdir()
    scenes[0].save(paths["png"])
    scenes[1].save(paths["jpeg"], quality=90)
    scenes[2].convert("L").save(paths["gray"])
    scenes[3].resize((123, 77)).save(paths["odd"])
    scenes[4].save(paths["twin"])
    garbage = folder / "garbage.png"
    garbage.write_bytes(np.random.default_rng(0).integers(0, 256, 3000, dtype=np.uint8).tobytes())
    return {**{k: str(v) for k, v in paths.items()}, "garbage": str(garbage), "missing": str(folder / "missing.jpg")}


@pytest.fixture(scope="module")
def vocabulary(tiny_run) -> set[str]:
    return set(torch.load(tiny_run.checkpoint, map_location="cpu", weights_only=True)["vocab"])


def _safe(word: str) -> str:
    return re.sub(r"[^\w-]", "_", word) or "_"


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


# caption -------------------------------------------------------------------------------------------


def test_caption_prints_path_tab_caption_per_image(tiny_run, images, vocabulary, capsys) -> None:
    given = [images["png"], images["jpeg"], images["gray"], images["odd"]]
    code = main(["caption", *given, "--checkpoint", str(tiny_run.checkpoint)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert captured.err == ""
    lines = _lines(captured.out)
    assert len(lines) == len(given)
    for line, path in zip(lines, given):
        printed_path, caption = line.split("\t")
        assert printed_path == path
        assert set(caption.split()) <= vocabulary - {"<pad>", "<start>", "<end>"}
    assert any(line.split("\t")[1] for line in lines)  # the tiny model does say something


def test_caption_json_matches_plain_output(tiny_run, images, capsys) -> None:
    given = [images["png"], images["odd"]]
    assert main(["caption", *given, "--checkpoint", str(tiny_run.checkpoint), "--beam-size", "1"]) == 0
    plain = [line.split("\t")[1] for line in _lines(capsys.readouterr().out)]
    assert main(["caption", *given, "--checkpoint", str(tiny_run.checkpoint), "--beam-size", "1", "--json"]) == 0
    objects = [json.loads(line) for line in _lines(capsys.readouterr().out)]
    assert [o["image"] for o in objects] == given
    for obj, caption in zip(objects, plain):
        assert set(obj) >= {"image", "caption", "tokens"}
        assert isinstance(obj["tokens"], list) and all(isinstance(t, str) for t in obj["tokens"])
        assert obj["caption"] == " ".join(obj["tokens"]) == caption


def test_caption_overlays_one_png_per_word_and_a_grid(tiny_run, images, tmp_path: Path, capsys) -> None:
    given = [images["png"], images["odd"], images["twin"]]
    out = tmp_path / "overlays"
    code = main(["caption", *given, "--checkpoint", str(tiny_run.checkpoint), "--json", "--overlays", str(out)])
    assert code == 0
    objects = [json.loads(line) for line in _lines(capsys.readouterr().out)]
    folders = ["scene", "odd", "scene_2"]  # the second scene.png does not overwrite the first
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == sorted(folders)
    assert (out / "index.html").is_file()
    assert any(o["tokens"] for o in objects)
    for obj, folder in zip(objects, folders):
        words = sorted((out / folder).glob("[0-9][0-9]_*.jpg"))
        assert [p.name for p in words] == [f"{i:02d}_{_safe(t)}.jpg" for i, t in enumerate(obj["tokens"])]
        assert (out / folder / "grid.jpg").is_file()
        with Image.open(obj["image"]) as original:
            size = original.size
        for path in [*words, out / folder / "grid.jpg"]:
            with Image.open(path) as picture:
                picture.load()
                if path.name != "grid.jpg":
                    assert picture.size == size  # drawn on the original, not on the encoder's crop


def test_bad_images_are_reported_and_the_rest_captioned(tiny_run, images, capsys) -> None:
    given = [images["png"], images["garbage"], images["gray"], images["missing"]]
    code = main(["caption", *given, "--checkpoint", str(tiny_run.checkpoint)])
    captured = capsys.readouterr()
    assert code == 1
    assert [line.split("\t")[0] for line in _lines(captured.out)] == [images["png"], images["gray"]]
    errors = _lines(captured.err)
    assert len(errors) == 2
    assert images["garbage"] in errors[0] and images["missing"] in errors[1]


@pytest.mark.parametrize("kind", ["garbage", "missing", "foreign"])
def test_bad_checkpoint_is_a_one_line_error(images, tmp_path: Path, capsys, kind: str) -> None:
    checkpoint = tmp_path / f"{kind}.pt"
    if kind == "garbage":
        checkpoint.write_bytes(b"\x89 definitely not a checkpoint" * 20)
    elif kind == "foreign":
        torch.save({"model": {"w": torch.zeros(2)}}, checkpoint)
    code = main(["caption", images["png"], "--checkpoint", str(checkpoint)])
    captured = capsys.readouterr()
    assert code != 0
    assert captured.out == ""
    errors = _lines(captured.err)
    assert len(errors) == 1 and str(checkpoint) in errors[0]


def test_caption_exit_code_end_to_end_in_a_subprocess(tiny_run, images) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run(
        [sys.executable, "-m", "captioning.cli", "caption", images["jpeg"], images["garbage"],
         "--checkpoint", str(tiny_run.checkpoint), "--beam-size", "1"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stderr
    lines = _lines(result.stdout)
    assert len(lines) == 1 and lines[0].startswith(images["jpeg"] + "\t")
    errors = _lines(result.stderr)
    assert len(errors) == 1 and images["garbage"] in errors[0]


def test_captioning_an_image_reads_no_caption_so_loads_no_tokenizer(tiny_run, images) -> None:
    """nltk, and the scipy it loads, come in at the first caption read (data/vocab.py): most of a
    second of every `captioning caption`, which reads none."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    script = ("import sys; from captioning.cli import main; "
              f"code = main(['caption', {images['jpeg']!r}, '--checkpoint', {str(tiny_run.checkpoint)!r}]); "
              "print(code, sorted(name for name in ('nltk', 'scipy') if name in sys.modules))")
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=300)
    assert _lines(result.stdout)[-1] == "0 []", result.stdout + result.stderr
    assert _lines(result.stdout)[0].startswith(images["jpeg"] + "\t")  # it did caption


def test_caption_takes_folders_globs_and_a_list_file_in_order(tiny_run, images, tmp_path: Path, capsys) -> None:
    folder = Path(images["png"]).parent  # scene.png, photo.jpg, gray.png, odd.png, garbage.png; other/scene.png
    listing = tmp_path / "list.txt"
    listing.write_text(f"# two of them\n{images['odd']}\n\n{images['jpeg']}\n")
    code = main(["caption", str(folder / "*.jpg"), "-r", str(folder / "other"), "--list", str(listing),
                 "--checkpoint", str(tiny_run.checkpoint), "--beam-size", "1"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert [line.split("\t")[0] for line in _lines(captured.out)] == [
        images["jpeg"], images["twin"], images["odd"], images["jpeg"]]

    code = main(["caption", str(folder), "--checkpoint", str(tiny_run.checkpoint), "--beam-size", "1"])
    captured = capsys.readouterr()
    assert code == 1  # garbage.png is in the folder
    assert [line.split("\t")[0] for line in _lines(captured.out)] == sorted(
        str(p) for p in folder.iterdir() if p.is_file() and p.name != "garbage.png")
    assert len(re.findall("error: ", captured.err)) == 1 and "garbage.png" in captured.err


def test_caption_in_batches_prints_what_one_at_a_time_prints(tiny_run, images, capsys) -> None:
    given = [images[k] for k in ("png", "jpeg", "gray", "odd", "twin")]
    assert main(["caption", *given, "--checkpoint", str(tiny_run.checkpoint), "--batch-size", "1"]) == 0
    alone = capsys.readouterr().out
    assert main(["caption", *given, "--checkpoint", str(tiny_run.checkpoint), "--batch-size", "4",
                 "--workers", "2"]) == 0
    assert capsys.readouterr().out == alone


def test_caption_shows_progress_for_many_images_and_errors_stay_one_line(tiny_run, images, capsys,
                                                                         monkeypatch) -> None:
    monkeypatch.setenv("CAPTIONING_LOG_SECONDS", "0")  # stderr is a log here: a line at every update
    monkeypatch.delenv("CAPTIONING_QUIET", raising=False)
    given = [images["png"]] * 8 + [images["garbage"], images["jpeg"]]
    code = main(["caption", *given, "--checkpoint", str(tiny_run.checkpoint), "--beam-size", "1", "--batch-size", "4"])
    captured = capsys.readouterr()
    assert code == 1
    assert len(_lines(captured.out)) == 9
    assert "10/10" in captured.err  # the last progress line
    errors = [line for line in re.split(r"[\r\n]", captured.err) if "error:" in line]
    assert len(errors) == 1 and errors[0].startswith("error: " + images["garbage"])


def test_caption_quiet_draws_no_bar(tiny_run, images, capsys, monkeypatch) -> None:
    monkeypatch.setenv("CAPTIONING_QUIET", "0")  # --quiet sets it to 1; the test leaves it as it was
    given = [images["png"]] * 10
    assert main(["caption", *given, "--checkpoint", str(tiny_run.checkpoint), "--beam-size", "1", "--quiet"]) == 0
    captured = capsys.readouterr()
    assert len(_lines(captured.out)) == 10 and captured.err == ""


def test_caption_coco_ids_json_and_results_file(tiny_run, images, tmp_path: Path, capsys) -> None:
    coco = tmp_path / "COCO_val2014_000000391895.jpg"
    shutil.copy(images["jpeg"], coco)
    results = tmp_path / "out" / "val" / "results.json"  # folders that do not exist yet
    code = main(["caption", str(coco), images["png"], "--checkpoint", str(tiny_run.checkpoint), "--json",
                 "--coco-results", str(results)])
    captured = capsys.readouterr()
    assert code == 0
    records = [json.loads(line) for line in _lines(captured.out)]
    assert records[0]["image_id"] == 391895 and "image_id" not in records[1]
    assert json.loads(results.read_text()) == [{"image_id": 391895, "caption": records[0]["caption"]}]
    assert f"note: 1 image left out of {results}: their names carry no COCO image id (e.g. {images['png']})" in (
        captured.err.splitlines())
    again = results.with_name("again.json")  # into the folder the first run made
    assert main(["caption", str(coco), "--checkpoint", str(tiny_run.checkpoint), "--coco-results", str(again)]) == 0
    assert json.loads(again.read_text()) == json.loads(results.read_text())
    # the same image under its 2017 name, and the file given twice: the evaluation takes one caption per id
    same = tmp_path / "000000391895.jpg"
    shutil.copy(images["jpeg"], same)
    twice = results.with_name("twice.json")
    assert main(["caption", str(coco), str(same), str(coco), "--checkpoint", str(tiny_run.checkpoint),
                 "--coco-results", str(twice)]) == 0
    assert json.loads(twice.read_text()) == json.loads(results.read_text())
    assert (f"note: 2 images left out of {twice}: an earlier file carries the same COCO image id (e.g. {same}, "
            f"id 391895, as {coco})") in capsys.readouterr().err.splitlines()


def test_a_coco_results_file_that_cannot_be_written_is_one_line_and_the_captions_still_print(tiny_run, images,
                                                                                          tmp_path: Path, capsys):
    folder = tmp_path / "results"
    folder.mkdir()
    args = ["caption", images["png"], "--checkpoint", str(tiny_run.checkpoint)]
    assert main([*args, "--coco-results", str(folder)]) == 2  # a folder: said before any image is captioned
    captured = capsys.readouterr()
    assert captured.out == "" and _lines(captured.err) == [
        f"error: {folder}: a folder; --coco-results names the file to write"]
    (tmp_path / "file").write_text("")
    under_a_file = tmp_path / "file" / "results.json"  # found only when written: after the captions
    assert main([*args, "--coco-results", str(under_a_file)]) == 1
    captured = capsys.readouterr()
    assert _lines(captured.out)[0].startswith(images["png"] + "\t")
    assert _lines(captured.err)[-1] == (f"error: {under_a_file}: the COCO results not written "
                                        f"(File exists: {tmp_path / 'file'})")


@pytest.mark.parametrize("recursive", [False, True])
def test_a_folder_that_cannot_be_read_is_one_line_and_the_other_images_are_captioned(tiny_run, images, tmp_path,
                                                                                     capsys, monkeypatch, recursive):
    """No rights to list it (which root, as tests may run, always has: so planted here)."""
    locked = tmp_path / "locked"
    locked.mkdir()
    shutil.copy(images["png"], locked / "scene.png")
    def refusing(real):
        def listing(path=".", *args):
            if Path(path) == locked:
                raise PermissionError(13, "Permission denied", str(path))
            return real(path, *args)
        return listing

    for owner, name in ((os, "scandir"), (Path, "iterdir"), (Path, "rglob")):  # at the call, on any Python
        monkeypatch.setattr(owner, name, refusing(getattr(owner, name)))
    code = main(["caption", str(locked), images["png"], "--checkpoint", str(tiny_run.checkpoint),
                 *(["--recursive"] if recursive else [])])
    captured = capsys.readouterr()
    assert code == 1
    assert [line.split("\t")[0] for line in _lines(captured.out)] == [images["png"]]
    assert _lines(captured.err) == [f"error: {locked}: cannot read this folder (Permission denied)"]


def test_caption_overrides_what_inference_may_change_and_refuses_the_rest(tiny_run, images, capsys) -> None:
    code = main(["caption", images["png"], "--checkpoint", str(tiny_run.checkpoint), "decode.max_length=2"])
    captured = capsys.readouterr()
    assert code == 0 and len(_lines(captured.out)[0].split("\t")[1].split()) <= 2
    code = main(["caption", images["png"], "--checkpoint", str(tiny_run.checkpoint), "model.hidden_dim=64"])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    errors = _lines(captured.err)
    assert len(errors) == 1 and "model.hidden_dim cannot change at inference" in errors[0]


def test_an_override_is_a_dotted_key_with_a_value_and_not_a_file(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "decode.beam_size=2").write_text("")  # a file of that name is an image
    given = ["decode.beam_size=3", "photo=1.jpg", "a=b.c=d", "decode.beam_size=2", "scene.png"]
    assert _split_overrides(given) == (["photo=1.jpg", "a=b.c=d", "decode.beam_size=2", "scene.png"],
                                       ["decode.beam_size=3"])


def test_caption_command_hands_on_the_device_and_looks_into_sub_folders_only_when_asked(
        tiny_run, images, tmp_path: Path, monkeypatch, capsys) -> None:
    from captioning.api import Captioner

    seen, load = [], Captioner.from_checkpoint.__func__

    def loading_on_the_cpu(cls, path, *, device=None, overrides=()):
        seen.append(device)
        return load(cls, path, device="cpu", overrides=overrides)

    monkeypatch.setattr(Captioner, "from_checkpoint", classmethod(loading_on_the_cpu))
    folder = tmp_path / "photos"
    (folder / "sub").mkdir(parents=True)
    shutil.copy(images["png"], folder / "top.png")
    shutil.copy(images["jpeg"], folder / "sub" / "inner.jpg")
    for flags, found in (([], ["top.png"]), (["--recursive"], ["sub/inner.jpg", "top.png"])):
        assert main(["caption", str(folder), "--checkpoint", str(tiny_run.checkpoint), "--device", "meta", *flags]) == 0
        captioned = [line.split("\t")[0] for line in _lines(capsys.readouterr().out)]
        assert captioned == [str(folder / name) for name in found]
    assert seen == [torch.device("meta")] * 2  # --device reaches the model (the stand-in loads it on the CPU)


def test_caption_of_nothing_is_an_error(tiny_run, tmp_path: Path, capsys) -> None:
    assert main(["caption", "--checkpoint", str(tiny_run.checkpoint)]) == 2
    assert capsys.readouterr().err == "error: no images given (files, folders, glob patterns or --list FILE)\n"
    assert main(["caption", str(tmp_path), "--checkpoint", str(tiny_run.checkpoint)]) == 2  # an empty folder
    assert capsys.readouterr().err.startswith(f"error: {tmp_path}: no images in this folder (files named *.jpg, ")


def test_an_empty_folder_among_other_inputs_gets_its_line_and_the_others_are_captioned(
        tiny_run, images, tmp_path: Path, capsys) -> None:
    from captioning.api import IMAGE_SUFFIXES

    (tmp_path / "empty").mkdir()
    (tmp_path / "nested" / "deeper").mkdir(parents=True)
    shutil.copy(images["png"], tmp_path / "nested" / "deeper" / "a.png")
    code = main(["caption", str(images["png"]), str(tmp_path / "empty"), str(tmp_path / "nested"), str(images["jpeg"]),
                 "--checkpoint", str(tiny_run.checkpoint), "--quiet"])
    printed = capsys.readouterr()
    assert code == 1
    assert [line.split("\t")[0] for line in _lines(printed.out)] == [str(images["png"]), str(images["jpeg"])]
    assert _lines(printed.err) == [
        f"error: {tmp_path / 'empty'}: no images in this folder (files named *{', *'.join(IMAGE_SUFFIXES)})",
        f"error: {tmp_path / 'nested'}: no images in this folder, only in its sub-folders (--recursive reads them)"]


class StandInCaptioner:
    """What `caption` hands the Python API, seen from the API's side: caption_files records its
    arguments and gives back `results` (any object with .source and .caption), calling `before_each`
    before each one; then raises `then`, if set."""

    language = "en"

    def __init__(self, results=(), before_each=lambda: None, then: BaseException | None = None) -> None:
        self.calls, self.results, self.before_each, self.then = [], list(results), before_each, then

    def caption_files(self, paths, **options):
        self.calls.append({"paths": list(paths), **options})
        for result in self.results:
            self.before_each()
            yield result
        if self.then is not None:
            raise self.then


@pytest.fixture
def stand_in(monkeypatch, tmp_path: Path):
    """stand_in(captioner, images, *flags) -> (exit code, the captioner): `caption` run on `images`
    PNG files (one real file, named again and again) with the stand-in in place of the checkpoint's model."""
    from captioning.api import Captioner

    photo = tmp_path / "photo.png"
    Image.new("RGB", (8, 8)).save(photo)

    def run(captioner: StandInCaptioner, images: int, *flags: str) -> tuple[int, StandInCaptioner]:
        monkeypatch.setattr(Captioner, "from_checkpoint", classmethod(lambda cls, path, **kw: captioner))
        return main(["caption", *[str(photo)] * images, "--checkpoint", "model.pt", *flags]), captioner

    return run


def test_caption_hands_the_batch_beam_workers_and_progress_to_the_api(stand_in, monkeypatch) -> None:
    import captioning.api

    monkeypatch.setattr(captioning.api, "reading_workers", lambda: 7)  # what the cores would allow

    def options(images: int, *flags: str) -> dict:
        code, captioner = stand_in(StandInCaptioner(), images, *flags)
        assert code == 0
        (call,) = captioner.calls
        return call

    first = options(3, "--batch-size", "4", "--beam-size", "2")
    assert first["batch_size"] == 4 and first["beam_size"] == 2 and first["hard_choice"] is None
    assert len(first["paths"]) == 3
    # Workers: none for what fits in one batch (starting them costs more than they read), the
    # machine's share beyond that, and --workers whatever the count.
    assert first["num_workers"] == 0
    assert options(4, "--batch-size", "4")["num_workers"] == 0
    assert options(5, "--batch-size", "4")["num_workers"] == 7
    assert options(2, "--workers", "3")["num_workers"] == 3
    # Progress on a terminal, or (stderr not a terminal here) for more than 8 images: None, which is
    # a bar on a terminal and plain lines in a log (captioning.progress).
    assert options(8)["progress"] is False and options(9)["progress"] is None
    defaults = options(2)
    assert defaults["batch_size"] == 16 and defaults["beam_size"] is None  # --help: 16; the checkpoint's


def test_the_old_hard_attention_flag_still_names_the_hard_choice(stand_in, capsys) -> None:
    code, captioner = stand_in(StandInCaptioner(), 1, "--hard-attention", "argmax")
    assert code == 0 and captioner.calls[0]["hard_choice"] == "argmax"
    with pytest.raises(SystemExit) as stopped:
        stand_in(StandInCaptioner(), 1, "--hard-attention", "bogus")
    assert stopped.value.code == 2 and "--hard-attention: invalid choice: 'bogus'" in capsys.readouterr().err


def test_a_reader_that_goes_away_ends_captioning_quietly(stand_in, monkeypatch, tmp_path: Path) -> None:
    """`captioning caption photos/ | head`: the pipe breaks; stdout is pointed at /dev/null so that
    Python's own flush at exit does not fail again, and the command exits 1 without a traceback."""
    with open(tmp_path / "stdout", "w+b") as target:  # stands for the pipe's file descriptor

        class BrokenPipe:
            def write(self, text: str) -> int:
                raise BrokenPipeError

            def flush(self) -> None:
                pass

            def fileno(self) -> int:
                return target.fileno()
        monkeypatch.setattr(sys, "stdout", BrokenPipe())
        results = [types.SimpleNamespace(source="a.png", caption="a red circle")]
        code, _ = stand_in(StandInCaptioner(results), 1)
        os.write(target.fileno(), b"after")  # where the pipe was: now /dev/null
    assert code == 1 and (tmp_path / "stdout").read_bytes() == b""


def test_an_image_whose_overlays_cannot_be_written_is_named_and_the_others_still_captioned(
        stand_in, monkeypatch, capsys) -> None:
    import captioning.eval.html_page

    errors = {"b.png": OSError("No space left on device\n(while writing grid.jpg)"), "c.png": OSError()}

    class Overlays:  # the overlay folder, failing for two images
        def __init__(self, folder, animation=False, language="en") -> None:
            pass

        def add(self, result) -> None:
            if result.source in errors:
                raise errors[result.source]

        def finish(self) -> None:
            pass
    monkeypatch.setattr(captioning.eval.html_page, "OverlayFolder", Overlays)
    names = ("a.png", "b.png", "c.png", "d.png")
    results = [types.SimpleNamespace(source=name, caption="a red circle") for name in names]
    code, _ = stand_in(StandInCaptioner(results), 4, "--overlays", "overlays")
    out, err = capsys.readouterr()
    assert code == 1
    assert out.splitlines() == [f"{name}\ta red circle" for name in names]
    assert err.splitlines() == ["error: b.png: overlays not written (No space left on device)",
                                "error: c.png: overlays not written (OSError)"]


def test_a_page_that_cannot_be_written_is_one_line_and_the_captions_stand(stand_in, tmp_path: Path, capsys) -> None:
    out = tmp_path / "overlays"
    (out / "index.html").mkdir(parents=True)  # a folder where the page would go

    def save(folder: Path, animation: bool = False) -> None:
        folder.mkdir(parents=True, exist_ok=True)

    results = [types.SimpleNamespace(source="a.png", caption="a red circle", tokens=["a"], word_alphas=None,
                                     save_overlays=save)]
    code, _ = stand_in(StandInCaptioner(results), 1, "--overlays", str(out))
    printed, err = capsys.readouterr()
    assert code == 1 and printed == "a.png\ta red circle\n"
    assert err.splitlines() == [f"error: {out / 'index.html'}: the page not written (Is a directory)"]
    assert sorted(p.name for p in out.iterdir()) == ["a", "index.html"]  # no temporary left behind


def test_interrupted_captioning_says_how_far_it_got(stand_in, capsys) -> None:
    done = [types.SimpleNamespace(source=f"{i}.png", caption="a red circle") for i in range(2)]
    code, _ = stand_in(StandInCaptioner(done, then=KeyboardInterrupt()), 3)
    captured = capsys.readouterr()
    assert code == 130
    assert captured.out.splitlines() == ["0.png\ta red circle", "1.png\ta red circle"]
    assert captured.err == "interrupted after 2 of 3 images\n"


def test_captioning_interrupted_while_the_model_loads_is_one_line(monkeypatch, tmp_path: Path, capsys) -> None:
    from captioning.api import Captioner

    def loading(cls, path, **options):
        raise KeyboardInterrupt  # Ctrl-C while the checkpoint is read

    monkeypatch.setattr(Captioner, "from_checkpoint", classmethod(loading))
    Image.new("RGB", (8, 8)).save(tmp_path / "photo.png")
    assert main(["caption", str(tmp_path / "photo.png"), "--checkpoint", "model.pt"]) == 130
    assert capsys.readouterr().err == "interrupted before any image was captioned\n"


def test_each_caption_reaches_a_pipe_before_the_next_image_is_decoded(stand_in, monkeypatch) -> None:
    class Pipe(io.StringIO):
        """stdout as a pipe: what was flushed is what a reader (`| head`, a log) has seen."""
        seen = ""

        def flush(self) -> None:
            self.seen = self.getvalue()

    pipe, seen_before = Pipe(), []
    monkeypatch.setattr(sys, "stdout", pipe)
    done = [types.SimpleNamespace(source=f"{i}.png", caption="a red circle") for i in range(3)]
    code, _ = stand_in(StandInCaptioner(done, before_each=lambda: seen_before.append(pipe.seen)), 3)
    assert code == 0
    assert seen_before == ["", "0.png\ta red circle\n", "0.png\ta red circle\n1.png\ta red circle\n"]


def test_overlay_page_references_only_files_that_exist(tiny_run, images, tmp_path: Path, capsys) -> None:
    out = tmp_path / "overlays"
    given = [images["png"], images["garbage"], images["odd"]]
    code = main(["caption", *given, "--checkpoint", str(tiny_run.checkpoint), "--overlays", str(out), "--gif",
                 "--json"])
    assert code == 1
    records = [json.loads(line) for line in _lines(capsys.readouterr().out)]
    page = (out / "index.html").read_text()
    sources = re.findall(r'(?:src|data-map)="([^"]+)"', page)
    assert sources and all((out / source).is_file() for source in sources)
    assert not any(source.startswith(("/", "http")) for source in sources)
    for record, folder in zip(records, ["scene", "odd"]):
        assert f'{folder}/image.jpg' in sources
        if record["tokens"]:
            with Image.open(out / folder / "words.gif") as gif:
                assert gif.n_frames == len(record["tokens"])


def test_names_that_are_not_utf8_or_hold_a_line_break_are_one_line_each_and_on_the_page(
        tiny_run, images, tmp_path: Path, capsys) -> None:
    """Names people have: bytes that are not UTF-8 (Python's lone surrogates), a line break, a `#`.
    Each image is one `path<TAB>caption` line and one JSON line, the names escaped as Python writes
    them (\\xff, \\n); the page names them so and links to overlay folders that exist; a page
    already in the folder is replaced whole."""
    folder = tmp_path / "photos"
    folder.mkdir()
    for name in ("...png", os.fsdecode(b"bad\xffname.png"), "new\nline.png", "photo #1.png", "scene.png"):
        shutil.copy(images["png"], folder / name)
    shown = [f"{folder}/...png", f"{folder}/bad\\xffname.png", f"{folder}/new\\nline.png", f"{folder}/photo #1.png",
             f"{folder}/scene.png"]
    out = tmp_path / "overlays"
    out.mkdir()
    (out / "index.html").write_text("the page of an earlier run")
    code = main(["caption", str(folder), "--checkpoint", str(tiny_run.checkpoint), "--overlays", str(out)])
    captured = capsys.readouterr()
    assert code == 0 and captured.err == "", captured.err
    assert [line.split("\t")[0] for line in captured.out.splitlines()] == shown
    assert all(len(line.split("\t")) == 2 for line in captured.out.splitlines())
    page = (out / "index.html").read_text(encoding="utf-8")  # whole, and UTF-8
    assert "<p>5 images." in page and page.rstrip().endswith("</html>")
    assert re.findall(r'<span class="source">([^<]*)</span>', page) == [html.escape(name) for name in shown]
    links = [unquote(html.unescape(link)) for link in re.findall(r'(?:src|data-map)="([^"]+)"', page)]
    assert len(links) > 8 and all((out / link).is_file() for link in links)
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["bad_name", "image", "new_line", "photo #1", "scene"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["overlays", "photos"]  # `...png`'s folder is not `..`

    assert main(["caption", str(folder), "--checkpoint", str(tiny_run.checkpoint), "--json"]) == 0
    printed = capsys.readouterr().out
    assert printed.isascii() and len(printed.splitlines()) == 5
    assert [json.loads(line)["image"] for line in printed.splitlines()] == [
        f"{folder}/...png", f"{folder}/bad\\xffname.png", f"{folder}/new\nline.png", f"{folder}/photo #1.png",
        f"{folder}/scene.png"]


@pytest.mark.parametrize("how", ["SIGINT to a background job", "SIGTERM"])
def test_a_caption_run_stopped_by_a_signal_writes_the_page_of_the_images_done(tiny_run, tmp_path: Path,
                                                                               how: str) -> None:
    """Stopped part way, the run says how far it got, exits 128 + the signal, and the page shows the
    images captioned so far. A shell starts a background job (`captioning caption ... &`) with SIGINT
    ignored: `kill -INT` stops it all the same, as it stops training."""
    folder = tmp_path / "photos"
    folder.mkdir()
    Image.new("RGB", (32, 32), (200, 30, 30)).save(folder / "000.png")
    for i in range(1, 200):  # far more than can be captioned between the signal sent and received
        shutil.copy(folder / "000.png", folder / f"{i:03d}.png")
    out = tmp_path / "overlays"
    signum = signal.SIGINT if how.startswith("SIGINT") else signal.SIGTERM
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    run = subprocess.Popen([sys.executable, "-m", "captioning.cli", "caption", str(folder), "--checkpoint",
                            str(tiny_run.checkpoint), "--overlays", str(out), "--batch-size", "2", "--beam-size", "1",
                            "--quiet"],
                           cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        assert run.stdout.readline() and run.stdout.readline()  # two images captioned
        run.send_signal(signum)
        rest, err = run.communicate(timeout=60)
    finally:
        run.kill()
    done = 2 + len(rest.splitlines())
    assert run.returncode == 128 + signum, err
    said = "interrupted" if signum == signal.SIGINT else "stopped by SIGTERM"
    assert err.splitlines()[-1] == f"{said} after {done} of 200 images; the page of those: {out / 'index.html'}"
    assert done < 200 and (out / "index.html").read_text().count("<figure>") == done


def test_python_dash_m_captioning_is_the_captioning_command() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([sys.executable, "-m", "captioning", "caption", "--help"], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: captioning caption ")


# the guard every command runs under ----------------------------------------------------------------


@pytest.mark.parametrize("quiet", [True, False, None])
def test_an_expected_error_is_one_line_on_stderr_and_exit_2(quiet, monkeypatch, capsys) -> None:
    import argparse

    from captioning.checkpoint import CheckpointError

    monkeypatch.setenv("CAPTIONING_QUIET", "0")
    seen = []

    def command(args):
        seen.append(args)
        raise CheckpointError("runs/x/last.pt: checkpoint not found")
    args = argparse.Namespace() if quiet is None else argparse.Namespace(quiet=quiet)  # None: a command without --quiet
    assert _guarded(command)(args) == 2
    assert seen == [args]
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == "error: runs/x/last.pt: checkpoint not found\n"
    assert os.environ["CAPTIONING_QUIET"] == ("1" if quiet else "0")


def test_the_guard_returns_what_the_command_returns_and_lets_other_errors_through() -> None:
    import argparse

    assert _guarded(lambda args: 7)(argparse.Namespace(quiet=False)) == 7
    with pytest.raises(KeyError):  # a bug is not an expected error: its traceback is shown
        _guarded(lambda args: {}["missing"])(argparse.Namespace(quiet=False))


# the reference page --------------------------------------------------------------------------------


def test_docs_cli_md_is_every_commands_help() -> None:
    """docs/cli.md holds what `--help` prints (spacing aside: argparse wraps lines differently from one
    Python to the next), so the page cannot go stale and no option's help is lost."""
    from tests.cli_reference import PAGE, reference

    def words(text: str) -> list[str]:
        return text.split()
    assert words(PAGE.read_text()) == words(reference()), "docs/cli.md is stale: python -m tests.cli_reference"


@pytest.mark.parametrize(("script", "entry", "says"), [
    ("train.py", train_main, "Train a Show, Attend and Tell captioner."),
    ("eval.py", eval_main, "Score a checkpoint's captions on a split."),
])
def test_the_scripts_help_names_the_script_and_says_what_it_does(script, entry, says, capsys) -> None:
    """train.py and eval.py parse their own arguments (docs/cli.md covers `captioning`'s commands)."""
    with pytest.raises(SystemExit) as stopped:
        entry(["--help"])
    out = capsys.readouterr().out
    assert stopped.value.code == 0
    assert out.startswith(f"usage: {script} ") and says in [line.strip() for line in out.splitlines()]


def test_a_missing_command_or_an_unknown_option_is_a_usage_error(capsys) -> None:
    def error(*argv: str) -> str:
        with pytest.raises(SystemExit) as stopped:
            main(list(argv))
        assert stopped.value.code == 2
        return capsys.readouterr().err.splitlines()[-1]
    assert error() == "captioning: error: the following arguments are required: command"
    assert error("caption", "a.png", "--checkpoint", "m.pt", "--bogus", "b.png") == \
        "captioning: error: unrecognized arguments: --bogus b.png"
    assert error("inspect", "m.pt", "more.pt") == "captioning: error: unrecognized arguments: more.pt"


def test_a_count_at_its_bounds_is_read() -> None:
    from captioning.cli.common import whole_number

    assert [whole_number(1, 5)(text) for text in ("1", "5", "3")] == [1, 5, 3]
    assert whole_number(0)("0") == 0 and whole_number(0)("1000000") == 1_000_000  # no upper bound
    for text, says in (("0", "from 1 to 5, got 0"), ("6", "from 1 to 5, got 6"), ("2.5", "a whole number, got '2.5'")):
        with pytest.raises(argparse.ArgumentTypeError, match=re.escape(says)):
            whole_number(1, 5)(text)


@pytest.mark.parametrize(("command", "value", "says"), [
    (["evaluate", "--checkpoint", "m.pt", "--beam-size"], "0", "argument --beam-size: from 1 to 1024, got 0"),
    (["caption", "a.png", "--checkpoint", "m.pt", "--beam-size"], "1025", "argument --beam-size: from 1 to 1024, "
                                                                          "got 1025"),
    (["evaluate", "--checkpoint", "m.pt", "--beam-size"], "two", "argument --beam-size: a whole number, got 'two'"),
    (["caption", "a.png", "--batch-size"], "0", "argument --batch-size: from 1 to 65536, got 0"),
    (["caption", "a.png", "--workers"], "-1", "argument --workers: from 0 to 256, got -1"),
    (["make-shapes", "--out", "never", "--train"], "-3", "argument --train: at least 0, got -3"),
    (["make-shapes", "--out", "never", "--image-size"], "0", "argument --image-size: from 1 to 8192, got 0"),
    (["make-shapes", "--out", "never", "--folder"], "2", "argument --folder: at least 3, got 2"),
    # a negative tolerance failed after the whole re-validation; NaN passed exact matches only, "within nan"
    (["verify", "m.pt", "--tolerance"], "-1", "argument --tolerance: a finite number from 0 on, got -1"),
    (["verify", "m.pt", "--tolerance"], "nan", "argument --tolerance: a finite number from 0 on, got nan"),
    (["verify", "m.pt", "--tolerance"], "tiny", "argument --tolerance: a number, got 'tiny'"),
])
def test_a_count_out_of_its_bounds_is_a_usage_error(command, value, says, capsys, tmp_path, monkeypatch) -> None:
    """Past the parser a bad count misleads rather than fails: a beam of 0 decoded with the checkpoint's
    own beam, `make-shapes --train -3` wrote no image and said -3, a batch of 0 was torch's traceback."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stopped:
        main([*command, value])
    assert stopped.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith(f"error: {says}")
    assert list(tmp_path.iterdir()) == []


def test_values_after_options_join_the_overrides_and_features_caches_every_split_by_default(monkeypatch) -> None:
    import captioning.cli

    seen = []
    monkeypatch.setattr(captioning.cli, "_prepare_features", lambda args: seen.append(args) or 0)
    assert main(["prepare-features", "data.root=x", "--splits", "val", "model.dropout=0"]) == 0
    assert main(["prepare-features"]) == 0
    assert seen[0].overrides == ["data.root=x", "model.dropout=0"] and seen[0].splits == "val"
    assert seen[1].overrides == [] and seen[1].splits is None  # every split the data has


def test_train_py_and_eval_py_take_values_after_options_as_their_commands_do(monkeypatch) -> None:
    """docs/cli.md: train.py and eval.py take the same arguments as `captioning train` and `evaluate`."""
    import captioning.cli

    seen = []
    monkeypatch.setattr(captioning.cli, "_train", lambda args: seen.append(args) or 0)
    monkeypatch.setattr(captioning.cli, "_evaluate", lambda args: seen.append(args) or 0)
    assert train_main(["train.epochs=4", "--resume", "model.hidden_dim=512"]) == 0
    assert main(["train", "train.epochs=4", "--resume", "model.hidden_dim=512"]) == 0
    assert eval_main(["--checkpoint", "m.pt", "data.root=x", "--split", "val", "model.dropout=0"]) == 0
    assert [args.overrides for args in seen] == [["train.epochs=4", "model.hidden_dim=512"]] * 2 + [
        ["data.root=x", "model.dropout=0"]]
    assert seen[0].resume and seen[1].resume and seen[2].split == "val"
    with pytest.raises(SystemExit) as stopped:
        train_main(["a.b=1", "--bogus", "c.d=2"])
    assert stopped.value.code == 2


def test_images_after_a_double_dash_are_images_even_after_other_images(monkeypatch) -> None:
    """`--` ends the options wherever it comes: what follows is an image, even one named like an option."""
    import captioning.cli.caption

    seen = []
    monkeypatch.setattr(captioning.cli.caption, "_caption", lambda args: seen.append(args) or 0)
    assert main(["caption", "a.jpg", "--pretrained", "--", "b.jpg"]) == 0
    assert main(["caption", "a.jpg", "--json", "--", "-dash.jpg"]) == 0
    assert main(["caption", "--pretrained", "--", "photos/"]) == 0
    assert [args.inputs for args in seen] == [["a.jpg", "b.jpg"], ["a.jpg", "-dash.jpg"], ["photos/"]]
    assert seen[1].json


def test_pretrained_takes_a_name_but_leaves_an_override_or_image_after_it_where_it_stands(monkeypatch) -> None:
    """`--pretrained` takes an optional name: argparse alone took `data.root=X` or `photo.jpg` after it
    as the model's name, and the command failed on "no shipped model named 'data.root=X'"."""
    import captioning.cli
    import captioning.cli.caption

    seen = []
    monkeypatch.setattr(captioning.cli.caption, "_caption", lambda args: seen.append(args) or 0)
    monkeypatch.setattr(captioning.cli, "_evaluate", lambda args: seen.append(args) or 0)
    assert main(["caption", "a.jpg", "--pretrained", "b.jpg", "photos/", "--json", "c*.png"]) == 0
    assert main(["caption", "--pretrained", "flickr8k_de", "a.jpg", "--", "-b.jpg"]) == 0
    assert main(["caption", "--pretrained", "photos"]) == 0  # a plain word is a name
    assert main(["caption", "a.jpg", "--pretrained", "flickr8k_de"]) == 0  # whatever comes before it
    assert main(["caption", "a.jpg", "--", "--pretrained", "b.jpg"]) == 0  # after --, an image so named
    assert main(["caption", "a.jpg", "--pretrained"]) == 0
    assert eval_main(["--split", "val", "a.b=1", "--pretrained", "data.root=x", "a.b=2"]) == 0
    assert eval_main(["--pretrained", "--split", "val", "data.root=x"]) == 0
    assert eval_main(["--split", "val", "--pretrained", "data.root=x"]) == 0
    assert [(args.inputs if hasattr(args, "inputs") else args.overrides, args.pretrained) for args in seen] == [
        (["a.jpg", "b.jpg", "photos/", "c*.png"], None), (["a.jpg", "-b.jpg"], "flickr8k_de"), ([], "photos"),
        (["a.jpg"], "flickr8k_de"), (["a.jpg", "--pretrained", "b.jpg"], False), (["a.jpg"], None),
        (["a.b=1", "data.root=x", "a.b=2"], None), (["data.root=x"], None), (["data.root=x"], None)]
    assert seen[0].json and seen[6].split == seen[7].split == seen[8].split == "val"


def test_evaluation_scores_the_test_split_unless_told_and_takes_the_old_hard_attention_flag(monkeypatch) -> None:
    import captioning.cli

    seen = []
    monkeypatch.setattr(captioning.cli, "_evaluate", lambda args: seen.append(args) or 0)
    assert eval_main(["--checkpoint", "m.pt"]) == 0
    assert main(["evaluate", "--checkpoint", "m.pt", "--split", "val", "--hard-attention", "sample"]) == 0
    assert seen[0].split == "test" and seen[0].hard_choice is None
    assert seen[1].split == "val" and seen[1].hard_choice == "sample"


def test_make_shapes_hands_its_defaults_and_numbers_to_the_generator(monkeypatch, capsys) -> None:
    import captioning.data.shapes.scenes

    calls = []
    monkeypatch.setattr(captioning.data.shapes.scenes, "make_shapes",
                        lambda out, counts, **options: calls.append(options) or Path(out) / "dataset_shapes.json")
    assert main(["make-shapes", "--out", "shapes"]) == 0
    assert main(["make-shapes", "--out", "shapes", "--seed", "5", "--image-size", "64"]) == 0
    assert calls[0]["seed"] == 0 and calls[0]["image_size"] == 224  # what --help says
    assert calls[1]["seed"] == 5 and calls[1]["image_size"] == 64


# make-shapes ---------------------------------------------------------------------------------------


def test_make_shapes_command(tmp_path: Path, capsys) -> None:
    out = tmp_path / "shapes"
    code = main(["make-shapes", "--out", str(out), "--train", "3", "--val", "1", "--test", "1", "--image-size", "64"])
    assert code == 0
    assert "dataset_shapes.json" in capsys.readouterr().out
    split = json.loads((out / "dataset_shapes.json").read_text())["images"]
    assert [e["split"] for e in split] == ["train"] * 3 + ["val", "test"]
    for name in ("captions_train.json", "captions_val.json", "captions_test.json", "objects.json"):
        assert (out / name).is_file()
    pictures = sorted((out / "images").rglob("*.png"))
    assert len(pictures) == 5
    for path in pictures:
        with Image.open(path) as picture:
            assert picture.size == (64, 64)


def test_make_shapes_command_uses_the_seed_it_is_given(tmp_path: Path, capsys) -> None:
    sizes = ["--train", "2", "--val", "1", "--test", "1", "--image-size", "64"]
    for name, seed in (("a", "5"), ("b", "5"), ("c", "6")):
        assert main(["make-shapes", "--out", str(tmp_path / name), "--seed", seed, *sizes]) == 0
    capsys.readouterr()

    def captions(name: str) -> str:
        return (tmp_path / name / "captions_train.json").read_text()
    assert captions("a") == captions("b") != captions("c")
    assert make_shapes(tmp_path / "direct", {"train": 2, "val": 1, "test": 1}, seed=5, image_size=64)
    assert captions("direct") == captions("a")


def test_make_shapes_command_takes_the_training_mix_of_object_counts(tmp_path: Path, capsys) -> None:
    out = tmp_path / "shapes"
    code = main(["make-shapes", "--out", str(out), "--train", "4", "--val", "1", "--test", "1", "--image-size", "64",
                 "--train-object-weights", "0", "1", "0"])
    assert code == 0
    objects = json.loads((out / "objects.json").read_text())["images"]
    assert [len(objects[str(i)]["objects"]) for i in range(4)] == [2, 2, 2, 2]
    capsys.readouterr()
    code = main(["make-shapes", "--out", str(tmp_path / "bad"), "--train-object-weights", "0", "0", "0"])
    err = capsys.readouterr().err
    assert code == 2 and "train_object_weights" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "bad").exists()


# train ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("override", "named"), [
    ("train.bogus_key=1", "bogus_key"),
    ("trian.epochs=1", "trian"),
    ("model.hidden_dim.extra=3", "hidden_dim"),
])
def test_train_unknown_override_is_a_one_line_error(override: str, named: str, tmp_path: Path, capsys,
                                                    monkeypatch) -> None:
    def must_not_train(*args, **kwargs):
        raise AssertionError("training started despite a bad config")

    monkeypatch.setattr(training, "fit", must_not_train)
    code = train_main(["--config", str(REPO / "configs" / "shapes_soft.yaml"), f"train.out_dir={tmp_path}", override])
    captured = capsys.readouterr()
    assert code != 0
    errors = _lines(captured.err)
    assert len(errors) == 1 and named in errors[0]


def test_train_command_trains_and_resumes(tiny_run, tmp_path: Path, capsys) -> None:
    common = [*tiny_run.overrides, f"train.out_dir={tmp_path}"]
    assert main(["train", *common, "train.max_steps=2"]) == 0
    assert "best CIDEr" in capsys.readouterr().out
    assert main(["train", "--resume", *common, "train.max_steps=3"]) == 0
    payload = torch.load(tmp_path / "last.pt", map_location="cpu", weights_only=True)
    assert payload["progress"]["step"] == 3


def test_the_options_off_by_default_survive_the_checkpoint_and_caption(tiny_config, images, tmp_path: Path,
                                                                       capsys) -> None:
    """model.extras.init=layout, model.deep_output=tanh, model.extras.glimpses=2 and encoder.padding=reflect:
    trained, saved, and used again by `caption`, which must build the same decoder and encode the image the
    same way."""
    options = ("model.score=local", "model.extras.init=layout", "model.deep_output=tanh", "model.extras.glimpses=2",
               "model.extras.position=coordinates", "encoder.padding=reflect")
    training.fit(tiny_config(tmp_path, *options, "train.max_steps=2"))
    payload = torch.load(tmp_path / "best.pt", map_location="cpu", weights_only=True)
    assert payload["config"]["model"]["extras"]["init"] == "layout"
    assert payload["config"]["encoder"]["padding"] == "reflect"
    assert any(name.startswith("summary.layout.") for name in payload["decoder"])
    capsys.readouterr()  # training's own output
    model = load_trained(tmp_path / "best.pt").model()
    assert model.decoder.deep_output == "tanh" and isinstance(model.decoder.summary, LayoutSummary)
    assert isinstance(model.decoder.attention, TwoGlimpses)
    assert any(name.startswith("attention.second.") for name in payload["decoder"])
    uniform = torch.full((1, 3, 64, 64), 0.3)
    with torch.no_grad():
        annotations, _ = model.encoder(uniform)  # reflected borders: every cell the same
    torch.testing.assert_close(annotations, annotations[:, :1].expand_as(annotations), rtol=0, atol=1e-4)
    code = main(["caption", images["png"], "--checkpoint", str(tmp_path / "best.pt"), "--json"])
    assert code == 0
    record = json.loads(_lines(capsys.readouterr().out)[0])  # after 2 steps the caption may be empty
    assert record["image"] == images["png"] and record["caption"] == " ".join(record["tokens"])


# hard attention ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def hard_checkpoint(tiny_config, tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("hard")
    training.fit(tiny_config(run_dir, "model.attention=hard", "train.max_steps=12"))
    return run_dir / "best.pt"


def test_caption_hard_attention_choices_and_chosen_cell_overlays(hard_checkpoint, images, tmp_path: Path,
                                                                  capsys) -> None:
    out = tmp_path / "overlays"
    args = ["caption", images["png"], "--checkpoint", str(hard_checkpoint), "--json", "--beam-size", "1"]
    assert main([*args, "--hard-choice", "argmax", "--overlays", str(out / "argmax")]) == 0
    argmax = json.loads(_lines(capsys.readouterr().out)[0])
    assert main([*args, "--overlays", str(out / "expectation")]) == 0  # the default: the expectation
    assert json.loads(_lines(capsys.readouterr().out)[0])["caption"]  # says something
    assert main([*args, "--hard-choice", "sample"]) == 0
    capsys.readouterr()
    words = sorted((out / "argmax" / "scene").glob("[0-9][0-9]_*.jpg"))
    assert len(words) == len(argmax["tokens"]) >= 1
    # The first word's map depends on the image alone, so it is the same in both runs (the label aside,
    # if the first word differs); argmax adds the white outline of the chosen cell.
    chosen = np.asarray(Image.open(words[0]).convert("RGB")).astype(int)
    (first,) = (out / "expectation" / "scene").glob("00_*.jpg")  # its word may differ, its map does not
    plain = np.asarray(Image.open(first).convert("RGB")).astype(int)
    changed = np.abs(chosen - plain).max(axis=2) > 60  # JPEG moves pixels a little; the outline a lot
    changed[: chosen.shape[0] // 8] = False  # the word's label sits in the top rows
    assert changed.sum() > 20 and (chosen[changed].min(axis=1) > 180).mean() > 0.8
    # Losslessly, through the API the command uses: the outline is exactly white.
    from captioning.api import Captioner

    captioner = Captioner.from_checkpoint(hard_checkpoint)
    outlined = np.asarray(captioner.caption(images["png"], beam_size=1, hard_choice="argmax").overlay(word=0))
    expected = np.asarray(captioner.caption(images["png"], beam_size=1).overlay(word=0))
    changed = (outlined != expected).any(axis=2)
    changed[: outlined.shape[0] // 8] = False
    assert changed.sum() > 20 and (outlined[changed] == 255).all()


def test_hard_attention_choice_on_a_soft_checkpoint_is_a_one_line_error(tiny_run, images, capsys) -> None:
    code = main(["caption", images["png"], "--checkpoint", str(tiny_run.checkpoint), "--hard-choice", "argmax"])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    assert _lines(captured.err) == [_lines(captured.err)[0]] and "soft attention" in captured.err


def test_eval_with_a_hard_attention_choice(hard_checkpoint, tiny_run, tmp_path: Path, capsys) -> None:
    from captioning.cli import eval_main

    out = tmp_path / "metrics.json"
    code = eval_main(["--checkpoint", str(hard_checkpoint), "--split", "test", "--beam-size", "1",
                      "--hard-choice", "argmax", "--out", str(out), *tiny_run.overrides[:1]])
    assert code == 0, capsys.readouterr().err
    metrics = json.loads(out.read_text())
    assert metrics["hard_choice"] == "argmax" and "CIDEr" in metrics and "attention_correctness" in metrics
    assert "hard attention: argmax" in capsys.readouterr().out


# inspect -------------------------------------------------------------------------------------------


def test_inspect_shows_what_a_checkpoint_holds(tiny_run, capsys) -> None:
    assert main(["inspect", str(tiny_run.last)]) == 0
    out = capsys.readouterr().out
    payload = torch.load(tiny_run.last, map_location="cpu", weights_only=True)
    assert f"vocabulary of {len(payload['vocab'])} words" in out
    assert f"step {tiny_run.steps}," in out and "resumable   yes" in out
    for name, tensor in payload["decoder"].items():  # every tensor, with its shape
        assert re.search(rf"^\s+{re.escape(name)}\s+{re.escape(str(tuple(tensor.shape)))}", out, flags=re.M), name


class _Payload:  # pickled as code: a checkpoint must never run it
    def __reduce__(self):
        return (print, ("this ran",))


@pytest.mark.parametrize("kind", ["text", "code", "foreign"])
def test_inspect_of_what_is_not_our_checkpoint_is_one_line(kind: str, tmp_path: Path, capsys) -> None:
    path = tmp_path / f"{kind}.pt"
    if kind == "text":
        path.write_text("not a checkpoint\n")
    elif kind == "code":
        torch.save({"format_version": 2, "payload": _Payload()}, path)
    else:
        torch.save({"state_dict": {"w": torch.zeros(2)}}, path)
    assert main(["inspect", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "this ran" not in captured.err
    errors = _lines(captured.err)
    assert len(errors) == 1 and str(path) in errors[0]


def test_eval_pretrained_scores_the_shipped_file_and_takes_no_checkpoint_beside_it(monkeypatch, capsys) -> None:
    import captioning.eval.evaluate as evaluation
    from captioning.config import ConfigError
    from captioning.shipped import pretrained_path

    asked = {}

    def scored(checkpoint, **kwargs):  # the shipped model needs Flickr8k to be scored: what it was asked is enough
        asked.update(checkpoint=checkpoint, **kwargs)
        raise ConfigError("stop here")

    monkeypatch.setattr(evaluation, "evaluate_checkpoint", scored)
    assert eval_main(["--pretrained", "--split", "val", "data.root=/data/flickr8k"]) == 2
    assert asked["checkpoint"] == [str(pretrained_path())] and asked["split"] == "val"
    assert asked["overrides"] == ["data.root=/data/flickr8k"] and asked["beam_size"] is None  # the card's beam
    with pytest.raises(SystemExit):
        eval_main(["--pretrained", "--checkpoint", "best.pt"])
    assert "not allowed with argument" in capsys.readouterr().err


def test_a_checkpoint_given_twice_is_an_ensemble_that_captions_and_scores_as_it_does_alone(tiny_run, images,
                                                                                           capsys) -> None:
    from captioning.eval.evaluate import evaluate_checkpoint

    data = f"data.root={tiny_run.data_root}"
    alone = evaluate_checkpoint(tiny_run.checkpoint, split="val", overrides=[data], beam_size=2)
    best_twice = evaluate_checkpoint([tiny_run.checkpoint] * 2, split="val", overrides=[data], beam_size=2)
    assert best_twice.results == alone.results  # the mean of one distribution with itself is that distribution
    caption_metrics = {k: v for k, v in alone.metrics.items() if "probe" not in k and v == v}  # not probed; NaN: none
    assert {k: best_twice.metrics[k] for k in caption_metrics} == pytest.approx(caption_metrics, abs=1e-6)
    files = [images["png"], images["jpeg"]]
    assert main(["caption", "--checkpoint", str(tiny_run.checkpoint), *files, "--device", "cpu"]) == 0
    one = capsys.readouterr().out
    assert main(["caption", "--checkpoint", str(tiny_run.checkpoint), "--checkpoint", str(tiny_run.checkpoint),
                 *files, "--device", "cpu"]) == 0
    assert capsys.readouterr().out == one


def test_an_ensemble_of_checkpoints_with_other_vocabularies_is_one_line_naming_the_member(tiny_run, tmp_path,
                                                                                           capsys) -> None:
    payload = torch.load(tiny_run.checkpoint, map_location="cpu", weights_only=True)
    payload["vocab"] = [*payload["vocab"][:-1], "zebra"]
    other = tmp_path / "other.pt"
    torch.save(payload, other)
    code = eval_main(["--checkpoint", str(tiny_run.checkpoint), "--checkpoint", str(other), "--split", "val",
                      f"data.root={tiny_run.data_root}", "--device", "cpu"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert f"{other}: its vocabulary differ" in err
