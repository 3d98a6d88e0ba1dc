"""Word cross-entropy and the doubly stochastic term (Eq. 14); padding never reaches either."""

from __future__ import annotations

import pytest
import torch

from captioning.data.dataset import Batch
from captioning.data.vocab import Vocabulary
from captioning.model.paper import AdditiveScore, AttentionDecoder, SoftAttention, cross_entropy, doubly_stochastic
from captioning.train.paper_objective import train_step

B, T, L, V = 2, 5, 9, 11
PAD, START, END = Vocabulary.pad_id, Vocabulary.start_id, Vocabulary.end_id


def random_logits(seed: int = 0) -> torch.Tensor:
    return torch.randn(B, T, V, generator=torch.Generator().manual_seed(seed))


def random_alphas(seed: int = 0, steps: int = T) -> torch.Tensor:
    logits = torch.randn(B, steps, L, generator=torch.Generator().manual_seed(seed))
    return torch.softmax(logits * 2, dim=2)


# targets: image 0 has 5 real words, image 1 has 3 (then padding)
TARGETS = torch.tensor([[4, 5, 6, 7, END], [8, 9, END, PAD, PAD]])
MASK = (TARGETS != PAD).float()


def test_cross_entropy_is_the_mean_nll_over_real_words():
    logits = random_logits()
    log_probs = torch.log_softmax(logits, dim=2)
    terms = [-log_probs[b, t, TARGETS[b, t]] for b in range(B) for t in range(T) if MASK[b, t]]
    expected = sum(terms) / len(terms)
    torch.testing.assert_close(cross_entropy(logits, TARGETS, MASK), expected)
    assert len(terms) == 8


def test_word_weights_multiply_each_target_words_term_and_keep_the_per_word_mean():
    logits = random_logits()
    log_probs = torch.log_softmax(logits, dim=2)
    weights = torch.ones(V)
    weights[5], weights[END] = 4.0, 0.5
    terms = [-weights[TARGETS[b, t]] * log_probs[b, t, TARGETS[b, t]] for b in range(B) for t in range(T) if MASK[b, t]]
    expected = sum(terms) / 8  # still divided by the 8 real words, not by the total weight
    torch.testing.assert_close(cross_entropy(logits, TARGETS, MASK, word_weights=weights), expected)
    torch.testing.assert_close(cross_entropy(logits, TARGETS, MASK, word_weights=torch.ones(V)),
                               cross_entropy(logits, TARGETS, MASK))
    padded = weights.clone()
    padded[PAD] = 100.0  # padding still reaches nothing
    torch.testing.assert_close(cross_entropy(logits, TARGETS, MASK, word_weights=padded), expected)


def test_cross_entropy_ignores_logits_at_padded_positions():
    logits = random_logits().requires_grad_(True)
    loss = cross_entropy(logits, TARGETS, MASK)
    (grad,) = torch.autograd.grad(loss, logits)

    changed = logits.detach().clone()
    changed[1, 3:] = 50 * torch.randn(2, V, generator=torch.Generator().manual_seed(5))
    changed.requires_grad_(True)
    changed_loss = cross_entropy(changed, TARGETS, MASK)
    (changed_grad,) = torch.autograd.grad(changed_loss, changed)

    torch.testing.assert_close(changed_loss, loss)
    torch.testing.assert_close(changed_grad, grad)
    assert (grad[1, 3:] == 0).all()  # nothing flows into padded positions
    assert (grad[MASK.bool()].abs().sum(-1) > 0).all()


def test_cross_entropy_ignores_the_target_ids_at_padded_positions():
    logits = random_logits()
    targets = TARGETS.clone()
    targets[1, 3:] = torch.tensor([4, 10])
    torch.testing.assert_close(cross_entropy(logits, targets, MASK), cross_entropy(logits, TARGETS, MASK))


def test_doubly_stochastic_one_matches_the_paper_formula():
    """Eq. 14's term of each caption, summed over the captions and divided by the 8 real words, as
    the word costs are: lambda then weighs it against a caption's summed word costs."""
    alphas = random_alphas()
    expected = 0.0
    for b in range(B):
        for i in range(L):
            total = sum(alphas[b, t, i] for t in range(T) if MASK[b, t])
            expected += (1 - total) ** 2
    expected /= 8  # the real words: 5 + 3 (per image, as before, would be / 2)
    torch.testing.assert_close(doubly_stochastic(alphas, MASK), expected)


def test_doubly_stochastic_excludes_masked_steps():
    alphas = random_alphas()
    changed = alphas.clone()
    changed[1, 3:] = random_alphas(7)[1, 3:]
    assert not torch.allclose(changed, alphas)
    torch.testing.assert_close(doubly_stochastic(changed, MASK), doubly_stochastic(alphas, MASK))
    # and with no masking at all, the same change matters
    full = torch.ones(B, T)
    assert not torch.allclose(doubly_stochastic(changed, full), doubly_stochastic(alphas, full))


def test_doubly_stochastic_one_is_zero_when_every_cell_totals_one():
    # L steps, each attending to a different cell: every cell gets exactly 1 in total
    alphas = torch.eye(L).expand(B, L, L).clone()
    assert float(doubly_stochastic(alphas, torch.ones(B, L))) == pytest.approx(0.0, abs=1e-7)


def test_doubly_stochastic_of_uniform_maps_is_what_the_unmeetable_target_leaves():
    alphas = torch.full((B, T, L), 1.0 / L)
    # T_b < L: the paper's target cannot be met by any map; uniform gives sum_i (1 - T_b/L)^2
    expected = (L * (1 - 5 / L) ** 2 + L * (1 - 3 / L) ** 2) / 8  # per real word
    assert float(doubly_stochastic(alphas, MASK)) == pytest.approx(expected, rel=1e-6)


def test_doubly_stochastic_accepts_a_boolean_mask():
    alphas = random_alphas()
    torch.testing.assert_close(doubly_stochastic(alphas, MASK.bool()), doubly_stochastic(alphas, MASK))


# End to end: the decoder, the batch layout of training, both terms ------------------------------------

D, H = 8, 16


def make_decoder(seed: int = 0) -> AttentionDecoder:
    torch.manual_seed(seed)
    attention = SoftAttention(AdditiveScore(annotation_dim=D, hidden_dim=H, attention_dim=8))
    return AttentionDecoder(vocab_size=V, annotation_dim=D, embed_dim=8, hidden_dim=H, attention=attention,
                            dropout=0.0)


def training_loss(decoder, annotations, tokens, mask):
    """What train_step computes: predict tokens[:, 1:] from tokens[:, :-1]; mask given from outside."""
    output = decoder(annotations, tokens[:, :-1])
    targets = tokens[:, 1:]
    return cross_entropy(output.logits, targets, mask) + 1.0 * doubly_stochastic(output.alphas, mask)


def padded_batch():
    annotations = torch.randn(B, L, D, generator=torch.Generator().manual_seed(3))
    tokens = torch.tensor([[START, 4, 5, 6, 7, 8, END],  # 5 words
                           [START, 9, 10, END, PAD, PAD, PAD]])  # 2 words, shorter
    return annotations, tokens


def test_padding_never_reaches_the_loss_or_the_gradients():
    decoder = make_decoder()
    annotations, tokens = padded_batch()
    mask = (tokens[:, 1:] != PAD).float()  # fixed from the clean batch

    loss = training_loss(decoder, annotations, tokens, mask)
    grads = torch.autograd.grad(loss, list(decoder.parameters()))

    corrupted = tokens.clone()
    corrupted[1, 4:] = torch.tensor([5, 10, 4])  # after <end>: inputs at steps 4, 5 and targets at 3, 4, 5
    changed_loss = training_loss(decoder, annotations, corrupted, mask)
    changed_grads = torch.autograd.grad(changed_loss, list(decoder.parameters()))

    torch.testing.assert_close(changed_loss, loss, rtol=1e-6, atol=1e-7)
    for (name, _), grad, changed in zip(decoder.named_parameters(), grads, changed_grads):
        torch.testing.assert_close(changed, grad, rtol=1e-5, atol=1e-7, msg=name)

    # control: the same corruption *with* the mask following it does change the loss
    leaky = (corrupted[:, 1:] != PAD).float()
    assert not torch.allclose(training_loss(decoder, annotations, corrupted, leaky), loss)


def test_the_end_to_end_computation_is_what_train_step_does():
    decoder = make_decoder()
    annotations, tokens = padded_batch()
    mask = (tokens[:, 1:] != PAD).float()
    with torch.no_grad():
        expected = training_loss(decoder, annotations, tokens, mask)
    optimizer = torch.optim.SGD(decoder.parameters(), lr=0.0)
    batch = Batch(annotations=annotations, tokens=tokens, lengths=torch.tensor([7, 4]))
    result = train_step(decoder, batch, optimizer, grad_clip=1e9, ds_lambda=1.0)
    assert result.losses["loss"] == pytest.approx(float(expected), rel=1e-6)


def test_the_meetable_target_t_over_l_differs_by_a_constant_so_gives_the_papers_gradient():
    """sum_i (tau - S_i)^2 = L tau^2 - 2 tau sum_i S_i + sum_i S_i^2 and sum_i S_i = T_b whatever the
    maps: tau = T_b/L (written out here) differs from the paper's tau = 1 by a constant per caption,
    and the gradients are identical, which is why the project keeps tau = 1 alone."""
    scores = torch.randn(B, T, L, generator=torch.Generator().manual_seed(2)).requires_grad_(True)
    alphas = torch.softmax(scores, dim=2)
    one = doubly_stochastic(alphas, MASK)
    totals = (alphas * MASK[:, :, None]).sum(1)  # [B, L]
    length = ((MASK.sum(1, keepdim=True) / L - totals) ** 2).sum() / MASK.sum()
    (grad_one,) = torch.autograd.grad(one, scores, retain_graph=True)
    (grad_length,) = torch.autograd.grad(length, scores)
    assert float((one - length).detach()) > 0.2  # the values differ...
    torch.testing.assert_close(grad_one, grad_length, rtol=1e-5, atol=1e-7)  # ...their gradients do not
