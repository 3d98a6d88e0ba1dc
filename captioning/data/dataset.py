"""(image, caption) training pairs, over cached annotations or over image files, and their collation;
an epoch's batches (`epoch_batches`), and the feature cache's memory maps pickled by reference into
DataLoader workers (`by_reference`).

Notation: B batch, T caption tokens (<start> .. <end>), L grid cells, D channels, S input side.
"""

from __future__ import annotations

import mmap
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from captioning.data.images import ImageReadError, augment, load_image, to_tensor
from captioning.data.records import ImageRecord
from captioning.data.tokenized import Tokenized
from captioning.data.vocab import Vocabulary


@dataclass
class Batch:
    # [B, L, D] from the cache, in its dtype (fp16) until `to` widens them to float32 on the device;
    # None when images are given
    annotations: torch.Tensor | None
    tokens: torch.Tensor  # [B, T] <start> w1 .. wn <end> <pad> ..
    lengths: torch.Tensor  # [B] tokens including <start> and <end>
    images: torch.Tensor | None = None  # [B, 3, S, S] normalized, for an encoder that runs on the fly
    failures: tuple[str, ...] = ()  # why each pair left out of this batch had an unreadable image
    # [B] long: where each pair sat in the batch it was collated from, when pairs were left out (on the
    # CPU: hard attention's draws are picked by it, captioning.train.paper_objective.row_uniforms); None when none was
    positions: torch.Tensor | None = None

    def _map(self, function) -> Batch:
        optional = {name: None if value is None else function(value)
                    for name, value in (("annotations", self.annotations), ("images", self.images))}
        return replace(self, tokens=function(self.tokens), lengths=function(self.lengths), **optional)

    def to(self, device: str | torch.device, non_blocking: bool = False) -> Batch:
        """The batch on `device`, its annotations widened to float32 there, after the copy: the cache's
        fp16 is pinned and crosses to the GPU at half the bytes, and the model still computes in float32."""
        moved = self._map(lambda t: t.to(device, non_blocking=non_blocking))
        return moved if moved.annotations is None else replace(moved, annotations=moved.annotations.float())

    def pin_memory(self) -> Batch:  # called by DataLoader(pin_memory=True) in its pinning thread
        return self._map(torch.Tensor.pin_memory)

    @property
    def source(self) -> torch.Tensor:
        """What the model reads: cached annotations, or images for its encoder."""
        return self.annotations if self.annotations is not None else self.images

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def counts(self) -> dict[str, float]:
        """What processes weigh their parts of a global batch by (captioning.runtime.distributed.agree):
        the target words (every term of the loss is divided by them) and the pairs."""
        return {"words": float((self.tokens[:, 1:] != Vocabulary.pad_id).sum()), "images": float(len(self))}


Words = Callable[[list[str]], list[str]]  # how a caption's words are read (data/flips.py swaps some)


class _Pairs(Dataset):
    """(image index, token ids) pairs of every caption of a split (data/tokenized.py), held as three
    arrays rather than a Python object per pair: 566 747 pairs on COCO, which a DataLoader worker
    would otherwise copy page by page as it read them (docs/scale.md). `lengths` is what
    length-bucketed batches sort by."""

    def __init__(self, captions: Tokenized, vocab: Vocabulary, *, max_length: int | None, words: Words):
        self.images, self.tokens, self.offsets = captions.encoded(vocab, max_length=max_length, words=words)

    @property
    def lengths(self) -> np.ndarray:
        """[P] tokens of each pair, <start> and <end> included."""
        return np.diff(self.offsets)

    def __len__(self) -> int:
        return len(self.images)

    def pair(self, index: int) -> tuple[int, list[int]]:
        """(image row, token ids) of pair `index`."""
        return int(self.images[index]), self.tokens[self.offsets[index]:self.offsets[index + 1]].tolist()


class CaptionPairs(_Pairs):
    """Every (image, reference caption) pair of a split; item = (annotations [L, D] in the cache's
    dtype, fp16: Batch.to widens them once on the device, token ids)."""

    def __init__(self, annotations: np.ndarray, captions: Tokenized, vocab: Vocabulary, *,
                 max_length: int | None = None, words: Words = list):
        super().__init__(captions, vocab, max_length=max_length, words=words)
        self.annotations = annotations  # [N, L, D] fp16, possibly memory-mapped

    def __getstate__(self) -> dict:
        return by_reference(self.__dict__)  # a DataLoader worker maps the cache again rather than receive a copy

    def __getitem__(self, index: int) -> tuple[torch.Tensor, list[int]]:
        image, tokens = self.pair(index)
        return torch.from_numpy(np.array(self.annotations[image])), tokens  # a copy: the map is read-only


class ImageCaptionPairs(_Pairs):
    """The same pairs over image files, for an encoder that runs on the fly (fine-tuning).

    item = (pixels [3, S, S] or None, token ids, why the image could not be read or None). Images are
    decoded here, in the DataLoader workers; every read opens and closes its own file. `transform`
    changes each image as it is read (data/flips.py flips it), before data.augment's random crop.
    """

    def __init__(self, records: list[ImageRecord], captions: Tokenized, vocab: Vocabulary, *, image_size: int,
                 mean: tuple[float, ...], std: tuple[float, ...], max_length: int | None = None,
                 augmented: bool = False, transform: Callable[[Image.Image], Image.Image] | None = None,
                 words: Words = list):
        super().__init__(captions, vocab, max_length=max_length, words=words)
        self.records, self.size, self.mean, self.std = records, image_size, mean, std
        self.augmented = augmented  # data.augment: a random crop and colour jitter per read (images.augment)
        self.transform = transform

    def __getitem__(self, index: int) -> tuple[torch.Tensor | None, list[int], str | None]:
        image, tokens = self.pair(index)
        try:
            picture = load_image(self.records[image].path)
            if self.transform is not None:
                picture = self.transform(picture)
            if self.augmented:  # drawn from the worker's torch RNG, which the DataLoader seeds
                picture = augment(picture)
            pixels = to_tensor(picture, size=self.size, mean=self.mean, std=self.std)
        except ImageReadError as error:
            return None, tokens, str(error)
        return pixels, tokens, None


def _tokens(ids: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    lengths = torch.tensor([len(row) for row in ids])
    tokens = torch.full((len(ids), int(lengths.max())), Vocabulary.pad_id, dtype=torch.long)  # [B, T]
    for row, values in enumerate(ids):
        tokens[row, : len(values)] = torch.tensor(values)
    return tokens, lengths


def collate(items: list[tuple[torch.Tensor, list[int]]]) -> Batch:
    if not items:  # a process's empty part of a global batch (data.sampling.rank_batches)
        return Batch(annotations=None, tokens=torch.zeros(0, 0, dtype=torch.long),
                     lengths=torch.zeros(0, dtype=torch.long))
    tokens, lengths = _tokens([ids for _, ids in items])
    return Batch(annotations=torch.stack([a for a, _ in items]), tokens=tokens, lengths=lengths)


def collate_image_pairs(items: list[tuple[torch.Tensor | None, list[int], str | None]]) -> Batch:
    """Pairs whose image could not be read are left out, with the reason and the positions of those
    kept; the batch may end up empty."""
    kept = [row for row, (pixels, _, _) in enumerate(items) if pixels is not None]
    failures = tuple(error for _, _, error in items if error is not None)
    positions = torch.tensor(kept, dtype=torch.long) if failures else None
    if not kept:
        return Batch(annotations=None, tokens=torch.zeros(0, 0, dtype=torch.long),
                     lengths=torch.zeros(0, dtype=torch.long), failures=failures, positions=positions)
    tokens, lengths = _tokens([items[row][1] for row in kept])
    return Batch(annotations=None, images=torch.stack([items[row][0] for row in kept]), tokens=tokens, lengths=lengths,
                 failures=failures, positions=positions)


# an epoch's batches -------------------------------------------------------------------------------
# The batches of an epoch: shuffled, length-bucketed, split across processes, a pure function of
# (seed, epoch), so that a resumed run can skip exactly the batches it already did.
#
# Bucketing: captions of similar length in one batch waste fewer padded decoder steps. The epoch's
# random order is cut into pools of `pool` batches; each pool is sorted by length and cut into
# batches; the batches are shuffled again, so consecutive batches are not ordered by length.

def epoch_batches(lengths: Sequence[int], *, batch_size: int, seed: int, epoch: int, bucket: bool = True,
                  pool: int = 50) -> list[list[int]]:
    """The global batches of one epoch, as lists of item indices."""
    generator = torch.Generator().manual_seed(seed * 100_003 + epoch)
    order = torch.randperm(len(lengths), generator=generator)
    if not bucket:
        return [b.tolist() for b in order.split(batch_size)]
    lengths_t = torch.as_tensor(np.asarray(lengths, dtype=np.int64))
    batches = []
    for chunk in order.split(batch_size * pool):
        ranked = chunk[torch.argsort(lengths_t[chunk], stable=True)]  # ties keep the random order
        batches += [b.tolist() for b in ranked.split(batch_size)]
    return [batches[i] for i in torch.randperm(len(batches), generator=generator).tolist()]


def rank_batches(batches: list[list[int]], *, rank: int, world_size: int) -> list[list[int]]:
    """This process's part of every global batch: contiguous, near-equal slices, one per global batch
    whatever the number of processes, so that a run resumes at the same global batch on more or fewer
    processes. A global batch with fewer items than processes leaves some slices empty; those
    processes take part in the step with nothing of their own (captioning.runtime.distributed)."""
    if world_size == 1:
        return batches
    return [batch[len(batch) * rank // world_size: len(batch) * (rank + 1) // world_size] for batch in batches]


# pickling the feature cache by reference ----------------------------------------------------------
# Pickling the feature cache by reference: a read-only memory map travels as its file's name.
#
# A DataLoader started with the spawn or forkserver method (the default on macOS and Windows, and
# what CUDA needs) pickles its dataset into every worker. A pickled np.memmap carries its whole
# contents, tens of GB for COCO's cache, once per worker and per epoch. A memory map that covers a
# whole .npy file (np.load(path, mmap_mode="r"), captioning.data.features) is fully described by
# the file's name, the data's offset in it, its shape, dtype and order, so datasets that hold one
# pickle that description instead (`MappedFile`, a few hundred bytes) and the worker maps the same
# file again, read-only: the pages are the operating system's page cache, shared by every process.
#
# Anything else (an array in memory, or a view into a map, which the file alone does not describe)
# pickles as it always did.

@dataclass(frozen=True)
class MappedFile:
    """Where a read-only memory-mapped array lives; unpickling it maps the file again (np.memmap)."""

    filename: str
    offset: int  # bytes before the data: the .npy header
    shape: tuple[int, ...]
    dtype: np.dtype
    order: str  # "C" or "F"

    @classmethod
    def of(cls, array: Any) -> MappedFile | None:
        """The file behind `array` if it is a read-only memory map of a whole file; None otherwise.

        Only a map made from the file (its base is the mmap itself) covers the file from `offset` to
        the end; a slice or any other view of it has the map as its base and is not described by it.
        """
        if not (isinstance(array, np.memmap) and isinstance(array.base, mmap.mmap)):
            return None
        if array.mode != "r" or array.filename is None:  # "r+"/"w+": being written; "c": private changes
            return None
        order = "C" if array.flags.c_contiguous else "F"
        return cls(str(array.filename), int(array.offset), tuple(array.shape), array.dtype, order)

    def __reduce__(self) -> tuple:
        # Unpickled, the description becomes the map itself: the dataset gets back the array type it had.
        return np.memmap, (self.filename, self.dtype, "r", self.offset, self.shape, self.order)


def by_reference(state: dict[str, Any]) -> dict[str, Any]:
    """An object's attributes for pickling (`__getstate__`), each read-only memory map of a whole
    file replaced by its MappedFile: a copy of the dict, the object itself is left as it is."""
    return {name: MappedFile.of(value) or value for name, value in state.items()}
