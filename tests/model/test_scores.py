"""The attention score family: each score against its formula computed directly from its weights,
float64 gradcheck with soft and with hard attention, and the image-side work done once per image."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from captioning.config import ConfigError
from captioning.model import fused_check
from captioning.model.attention import choosing
from captioning.model.encoder_decoder import build_decoder
from captioning.model.extras.position import GridCoordinates, GridPosition
from captioning.model.extras.window import LearnedWindowScore
from captioning.model.paper import AttentionDecoder, HardAttention, SoftAttention
from captioning.model.scores import SCORES, CosineScore, DotScore, LocalScore
from tests.model.sizes import GRID, A, B, D, H, L, V, inputs, make_attention, model_section


def make_score(name: str, seed: int = 0, dtype=torch.float32, **options) -> torch.nn.Module:
    torch.manual_seed(seed)
    return SCORES[name](annotation_dim=D, hidden_dim=H, attention_dim=A, grid=GRID, **options).to(dtype)


def scores_of(score: torch.nn.Module, annotations: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return score(score.keys(annotations), hidden)  # [B, L]


def gradcheck_attention(attention: torch.nn.Module, *, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 gradcheck of context, alpha, log p(s_t) and entropy with respect to the annotations and
    the state; hard attention in eval mode with argmax, where the cell is a fixed function of the input.
    Returns the inputs it checked at (they require grad)."""
    if kind == "hard":
        attention.eval()
        attention.choice = "argmax"
    a, h = inputs(dtype=torch.float64)
    a.requires_grad_(True)
    h.requires_grad_(True)

    def run(annotations, hidden):
        out = attention(attention.start(annotations), hidden)
        return tuple(x for x in (out.context, out.alpha, out.log_prob, out.entropy) if x is not None)

    assert torch.autograd.gradcheck(run, (a, h), eps=1e-6, atol=1e-5)
    return a, h


def by_formula(function) -> torch.Tensor:
    """e[b, i] = function(b, i), one cell at a time: no batching tricks shared with the code under test."""
    with torch.no_grad():
        return torch.tensor([[float(function(b, i)) for i in range(L)] for b in range(B)])


def test_concat_is_v_tanh_of_one_matrix_on_the_concatenation():
    score = make_score("concat")
    a, h = inputs()
    W, b, v = score.W.weight, score.W.bias, score.v.weight[0]  # [A, H + D], [A], [A]
    expected = by_formula(lambda n, i: v @ torch.tanh(W @ torch.cat([h[n], a[n, i]]) + b))
    torch.testing.assert_close(scores_of(score, a, h), expected, rtol=1e-5, atol=1e-5)


def test_general_is_bilinear():
    score = make_score("general")
    a, h = inputs()
    W = score.W.weight  # [H, D]
    torch.testing.assert_close(scores_of(score, a, h), by_formula(lambda n, i: h[n] @ W @ a[n, i]),
                               rtol=1e-5, atol=1e-5)


def test_dot_projects_the_query_only_when_the_sizes_differ():
    score = make_score("dot")
    a, h = inputs()
    W_q = score.query.weight  # [D, H]
    torch.testing.assert_close(scores_of(score, a, h), by_formula(lambda n, i: (W_q @ h[n]) @ a[n, i]),
                               rtol=1e-5, atol=1e-5)
    same = DotScore(annotation_dim=D, hidden_dim=D, attention_dim=A)
    assert not list(same.parameters())  # H == D: Luong's plain dot product, q = h
    h_d = torch.randn(B, D, generator=torch.Generator().manual_seed(4))
    torch.testing.assert_close(scores_of(same, a, h_d), by_formula(lambda n, i: h_d[n] @ a[n, i]),
                               rtol=1e-5, atol=1e-5)


def test_scaled_dot_divides_by_the_root_of_the_annotation_size():
    score = make_score("scaled_dot")
    a, h = inputs()
    W_q = score.query.weight
    expected = by_formula(lambda n, i: (W_q @ h[n]) @ a[n, i] / math.sqrt(D))
    torch.testing.assert_close(scores_of(score, a, h), expected, rtol=1e-5, atol=1e-5)


def test_cosine_is_sharpness_times_the_cosine():
    score = make_score("cosine")
    a, h = inputs()
    W_q, beta = score.query.weight, score.log_sharpness.detach().exp()
    assert isinstance(score.log_sharpness, torch.nn.Parameter) and float(beta) == pytest.approx(5.0)
    expected = by_formula(lambda n, i: beta * torch.cosine_similarity(W_q @ h[n], a[n, i], dim=0))
    got = scores_of(score, a, h)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert got.abs().max() <= float(beta) + 1e-5  # a cosine never leaves [-1, 1]
    fixed = CosineScore(annotation_dim=D, hidden_dim=H, attention_dim=A, sharpness=1.0, learn_sharpness=False)
    assert "log_sharpness" not in dict(fixed.named_parameters())


def test_cosine_sharpness_comes_from_the_config_and_reaches_both_glimpses():
    model = model_section("score=cosine", "extras.glimpses=2", "cosine.sharpness=12.0")
    decoder = build_decoder(model, vocab_size=11, annotation_dim=D, grid=GRID)
    for score in (decoder.attention.first.score, decoder.attention.second.score):
        assert isinstance(score.log_sharpness, torch.nn.Parameter)  # a start, still learned
        assert float(score.log_sharpness.detach().exp()) == pytest.approx(12.0)
    default = build_decoder(model_section("score=cosine"), vocab_size=11, annotation_dim=D, grid=GRID)
    assert float(default.attention.score.log_sharpness.detach().exp()) == pytest.approx(5.0)
    with pytest.raises(ConfigError, match="model.cosine applies only with model.score=cosine"):
        model_section("cosine.sharpness=12.0")
    on_cosine = model_section("score=local", "local.base=cosine", "extras.glimpses=2", "cosine.sharpness=12.0")
    local = build_decoder(on_cosine, vocab_size=11, annotation_dim=D, grid=GRID)
    for score in (local.attention.first.score, local.attention.second.score):  # the local score's cosine base too
        assert float(score.base.log_sharpness.detach().exp()) == pytest.approx(12.0)
    with pytest.raises(ConfigError, match=r"model.cosine applies only with model.score=cosine "
                                          r"\(or model.local.base=cosine\), not model.score=local"):
        model_section("score=local", "cosine.sharpness=12.0")


def test_location_ignores_the_content():
    score = make_score("location")
    a, h = inputs()
    W, b = score.W.weight, score.W.bias  # [L, H], [L]
    torch.testing.assert_close(scores_of(score, a, h), by_formula(lambda n, i: W[i] @ h[n] + b[i]),
                               rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(scores_of(score, a * 3 + 1, h), scores_of(score, a, h))  # content plays no part


def test_local_adds_a_log_gaussian_window_around_the_predicted_centre():
    score = make_score("local")
    assert isinstance(score, LocalScore) and score.sigma == pytest.approx(3 / 4)
    a, h = inputs()
    V_p, b_v, W_p, b_w = score.centre[0].weight, score.centre[0].bias, score.centre[2].weight, score.centre[2].bias
    with torch.no_grad():
        base = scores_of(score.base, a, h)  # the additive score, [B, L]
    centre = [torch.tensor(GRID, dtype=torch.float32) * torch.sigmoid(W_p @ torch.tanh(V_p @ h[n] + b_v) + b_w)
              for n in range(B)]

    def window(n: int, i: int) -> torch.Tensor:
        row, column = divmod(i, GRID[1])
        cell = torch.tensor([row + 0.5, column + 0.5])
        return torch.exp(-((cell - centre[n]) ** 2).sum() / (2 * score.sigma ** 2))

    expected = by_formula(lambda n, i: base[n, i] + torch.log(window(n, i)))
    torch.testing.assert_close(scores_of(score, a, h), expected, rtol=1e-5, atol=1e-5)
    # So the weights are the base weights times the window, renormalized (Luong's local-p, in 2-D).
    torch.manual_seed(0)
    attention = make_attention("score=local")
    with torch.no_grad():
        alpha = attention(attention.start(a), h).alpha
    product = torch.softmax(base, dim=1) * by_formula(window)
    torch.testing.assert_close(alpha, product / product.sum(1, keepdim=True), rtol=1e-5, atol=1e-6)


def test_learned_local_window_adds_a_shape_of_the_offset_from_the_centre():
    plain = make_score("local")
    torch.manual_seed(0)
    learned = LearnedWindowScore(annotation_dim=D, hidden_dim=H, attention_dim=A, grid=GRID)
    a, h = inputs()
    # w_s starts at zero: the learned window starts as the Gaussian one (same seed, same base and centre).
    torch.testing.assert_close(scores_of(learned, a, h), scores_of(plain, a, h))
    with torch.no_grad():
        learned.shape["out"].weight.normal_(generator=torch.Generator().manual_seed(3))
    W_s, b_s = learned.shape["offset"].weight, learned.shape["offset"].bias  # [A/4, 2], [A/4]
    U_s, w_s = learned.shape["query"].weight, learned.shape["out"].weight[0]  # [A/4, H], [A/4]
    plain_scores = scores_of(plain, a, h)
    with torch.no_grad():
        centres = learned.centre_of(h)  # [B, 2], checked against its formula above

    def shape(n: int, i: int) -> torch.Tensor:
        row, column = divmod(i, GRID[1])
        offset = (torch.tensor([row + 0.5, column + 0.5]) - centres[n]) / learned.sigma
        return w_s @ torch.tanh(W_s @ offset + b_s + U_s @ h[n])

    expected = by_formula(lambda n, i: plain_scores[n, i] + shape(n, i))
    torch.testing.assert_close(scores_of(learned, a, h), expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(ConfigError, match="model.local.window 'square' is not one of gaussian, learned"):
        model_section("score=local", "local.window=square")
    with pytest.raises(ConfigError, match="model.local applies only with model.score=local, not"):
        model_section("score=additive", "local.window=learned")


def test_local_window_width_comes_from_the_config_and_reaches_both_glimpses():
    model = model_section("score=local", "extras.glimpses=2", "local.sigma=1.5")
    decoder = build_decoder(model, vocab_size=11, annotation_dim=D, grid=GRID)
    assert decoder.attention.first.score.sigma == decoder.attention.second.score.sigma == 1.5
    # and the width is the formula's sigma: half of it doubles the log window's fall-off
    wide, narrow = make_score("local", sigma=3.0), make_score("local", sigma=1.5)
    a, h = inputs()
    log_window = {width: scores_of(score, a, h) - scores_of(score.base, a, h) for width, score in
                  (("wide", wide), ("narrow", narrow))}  # [B, L]: -||c_i - p_t||^2 / (2 sigma^2)
    fall_off = log_window["narrow"] / log_window["wide"]
    torch.testing.assert_close(fall_off, torch.full_like(fall_off, 4.0))
    with pytest.raises(ConfigError, match="model.local applies only with model.score=local, not"):
        model_section("local.sigma=1.5")


@pytest.mark.parametrize("kind", ["soft", "hard"])
def test_gradcheck_float64_learned_local_window(kind):
    torch.manual_seed(0)
    attention = make_attention(f"attention={kind}", "score=local", "local.window=learned",
                               "extras.position=coordinates").to(torch.float64)
    assert isinstance(attention.score, LearnedWindowScore)
    with torch.no_grad():
        attention.score.shape["out"].weight.normal_()  # not the zero start, where the shape passes no gradient
    gradcheck_attention(attention, kind=kind)


def test_local_takes_any_content_score_as_its_base():
    torch.manual_seed(0)
    attention = make_attention("score=local", "local.base=general")
    assert type(attention.score.base).__name__ == "GeneralScore"
    with pytest.raises(ConfigError, match="model.local.base 'local' is not one of the scores a window can wrap"):
        model_section("score=local", "local.base=local")


@pytest.mark.parametrize("name", ["location", "local"])
def test_scores_that_know_the_grid_need_it_and_check_it(name):
    with pytest.raises(ValueError, match="grid"):
        SCORES[name](annotation_dim=D, hidden_dim=H, attention_dim=A)
    score = make_score(name)
    with pytest.raises(ValueError, match="9 grid cells"):
        score.keys(torch.randn(B, 16, D))


def test_softmax_temperature_divides_the_scores():
    torch.manual_seed(0)
    hot = make_attention("score=general", "extras.temperature=2.5")
    a, h = inputs()
    with torch.no_grad():
        alpha = hot(hot.start(a), h).alpha
    torch.testing.assert_close(alpha, torch.softmax(scores_of(hot.score, a, h) / 2.5, dim=1))
    with pytest.raises(ConfigError, match="model.extras.temperature must be positive"):
        model_section("extras.temperature=0.0")


def test_learned_position_is_added_per_row_and_column():
    torch.manual_seed(0)
    attention = make_attention("score=dot", "extras.position=learned")
    position = attention.inputs[0]
    assert isinstance(position, GridPosition) and len(attention.inputs) == 1
    a, _ = inputs()
    memory = attention.start(a)
    rows, columns = position.rows, position.columns
    for i in range(L):
        row, column = divmod(i, GRID[1])
        torch.testing.assert_close(memory.annotations[:, i], a[:, i] + rows[row] + columns[column])
    with pytest.raises(ConfigError, match="model.extras.position 'sinusoidal' is not one of"):
        model_section("extras.position=sinusoidal")


def centre(i: int) -> torch.Tensor:
    """(x, y) of cell i's centre in [-1, 1], from the grid by hand."""
    row, column = divmod(i, GRID[1])
    return torch.tensor([(2 * column + 1) / GRID[1] - 1, (2 * row + 1) / GRID[0] - 1])


def test_coordinates_are_appended_and_the_soft_context_ends_with_the_centre_of_mass():
    torch.manual_seed(0)
    attention = make_attention("extras.position=coordinates")
    assert isinstance(attention.inputs[0], GridCoordinates) and attention.context_dim(D) == D + 2
    a, h = inputs()
    memory = attention.start(a)
    assert memory.annotations.shape == (B, L, D + 2)
    torch.testing.assert_close(memory.annotations[:, :, :D], a)
    for b in range(B):
        rms = a[b].pow(2).mean().sqrt()  # the image's own scale, not the batch's
        for i in range(L):
            torch.testing.assert_close(memory.annotations[b, i, D:], rms * centre(i))
    out = attention(memory, h)
    for b in range(B):
        mass_centre = sum(out.alpha[b, i] * centre(i) for i in range(L))  # sum_i alpha_i (x_i, y_i)
        torch.testing.assert_close(out.context[b, D:], a[b].pow(2).mean().sqrt() * mass_centre)
    # A corner cell's coordinates do not depend on which other images share the batch.
    alone = attention.start(a[1:])
    torch.testing.assert_close(alone.annotations[0], memory.annotations[1])


def test_hard_attention_with_coordinates_hands_over_the_chosen_cells_centre():
    torch.manual_seed(0)
    attention = make_attention("attention=hard", "score=local", "extras.position=coordinates").eval()
    a, h = inputs()
    with choosing(attention, "argmax"):
        out = attention(attention.start(a), h)
    for b in range(B):
        cell = int(out.location[b])
        torch.testing.assert_close(out.context[b], torch.cat([a[b, cell], a[b].pow(2).mean().sqrt() * centre(cell)]))


def test_a_decoder_with_coordinates_widens_its_context_not_its_initial_state():
    torch.manual_seed(0)
    attention = make_attention("extras.position=coordinates")
    decoder = AttentionDecoder(vocab_size=V, annotation_dim=D, embed_dim=6, hidden_dim=H, attention=attention,
                               gate="vector")
    assert decoder.init_h.in_features == D  # h_0 from the mean of the annotations themselves
    assert decoder.lstm.input_size == 6 + D + 2 and decoder.out_z.in_features == D + 2
    assert decoder.gate.out_features == D + 2
    a, _ = inputs()
    logits = decoder(a, torch.full((B, 4), 1, dtype=torch.long), lengths=torch.tensor([4, 2])).logits
    assert logits.shape == (B, 4, V) and torch.isfinite(logits).all()
    with pytest.raises(ValueError, match="grid"):
        make_attention("extras.position=coordinates", grid=None)


@pytest.mark.parametrize("name", list(SCORES))
@pytest.mark.parametrize("kind", ["soft", "hard"])
@pytest.mark.parametrize("position", ["learned", "coordinates"])
def test_gradcheck_float64_every_score_with_both_kinds(name, kind, position):
    """Hard attention is checked in eval mode with argmax (gradcheck_attention); then the state and,
    for every score but location, the annotations get a gradient."""
    torch.manual_seed(0)
    attention = make_attention(f"attention={kind}", f"score={name}", f"extras.position={position}").to(torch.float64)
    a, h = gradcheck_attention(attention, kind=kind)
    out = attention(attention.start(a), h)
    (out.context.sum() + out.alpha[:, 0].sum()).backward()
    assert a.grad.abs().sum() > 0 or name == "location"  # location alone ignores the content
    assert h.grad.abs().sum() > 0


@pytest.mark.parametrize("name", list(SCORES))
def test_every_score_works_in_both_kinds_and_sums_to_one(name):
    a, h = inputs()
    for kind, cls in (("soft", SoftAttention), ("hard", HardAttention)):
        torch.manual_seed(0)
        attention = make_attention(f"attention={kind}", f"score={name}")
        assert type(attention) is cls
        with torch.no_grad():
            out = attention(attention.start(a), h)
        assert out.alpha.shape == (B, L) and out.context.shape == (B, D)
        torch.testing.assert_close(out.alpha.sum(1), torch.ones(B))


@pytest.mark.parametrize("name", list(SCORES))
def test_image_side_work_runs_once_per_decoder_forward(name, monkeypatch):
    torch.manual_seed(0)
    attention = make_attention(f"score={name}")
    decoder = AttentionDecoder(vocab_size=V, annotation_dim=D, embed_dim=8, hidden_dim=H, attention=attention,
                               dropout=0.0)
    # The count is the behaviour: a score's image side redone per step gives the same numbers at T times
    # the cost (tests/model/test_decoding.py checks the same of decoding by its operations).
    fused_check.prove_recurrence(decoder, inputs()[0])  # the fast path's one-time check, not counted
    calls = []
    keys = attention.score.keys
    monkeypatch.setattr(attention.score, "keys", lambda annotations: calls.append(1) or keys(annotations))
    tokens = torch.randint(0, V, (B, 5), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        output = decoder(inputs()[0], tokens)
    assert output.alphas.shape == (B, 5, L)
    assert calls == [1]


@pytest.mark.parametrize("kind", ["soft", "hard"])
def test_unit_annotations_give_every_cell_the_same_norm(kind):
    torch.manual_seed(0)
    attention = make_attention(f"attention={kind}", "extras.unit_annotations=true", grid=None)
    a, h = inputs()
    a = a * torch.linspace(0.1, 10, L)[None, :, None]  # loud and quiet cells
    memory = attention.start(a)
    torch.testing.assert_close(memory.annotations.norm(dim=2), torch.full((B, L), D ** 0.5))
    torch.testing.assert_close(memory.annotations, a / a.norm(dim=2, keepdim=True) * D ** 0.5)
    plain = make_attention(f"attention={kind}", grid=None)
    assert plain.start(a).annotations is a  # off by default


def test_a_score_written_with_the_old_name_prepare_still_scores_and_says_the_new_one():
    """`Score.keys` was `prepare` (also a command's name); a score of one's own that defines
    `prepare` is taken as its keys, with a warning naming the new name."""
    from captioning.model.scores import Score

    with pytest.warns(FutureWarning, match="OldScore.prepare is now named keys"):
        class OldScore(Score):
            def __init__(self):
                super().__init__()
                self.key = torch.nn.Linear(D, A)

            def prepare(self, annotations):
                return self.key(annotations)

            def forward(self, keys, hidden):
                return keys.sum(2)

    a = inputs()[0]
    score = OldScore()
    assert torch.equal(score.keys(a), score.key(a))
    soft = SoftAttention(score)
    torch.testing.assert_close(soft(soft.start(a), torch.zeros(B, H)).alpha, torch.softmax(score.key(a).sum(2), 1))


def test_the_decoders_old_name_prepare_still_starts_and_says_the_new_one():
    """The warning reads as the pytest config's filter for old names expects, and hard attention's
    draws are handed on."""
    from captioning.model.paper import Draws

    decoder = build_decoder(model_section("attention=hard"), vocab_size=V, annotation_dim=D, grid=GRID).train()
    a = inputs(batch=16)[0]
    draws = Draws.from_uniform(torch.rand(16, 1 + 3, generator=torch.Generator().manual_seed(0)), expectation_prob=0.0)
    torch.manual_seed(0)  # without its draws, start would flip 16 coins of its own: some would say "expectation"
    with pytest.warns(FutureWarning, match=r"^AttentionDecoder\.prepare is now named start \(the old name still "
                                           r"works\)$") as warned:
        memory, state = decoder.prepare(a, draws=draws)
    # it names the caller's line, the one to change; under mutation testing every function is reached
    # through a trampoline, one frame more, and no stacklevel names the caller there
    from captioning.model import paper

    assert warned[0].filename == __file__ or "mutmut" in Path(paper.__file__).read_text()
    started, started_state = decoder.start(a, draws=draws)
    torch.testing.assert_close(state.h, started_state.h)
    assert torch.equal(memory.expectation, started.expectation) and not memory.expectation.any()  # its draws' coins
