"""Train a captioner: `python train.py [--config CFG] [--resume] [key.sub=value ...]`.

With no config, trains the embedded default (soft attention on the shapes dataset).
"""

from captioning.cli import train_main

if __name__ == "__main__":
    raise SystemExit(train_main())
