"""Self-critical sequence training on the embedded default: does it raise test CIDEr over the
cross-entropy model it starts from, on every seed, without hurting attention or degenerating?

    make demo                                   # the cross-entropy model: runs/shapes_soft/best.pt
    python -m studies.scst.run                  # three SCST runs from it, scored; the table in docs/results.md
    python -m studies.scst.run --tables-only

Each run is configs/shapes_scst.yaml (5 samples per image, greedy baseline, lr 5e-5, 2 epochs of 50
images per batch, best validation CIDEr kept) with train.seed 0, 1, 2, from the same best.pt. The
starting model and each run's best.pt are scored on the 500 test images as eval.py scores them (beam 3,
pycocoevalcap with Java), plus the share of captions that end in <end> before the length limit and
the number of distinct words used. Results are kept per run in RESULTS/<name>.json (committed).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import torch

from captioning.checkpoint import decoder_from_checkpoint, load_checkpoint
from captioning.config import load_config
from captioning.data.splits import load_splits
from captioning.data.vocab import Vocabulary
from captioning.eval.evaluate import evaluate_checkpoint
from captioning.model.decoding import decode
from captioning.train.loop import fit
from studies.tables import REPO, study_parser, write_between

SEEDS = (0, 1, 2)


def score(checkpoint: Path, *, data: Path) -> dict:
    """Test metrics as eval.py computes them, and how the beam-3 captions end and what words they use."""
    evaluation = evaluate_checkpoint(checkpoint, split="test", overrides=[f"data.root={data}"])
    payload = load_checkpoint(checkpoint)
    config = load_config(None, [f"data.root={data}"])
    test = load_splits(config, ("test",))["test"]
    decoder = decoder_from_checkpoint(payload, evaluation.config)
    with torch.no_grad():
        captions = decode(decoder, torch.from_numpy(test.annotations[:].astype("float32")),
                          beam_size=evaluation.beam_size, max_length=evaluation.config.decode.max_length)
    ended = (captions.tokens == Vocabulary.end_id).any(dim=1).float().mean().item()
    words = {w for r in evaluation.results for w in r["caption"].split()}
    metrics = evaluation.metrics
    return {**metrics, "ratio": metrics["attention_correctness"] / metrics["attention_correctness_chance"],
            "ended": ended, "distinct_words": len(words)}


def run(name: str, seed: int | None, *, start: Path, data: Path, out: Path, results: Path) -> dict:
    path = results / f"{name}.json"
    if path.exists():
        return json.loads(path.read_text())
    checkpoint = start
    if seed is not None:
        overrides = [f"data.root={data}", f"train.init_from={start}", f"train.out_dir={out / name}",
                     f"train.seed={seed}"]
        if not (out / name / "best.pt").exists():  # a run stopped before its first best goes on
            fit(load_config(REPO / "configs" / "shapes_scst.yaml", overrides), resume=(out / name / "last.pt").exists())
        checkpoint = out / name / "best.pt"
    result = {"name": name, "seed": seed, **score(checkpoint, data=data)}
    results.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2))
    return result


def table(results: dict[str, dict]) -> str:
    lines = ["| model | BLEU-4 | METEOR | CIDEr | attention / chance | end in `<end>` | words used |",
             "|---|---|---|---|---|---|---|"]
    start = results.get("cross_entropy")
    for name, result in results.items():
        label = "cross-entropy (start)" if name == "cross_entropy" else f"SCST, seed {result['seed']}"
        cells = [f"{result['Bleu_4']:.3f}", f"{result['METEOR']:.3f}", f"{result['CIDEr']:.3f}",
                 f"{result['ratio']:.2f}×", f"{result['ended']:.1%}", str(result["distinct_words"])]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    gains = [r["CIDEr"] - start["CIDEr"] for n, r in results.items() if n != "cross_entropy"] if start else []
    if len(gains) > 1:
        lines.append("")
        lines.append(f"CIDEr gain over the start: mean {statistics.mean(gains):+.3f}, from {min(gains):+.3f} to "
                     f"{max(gains):+.3f} over {len(gains)} seeds.")
    return "\n".join(lines)


def main() -> int:
    parser = study_parser(__doc__, data="data/shapes", out="runs/scst", results="studies/scst/results",
                          data_help="the shapes data of make demo", table_doc="docs/results.md")
    parser.add_argument("--start", default="runs/shapes_soft/best.pt", help="the cross-entropy checkpoint")
    args = parser.parse_args()
    data, out, kept, start = Path(args.data), Path(args.out), Path(args.results), Path(args.start)
    names = {"cross_entropy": None, **{f"scst_seed{s}": s for s in SEEDS}}
    results = {}
    for name, seed in names.items():
        if args.tables_only or (args.only and args.only not in name):
            if (kept / f"{name}.json").exists():
                results[name] = json.loads((kept / f"{name}.json").read_text())
            continue
        results[name] = run(name, seed, start=start, data=data, out=out, results=kept)
        print(name, f"CIDEr {results[name]['CIDEr']:.3f}", flush=True)
    write_between(Path(args.doc), "scst", "python -m studies.scst.run", table(results))
    print(f"table written to {args.doc}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
