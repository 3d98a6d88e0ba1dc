"""The largest value each size setting may take, checked when a config is loaded (checks.py).

A size is a number the run allocates by: a width of the model, a side of the input, a batch, a
beam, a caption's length, samples per caption. Without a bound, a slip of the keyboard
(model.hidden_dim=99999999999999999999) passes every check and fails deep inside torch, pages of
traceback later, or fills the machine's memory. Each bound is far beyond any model or data a
captioner is trained on, so that no real config meets it; a model that is within them and still too
large for the machine is refused in one line where it is built (captioning.train.build).

Counts that size nothing (epochs, steps, patience, images decoded) and seeds are left unbounded.
"""

from __future__ import annotations

# model.embed_dim, model.hidden_dim, model.attention_dim: the paper's LSTM and today's widest
# language models are a thousand to a few tens of thousands wide. An LSTM 65536 wide holds 4 x 65536²
# recurrent weights alone, 64 GiB in float32: within the bound, but too large for most machines.
WIDTH = 2**16

# data.image_size, the encoder's square input: 8192² is 67 megapixels, a grid of 512 x 512 cells at
# stride 16, where the paper attends over 14 x 14 (COCO's photos are 640 pixels wide).
IMAGE_SIDE = 8192

# train.batch_size, encoder.batch_size: the largest batches anyone trains with fit (CLIP: 32768 pairs;
# BERT with LAMB: 65536 sequences).
BATCH = 2**16

# decode.beam_size, train.val_beam_size: captioners decode with 3 to 20 beams, and studies of beam
# search itself try up to about a thousand.
BEAM = 1024

# data.max_caption_length, decode.max_length (words): paragraph captions run to a few hundred words,
# COCO's to about 20.
LENGTH = 10_000

# train.reinforce.location_samples, train.scst.samples: papers sample 1 to 20 per caption or image.
SAMPLES = 1024

# model.extras.grid_attention (heads): the heads share out the annotation channels, one at least
# each, and the widest annotations of the encoders here have 2048 (ResNet's last stage).
HEADS = 4096

# train.num_workers: a loading process per core of the largest two-socket servers (2 x 128 cores).
WORKERS = 256
