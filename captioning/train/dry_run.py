"""`train.py --dry-run`: the whole run in miniature, so that a broken config fails in seconds on a
laptop rather than after the feature cache is built on the cluster.

The real config, with only its size cut: the first few images of each split that are on disk
(data.max_images), the encoder on the images (no feature cache written), two optimizer steps, one
validation batch with its metrics, and the checkpoint written and read back as `caption` and
`eval.py` read it. A warm start (train.init_from) loads its checkpoint as the real run would.
Self-critical training reads cached annotations only: its dry run caches the few images it uses,
in the temporary folder, through a folder of links to the data. Everything goes to a temporary
folder; train.out_dir is not touched, nor is data.root, but for what a reader of the data records
there once, the same for any run (a folder of photos' kept splits: data/kept_splits.py; drawing
them reads every photo once). What the real run would refuse of its folder
(a resume of another model, a new run over another's checkpoints, a warm start's other vocabulary)
is read there first.
"""

from __future__ import annotations

import copy
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from captioning.checkpoint import load_checkpoint, load_trained
from captioning.config import Config, validate
from captioning.data.records import format_extra, read_records
from captioning.train.loop import fit
from captioning.train.resume import LastCheckpoint
from captioning.train.run_folder import refuse_to_replace_a_run
from captioning.train.warm_start import warm_vocabulary

# On a 2-core CPU the encoder on the fly is most of a dry run (a ResNet-101 forward at 448² takes about
# 0.4 s an image in float32): a few captions a step and one overlay keep every COCO config's dry run
# well under a minute there (docs/benchmarks.md, "Dry runs").
TRAIN_IMAGES, VAL_IMAGES, STEPS, MAX_BATCH, OVERLAYS = 8, 2, 2, 4, 1


@dataclass
class DryRun:
    steps: int
    metric: str  # train.val_metric, on the validation batch
    value: float
    seconds: float


def miniature(config: Config, out_dir: Path) -> Config:
    """The config cut to a few images, steps and captions, writing under `out_dir`; the rest as it is."""
    trial = copy.deepcopy(config)
    trial.data.max_images = TRAIN_IMAGES
    if trial.train.objective == "scst" or trial.encoder.cache_frozen:  # these read a feature cache only
        # The cache of its few images goes under out_dir, never where the real run's caches are (a
        # cache of 8 images would take the place of the split's): a cache root of its own that links
        # to what the real one holds but its feature caches (the tokenized captions, read as they are).
        source = Path(trial.data.cache_root or trial.data.root)
        trial.data.cache_root = str(_linked(source, out_dir / "cache") if source.is_dir() else out_dir / "cache")
    else:
        trial.data.feature_cache = False  # the encoder runs on the images: nothing cached for a dry run
    t = trial.train
    t.out_dir, t.max_steps, t.epochs = str(out_dir / "run"), STEPS, STEPS  # an epoch may be one batch
    t.batch_size, t.val_images, t.log_images = min(t.batch_size, MAX_BATCH), VAL_IMAGES, min(t.log_images, OVERLAYS)
    t.num_workers, t.save_every_steps, t.eval_every_steps, t.log_every_steps = 0, None, None, 1
    miniature = format_extra(trial.data, "miniature")  # data that a dry run draws small for itself (shapes)
    if miniature is not None:
        miniature(trial, out_dir)
    return validate(trial, "config (dry run)")


def _linked(root: Path, into: Path) -> Path:
    """`into`, holding a link to each entry of `root` but its feature caches: what is read comes from
    `root`, what is written (a cache of the miniature's images) stays in `into`."""
    into.mkdir(parents=True)
    for entry in root.iterdir():
        if entry.name != "features":
            (into / entry.name).symlink_to(entry.resolve(), target_is_directory=entry.is_dir())
    return into


def dry_run(config: Config, *, device: str | torch.device = "cpu", resume: bool = False) -> DryRun:
    """Run the miniature; any problem raises (the CLI turns it into one line). First, read only, what
    the real run would refuse of its folder: a resume of another model or optimizer (`resume`: the
    miniature itself starts afresh), a new run over one there, and a warm start's vocabulary against
    the one prepared there."""
    start = time.perf_counter()
    t = config.train
    if resume:
        LastCheckpoint.read(config)
    else:
        refuse_to_replace_a_run(t.out_dir)
    if t.init_from and not resume:
        warm_vocabulary(config, load_checkpoint(t.init_from), t.init_from)
    with tempfile.TemporaryDirectory(prefix="captioning-dry-run-") as folder:
        trial = miniature(config, Path(folder))
        for split in ("train", "val"):  # the cheap things first: the data's folder and files, then weights
            read_records(trial.data, split)
        summary = fit(trial, device=device)
        last = Path(trial.train.out_dir) / "last.pt"
        load_checkpoint(last)
        load_trained(last).model()  # the model that caption and eval.py build from it
    return DryRun(steps=summary["steps"], metric=summary["metric"], value=summary["best_metric"],
                  seconds=time.perf_counter() - start)
