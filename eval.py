"""Evaluate a checkpoint: `python eval.py --checkpoint CKPT --split test [--beam-size K] [--out metrics.json]`."""

from captioning.cli import eval_main

if __name__ == "__main__":
    raise SystemExit(eval_main())
