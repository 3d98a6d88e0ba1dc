"""The config's schema: one dataclass per section, their defaults, and the error every check raises.

The paper's model is `ModelConfig` itself; hard attention's own settings are `model.hard`,
REINFORCE's are `train.reinforce`, and the options that are not in the paper are `model.extras`
(captioning/model/extras). A plugin's own settings are not here: the score, dataset format or
objective registers their dataclass where it is defined (`model.cosine` with the cosine score,
`data.folder` with the folder format, `train.scst` with self-critical training), and the section it
belongs to holds them (`Extensible`).
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

from captioning.config.registry import ConfigError, added_sections

__all__ = ["Config", "ConfigError", "DataConfig", "DecodeConfig", "EncoderConfig", "Extensible", "ExtrasConfig",
           "HardConfig", "ModelConfig", "ReinforceConfig", "TrainConfig", "as_dict", "settings_of"]


class Extensible:
    """A section that registered plugins add their settings to (data, model, train).

    Its own settings are its dataclass's fields. A plugin's section (model.cosine, data.folder,
    train.scst) is set on each instance as it is made, from the dataclass the plugin registered
    (captioning.config.registry: `register(name, settings=...)`); making one imports the registering
    modules first. `settings_of` and `as_dict` list both, and equality and repr see both; copy a
    section with copy.deepcopy, not dataclasses.replace, which knows the fields only.
    """

    section: ClassVar[str]  # its name in the config ("model")

    def __post_init__(self) -> None:
        own = {item.name for item in dataclasses.fields(self)}
        for name, settings in added_sections(self.section).items():
            if name in own:  # it would replace the section's own setting without a word
                raise ValueError(f"{self.section}.{name} is a setting of the config's own; a plugin named "
                                 f"{name} cannot add its settings there")
            setattr(self, name, settings())

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and as_dict(self) == as_dict(other)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{name}={getattr(self, name)!r}' for name in settings_of(self))})"


def settings_of(section: Any) -> dict[str, Any]:
    """A section's settings and subsections by name, each with its annotated type: its dataclass's
    fields (the annotation as written), then the sections plugins added to it (their dataclass)."""
    names: dict[str, Any] = {item.name: item.type for item in dataclasses.fields(section)}
    if isinstance(section, Extensible):  # a plugin registered after this section was made is not in it
        names.update({name: kind for name, kind in added_sections(section.section).items() if name in vars(section)})
    return names


def as_dict(section: Any) -> dict[str, Any]:
    """A section as plain data, its subsections (a plugin's too) nested: what a checkpoint stores."""
    return {name: as_dict(value) if dataclasses.is_dataclass(value) else copy.deepcopy(value)
            for name in settings_of(section) for value in (getattr(section, name),)}


@dataclass(eq=False, repr=False)
class DataConfig(Extensible):
    section: ClassVar[str] = "data"

    # shapes | coco | flickr8k | flickr30k | karpathy (any Karpathy-format split file): read from
    # `split_file`; coco_official: the official captions_*2014.json files (data.coco_official);
    # folder: a folder of your own images and its captions file (data.folder).
    dataset: str = "shapes"
    root: str = "data/shapes"  # every relative path below is relative to this folder
    # Where a run keeps what it computes from the data (features/: the feature caches, tokens/:
    # the tokenized captions); None: data.root. Set it where data.root is read-only (a cluster's
    # dataset mount, a shared download).
    cache_root: str | None = None
    split_file: str = "dataset_shapes.json"  # Karpathy-format: dataset_coco.json, dataset_flickr8k.json ...
    image_dir: str = ""  # images are image_dir/filepath/filename (Flickr entries have no filepath)
    # The captions from a file in Flickr8k's token format (`<image file>#<i><TAB><caption>`, UTF-8)
    # in place of the split file's sentences: Flickr8k.token.txt, or captions of the same photos in
    # another language (Flickr8k.de.token.txt). The split file still says which image is in which
    # split; an image the file gives no caption is left out, and one line counts them. Karpathy-format
    # datasets only; None: the split file's own sentences.
    token_file: str | None = None
    # The captions' language, as a tag (en, de, pt-BR): how they are tokenized (English by the Treebank's
    # rules, any other language by Unicode words) and scored (METEOR and the PTB tokenizer are English's).
    language: str = "en"
    image_size: int = 224  # the encoder's square input; the shorter side is resized, then centre-cropped
    min_word_count: int = 1  # a word seen fewer times in the training captions becomes <unk> (COCO's configs: 5)
    max_caption_length: int = 20  # clips training targets only, never references
    feature_cache: bool = True  # frozen encoder: train on cached annotations; False runs it on the fly
    bucket_batches: bool = True  # batches of captions of similar length (less padding per step)
    # Training images only, with the encoder on the fly: a random square crop of 80-100% of the
    # shorter side and colour jitter (data/images.py). Never a plain horizontal flip: it would make
    # "to the left of" in the caption false (data.mirror flips the image and swaps the words).
    augment: bool = False
    # Training pairs only (not in the paper): on a coin per pair and epoch, the image mirrored
    # left-right and "left" and "right" swapped in its caption (data/flips.py).
    mirror: bool = False
    # The first N images of each split whose files are on disk (None: all): a quick look at a
    # partial download, and what `train.py --dry-run` uses. Their feature cache is kept apart, in
    # first<N>/ inside the whole splits' folder.
    max_images: int | None = None
    # The share of a split's images that may be unreadable (left out, and named) before the run stops.
    max_bad_images: float = 0.01
    # COCO's instances annotations (coco and coco_official), for CHAIR and attention correctness on the
    # object masks (eval/coco/); where neither file is there, evaluation says so and goes on without.
    train_instances: str = "annotations/instances_train2014.json"
    val_instances: str = "annotations/instances_val2014.json"  # val2014's, where the val and test images are


@dataclass
class EncoderConfig:
    name: str = "efficientnet_lite0"  # or resnet101, resnet152, vgg19 (resnet18/34/50 for small tests)
    layer: str = "stride16"  # stride16 (14x14 at 224²; vgg19: conv5_4) or stride32 (7x7 at 224², 14x14 at 448²)
    weights_path: str | None = None  # a local state dict, for machines that cannot download
    batch_size: int = 32  # when computing the feature cache
    padding: str = "zeros"  # how convolutions pad the border: zeros (as trained), reflect, replicate
    fine_tune_from: str | None = None  # e.g. layer4: train this stage and the later ones (no feature cache)
    # with fine_tune_from: the stages before it run once per image into a cache of their own, and a
    # step runs only the stages that train (data.feature_cache on, no data.augment)
    cache_frozen: bool = False
    lr: float = 1e-4  # the learning rate of the fine-tuned part


@dataclass
class HardConfig:
    """Hard attention's own settings (Sec. 4.1); model.attention=hard reads them."""

    expectation_prob: float = 0.5  # an image uses the soft expectation instead of samples (the paper: 0.5)
    coin: str = "image"  # one coin per image, or per "batch" (as the authors' code)
    warmup: int = 0  # steps over which that chance falls from 1 to expectation_prob (not in the paper)


@dataclass
class ExtrasConfig:
    """Options that are not in the paper (captioning/model/extras), all off by default."""

    init: str = "mean"  # h_0, c_0 from the mean annotation (the paper) or also the "layout" (extras/layout.py)
    glimpses: int = 1  # 2: a second soft glimpse per word (extras/glimpses.py)
    query_word: bool = False  # attention queried with [h_{t-1}; E y_{t-1}] (extras/query_word.py)
    position: str = "none"  # "learned" or "coordinates": 2-D position in the annotations (extras/position.py)
    unit_annotations: bool = False  # annotations rescaled to norm sqrt(D) (extras/unit_annotations.py)
    temperature: float = 1.0  # alpha = softmax(e / temperature)
    # Self-attention (Cheng et al., 2016): over the words said so far, its result in the attention
    # query (extras/word_attention.py); over the grid, with this many heads, before attention sees
    # the annotations (0: off; extras/grid_attention.py).
    word_attention: bool = False
    grid_attention: int = 0  # heads of self-attention over the grid (0: off)


@dataclass(eq=False, repr=False)
class ModelConfig(Extensible):
    section: ClassVar[str] = "model"

    embed_dim: int = 128  # m, the size of a word's embedding E y (Eqs. 1, 7)
    hidden_dim: int = 256  # n, the LSTM's size (Eqs. 1-3)
    attention_dim: int = 128  # the size of the score's hidden layer (f_att, Eq. 4)
    dropout: float = 0.3  # on h_t where the deep output reads it, and before L_o (Eq. 7)
    attention: str = "soft"  # how the weights are used: soft (Sec. 4.2) or hard (Sec. 4.1)
    score: str = "additive"  # the attention score function (captioning.model.scores.SCORES)
    gate: str = "scalar"  # the paper's scalar beta; "vector" is the per-channel gate some ports use
    # Eq. 7: "linear" as printed, L_o(E y + L_h h + L_z z); "tanh" as the authors' code, L_o(tanh(...)).
    deep_output: str = "linear"
    # How, not what: soft attention with the additive score trains and beam-searches through the
    # fused path (model/fused.py: the same equations, faster, with a hand-written backward); false
    # runs AttentionDecoder._advance step by step for every config, where an edit of it takes effect.
    fused: bool = True
    hard: HardConfig = field(default_factory=HardConfig)
    extras: ExtrasConfig = field(default_factory=ExtrasConfig)


@dataclass
class ReinforceConfig:
    """Hard attention's REINFORCE terms (Sec. 4.1); soft attention samples nothing and ignores them."""

    weight: float = 1.0  # lambda_r
    entropy_weight: float = 0.0  # lambda_e
    baseline: str = "moving_average"  # the paper's; none; leave_one_out (needs location_samples >= 2)
    baseline_decay: float = 0.9  # b <- decay b + (1 - decay) log p(y|s,a)
    location_samples: int = 1  # sequences of locations sampled per caption (its rows are repeated)
    weight_warmup: int = 0  # steps over which both terms grow from 0 to their weight (not in the paper)


@dataclass(eq=False, repr=False)
class TrainConfig(Extensible):
    section: ClassVar[str] = "train"

    out_dir: str = "runs/shapes_soft"  # the run's folder: best.pt, last.pt, vocab.json, log.jsonl, tensorboard/
    # Start from this checkpoint's weights and vocabulary, with a fresh optimizer, schedule and step
    # count (train/warm_start.py); --resume continues a run instead, and then this is ignored.
    init_from: str | None = None
    seed: int = 0  # the initial weights, the batches' order, dropout, hard attention's draws
    epochs: int = 8  # passes over the training pairs (or images, for scst)
    batch_size: int = 64  # captions per step (images, for scst)
    lr: float = 1e-3  # the decoder's learning rate (encoder.lr: a fine-tuned encoder's)
    optimizer: str = "adam"  # adam | rmsprop (the paper: RMSProp on Flickr8k, Adam on Flickr30k and COCO)
    grad_clip: float = 5.0  # the gradient's norm, over all parameters, is clipped to this
    # A step whose loss or gradient is not finite is skipped; this many in a row stop the run.
    max_bad_steps: int = 20
    # Doubly stochastic regularization: lambda of Eq. 14, the weight of sum_i (1 - sum_t alpha_ti)^2
    # against a caption's summed word costs (the authors' COCO scripts: 1; docs/attention.md).
    ds_lambda: float = 0.0
    # Validation keeps the checkpoint with the best val_metric of the validation split's captions,
    # decoded with val_beam_size (1: greedy; None: decode.beam_size; either with the decode section's
    # n-gram block and <unk> rule, and a beam with its length penalty) and tokenized with
    # val_tokenizer ("own": the project's, no Java; "ptb": pycocoevalcap's, as eval.py reports).
    # The defaults are fast; the real photos' configs
    # (coco_vgg19_soft.yaml and what builds on it, folder_soft.yaml) keep checkpoints on what eval.py
    # reports: null and ptb (on Flickr8k the defaults kept a checkpoint 0.013 BLEU-4 below another).
    val_metric: str = "CIDEr"
    val_beam_size: int | None = 1
    val_tokenizer: str = "own"
    lr_decay: float = 0.5  # multiply the learning rate by this when the metric stalls...
    lr_patience: int = 1  # ...for this many evaluations
    early_stop_patience: int = 3  # stop after this many evaluations without a better val_metric
    max_steps: int | None = None  # stop after this many optimizer steps (tests, quick looks)
    eval_every_steps: int | None = None  # also evaluate mid-epoch every this many steps
    val_images: int | None = None  # decode only the first N validation images when evaluating
    num_workers: int = 0  # processes that load the training batches (0: the training process itself)
    pin_memory: bool = True  # only used when training on a GPU
    tf32: bool = True  # TF32 matmuls and convolutions in fp32 on GPUs that have them (Ampere and later)
    # Under torchrun: how long (seconds) a process may wait for the others in one collective before
    # the run stops, naming what each process was doing (runtime/distributed.py).
    dist_timeout: float = 3600.0
    save_every_steps: int | None = None  # also write last.pt every this many steps (resume after a kill)
    log_every_steps: int = 10  # losses to TensorBoard and log.jsonl
    log_images: int = 3  # validation images with per-word overlays in TensorBoard at each evaluation
    amp: bool = False  # autocast: bf16 where supported, else fp16 with a gradient scaler
    # The whole step (forward, loss, backward, clipping, Adam) replayed as one CUDA graph per batch
    # shape, the captions padded to length buckets (train/graphed.py): for a GPU that waits on the
    # step's launches. The paper's objective on the fused path, in one process, on cached annotations.
    graph: bool = False
    # Not in the paper: target words whose cross-entropy counts this many times, e.g. {above: 4}
    # (train/extras/word_weights.py), and an average of the decoder's weights that is validated and
    # kept (train/extras/averaging.py; 0 = off).
    word_weights: dict[str, float] = field(default_factory=dict)
    ema_decay: float = 0.0  # the weights' average: its decay per applied step (0: off)
    # Not in the paper: terms added to the loss of either objective, by name with their weights, e.g.
    # {map_entropy: 0.01} (captioning.config.registry.TERMS; docs/architecture.md writes one).
    terms: dict[str, float] = field(default_factory=dict)
    reinforce: ReinforceConfig = field(default_factory=ReinforceConfig)
    # xe: cross-entropy on the references (the paper); scst: the CIDEr-D of sampled captions, from a
    # trained model (train.init_from), batches of train.batch_size images (train/scst.py).
    objective: str = "xe"


@dataclass
class DecodeConfig:
    beam_size: int = 3  # hypotheses kept per image (1: greedy)
    max_length: int = 20  # words in a caption at most
    # Beams ranked by score / n**alpha, n the tokens scored (the words, and <end> where emitted); 0 = raw log-prob
    length_penalty: float = 0.0
    # n > 0: no caption says the same n words twice in that order (0: off; not in the paper)
    no_repeat_ngram: int = 0
    allow_unk: bool = False  # let captions say <unk> (the rare words min_word_count dropped); never by default
    hard_choice: str = "expectation"  # how hard attention picks its cell: expectation, argmax or sample


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)

    def to_dict(self) -> dict[str, Any]:
        return as_dict(self)

