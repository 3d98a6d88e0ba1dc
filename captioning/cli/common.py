"""What the commands share: the errors that end a command in one line (the file and the problem,
exit code 2), and the arguments several commands take."""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from captioning.config.bounds import BEAM
from captioning.config.choices import HARD_CHOICES
from captioning.progress import quiet


def expected_errors() -> tuple[type[Exception], ...]:
    """The errors a command ends with in one line. Imported when a command runs, not when its
    parser is built: `captioning --help` loads neither torch nor the modules that raise them."""
    from captioning.checkpoint import CheckpointError
    from captioning.config import ConfigError
    from captioning.data.images import ImageReadError
    from captioning.data.records import DatasetError
    from captioning.model.encoder import EncoderWeightsError
    from captioning.model.fused_check import FastPathError
    from captioning.runtime.distributed import DistributedError
    from captioning.runtime.hardware import DeviceError
    from captioning.train.objective import TrainingError

    return (CheckpointError, ConfigError, DatasetError, DeviceError, DistributedError, EncoderWeightsError,
            FastPathError, ImageReadError, TrainingError)


PACKAGE = Path(__file__).resolve().parents[1]


def guarded(function: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """The command, its expected errors in one line each (exit 2), the package's own warnings (a
    setting under its old name) in one line each too."""
    def run(args: argparse.Namespace) -> int:
        if getattr(args, "quiet", False):
            quiet()
        with warnings_in_one_line():
            try:
                return function(args)
            except expected_errors() as error:
                print(f"error: {error}", file=sys.stderr)
                return 2
    return run


@contextlib.contextmanager
def warnings_in_one_line() -> Iterator[None]:
    """The package's own warnings as one line each ("warning: ..."), others as Python shows them."""
    with warnings.catch_warnings():
        warnings.showwarning = _one_line_if_ours(warnings.showwarning)
        yield


def _one_line_if_ours(shown: Callable[..., None]) -> Callable[..., None]:
    def show(message, category, filename, *rest) -> None:  # noqa: ANN001 - warnings.showwarning's signature
        if Path(filename).resolve().is_relative_to(PACKAGE):
            print(f"warning: {message}", file=sys.stderr)
        else:
            shown(message, category, filename, *rest)
    return show


def add_quiet_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quiet", "-q", action="store_true", help="no progress bars (they are off anyway where "
                        "stderr is not a terminal)")


def add_hard_choice_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--hard-choice", choices=HARD_CHOICES,
                        help="how a hard attention model picks its cell per word (default: the checkpoint config's "
                             "decode.hard_choice, normally expectation); soft models take only expectation")
    # its name before the config had one word for it (decode.hard_attention)
    parser.add_argument("--hard-attention", dest="hard_choice", choices=HARD_CHOICES, help=argparse.SUPPRESS)


def add_beam_size_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--beam-size", type=whole_number(1, BEAM), metavar="N",
                        help="default: the checkpoint config's decode.beam_size")


def whole_number(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse type: a whole number from `low` (to `high`), else a usage error naming the option.
    Checked where it is read, since past it a bad count does not fail, it misleads: a beam of 0
    decoded with the config's beam, and `make-shapes --train -3` wrote no image and said -3."""
    def number(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"a whole number, got {text!r}") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"from {low} to {high}, got {value}" if high is not None
                                             else f"at least {low}, got {value}")
        return value

    return number


def tolerance(text: str) -> float:
    """An argparse type: a finite number from 0 on (a difference allowed), else a usage error: -1
    failed after a whole re-validation, NaN let only exact matches through and said "within nan"."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a number, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"a finite number from 0 on, got {text}")
    return value


def add_pretrained_argument(parser: argparse.ArgumentParser | argparse._MutuallyExclusiveGroup, *, use: str) -> None:
    """--pretrained [NAME]: a model the package ships (captioning.shipped.PRETRAINED), the English
    one where no name is given. Absent it is False; alone, None (captioning.shipped.pretrained_path's
    default); `use` says what the command does with it. A value after it that cannot be a model's
    name stays a positional value (pretrained_alone)."""
    parser.add_argument("--pretrained", nargs="?", default=False, const=None, metavar="NAME",
                        help=f"a model the package ships: flickr8k (English, the default) or flickr8k_de (German), "
                             f"both trained on Flickr8k's photos; {use}")


def pretrained_alone(argv: Sequence[str]) -> list[str]:
    """`eval.py --pretrained data.root=X` and `caption --pretrained photo.jpg` mean the default model:
    argparse would take the value that follows as the model's name (nargs="?"). A shipped model's
    name is one word, so where that value holds '=', '.', '/' or a glob's '*?[' (an override, a
    file, a folder, a pattern), --pretrained moves to the end of the options, where it takes no
    value, and the values keep their order. A plain word (`--pretrained flickr8k_fr`) stays the
    name, refused by captioning.shipped.pretrained_path if no model has it."""
    argv = list(argv)
    end = argv.index("--") if "--" in argv else len(argv)
    if "--pretrained" not in argv[:end]:
        return argv
    at = argv.index("--pretrained")
    value = argv[at + 1] if at + 1 < end else ""
    if not any(mark in value for mark in "=./\\*?["):  # an option after it (--json) has none, or moves harmlessly
        return argv
    return [*argv[:at], *argv[at + 1:end], "--pretrained", *argv[end:]]
