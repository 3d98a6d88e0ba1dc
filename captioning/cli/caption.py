"""`captioning caption`: image files, folders and glob patterns captioned in batches, in order, with
per-word attention overlays and a page to browse them; a file that cannot be read is one line on
stderr and the others are still captioned (exit code 1). Each image is one line of output, whatever
its name holds; SIGINT or SIGTERM stops the run in one line (exit code 128 + the signal), the page
of the images done written."""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from captioning.cli.common import (
    add_beam_size_argument,
    add_hard_choice_argument,
    add_pretrained_argument,
    add_quiet_argument,
    expected_errors,
    warnings_in_one_line,
    whole_number,
)
from captioning.config import ConfigError
from captioning.config.bounds import BATCH, WORKERS
from captioning.data.records import counted, name_as_text, name_on_one_line
from captioning.progress import quiet
from captioning.runtime.signals import StopSignalHandler


def add_caption_command(commands: argparse._SubParsersAction) -> None:
    caption = commands.add_parser(
        "caption", help="caption images, optionally with per-word attention overlays and a page to browse them",
        description="Caption image files, folders and glob patterns, in batches, in the order given. A file "
                    "that cannot be read gets one line on stderr and the others are captioned (exit code 1).")
    caption.add_argument("inputs", nargs="*", metavar="IMAGE|FOLDER|GLOB|key.sub=value",
                         help="images, folders of images, glob patterns ('photos/*.jpg'); and overrides of what "
                              "inference may change: encoder.weights_path, decode.*")
    caption.add_argument("--list", metavar="FILE", help="also the images in FILE, one path per line")
    caption.add_argument("--recursive", "-r", action="store_true", help="folders: their sub-folders too")
    model = caption.add_mutually_exclusive_group()
    model.add_argument("--checkpoint", metavar="FILE", action="append", help="best.pt or last.pt of a run "
                       "(default: the English model that ships with the package, soft attention trained on "
                       "Flickr8k's photos); given more than once, the checkpoints caption together as one ensemble")
    add_pretrained_argument(model, use="an image, folder or pattern after it is one to caption")
    add_beam_size_argument(caption)
    add_hard_choice_argument(caption)
    caption.add_argument("--batch-size", type=whole_number(1, BATCH), default=16,
                         help="images encoded and decoded at once (16)")
    caption.add_argument("--workers", type=whole_number(0, WORKERS), help="processes reading the images (default: "
                         "one per four cores up to 4, none on four cores or fewer or for a single batch)")
    caption.add_argument("--overlays", metavar="DIR", help="write DIR/<image>/ (a JPEG per word, grid.jpg, "
                         "image.jpg) and DIR/index.html to browse them (hard attention with argmax or sample: "
                         "the chosen cell outlined over each map)")
    caption.add_argument("--gif", action="store_true", help="with --overlays: also DIR/<image>/words.gif, a "
                         "frame per word")
    caption.add_argument("--json", action="store_true", help="one JSON object per line (image, caption, tokens, "
                         "and image_id where the file name carries a COCO id)")
    caption.add_argument("--coco-results", metavar="FILE", help="write [{image_id, caption}] for the COCO "
                         "evaluation server (images whose name carries a COCO id)")
    caption.add_argument("--device", help="cpu, cuda, cuda:1 ... (default: cuda if available)")
    add_quiet_argument(caption)
    caption.set_defaults(run=_caption)


def split_overrides(values: Sequence[str]) -> tuple[list[str], list[str]]:
    """IMAGE and key.sub=value arguments share the command line: an override is a dotted key with
    `=` that is not also an existing file."""
    images, overrides = [], []
    for value in values:
        is_override = "=" in value and "." in value.split("=", 1)[0] and not Path(value).exists()
        (overrides if is_override else images).append(value)
    return images, overrides


class Stopped(KeyboardInterrupt):
    """SIGINT or SIGTERM, raised wherever the command is, as Python raises KeyboardInterrupt for
    Ctrl-C: the run stops there, says how far it got, and still writes the page of the images done."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class _StopSignals(StopSignalHandler):
    """SIGINT and SIGTERM raise Stopped while the command runs (SIGTERM would otherwise end the
    process with no page; runtime/signals.py says why both).

    An exception raised by a signal handler is lost where the signal lands in a __del__ method or a
    callback (Python prints it and goes on): the signal is kept too, and `check` raises it again."""

    def __init__(self) -> None:
        super().__init__()
        self.received: int | None = None
        self._holding = False

    def handle(self, signum: int) -> None:
        again = self.received is not None
        self.received = signum
        if again or not self._holding:
            raise Stopped(signum)

    def check(self) -> None:
        if self.received is not None:
            raise Stopped(self.received)

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """A signal received inside stops the command at the end of the block (an image's line and
        overlays: each image is done whole, or not at all, and the page holds those printed); a
        second one at once, as a second Ctrl-C interrupts training."""
        self._holding = True
        try:
            yield
        finally:
            self._holding = False
        self.check()


def _error(message: object) -> None:
    """One line on stderr; the messages name files, and a file's name can hold a line break."""
    from tqdm import tqdm

    tqdm.write(f"error: {name_on_one_line(str(message))}", file=sys.stderr)


@dataclass
class _Progress:
    """How far the command got, for the line that says so when a signal stops it."""

    images: int | None = None  # found to caption (None: not known yet)
    captioned: int = 0
    page: Path | None = None  # the overlay page, once written

    def stopped(self, signum: int) -> str:
        how = "interrupted" if signum == signal.SIGINT else f"stopped by {signal.Signals(signum).name}"
        if self.images is None:
            return f"{how} before any image was captioned"
        page = f"; the page of those: {name_on_one_line(self.page)}" if self.page is not None else ""
        return f"{how} after {self.captioned} of {counted(self.images, 'image')}{page}"


def _caption(args: argparse.Namespace) -> int:
    if args.quiet:
        quiet()
    progress = _Progress()
    with _StopSignals() as signals, warnings_in_one_line():
        try:
            return _caption_all(args, progress, signals)
        except KeyboardInterrupt as stop:  # Ctrl-C, SIGINT or SIGTERM, wherever it came
            signum = getattr(stop, "signum", signal.SIGINT)
            print(progress.stopped(signum), file=sys.stderr)
            return 128 + signum


def _caption_all(args: argparse.Namespace, progress: _Progress, signals: _StopSignals) -> int:
    from captioning.api import Captioner, Unreadable, empty_folders, find_images, read_list, reading_workers
    from captioning.eval.html_page import OverlayFolder
    from captioning.runtime.hardware import default_device

    given, overrides = split_overrides(args.inputs)
    try:
        inputs = [*given, *(read_list(args.list) if args.list else [])]
        paths = find_images(inputs, recursive=args.recursive)
        empty = empty_folders(inputs, recursive=args.recursive)
        device = default_device(args.device)
        captioner = (Captioner.from_checkpoint(args.checkpoint, device=device, overrides=overrides) if args.checkpoint
                     else Captioner.from_pretrained(args.pretrained or None, device=device, overrides=overrides))
    except expected_errors() as error:
        _error(error)
        return 2
    if args.coco_results and Path(args.coco_results).is_dir():  # said now, not after captioning every image
        _error(f"{args.coco_results}: a folder; --coco-results names the file to write")
        return 2
    for folder in empty:  # a folder with nothing to caption is a bad input like any other: one line
        _error(folder)
    if not paths:
        if not empty:
            print("error: no images given (files, folders, glob patterns or --list FILE)", file=sys.stderr)
        return 2
    progress.images = len(paths)
    signals.check()
    workers = args.workers if args.workers is not None else (0 if len(paths) <= args.batch_size else
                                                             reading_workers())
    try:
        stream = captioner.caption_files(paths, batch_size=args.batch_size, num_workers=workers,
                                         progress=None if sys.stderr.isatty() or len(paths) > 8 else False,
                                         beam_size=args.beam_size, hard_choice=args.hard_choice)
    except ConfigError as error:
        _error(error)
        return 2
    overlays = OverlayFolder(Path(args.overlays), animation=args.gif, language=captioner.language) if args.overlays \
        else None
    failures, results = len(empty), []
    try:
        for result in stream:
            signals.check()
            if isinstance(result, Unreadable):
                failures += 1
                _error(result.error)
                continue
            with signals.held():
                # One image, one line: a name with a line break or bytes that are not UTF-8 is escaped
                # (data/records.py); JSON escapes line breaks itself.
                print(json.dumps({**result.to_json(), "image": name_as_text(result.source)}) if args.json
                      else f"{name_on_one_line(result.source)}\t{result.caption}", flush=True)
                progress.captioned += 1
                if overlays is not None:
                    try:
                        overlays.add(result)
                    except (OSError, ValueError, RuntimeError) as error:  # e.g. the file changed since it was read
                        failures += 1
                        message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
                        _error(f"{result.source}: overlays not written ({message})")
                if args.coco_results:
                    results.append(result)
    finally:  # stopped by a signal too: the page of the images done is written
        if overlays is not None and not _write_page(overlays, progress):
            failures += 1
    if args.coco_results and not _write_coco_results(results, args.coco_results):
        failures += 1
    return 1 if failures else 0


def _write_page(overlays, progress: _Progress) -> bool:  # noqa: ANN001 - eval.html_page.OverlayFolder, imported late
    """The page over the overlays written so far, whole (or the one there left as it was); False,
    after one line, where it cannot be written."""
    try:
        progress.page = overlays.finish()
    except OSError as error:
        _error(f"{overlays.out_dir / 'index.html'}: the page not written ({error.strerror or type(error).__name__})")
        return False
    return True


def _write_coco_results(results: list, path: str) -> bool:
    """[{image_id, caption}], what the COCO evaluation server takes: one caption per image id (the
    evaluation refuses two), the first file's where several carry the same id (a file given twice, both
    names of one image); images without an id in their name are left out. Both are said. False, after
    one line, where it cannot be written."""
    first: dict[int, str] = {}
    records, repeated = [], []
    for r in results:
        if r.image_id is None:
            continue
        if r.image_id in first:
            repeated.append(r)
            continue
        first[r.image_id] = r.source
        records.append({"image_id": r.image_id, "caption": r.caption})
    left_out = [r.source for r in results if r.image_id is None]
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(records))
    except OSError as error:  # a folder there, a file where a parent folder would be, no rights, a full disk
        where = f": {error.filename}" if error.filename and str(error.filename) != str(path) else ""
        _error(f"{path}: the COCO results not written ({error.strerror or type(error).__name__}{where})")
        return False
    if left_out:
        print(f"note: {counted(len(left_out), 'image')} left out of {path}: their names carry no COCO image id "
              f"(e.g. {name_on_one_line(left_out[0])})", file=sys.stderr)
    if repeated:
        r = repeated[0]
        print(f"note: {counted(len(repeated), 'image')} left out of {path}: an earlier file carries the same "
              f"COCO image id (e.g. {name_on_one_line(r.source)}, id {r.image_id}, as "
              f"{name_on_one_line(first[r.image_id])})", file=sys.stderr)
    return True
