"""What went wrong, not only how much: the failures of decoding that BLEU and CIDEr average away.

Read from the generated captions (their words, as printed) and the references (tokenized as
training targets are), for eval.py's metrics file and output:

  distinct_captions        distinct captions / captions: a decoder that says the same of every image
                           scores near 0, however good that one caption's BLEU
  vocabulary_used          distinct words over all captions (against the vocabulary it could use)
  at_length_limit          share of captions with decode.max_length words: the decoder stopped there,
                           most likely without choosing to end (a beam that never ends)
  repeated_3gram_captions  share of captions in which some 3 words come twice ("a man riding a wave on
                           a surfboard riding a wave"): a decoder caught in a loop
  unk_captions             share of captions that say <unk> (only where decode.allow_unk lets them)
  mean_length              words per caption, beside reference_mean_length (words per reference)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from captioning.data.vocab import tokenize
from captioning.model.tokens import UNK


def _repeats(words: Sequence[str], n: int = 3) -> bool:
    grams = Counter(tuple(words[i:i + n]) for i in range(len(words) - n + 1))
    return any(count > 1 for count in grams.values())


def caption_diagnostics(captions: Mapping[int, str], references: Mapping[int, Sequence[str]], *,
                        max_length: int) -> dict[str, float]:
    """The numbers above for one caption per image (image id -> caption) and those images' references."""
    words = [caption.split() for caption in captions.values()]
    if not words:
        return {}
    reference_words = [len(tokenize(reference)) for image in captions for reference in references[image]]
    return {
        "distinct_captions": len(set(captions.values())) / len(words),
        "vocabulary_used": float(len({word for caption in words for word in caption})),
        "at_length_limit": sum(len(caption) >= max_length for caption in words) / len(words),
        "repeated_3gram_captions": sum(_repeats(caption) for caption in words) / len(words),
        "unk_captions": sum(UNK in caption for caption in words) / len(words),
        "mean_length": sum(map(len, words)) / len(words),
        "reference_mean_length": sum(reference_words) / max(len(reference_words), 1),
    }
