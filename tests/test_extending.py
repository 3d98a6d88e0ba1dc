"""docs/architecture.md's worked examples (a new score, a dataset format, an objective, a term of the loss) run as
written there, and a config then uses each one by its name: one module and its registration is all
each needs."""

from __future__ import annotations

import re

import pytest
import torch

from captioning.config import ConfigError, from_dict, load_config
from captioning.config.registry import DATASETS, OBJECTIVES, SCORES, TERMS
from captioning.data.records import read_records
from captioning.model.encoder_decoder import build_decoder
from tests.tiny import REPO


def example(title: str) -> str:
    """The code block under `### {title}` in the section on adding things."""
    text = (REPO / "docs" / "architecture.md").read_text()
    section = text[text.index(f"### {title}\n"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.fixture
def registries(monkeypatch):
    """The registries and the sections they add, as they are, given back after the test (an
    example's name and section stay in no other test)."""
    for registry in (SCORES, DATASETS, OBJECTIVES, TERMS):
        monkeypatch.setattr(registry, "_entries", dict(registry.entries))  # filled first: the copy is whole
        monkeypatch.setattr(registry, "_sections", {key: (settings, set(names))
                                                    for key, (settings, names) in registry._sections.items()})


SMALL = ["model.embed_dim=8", "model.hidden_dim=8", "model.attention_dim=8"]


def test_the_score_example_trains_under_its_name_with_soft_and_hard_attention(registries):
    namespace: dict = {}
    exec(compile(example("A score"), "docs/architecture.md", "exec"), namespace)
    for attention in ("soft", "hard"):
        model = load_config(None, ["model.score=rbf", "model.rbf.bandwidth=2", f"model.attention={attention}",
                                   *SMALL]).model
        torch.manual_seed(0)
        decoder = build_decoder(model, vocab_size=9, annotation_dim=6, grid=(2, 2))
        score = decoder.attention.score
        assert type(score).__name__ == "RbfScore" and score.bandwidth == 2.0  # its setting reached it
        output = decoder(torch.randn(3, 4, 6), torch.randint(3, 9, (3, 5)))
        output.logits.logsumexp(-1).sum().backward()
        assert torch.allclose(output.alphas.sum(-1), torch.ones(3, 5))  # weights over the 4 cells
        assert score.key.weight.grad.abs().sum() > 0  # the score is trained
    # the kernel, against torch.cdist: e = -d^2 / (2 * 2^2)
    annotations, hidden = torch.randn(2, 4, 6), torch.randn(2, 8)
    expected = -torch.cdist(score.key(annotations), score.query(hidden)[:, None]).squeeze(2) ** 2 / 8
    assert torch.allclose(score(score.keys(annotations), hidden), expected, atol=1e-5)


def test_the_score_examples_setting_is_a_section_of_the_config_with_its_rules(registries, tmp_path):
    namespace: dict = {}
    exec(compile(example("A score"), "docs/architecture.md", "exec"), namespace)
    # read from a file as from an override, typed, kept in a checkpoint's plain data and read back
    (tmp_path / "rbf.yaml").write_text("model:\n  score: rbf\n  rbf:\n    bandwidth: 3\n")
    config = load_config(tmp_path / "rbf.yaml")
    assert isinstance(config.model.rbf.bandwidth, float) and config.model.rbf.bandwidth == 3.0
    assert config.to_dict()["model"]["rbf"] == {"bandwidth": 3.0}
    assert from_dict(config.to_dict()).model.rbf == namespace["RbfConfig"](bandwidth=3.0)
    assert load_config(None).model.rbf.bandwidth == 1.0  # its default, where nothing sets it
    refused = {"its own rule": (["model.score=rbf", "model.rbf.bandwidth=0"],
                                "config: model.rbf.bandwidth must be positive, got 0.0"),
               "the rule for every section": (["model.rbf.bandwidth=2"],
                                              "config: model.rbf applies only with model.score=rbf (or "
                                              "model.local.base=rbf), not model.score=additive"),
               "its types": (["model.score=rbf", "model.rbf.bandwidth=wide"], "'bandwidth' must be a number"),
               "its keys": (["model.score=rbf", "model.rbf.width=2"], "unknown key 'model.rbf.width'")}
    for why, (overrides, message) in refused.items():
        with pytest.raises(ConfigError) as error:
            load_config(None, overrides)
        assert message in str(error.value), why


def test_no_module_of_the_config_names_a_plugin_or_its_settings():
    """The checks and the loader name no score, format or objective (each registers its name and its
    rules), and the schema holds none of their sections (each registers its own)."""
    names = set(SCORES.names()) | set(DATASETS.names()) | set(OBJECTIVES.names())
    config = REPO / "captioning" / "config"
    found = []
    for path in (config / "checks.py", config / "loading.py"):
        code = "\n".join(line.split("#")[0] for line in path.read_text().splitlines())  # not its comments
        code = re.sub(r'"""(.*?)"""', "", code, flags=re.S)  # nor its docstrings
        found += [f"{path.name}: {name}" for name in sorted(names) if re.search(rf"[\"'.]{re.escape(name)}\b", code)]
    schema = (config / "schema.py").read_text()
    sections = [key.split(".")[1] for registry in (SCORES, DATASETS, OBJECTIVES) for key in registry.sections()]
    found += [f"schema.py: {name}" for name in sections if re.search(rf"^\s+{name}\s*:", schema, re.M)]
    assert sections and not found, found


def test_the_dataset_format_example_reads_a_split_under_its_name(registries, tmp_path):
    namespace: dict = {}
    exec(compile(example("A dataset format"), "docs/architecture.md", "exec"), namespace)
    (tmp_path / "captions.tsv").write_text("b.jpg\ta dog\ttrain\na.jpg\ta cat\ttrain\na.jpg\ta cat sits\ttrain\n"
                                           "c.jpg\ta bird\tval\n")
    data = load_config(None, ["data.dataset=tsv", f"data.root={tmp_path}", "data.split_file=captions.tsv"]).data
    train = read_records(data, "train")
    assert [(r.path.name, r.captions) for r in train] == [("a.jpg", ("a cat", "a cat sits")), ("b.jpg", ("a dog",))]
    assert [r.path for r in read_records(data, "val")] == [tmp_path / "c.jpg"]


def test_the_objective_example_orders_its_first_epoch_and_trains_a_run_under_its_name(registries, tiny_config,
                                                                                      tmp_path):
    from captioning.train.loop import fit

    namespace: dict = {}
    exec(compile(example("An objective"), "docs/architecture.md", "exec"), namespace)
    objective = OBJECTIVES["xe_short_first"]
    assert objective is namespace["ShortCaptionsFirst"]
    # its batches, on pairs of these lengths: the first epoch's shortest first, the others as cross-entropy's
    lengths = torch.tensor([7, 3, 9, 2, 5, 8, 4, 6, 1, 10])
    config = tiny_config(tmp_path / "run", "train.objective=xe_short_first", "train.max_steps=3",
                         "train.batch_size=2", "data.bucket_batches=false")
    probe = object.__new__(objective)
    probe.config, probe.data = config, type("Data", (), {"pairs": type("Pairs", (), {"lengths": lengths})})
    longest = [max(int(lengths[i]) for i in batch) for batch in probe.batches(0)]
    assert longest == sorted(longest) and sorted(i for b in probe.batches(0) for i in b) == list(range(10))
    later = [max(int(lengths[i]) for i in batch) for batch in probe.batches(1)]
    assert later != sorted(later)  # a shuffled epoch (seeded), not the curriculum
    fit(config)
    assert (tmp_path / "run" / "last.pt").is_file()


def _entropy_of(alphas: torch.Tensor, words: list[tuple[int, int]]) -> float:
    """The mean over the real words of each map's entropy, computed cell by cell."""
    return sum(-sum(float(a) * float(torch.log(a)) for a in alphas[row, t]) for row, t in words) / len(words)


def test_the_loss_term_example_adds_its_weighted_term_under_cross_entropy_and_the_logs(registries, tiny_config,
                                                                                        tmp_path):
    import json

    from captioning.train.loop import fit
    from captioning.train.paper_objective import PaperObjective, paper_loss

    namespace: dict = {}
    exec(compile(example("A term of the loss"), "docs/architecture.md", "exec"), namespace)
    assert TERMS["map_entropy"] is namespace["map_entropy"]
    config = tiny_config(tmp_path / "run", "train.terms={map_entropy: 0.01}", "train.max_steps=2",
                         "train.log_every_steps=1")
    # the loss with the term is the paper's plus 0.01 times the maps' entropy, computed here by hand
    torch.manual_seed(0)
    decoder = build_decoder(config.model, vocab_size=9, annotation_dim=6, grid=(2, 2))
    decoder.dropout.p = 0.0  # the two forwards see the same decoder
    from captioning.data.dataset import Batch

    tokens = torch.tensor([[1, 5, 6, 7, 2], [1, 8, 2, 0, 0]])
    batch = Batch(annotations=torch.randn(2, 4, 6), tokens=tokens, lengths=torch.tensor([5, 3]))
    probe = object.__new__(PaperObjective)
    probe.config = config
    with_term = paper_loss(decoder, batch, ds_lambda=0.0, terms=probe.terms)
    without = paper_loss(decoder, batch, ds_lambda=0.0)
    alphas = decoder(batch.annotations, tokens[:, :-1]).alphas.detach()
    entropy = _entropy_of(alphas, [(row, t) for row in range(2) for t in range(4) if tokens[row, t + 1] != 0])
    assert float((with_term.value - without.value).detach()) == pytest.approx(0.01 * entropy, rel=1e-4)
    assert float(with_term.stats["map_entropy"].detach()) == pytest.approx(0.01 * entropy, rel=1e-4)
    fit(config)
    logged = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert any("map_entropy" in row and row["map_entropy"] > 0 for row in logged)


def test_the_loss_term_example_adds_the_same_term_under_self_critical_training(registries):
    """The term written once is added on the sampled captions' maps: the loss grows by 0.01 times
    their entropy over the words sampled, <end> included."""
    from captioning.data.vocab import SPECIALS, Vocabulary
    from captioning.train.scst import ImageRows, ScstConfig, SelfCritical
    from tests.model.sizes import model_section

    namespace: dict = {}
    exec(compile(example("A term of the loss"), "docs/architecture.md", "exec"), namespace)
    words = ["a", "red", "square", "circle"]
    critics = [SelfCritical(ScstConfig(samples=2, baseline="leave_one_out"), references=[[["a", "red", "square"]],
                                                                                       [["a", "circle"]]],
                            vocab=Vocabulary([*SPECIALS, *words]), max_length=5, terms=terms)
               for terms in ({"map_entropy": 0.01}, {})]
    torch.manual_seed(0)
    decoder = build_decoder(model_section("embed_dim=8", "hidden_dim=16"), vocab_size=len(SPECIALS) + len(words),
                            annotation_dim=6, grid=(2, 2)).train()
    decoder.dropout.p = 0.0
    batch = ImageRows(torch.tensor([0, 1]), torch.randn(2, 4, 6))
    losses = []
    for critic in critics:
        torch.manual_seed(1)  # the same captions sampled
        losses.append(critic.surrogate(decoder, batch))
    torch.manual_seed(1)
    tokens, _, alphas = critics[1].sample(decoder, batch.annotations)
    sampled = [(row, t) for row in range(tokens.shape[0]) for t in range(tokens.shape[1])
               if tokens[row, t] != Vocabulary.pad_id]
    entropy = _entropy_of(alphas.detach(), sampled)
    assert float((losses[0][0] - losses[1][0]).detach()) == pytest.approx(0.01 * entropy, rel=1e-4)
    assert float(losses[0][1]["map_entropy"].detach()) == pytest.approx(0.01 * entropy, rel=1e-4)
    assert "map_entropy" not in losses[1][1]


def test_a_term_no_module_registered_is_refused_when_the_config_is_loaded() -> None:
    with pytest.raises(ConfigError, match=r"train.terms: 'sharpness' is not a registered term"):
        load_config(None, ["train.terms={sharpness: 0.1}"])


def test_no_module_outside_the_formats_asks_for_a_dataset_by_its_name():
    """What a format brings besides reading rides on its reader (data.records.format_extra): no other
    module switches on data.dataset's value. A format's own module may (shapes' ensure_shapes leaves
    other data alone when called directly)."""
    switch = re.compile(r"\.dataset\s*(==|!=|\bin\b|\bnot in\b)|[\"'](shapes|folder|coco|coco_official)[\"']\s*"
                        r"(==|!=)\s*\w*\.?dataset")
    formats = REPO / "captioning" / "data" / "formats"
    found = [f"{path.relative_to(REPO)}:{number}" for path in (REPO / "captioning").rglob("*.py")
             if formats not in path.parents
             for number, line in enumerate(path.read_text().splitlines(), 1) if switch.search(line)]
    assert not found, found


def test_each_format_carries_what_it_brings_besides_reading():
    from captioning.data.records import format_extra

    def extras(dataset: str) -> set[str]:
        data = load_config(None, [f"data.dataset={dataset}"]).data
        names = ("validation_metrics", "make_missing", "miniature", "scenes", "instances", "prepare_report",
                 "beside_vocabulary")
        return {name for name in names if format_extra(data, name) is not None}

    assert extras("shapes") == {"validation_metrics", "make_missing", "miniature", "scenes"}
    assert extras("folder") == {"prepare_report", "beside_vocabulary"}
    assert extras("coco") == extras("coco_official") == {"instances"}
    assert extras("flickr8k") == set()
