"""Caption metrics: BLEU-1..4, METEOR, ROUGE-L and CIDEr from pycocoevalcap.

pycocoevalcap is the code behind the COCO leaderboard: one generated caption per image against all
its references. Its PTB tokenizer and METEOR run on Java; without Java we say so and score BLEU,
ROUGE-L and CIDEr on the project's own tokenization.

Both are English's: the PTB tokenizer splits English clitics, and the METEOR 1.5 jar pycocoevalcap
ships holds English's paraphrase table only (`-l de` stops at the missing data/paraphrase-de.gz).
Captions in another language (data.language) are scored on the project's tokenizer for any language
(Unicode words: data/vocab.py), named with its language, and METEOR is left out, said in one line.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence

from captioning.config.choices import ENGLISH
from captioning.data.vocab import normalize, tokenize

JAVA_METRICS = ("METEOR", "SPICE", "the PTB tokenizer")
# The tokenization the metrics were computed on, as the output and the metrics file name it: the two
# move the scores apart (docs/metrics.md measures by how much).
PTB_TOKENIZER = "PTB (pycocoevalcap, Java)"
OWN_TOKENIZER = "the project's Treebank (no Java)"


def words_tokenizer(language: str) -> str:
    """The name of the tokenizer the metrics of captions in a language other than English are on."""
    return f"the project's Unicode words ({language})"

# What validation during training scores (caption_metrics with full=False: BLEU and CIDEr, on the
# tokenizer train.val_tokenizer names) is VALIDATION_METRICS: the config's list, which
# train.val_metric picks from.


def java_available() -> bool:
    return shutil.which("java") is not None


def metrics_tokenizer(*, ptb: bool = True, language: str = ENGLISH) -> str:
    """What caption_metrics(ptb=ptb, language=language) tokenizes with here: for English, the PTB
    tokenizer where it is asked for and Java is found, the project's own otherwise; for another
    language, the project's tokenizer of Unicode words."""
    if language != ENGLISH:
        return words_tokenizer(language)
    return PTB_TOKENIZER if ptb and java_available() else OWN_TOKENIZER


def _quietly(function, *args):
    """pycocoevalcap prints its internals to stdout; keep our output readable."""
    with contextlib.redirect_stdout(io.StringIO()):
        return function(*args)


@contextlib.contextmanager
def _java_chatter_held():
    """The PTB tokenizer's Java prints a line per call ("PTBTokenizer tokenized 645 tokens at ...") to
    the process's own stderr, below Python's sys.stderr: held in a file while it runs, and shown only
    when the call fails, where it may say why."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        except BaseException:
            os.dup2(saved, 2)
            held.seek(0)
            sys.stderr.write(held.read().decode(errors="replace"))
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)


# The process's METEOR scorer, by the process that started it: its Java server loads its paraphrase
# tables for seconds at each start, so one is started at the first METEOR a process scores and asked
# again (an ensemble's members, the splits of one run). A forked child starts its own: the pipes it
# inherits are its parent's conversation.
_meteors: dict[int, object] = {}


def _meteor_score(gts: dict[int, list[str]], res: dict[int, list[str]]) -> float:
    from pycocoevalcap.meteor.meteor import Meteor

    scorer = _meteors.get(os.getpid())
    if scorer is None:
        scorer = _meteors[os.getpid()] = Meteor()
    try:
        return float(_quietly(scorer.compute_score, gts, res)[0])
    except BaseException:
        _stop_meteor()  # one that failed mid-answer holds its lock and a half-read reply: never asked again
        raise


@atexit.register
def _stop_meteor() -> None:
    """Stop this process's METEOR server, before the interpreter's teardown would (pycocoevalcap's
    __del__ then, with half the modules gone, would print an error on the way out)."""
    scorer = _meteors.pop(os.getpid(), None)
    if scorer is None:
        return
    if scorer.lock.locked():  # stopped mid-call: its __del__ takes the lock too
        scorer.lock.release()
    scorer.meteor_p.kill()
    scorer.meteor_p.wait()


def caption_metrics(references: dict[int, Sequence[str]], candidates: dict[int, str], *,
                    full: bool = True, ptb: bool | None = None, language: str = ENGLISH) -> dict[str, float]:
    """BLEU-1..4, METEOR, ROUGE-L and CIDEr of one candidate per image against its references.

    `full=False` is the subset that picks checkpoints during training: BLEU and CIDEr (METEOR and
    ROUGE-L cost more and pick nothing). `ptb`: tokenize with the PTB tokenizer (where Java is
    found), as the reported numbers are; False: the project's own tokenization, no Java. None: PTB
    for the full metrics, the project's own for the subset. `language`: the captions' (data.language);
    other than English, the project's Unicode words and no METEOR, whatever `ptb` says.
    """
    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.rouge.rouge import Rouge

    ptb = (full if ptb is None else ptb) and language == ENGLISH
    use_java = ptb and java_available()
    if full and language != ENGLISH:
        print(f"note: METEOR is not scored on captions in {language}: the METEOR 1.5 jar pycocoevalcap ships "
              f"has English's paraphrase table only (-l {language} would need its own); BLEU, ROUGE_L and CIDEr "
              f"are on {words_tokenizer(language)}", file=sys.stderr)
    elif full and not use_java and ptb:
        print(f"warning: java not found: {', '.join(JAVA_METRICS[:-1])} and {JAVA_METRICS[-1]} need it, so METEOR "
              f"is not scored and BLEU, ROUGE_L and CIDEr are on {OWN_TOKENIZER} tokenization, which moves them "
              "(docs/metrics.md); install a Java runtime for the standard numbers", file=sys.stderr)
    gts, res = _tokenized(references, candidates, use_java=use_java, language=language)
    metrics: dict[str, float] = {}
    bleu, _ = _quietly(Bleu(4).compute_score, gts, res)
    metrics.update({f"Bleu_{n + 1}": float(b) for n, b in enumerate(bleu)})
    if full and use_java:
        metrics["METEOR"] = _meteor_score(gts, res)
    if full:
        metrics["ROUGE_L"] = float(_quietly(Rouge().compute_score, gts, res)[0])
    metrics["CIDEr"] = float(_quietly(Cider().compute_score, gts, res)[0])
    return metrics


def cider_per_image(references: dict[int, Sequence[str]], candidates: dict[int, str], *,
                    ptb: bool = True, language: str = ENGLISH) -> dict[int, float]:
    """Each image's CIDEr-D, tokenized as caption_metrics tokenizes (`ptb`); the document
    frequencies come from all the images given, so the mean over them is caption_metrics' CIDEr,
    and a mean over some of them is that part's share of it (what a study needs to score halves or
    resamples of a split without decoding again)."""
    from pycocoevalcap.cider.cider import Cider

    use_java = ptb and language == ENGLISH and java_available()
    gts, res = _tokenized(references, candidates, use_java=use_java, language=language)
    _, scores = _quietly(Cider().compute_score, gts, res)
    return {image_id: float(score) for image_id, score in zip(gts, scores)}  # compute_score walks gts' keys


def _tokenized(references: dict[int, Sequence[str]], candidates: dict[int, str], *,
               use_java: bool, language: str) -> tuple[dict[int, list[str]], dict[int, list[str]]]:
    """References and candidates as pycocoevalcap's scorers take them: {image_id: [tokenized caption, ...]}."""
    if use_java:
        from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

        tokenizer = PTBTokenizer()
        # The same normalization as training targets (curly quotes, case, spaces), then the PTB tokenizer.
        with _java_chatter_held():
            gts = _quietly(tokenizer.tokenize,
                           {i: [{"caption": normalize(c)} for c in refs] for i, refs in references.items()})
            res = _quietly(tokenizer.tokenize, {i: [{"caption": candidates[i]}] for i in references})
        return gts, res
    gts = {i: [" ".join(tokenize(c, language=language)) for c in refs] for i, refs in references.items()}
    res = {i: [" ".join(tokenize(candidates[i], language=language))] for i in references}
    return gts, res
