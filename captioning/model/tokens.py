"""The special tokens the model reads and writes, and their ids: every vocabulary begins with them
(captioning.data.vocab.Vocabulary), so the decoder and decoding know them without a vocabulary."""

from __future__ import annotations

PAD, START, END, UNK = "<pad>", "<start>", "<end>", "<unk>"
SPECIALS = (PAD, START, END, UNK)
PAD_ID, START_ID, END_ID, UNK_ID = range(len(SPECIALS))  # 0, 1, 2, 3
