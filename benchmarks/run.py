"""Throughput and peak memory of the decoder: five cases, one line each.

    python benchmarks/run.py --cases a,b,c3,c5,d,caption,encoder [--json PATH] [--threads N] [--repeats R]
                             [--impl fast|reference|port] [--device cpu|cuda] [--amp bf16] [--compile]

Cases (model dims as in the paper's COCO setting: embedding = attention = hidden = 512, V = 10 000):
  a   decoder training step, annotations given: B=32, 14x14x2048, caption lengths uniform in 10..22
      tokens (counting <start> and <end>): forward + cross-entropy + doubly stochastic term + backward
      + Adam step. captions/s.
  b   the same at B=64 with 7x7x512 annotations.
  c3  beam search, beam 3, 14x14x2048, exactly 50 steps (<end> forbidden, so no beam finishes early),
      as many images at once as is fastest (the batch sizes in --beam-batches are tried); images/s.
  c5  the same with beam 5.
  d   encoder + decoder training step on 256x256 images, B=8, frozen ResNet-101 with random weights
      cut at the project's default stride-16 layer (layer3: a 16x16x1024 grid); images/s.
  caption
      `captioning caption` end to end through captioning.api on a folder of --photos JPEGs (640x480,
      made once): the embedded default's encoder (EfficientNet-Lite0, 224², 14x14 grid) and decoder
      sizes with random decoder weights and a 10 000-word vocabulary, beam 3, captions of exactly
      --caption-words words. The loop the command ran before captioning.api (read, encode, decode one
      image), one image at a time through the API, then in batches, overlays off and on; the same
      captions each way; and how the batched time splits into reading, encoding, decoding and
      overlays. images/s.
  encoder
      the embedded default's encoder alone (EfficientNet-Lite0 at 224², frozen, random input): images/s
      for each batch size of --encoder-batches, in the default (NCHW) layout and in channels-last,
      --encoder-seconds each after two warm-up batches. What `captioning caption` encodes at once on a
      CPU (captioning.model.encoder_decoder.CPU_ENCODER_CHUNK, channels-last) was chosen from this.
  shipped
      what the shipped model costs against one of its decoders: `captioning caption --pretrained`'s
      work through captioning.api on the --photos JPEGs in batches of --caption-batch, with the
      package's Flickr8k file (EfficientNet-Lite2, a fine-tuned copy of its last stages, and its
      decoders decoded together, beam 3, its own decoding) and with its first decoder alone over its
      own encoder, --repeats rounds taking turns; and each one's encoding and decoding alone over the
      same images. images/s (the shipped file's).

--impl picks whose code runs: `fast` (the package), `stepwise` (the package with model.fused=false:
the decoder's `_advance` at every step, what the fused path accelerates), `reference`
(benchmarks/implementations/reference.py: the straightforward loop and beam search of main c47c7db) or `port`
(benchmarks/implementations/port_style.py: our re-implementation of the loop style of the popular public ports).
All four use the same model.

Each case runs in its own fresh subprocess, so that its peak RSS is its own; inside it, `--warmup`
untimed iterations, then `--repeats` timed ones, and the median is reported. Every line and the JSON
carry the machine, torch version, thread count and date.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path

import torch

from captioning.data.vocab import Vocabulary
from captioning.model.accelerator import accelerator_for
from captioning.model.paper import AdditiveScore, AttentionDecoder, SoftAttention, cross_entropy, doubly_stochastic

REPO = Path(__file__).resolve().parents[1]

CASES = ("a", "b", "c3", "c5", "d", "caption", "encoder", "shipped")
VOCAB, EMBED, HIDDEN, ATTENTION = 10_000, 512, 512, 512
SHORTEST, LONGEST = 10, 22  # caption tokens, <start> and <end> included
BEAM_STEPS = 50


# ----------------------------------------------------------------------------------------------- setup

def machine() -> dict[str, str | int]:
    """What the numbers were taken on."""
    model = platform.processor() or "unknown"
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout.splitlines():
            if line.startswith("Model name:"):
                model = line.split(":", 1)[1].strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    try:
        commit = subprocess.run(["git", "-C", str(REPO), "describe", "--always", "--dirty"], capture_output=True,
                                text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    info: dict[str, str | int] = {
        "cpu": model, "cpus": os.cpu_count() or 0, "torch": torch.__version__, "threads": torch.get_num_threads(),
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"), "commit": commit,
        "load_average": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    return info


def make_decoder(*, annotation_dim: int, device: str) -> AttentionDecoder:
    torch.manual_seed(0)
    attention = SoftAttention(AdditiveScore(annotation_dim=annotation_dim, hidden_dim=HIDDEN, attention_dim=ATTENTION))
    decoder = AttentionDecoder(vocab_size=VOCAB, annotation_dim=annotation_dim, embed_dim=EMBED, hidden_dim=HIDDEN,
                               attention=attention, gate="scalar", dropout=0.3)
    decoder.accelerator = accelerator_for(decoder)  # the package's fast path, as build_decoder hands it out
    return decoder.to(device)


def make_tokens(batch: int, generator: torch.Generator) -> torch.Tensor:
    """[B, T] <start> w1 .. wn <end> <pad> .., lengths uniform in SHORTEST..LONGEST tokens."""
    lengths = torch.randint(SHORTEST, LONGEST + 1, (batch,), generator=generator)
    tokens = torch.full((batch, int(lengths.max())), Vocabulary.pad_id, dtype=torch.long)
    for row, n in enumerate(lengths.tolist()):
        tokens[row, 0] = Vocabulary.start_id
        tokens[row, 1:n - 1] = torch.randint(4, VOCAB, (n - 2,), generator=generator)
        tokens[row, n - 1] = Vocabulary.end_id
    return tokens


class Implementation:
    """Whose code runs the teacher-forced forward and the beam search."""

    def __init__(self, name: str):
        self.name = name
        if name == "fast":
            from captioning.model import decoding

            self.forward = lambda decoder, annotations, inputs, lengths: decoder(annotations, inputs, lengths=lengths)
            self.beam_search = decoding.beam_search
        elif name == "reference":
            from implementations import reference

            self.forward = lambda decoder, annotations, inputs, lengths: reference.forward(decoder, annotations,
                                                                                              inputs)
            self.beam_search = reference.beam_search
        elif name == "stepwise":  # the package with model.fused=false: AttentionDecoder._advance at every step
            from captioning.model import decoding

            self.forward = _unfused(lambda decoder, annotations, inputs, lengths: decoder(annotations, inputs,
                                                                                         lengths=lengths))
            self.beam_search = _unfused(decoding.beam_search)
        elif name == "port":
            from implementations import port_style

            self.forward = port_style.forward
            self.beam_search = port_style.beam_search
        else:
            raise ValueError(f"unknown implementation '{name}' (known: {', '.join(IMPLEMENTATIONS)})")


IMPLEMENTATIONS = ("fast", "stepwise", "reference", "port")


def _unfused(call: Callable[..., object]) -> Callable[..., object]:
    """`call(decoder, ...)` with the decoder's fused path off for the call (ab.py shares one decoder
    between implementations)."""
    def unfused(decoder, *args, **kwargs):
        accelerator, decoder.accelerator = decoder.accelerator, None
        try:
            return call(decoder, *args, **kwargs)
        finally:
            decoder.accelerator = accelerator
    return unfused


# ----------------------------------------------------------------------------------------------- timing

def timed(fn: Callable[[], object], *, warmup: int, repeats: int, device: str) -> list[float]:
    def sync() -> None:
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    for _ in range(warmup):
        fn()
    sync()
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        seconds.append(time.perf_counter() - start)
    return seconds


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


# ----------------------------------------------------------------------------------------------- cases

def training_case(args: argparse.Namespace, impl: Implementation, *, batch: int, cells: int, channels: int,
                  with_encoder: bool) -> dict[str, float]:
    device = args.device
    generator = torch.Generator().manual_seed(1)
    encoder = None
    if with_encoder:
        import torchvision

        from captioning.model.encoder import Encoder

        torch.manual_seed(0)
        resnet = torchvision.models.resnet101(weights=None)  # random weights: only the arithmetic matters
        body = torch.nn.Sequential(resnet.conv1, resnet.bn1, resnet.relu, resnet.maxpool, resnet.layer1,
                                   resnet.layer2, resnet.layer3)  # stride 16, 1024 channels
        encoder = Encoder(body=body, dim=1024, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
        encoder = encoder.requires_grad_(False).eval().to(device)
        channels = encoder.dim
    decoder = make_decoder(annotation_dim=channels, device=device).train()
    optimizer = torch.optim.Adam(decoder.parameters(), lr=1e-4, **({"fused": True} if args.fused_adam else {}))
    forward = impl.forward
    if args.compile:
        forward = torch.compile(forward, dynamic=True)
    # A few different batches, cycled: the lengths (and so the work) vary from step to step as in training.
    batches = []
    for _ in range(4):
        if encoder is not None:
            inputs = torch.randn(batch, 3, args.image_size, args.image_size, generator=generator)
        else:
            inputs = torch.randn(batch, cells, channels, generator=generator)
        batches.append((inputs.to(device), make_tokens(batch, generator).to(device)))
    counter = iter(range(10**9))
    autocast = (torch.autocast(device_type=device.split(":")[0], dtype=torch.bfloat16) if args.amp == "bf16"
                else nullcontext())

    def step() -> None:
        source, tokens = batches[next(counter) % len(batches)]
        inputs, targets = tokens[:, :-1], tokens[:, 1:]  # [B, T-1]
        mask = (targets != Vocabulary.pad_id).float()
        lengths = mask.sum(1).long()  # [B] real steps
        with autocast:
            if encoder is not None:
                with torch.no_grad():
                    annotations, _ = encoder(source)  # frozen: no graph through the CNN
            else:
                annotations = source
            output = forward(decoder, annotations, inputs, lengths)
            loss = cross_entropy(output.logits.float(), targets, mask) + doubly_stochastic(output.alphas.float(), mask)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    seconds = timed(step, warmup=args.warmup, repeats=args.repeats, device=device)
    median = statistics.median(seconds)
    key = "images_per_s" if with_encoder else "captions_per_s"
    return {key: batch / median, "batch": batch, "seconds_median": median, "seconds_min": min(seconds),
            "seconds_max": max(seconds), "repeats": len(seconds)}


def beam_case(args: argparse.Namespace, impl: Implementation, *, beam_size: int) -> dict[str, float]:
    device = args.device
    decoder = make_decoder(annotation_dim=2048, device=device).eval()
    generator = torch.Generator().manual_seed(2)
    autocast = (torch.autocast(device_type=device.split(":")[0], dtype=torch.bfloat16) if args.amp == "bf16"
                else nullcontext())
    search = impl.beam_search
    if args.compile:  # the per-step function of the search; untested on a GPU so far (docs/benchmarks.md)
        from captioning.model import fused

        decoder.next_word = torch.compile(decoder.next_word)  # the step-by-step path (any other attention)
        fused.GroupedStep.__call__ = torch.compile(fused.GroupedStep.__call__)  # the default decoder's path

    def run(annotations: torch.Tensor) -> Callable[[], object]:
        def go() -> object:
            with autocast:
                captions = search(decoder, annotations, beam_size=beam_size, max_length=BEAM_STEPS,
                                  min_length=BEAM_STEPS)
            assert captions.tokens.shape[1] == BEAM_STEPS  # the timing mode must not stop early
            return captions
        return go

    # "As many images at once as is fastest": a short trial of each candidate batch, then the real run.
    trials = {}
    for images in args.beam_batches:
        annotations = torch.randn(images, 196, 2048, generator=generator).to(device)
        seconds = timed(run(annotations), warmup=1, repeats=1, device=device)
        trials[images] = images / seconds[0]
    best = max(trials, key=trials.get) if len(trials) > 1 else args.beam_batches[0]
    annotations = torch.randn(best, 196, 2048, generator=generator).to(device)
    seconds = timed(run(annotations), warmup=args.warmup, repeats=args.repeats, device=device)
    median = statistics.median(seconds)
    return {"images_per_s": best / median, "batch": best, "seconds_median": median, "seconds_min": min(seconds),
            "seconds_max": max(seconds), "repeats": len(seconds),
            "trial_images_per_s": {str(k): round(v, 2) for k, v in trials.items()}}


def make_photos(count: int, folder: Path) -> list[Path]:
    """`count` 640x480 JPEGs of smooth random colour (decoding them costs what a photo's decoding costs)."""
    import numpy as np
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / f"photo_{i:04d}.jpg" for i in range(count)]
    rng = np.random.default_rng(0)
    for path in paths:
        if not path.exists():
            coarse = rng.integers(0, 256, (12, 16, 3), dtype=np.uint8)
            Image.fromarray(coarse).resize((640, 480), Image.BICUBIC).save(path, quality=90)
    return paths


def caption_case(args: argparse.Namespace) -> dict[str, object]:
    import copy
    import tempfile

    from captioning.api import Captioned, Captioner, image_files, reading_workers
    from captioning.config import load_config
    from captioning.data.images import load_image, to_tensor
    from captioning.data.vocab import SPECIALS
    from captioning.model.decoding import decode
    from captioning.model.encoder_decoder import EncoderDecoder

    config = load_config(None, [f"decode.max_length={args.caption_words}"])  # the embedded default
    torch.manual_seed(0)
    vocab = Vocabulary([*SPECIALS, *(f"w{i}" for i in range(VOCAB - len(SPECIALS)))])
    model = EncoderDecoder.from_config(config, vocab_size=len(vocab), grid=(14, 14))
    with torch.no_grad():  # no special token: every caption has max_length words, the same work for every image
        model.decoder.out.bias[[Vocabulary.pad_id, Vocabulary.start_id, Vocabulary.end_id]] = -1e4
    before = copy.deepcopy(model).to(args.device).eval()  # as the command ran before: default layout, whole batches
    captioner = Captioner(model, vocab, config, device=args.device)
    paths = make_photos(args.photos, Path(tempfile.gettempdir()) / "captioning_benchmark_photos")
    batch = args.caption_batch
    workers = args.caption_workers if args.caption_workers is not None else reading_workers()

    def batched(overlays: Path | None = None) -> list[Captioned]:
        results = []
        for result in captioner.caption_files(paths, batch_size=batch, num_workers=workers, beam_size=3):
            if overlays is not None:
                result.save_overlays(overlays / Path(result.source).stem)
            results.append(result)
        return results

    def previous_command(path: Path) -> list[str]:  # the loop `captioning caption` ran before captioning.api
        image = load_image(path)
        pixels = to_tensor(image, size=config.data.image_size, mean=before.encoder.mean, std=before.encoder.std)
        with torch.no_grad():
            annotations, _ = before.encoder(pixels[None].to(args.device))
        captions = decode(before.decoder, annotations, beam_size=3, max_length=config.decode.max_length)
        return vocab.decode(captions.tokens[0].tolist())

    captioner.caption(paths[:2], beam_size=3)  # warm-up
    previous_command(paths[0])
    start = time.perf_counter()
    previous = [previous_command(path) for path in paths]
    previous_seconds = time.perf_counter() - start
    start = time.perf_counter()
    alone = [captioner.caption(path, beam_size=3) for path in paths]
    one_at_a_time = time.perf_counter() - start
    start = time.perf_counter()
    together = batched()
    in_batches = time.perf_counter() - start
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        batched(Path(out))
        with_overlays = time.perf_counter() - start
    same = [r.tokens for r in alone] == [r.tokens for r in together] == previous

    # Where the batched time goes: each stage alone, in this process, over the same images.
    photos = image_files(paths, size=config.data.image_size, mean=model.encoder.mean, std=model.encoder.std)
    start = time.perf_counter()
    pixels = [photos[i][1] for i in range(len(photos))]
    reading = time.perf_counter() - start
    encoding = decoding = 0.0
    with torch.no_grad():
        for first in range(0, len(pixels), batch):
            start = time.perf_counter()
            annotations, _ = captioner.model.encode(torch.stack(pixels[first:first + batch]).to(args.device))
            encoding += time.perf_counter() - start
            start = time.perf_counter()
            decode(model.decoder, annotations, beam_size=3, max_length=config.decode.max_length)
            decoding += time.perf_counter() - start
    count = len(paths)
    return {"images_per_s": count / in_batches, "one_at_a_time_images_per_s": count / one_at_a_time,
            "previous_command_images_per_s": count / previous_seconds,
            "speedup_over_previous": previous_seconds / in_batches,
            "with_overlays_images_per_s": count / with_overlays, "speedup": one_at_a_time / in_batches,
            "same_captions": same, "batch": batch, "workers": workers, "images": count,
            "words": args.caption_words, "stage_seconds": {"read": reading, "encode": encoding, "decode": decoding,
                                                            "overlays": with_overlays - in_batches,
                                                            "batched_total": in_batches}}


def encoder_case(args: argparse.Namespace) -> dict[str, object]:
    from captioning.model.encoder import build_encoder

    encoder = build_encoder(name="efficientnet_lite0", layer="stride16").eval().to(args.device)
    rates: dict[str, dict[str, float]] = {"nchw": {}, "channels_last": {}}
    with torch.no_grad():
        for batch in args.encoder_batches:
            for layout, memory_format in (("nchw", torch.contiguous_format), ("channels_last", torch.channels_last)):
                encoder = encoder.to(memory_format=memory_format)
                pixels = torch.randn(batch, 3, 224, 224).to(args.device).contiguous(memory_format=memory_format)
                for _ in range(2):  # warm-up
                    encoder(pixels)
                start, done = time.perf_counter(), 0
                while time.perf_counter() - start < args.encoder_seconds:
                    encoder(pixels)
                    done += batch
                if args.device.startswith("cuda"):
                    torch.cuda.synchronize()
                rates[layout][str(batch)] = done / (time.perf_counter() - start)
    layout, batch = max(((layout, batch) for layout in rates for batch in rates[layout]),
                        key=lambda key: rates[key[0]][key[1]])
    return {"images_per_s": rates[layout][batch], "batch": int(batch), "layout": layout, "images_per_s_by_batch": rates}


def shipped_case(args: argparse.Namespace) -> dict[str, object]:
    import tempfile

    from captioning.api import Captioner, image_files
    from captioning.model.decoding import decode
    from captioning.model.encoder_decoder import EncoderDecoder
    from captioning.model.ensemble import JoinedEncoder

    shipped = Captioner.from_pretrained(device=args.device)
    ensemble, joined = shipped.model.decoder, shipped.model.encoder
    # its first decoder alone, over its own encoder (a joined encoder's first view)
    own = joined.encoders[ensemble.views[0]] if isinstance(joined, JoinedEncoder) else joined
    alone = Captioner(EncoderDecoder(encoder=own, decoder=ensemble.members[0]), shipped.vocab, shipped.config,
                      device=args.device)
    paths = make_photos(args.photos, Path(tempfile.gettempdir()) / "captioning_benchmark_photos")
    batch, decoding = args.caption_batch, shipped.config.decode

    def captioned(captioner: Captioner) -> Callable[[], object]:
        return lambda: list(captioner.caption_files(paths, batch_size=batch, num_workers=0))

    seconds: dict[str, list[float]] = {"shipped": [], "alone": []}
    for captioner in (shipped, alone):  # warm-up
        list(captioner.caption_files(paths[:batch], batch_size=batch, num_workers=0))
    for _ in range(args.repeats):  # taking turns, so that a change in the machine's load touches both alike
        for name, captioner in (("shipped", shipped), ("alone", alone)):
            seconds[name] += timed(captioned(captioner), warmup=0, repeats=1, device=args.device)
    # each stage alone, over the same images
    photos = image_files(paths, size=shipped.config.data.image_size, mean=joined.mean, std=joined.std)
    pixels = [photos[i][1] for i in range(len(photos))]
    stages = {"encode": 0.0, "encode_alone": 0.0, "decode_shipped": 0.0, "decode_alone": 0.0}
    with torch.no_grad():
        for first in range(0, len(pixels), batch):
            chunk = torch.stack(pixels[first:first + batch]).to(args.device)
            start = time.perf_counter()
            annotations, _ = shipped.model.encode(chunk)
            stages["encode"] += time.perf_counter() - start
            start = time.perf_counter()
            alone.model.encode(chunk)
            stages["encode_alone"] += time.perf_counter() - start
            firsts = ensemble.annotations(annotations)[0]  # the first decoder's own view
            for name, decoder, source in (("decode_shipped", ensemble, annotations),
                                          ("decode_alone", alone.model.decoder, firsts)):
                start = time.perf_counter()
                decode(decoder, source, beam_size=decoding.beam_size, max_length=decoding.max_length,
                       length_penalty=decoding.length_penalty, no_repeat_ngram=decoding.no_repeat_ngram,
                       allow_unk=decoding.allow_unk)
                stages[name] += time.perf_counter() - start
    count, shipped_s, alone_s = len(paths), statistics.median(seconds["shipped"]), statistics.median(seconds["alone"])
    return {"images_per_s": count / shipped_s, "alone_images_per_s": count / alone_s, "cost": shipped_s / alone_s,
            "decoders": len(ensemble.members), "images": count, "batch": batch, "repeats": args.repeats,
            "stage_seconds": stages}


def run_case(case: str, args: argparse.Namespace) -> dict[str, float]:
    impl = Implementation(args.impl)
    if case == "a":
        result = training_case(args, impl, batch=32, cells=196, channels=2048, with_encoder=False)
    elif case == "b":
        result = training_case(args, impl, batch=64, cells=49, channels=512, with_encoder=False)
    elif case in ("c3", "c5"):
        result = beam_case(args, impl, beam_size=int(case[1]))
    elif case == "d":
        result = training_case(args, impl, batch=8, cells=0, channels=0, with_encoder=True)
    elif case == "caption":
        result = caption_case(args)
    elif case == "encoder":
        result = encoder_case(args)
    elif case == "shipped":
        result = shipped_case(args)
    else:
        raise ValueError(f"unknown case '{case}' (known: {', '.join(CASES)})")
    result["peak_rss_mib"] = peak_rss_mib()
    if args.device.startswith("cuda"):
        result["peak_cuda_mib"] = torch.cuda.max_memory_allocated() / 2**20
    return result


def describe(case: str, result: dict) -> str:
    if case == "caption":
        stages = result["stage_seconds"]
        split = ", ".join(f"{name} {stages[name]:.1f} s" for name in ("read", "encode", "decode", "overlays"))
        return (f"caption {result['images_per_s']:.2f} images/s in batches of {result['batch']} with "
                f"{result['workers']} reading workers, {result['one_at_a_time_images_per_s']:.2f} one at a time "
                f"({result['speedup']:.2f}x), {result['previous_command_images_per_s']:.2f} as the command ran before "
                f"({result['speedup_over_previous']:.2f}x), {result['with_overlays_images_per_s']:.2f} with overlays; "
                f"{result['images']} images, {result['words']} words each, same captions: {result['same_captions']}; "
                f"stages alone: {split} (batched total {stages['batched_total']:.1f} s)  "
                f"peak RSS {result['peak_rss_mib']:.0f} MiB")
    if case == "encoder":
        rates = result["images_per_s_by_batch"]
        cells = ", ".join(f"{batch}: {rates['nchw'][batch]:.1f} / {rates['channels_last'][batch]:.1f}"
                          for batch in rates["nchw"])
        return (f"encoder images/s by batch, NCHW / channels-last: {cells}; fastest {result['images_per_s']:.1f} "
                f"at {result['batch']} in {result['layout']}  peak RSS {result['peak_rss_mib']:.0f} MiB")
    if case == "shipped":
        stages = result["stage_seconds"]
        return (f"shipped {result['images_per_s']:.2f} images/s with its {result['decoders']} decoders, "
                f"{result['alone_images_per_s']:.2f} with the first alone ({result['cost']:.2f}x the time), median of "
                f"{result['repeats']} rounds of {result['images']} images in batches of {result['batch']}; stages "
                f"alone: encode {stages['encode']:.1f} s (all) / {stages['encode_alone']:.1f} s (first alone), decode "
                f"{stages['decode_shipped']:.1f} s (all) / {stages['decode_alone']:.1f} s (first alone)  "
                f"peak RSS {result['peak_rss_mib']:.0f} MiB")
    unit = "captions/s" if "captions_per_s" in result else "images/s"
    rate = result.get("captions_per_s", result.get("images_per_s"))
    extra = f", tried {result['trial_images_per_s']}" if "trial_images_per_s" in result else ""
    memory = f", peak CUDA {result['peak_cuda_mib']:.0f} MiB" if "peak_cuda_mib" in result else ""
    return (f"{case:<3} {rate:8.2f} {unit:<10}  batch {result['batch']:<3}  step {result['seconds_median']:.3f} s "
            f"median of {result['repeats']} (min {result['seconds_min']:.3f}, max {result['seconds_max']:.3f})  "
            f"peak RSS {result['peak_rss_mib']:.0f} MiB{memory}{extra}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated, from " + ",".join(CASES))
    parser.add_argument("--json", type=Path, help="write {case: {captions_per_s | images_per_s, ...}} here")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--impl", default="fast", choices=IMPLEMENTATIONS)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--amp", default="none", choices=("none", "bf16"), help="autocast dtype")
    parser.add_argument("--compile", action="store_true",
                        help="torch.compile the teacher-forced forward (a, b, d) / the decoding step (c3, c5)")
    parser.add_argument("--no-fused-adam", dest="fused_adam", action="store_false",
                        help="torch's default Adam instead of the fused kernel")
    parser.add_argument("--beam-batches", default="8,16,32,64",
                        help="images at once to try for c3/c5; the fastest is used and reported")
    parser.add_argument("--image-size", type=int, default=256)
    parser.add_argument("--photos", type=int, default=256, help="caption: how many 640x480 JPEGs")
    parser.add_argument("--caption-words", type=int, default=12, help="caption: words per caption")
    parser.add_argument("--caption-batch", type=int, default=16, help="caption: images per batch")
    parser.add_argument("--caption-workers", type=int, help="caption: processes reading the images (default: "
                        "what `captioning caption` takes, captioning.api.reading_workers)")
    parser.add_argument("--encoder-batches", default="1,2,4,8,16", help="encoder: images at once to time")
    parser.add_argument("--encoder-seconds", type=float, default=3.0, help="encoder: seconds per batch size and layout")
    parser.add_argument("--one-case", help=argparse.SUPPRESS)  # internal: run one case in this process
    args = parser.parse_args(argv)
    args.beam_batches = [int(x) for x in args.beam_batches.split(",")]
    args.encoder_batches = [int(x) for x in args.encoder_batches.split(",")]
    if args.threads is not None:
        torch.set_num_threads(args.threads)

    if args.one_case:
        print(json.dumps(run_case(args.one_case, args)))
        return

    info = machine()
    print(f"# {info['date']}  {info['cpu']} ({info['cpus']} CPUs, load {info['load_average']})  torch {info['torch']}"
          f"  threads {info['threads']}  device {args.device}{' ' + info['gpu'] if 'gpu' in info else ''}"
          f"  amp {args.amp}  compile {args.compile}  impl {args.impl}  commit {info['commit']}", flush=True)
    results: dict[str, object] = {"machine": info, "settings": {
        "impl": args.impl, "device": args.device, "amp": args.amp, "compile": args.compile,
        "repeats": args.repeats, "warmup": args.warmup, "fused_adam": args.fused_adam}}
    passthrough = list(argv if argv is not None else sys.argv[1:])
    for case in args.cases.split(","):
        if case not in CASES:
            parser.error(f"unknown case '{case}' (known: {', '.join(CASES)})")
        command = [sys.executable, __file__, *passthrough, "--one-case", case]
        if args.threads is None:
            command += ["--threads", str(torch.get_num_threads())]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            print(f"{case:<3} failed:\n{done.stderr[-3000:]}", flush=True)
            results[case] = {"error": done.stderr[-3000:]}
            continue
        result = json.loads(done.stdout.strip().splitlines()[-1])
        results[case] = result
        print(describe(case, result), flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
