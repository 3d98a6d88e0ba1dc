"""The study's runs: each one's config, overrides and the table it belongs to (run.py trains and
scores them, tables.py sets them out)."""

from __future__ import annotations

from dataclasses import dataclass

METRICS = ("Bleu_1", "Bleu_4", "METEOR", "ROUGE_L", "CIDEr")


@dataclass(frozen=True)
class Run:
    group: str  # the table it belongs to
    label: str  # what it changes, as the table says it
    overrides: tuple[str, ...] = ()
    config: str = "flickr8k_soft.yaml"
    beam_size: int | None = None  # None: the config's (3)
    start: str | None = None  # SCST: the run whose best.pt it starts from (FIRST_SHIPPED: that file)
    decode: tuple[str, ...] = ()  # decode.* overrides when it is scored
    ablation: bool = False  # trained ABLATION_EPOCHS only, set beside the recipe's curve at that epoch
    split: str = "val"  # what it is scored on: train only to measure how a model fits its own training images
    members: tuple[str, ...] = ()  # an ensemble: the runs (or FIRST_SHIPPED) whose best.pt decode together


# The budget at which hard and soft attention are set side by side: the epochs the hard recipe needed
# to stop improving (hard_10ep's best epoch was its 9th), and the dropout that did better than the
# recipe's 0.5 after 3 epochs.
SIDE = ("train.epochs=10", "model.dropout=0.3")

# The wider decoder of the ablations: twice the recipe's embedding, hidden state and attention.
WIDE = ("model.embed_dim=512", "model.hidden_dim=1024", "model.attention_dim=512")

# Self-critical training's budget in the study: 2 epochs of 120 steps (train.max_steps the same, so a
# run stopped at 240 steps resumes as finished), validated every 60 steps, its losses every 5.
SCST_BUDGET = ("train.max_steps=240", "train.eval_every_steps=60", "train.log_every_steps=5")

# configs/flickr8k_hard.yaml as the first hard runs were trained, before it took what came closest to
# the paper's hard row (two location samples and the leave-one-out baseline, 10 epochs, dropout 0.3):
# the paper's moving-average baseline over one sample, and for the first runs 6 epochs at dropout 0.5
MOVING_AVERAGE = ("train.reinforce.location_samples=1", "train.reinforce.baseline=moving_average")
FIRST_HARD = ("train.epochs=6", "model.dropout=0.5", *MOVING_AVERAGE)

# The model the package shipped first: the first soft recipe's seed 1 (recipe_seed1), cut to fp16 by
# ship.py. The decoding table and one ensemble decode it; it is no longer in the package, and its
# run's best.pt is not kept, so run.py takes the file from the repository's history (run.first_shipped).
FIRST_SHIPPED = "first_shipped"

# How the first shipped model's run decoded, before the recipe took a length penalty and the n-gram block.
DECODED_AS_TRAINED = ("decode.length_penalty=0.0", "decode.no_repeat_ngram=0", "decode.allow_unk=false")

# The English captions of the photos that have German ones (languages.py writes the file under --cache):
# the English recipe trained and scored on the same photos as the German one.
SAME_PHOTOS_ENGLISH = "Flickr8k.en.photos_with_de.token.txt"

# An ablation trains this many epochs (of the recipe's 8) and is compared on the validation curve
# at that epoch, the recipe's own curve included: 2-core CPU time allows no more.
ABLATION_EPOCHS = 3


def _runs() -> dict[str, Run]:
    runs = {
        # what the decoder attends over: encoder x layer x input size (the images are 224² on disk)
        "lite0_stride16": Run("features", "EfficientNet-Lite0, stride 16, 224² (14x14x112)",
                              ("encoder.name=efficientnet_lite0", "encoder.layer=stride16"), ablation=True),
        "lite2_stride16": Run("features", "EfficientNet-Lite2, stride 16, 224² (14x14x120)",
                              ("encoder.layer=stride16",), ablation=True),
        "recipe": Run("features", "EfficientNet-Lite2, stride 32, 224² (7x7x352): the recipe"),
        # the recipe stopped where the ablations stop: their beam-3 numbers' reference
        "recipe_3ep": Run("recipe_3ep", "the recipe, 3 epochs", ablation=True),
        "lite2_head": Run("features", "EfficientNet-Lite2, head, 224² (7x7x1280)", ("encoder.layer=head",),
                          ablation=True),
        "lite2_160": Run("features", "EfficientNet-Lite2, stride 32, 160² (5x5x352)", ("data.image_size=160",),
                         ablation=True),
        "lite2_320": Run("features", "EfficientNet-Lite2, stride 32, 320² (10x10x352)", ("data.image_size=320",),
                         ablation=True),
        # the decoder's width and regularization
        "hidden256": Run("model", "embed 128, hidden 256, attention 128",
                         ("model.embed_dim=128", "model.hidden_dim=256", "model.attention_dim=128"), ablation=True),
        "hidden1024": Run("model", "embed 512, hidden 1024, attention 512",
                          WIDE, ablation=True),
        "dropout0.3": Run("model", "dropout 0.3", ("model.dropout=0.3",), ablation=True),
        "ds1": Run("model", "doubly stochastic λ = 1 (the authors' COCO script)", ("train.ds_lambda=1.0",),
                   ablation=True),
        # seeds of the final recipes
        "recipe_seed1": Run("seeds", "soft, seed 1", ("train.seed=1",)),
        "hard": Run("seeds", "hard, seed 0", FIRST_HARD, config="flickr8k_hard.yaml"),
        "hard_seed1": Run("seeds", "hard, seed 1", (*FIRST_HARD, "train.seed=1"), config="flickr8k_hard.yaml"),
        # hard attention's best checkpoint was its last at 6 epochs: the same recipe given 10
        "hard_10ep": Run("seeds", "hard, seed 0, 10 epochs", (*FIRST_HARD, "train.epochs=10"),
                         config="flickr8k_hard.yaml"),
        # self-critical training from the recipe's best.pt
        "scst": Run("scst", "SCST from the recipe", config="flickr8k_scst.yaml", start="recipe"),
        # Hard and soft side by side at one budget (10 epochs, dropout 0.3), each checkpoint kept on
        # what is reported (beam 3, the PTB tokenizer: the recipe's train.val_beam_size and val_tokenizer).
        "soft_side": Run("side", "soft, seed 0", SIDE),
        "hard_side": Run("side", "hard, seed 0", (*SIDE, *MOVING_AVERAGE), config="flickr8k_hard.yaml"),
        "soft_side_seed1": Run("side", "soft, seed 1", (*SIDE, "train.seed=1")),
        "hard_side_seed1": Run("side", "hard, seed 1", (*SIDE, *MOVING_AVERAGE, "train.seed=1"),
                               config="flickr8k_hard.yaml"),
        # two more soft seeds at the side-by-side budget: the second pair of an ensemble of two
        "soft_side_seed2": Run("side", "soft, seed 2", (*SIDE, "train.seed=2")),
        "soft_side_seed3": Run("side", "soft, seed 3", (*SIDE, "train.seed=3")),
        # the photos mirrored left-right for half the pairs of each epoch, "left" and "right" swapped in
        # their captions (data.mirror; from a second feature cache, of the mirrored photos)
        "soft_side_mirror": Run("stronger", "soft, seed 0, photos mirrored", (*SIDE, "data.mirror=true")),
        # the wider decoder of the ablations (embed 512, hidden 1024, attention 512) over the full schedule
        "wide_side": Run("stronger", "soft, seed 0, embed 512, hidden 1024, attention 512",
                         (*SIDE, *WIDE)),
        "wide_side_seed1": Run("stronger", "soft, seed 1, embed 512, hidden 1024, attention 512",
                               (*SIDE, *WIDE, "train.seed=1")),
        # stage 2 from soft_side's best.pt: Lite2's last block fine-tuned with the decoder, on the cache of
        # the blocks before it (encoder.cache_frozen)
        "finetune_block6": Run("stronger", "soft, seed 0, then block6 fine-tuned 4 epochs",
                               ("model.dropout=0.3",), config="flickr8k_finetune.yaml", start="soft_side"),
        "finetune_block6_seed1": Run("stronger", "soft, seed 1, then block6 fine-tuned 4 epochs",
                                     ("model.dropout=0.3", "train.seed=1"), config="flickr8k_finetune.yaml",
                                     start="soft_side_seed1"),
        # the same from block5 (five of Lite2's layers more, at 7x7): the cache holds block4's output
        "finetune_block5": Run("stronger", "soft, seed 0, then block5 and block6 fine-tuned 4 epochs",
                               ("model.dropout=0.3", "encoder.fine_tune_from=block5"),
                               config="flickr8k_finetune.yaml", start="soft_side"),
        "finetune_block5_seed1": Run("stronger", "soft, seed 1, then block5 and block6 fine-tuned 4 epochs",
                                     ("model.dropout=0.3", "encoder.fine_tune_from=block5", "train.seed=1"),
                                     config="flickr8k_finetune.yaml", start="soft_side_seed1"),
        # and from block4 (its four layers at 14x14): the cache holds block3's output
        "finetune_block4": Run("stronger", "soft, seed 0, then blocks 4 to 6 fine-tuned 4 epochs",
                               ("model.dropout=0.3", "encoder.fine_tune_from=block4"),
                               config="flickr8k_finetune.yaml", start="soft_side"),
        "finetune_block4_seed1": Run("stronger", "soft, seed 1, then blocks 4 to 6 fine-tuned 4 epochs",
                                     ("model.dropout=0.3", "encoder.fine_tune_from=block4", "train.seed=1"),
                                     config="flickr8k_finetune.yaml", start="soft_side_seed1"),
        # captions in German (Multi30k's descriptions of 5 528 train and 934 val photos): the recipe's
        # encoder, decoder and budget, two seeds, beside the English recipe on the same photos
        "de": Run("language", "German, seed 0", config="flickr8k_de_soft.yaml"),
        "de_seed1": Run("language", "German, seed 1", ("train.seed=1",), config="flickr8k_de_soft.yaml"),
        "en_de_photos": Run("language", "English, seed 0, the same photos",
                            (f"data.token_file={{cache}}/{SAME_PHOTOS_ENGLISH}",)),
        # several checkpoints decoded together (captioning.model.ensemble; no training)
        "ensemble_seeds01": Run("ensemble", "soft seeds 0 and 1", members=("soft_side", "soft_side_seed1")),
        "ensemble_seeds23": Run("ensemble", "soft seeds 2 and 3", members=("soft_side_seed2", "soft_side_seed3")),
        "ensemble_seeds01_shipped": Run("ensemble", "soft seeds 0 and 1 and the first shipped model",
                                        members=("soft_side", "soft_side_seed1", FIRST_SHIPPED)),
        # how far decoding together goes: all four seeds (35 MiB in fp16, over what may ship)
        "ensemble_seeds0123": Run("ensemble", "soft seeds 0 to 3",
                                  members=("soft_side", "soft_side_seed1", "soft_side_seed2", "soft_side_seed3")),
    }
    # Self-critical training's budget, from the best cross-entropy model on val (soft_side_seed1):
    # 240 steps of 50 images (2 epochs), validated every 60 steps as eval.py reports. The first runs
    # sampled with flickr8k_scst.yaml's dropout (the recipe's 0.5) where their start was trained with
    # 0.3; the rest keep the start's 0.3.
    for name, label, overrides in (
            ("loo_lr5e-5", "dropout 0.5, leave-one-out baseline, lr 5e-5",
             ("train.lr=0.00005", "train.scst.baseline=leave_one_out")),
            ("loo_lr2e-4", "dropout 0.5, leave-one-out baseline, lr 2e-4",
             ("train.lr=0.0002", "train.scst.baseline=leave_one_out")),
            # stopped at its first validation: val CIDEr had fallen by a quarter
            ("greedy_lr5e-4", "dropout 0.5, greedy baseline, lr 5e-4, stopped after 60 steps",
             ("train.lr=0.0005", "train.max_steps=60")),
            ("d3_greedy_lr5e-5", "greedy baseline, lr 5e-5 (Rennie et al.)", ("train.lr=0.00005", "model.dropout=0.3")),
            ("d3_loo_lr5e-5", "leave-one-out baseline, lr 5e-5",
             ("train.lr=0.00005", "train.scst.baseline=leave_one_out", "model.dropout=0.3")),
            ("d3_loo_lr2e-4", "leave-one-out baseline, lr 2e-4",
             ("train.lr=0.0002", "train.scst.baseline=leave_one_out", "model.dropout=0.3"))):
        runs[f"scst_{name}"] = Run("scst_budget", label, (*SCST_BUDGET, *overrides), config="flickr8k_scst.yaml",
                                   start="soft_side_seed1")
    # the setting that paid, given 8 epochs, validated every 120 steps, stopped after 3 validations without gain
    runs["scst_d3_greedy_lr5e-5_long"] = Run(
        "scst_budget", "greedy baseline, lr 5e-5, up to 8 epochs",
        ("train.lr=0.00005", "model.dropout=0.3", "train.epochs=8", "train.eval_every_steps=120",
         "train.log_every_steps=5", "train.early_stop_patience=3"),
        config="flickr8k_scst.yaml", start="soft_side_seed1")
    # the setting that paid (greedy baseline, lr 5e-5, dropout 0.3) from the other seed of the pair
    # decoded together, and the two self-critical models decoded together: SCST on top of the ensemble
    runs["scst_d3_greedy_lr5e-5_seed0"] = Run("stronger", "soft, seed 0, then SCST (greedy baseline, lr 5e-5)",
                                              (*SCST_BUDGET, "train.lr=0.00005", "model.dropout=0.3"),
                                              config="flickr8k_scst.yaml", start="soft_side")
    runs["ensemble_scst01"] = Run("stronger", "soft seeds 0 and 1, each after SCST, decoded together",
                                  members=("scst_d3_greedy_lr5e-5_seed0", "scst_d3_greedy_lr5e-5"))
    # SCST paid on seed 1 and not on seed 0: each seed as it scored best, decoded together
    runs["ensemble_seed0_scst1"] = Run("stronger", "soft seed 0, and seed 1 after SCST, decoded together",
                                       members=("soft_side", "scst_d3_greedy_lr5e-5"))
    # that pair decoded otherwise (the recipe's decoding was chosen on val with one model)
    pair = runs["ensemble_seed0_scst1"].members
    for name, label, beam, decode in (
            ("beam5", "beam 5", 5, ()),
            ("lp1.5", "length penalty 1.5", None, ("decode.length_penalty=1.5",)),
            ("lp0.5", "length penalty 0.5", None, ("decode.length_penalty=0.5",)),
            ("ngram3", "no 3-gram twice (where the recipe blocks 2-grams)", None, ("decode.no_repeat_ngram=3",))):
        runs[f"ensemble_seed0_scst1_{name}"] = Run("stronger", f"the same pair, {label}", beam_size=beam,
                                                   decode=decode, members=pair)
    # the wider decoder's two seeds decoded together, and beside the pair shipped then (over what may ship in
    # fp16: how far wider members go)
    runs["ensemble_wide01"] = Run("stronger", "wider decoders, seeds 0 and 1, decoded together",
                                  members=("wide_side", "wide_side_seed1"))
    runs["ensemble_pair_wide01"] = Run("stronger", "the pair then shipped and both wider decoders, decoded together",
                                       members=(*pair, "wide_side", "wide_side_seed1"))
    # a decoder over Lite2 fine-tuned from block5 beside that pair: it reads its own encoder's
    # annotations (the joined encoder runs the stages before block5 once for all three)
    for seed in ("", "_seed1"):
        label = f"that pair and a decoder over Lite2 fine-tuned from block5 (seed {1 if seed else 0}), together"
        runs[f"ensemble_pair_block5{seed}"] = Run("stronger", label, members=(*pair, f"finetune_block5{seed}"))
    # self-critical training of the decoder fine-tuned from block5, over its own encoder (its blocks
    # run on block4's cache, unchanged): the setting that paid on seed 1, then that decoder in the trio
    runs["scst_finetune_block5"] = Run("stronger", "soft, seed 0, block5 and block6 fine-tuned, then SCST (greedy "
                                       "baseline, lr 5e-5)",
                                       (*SCST_BUDGET, "train.lr=0.00005", "model.dropout=0.3",
                                        "encoder.fine_tune_from=block5", "encoder.cache_frozen=true"),
                                       config="flickr8k_scst.yaml", start="finetune_block5")
    runs["ensemble_pair_scst_block5"] = Run("stronger", "that pair and the fine-tuned decoder after SCST, together",
                                            members=(*pair, "scst_finetune_block5"))
    # the shipped trio decoded otherwise (the recipe's decoding was chosen on val with one model)
    trio = runs["ensemble_pair_block5"].members
    for name, label, beam, decode in (("beam5", "beam 5", 5, ()),
                                      ("lp0.5", "length penalty 0.5", None, ("decode.length_penalty=0.5",))):
        runs[f"ensemble_pair_block5_{name}"] = Run("stronger", f"that pair and seed 0's fine-tuned decoder, {label}",
                                                   beam_size=beam, decode=decode, members=trio)
    # in the seed-0 trio, seed 0's frozen decoder shares its start with the fine-tuned one: a third seed's
    # in its place (seeds 2 and 3, each side by side with the others' recipe) makes three starts
    for seed in (2, 3):
        runs[f"ensemble_seed{seed}_scst1_block5"] = Run(
            "stronger", f"soft seed {seed}, seed 1 after SCST and seed 0 fine-tuned from block5, together",
            members=(f"soft_side_seed{seed}", "scst_d3_greedy_lr5e-5", "finetune_block5"))
    # hard attention's best cross-entropy model on val, its settings (dropout 0.3, the 50% substitution
    # from the first step: its warm-up is behind it)
    runs["scst_hard_loo_lr5e-5"] = Run("scst_budget", "hard attention: leave-one-out baseline, lr 5e-5",
                                       (*SCST_BUDGET, "train.lr=0.00005", "train.scst.baseline=leave_one_out",
                                        "model.dropout=0.3", "model.attention=hard", "model.hard.warmup=0"),
                                       config="flickr8k_scst.yaml", start="hard_side_seed1")
    # What holds hard attention back: one change at a time from hard_side (seed 0; 10 epochs, dropout
    # 0.3, the moving-average baseline, lambda_r 1, no entropy term, the 50% substitution after a
    # 2 000-step warm-up). hard_variance.py measures the REINFORCE gradient's noise under each baseline.
    for name, label, overrides in (
            ("loo2", "2 location samples per caption, leave-one-out baseline",
             ("train.reinforce.location_samples=2", "train.reinforce.baseline=leave_one_out")),
            ("weight0.1", "REINFORCE weight lambda_r 0.1", ("train.reinforce.weight=0.1",)),
            ("no_warmup", "no warm-up of the 50% substitution (the paper)", ("model.hard.warmup=0",)),
            ("entropy0.01", "entropy term lambda_e 0.01", ("train.reinforce.entropy_weight=0.01",)),
            # whether the sampled half is what costs: three images in four train on the expectation
            ("expect0.75", "the expectation for 3 images in 4 instead of 1 in 2",
             ("model.hard.expectation_prob=0.75",)),
            # whether a smaller step lets the noisy REINFORCE term do less harm
            ("lr2e-4", "learning rate 2e-4 (half the recipe's 4e-4)", ("train.lr=0.0002",))):
        runs[f"hard_{name}"] = Run("hard_budget", label, (*SIDE, *MOVING_AVERAGE, *overrides),
                                   config="flickr8k_hard.yaml")
    # half the learning rate was still climbing at its 10th epoch: the same given 15, over two seeds
    for seed in (0, 1):
        runs[f"hard_lr2e-4_15ep{'_seed1' if seed else ''}"] = Run(
            "hard_budget", f"learning rate 2e-4, 15 epochs, seed {seed}",
            (*SIDE, *MOVING_AVERAGE, "train.lr=0.0002", "train.epochs=15", f"train.seed={seed}"),
            config="flickr8k_hard.yaml")
    # the leave-one-out baseline's second seed: the paper's row is a mean of two
    runs["hard_loo2_seed1"] = Run("hard_budget", "2 location samples per caption, leave-one-out baseline, seed 1",
                                  (*runs["hard_loo2"].overrides, "train.seed=1"), config="flickr8k_hard.yaml")
    # hard attention's best recipe (two location samples, leave-one-out) given what gained soft attention
    # the most: Lite2 fine-tuned from block5 with the decoder, at soft's fine-tuning budget (4 epochs,
    # lr 1e-4), from each seed's best.pt; the substitution's warm-up is behind it
    for seed in (0, 1):
        runs[f"hard_finetune_block5{'_seed1' if seed else ''}"] = Run(
            "hard_finetune", f"hard, seed {seed}, then block5 and block6 fine-tuned 4 epochs",
            ("model.attention=hard", "model.dropout=0.3", "model.hard.warmup=0", "train.reinforce.location_samples=2",
             "train.reinforce.baseline=leave_one_out", "encoder.fine_tune_from=block5", f"train.seed={seed}"),
            config="flickr8k_finetune.yaml", start=f"hard_loo2{'_seed1' if seed else ''}")
    # whether hard attention's objective keeps a good model where it is: its recipe (two location
    # samples, leave-one-out, the 50% substitution from the first step) from soft attention's best.pt
    # of each seed (the same weights), 4 epochs at a quarter of the rate, as the fine-tuning above
    for seed in (0, 1):
        runs[f"hard_from_soft{'_seed1' if seed else ''}"] = Run(
            "hard_finetune", f"soft, seed {seed}, then trained as hard attention 4 epochs (lr 1e-4)",
            ("model.hard.warmup=0", "train.epochs=4", "train.lr=0.0001", f"train.seed={seed}"),
            config="flickr8k_hard.yaml", start=f"soft_side{'_seed1' if seed else ''}")
    # hard attention's best model decoded with each word's most likely cell instead of the expectation
    # (no training): whether what it learned is a hard choice or a soft one
    runs["hard_side_seed1_argmax"] = Run("hard_budget", "hard, seed 1, decoded with each word's most likely cell",
                                         start="hard_side_seed1", decode=("decode.hard_choice=argmax",))
    # What SCST's rewards see: the training images, where the model's captions score far above val's.
    for name in ("soft_side_seed1", "scst_d3_loo_lr2e-4", "scst_d3_greedy_lr5e-5"):
        runs[f"{name}_on_train"] = Run("scst_train_split", f"{name}, scored on the training images",
                                       start=name, split="train")
    for beam in (1, 2, 5, 10):  # the recipe's checkpoint decoded with other beams (no training)
        runs[f"recipe_beam{beam}"] = Run("beam", f"beam {beam}", beam_size=beam, start="recipe")
    # The first shipped model decoded otherwise (no training): <unk>, the n-gram block, the length
    # penalty, each row from decoding as its run did (DECODED_AS_TRAINED), whatever its file's config says.
    for name, label, decode in (
            ("unk", "<unk> allowed (decoding before the block)", ("decode.allow_unk=true",)),
            ("default", "<unk> blocked (the default)", ()),
            ("ngram2", "no 2-gram twice", ("decode.no_repeat_ngram=2",)),
            ("ngram3", "no 3-gram twice", ("decode.no_repeat_ngram=3",)),
            ("lp0.5", "length penalty 0.5", ("decode.length_penalty=0.5",)),
            ("lp1", "length penalty 1", ("decode.length_penalty=1.0",)),
            ("ngram3_lp1", "no 3-gram twice, length penalty 1",
             ("decode.no_repeat_ngram=3", "decode.length_penalty=1.0")),
            ("ngram2_lp1", "no 2-gram twice, length penalty 1",
             ("decode.no_repeat_ngram=2", "decode.length_penalty=1.0")),
            ("ngram3_lp1.5", "no 3-gram twice, length penalty 1.5",
             ("decode.no_repeat_ngram=3", "decode.length_penalty=1.5")),
            ("ngram3_lp2", "no 3-gram twice, length penalty 2",
             ("decode.no_repeat_ngram=3", "decode.length_penalty=2.0"))):
        runs[f"shipped_{name}"] = Run("decoding", label, start=FIRST_SHIPPED, decode=(*DECODED_AS_TRAINED, *decode))
    return runs


RUNS = _runs()
