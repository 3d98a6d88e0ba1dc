"""Greedy decoding and batched beam search on small random (and one hand-built) decoders."""

from __future__ import annotations

import math

import pytest
import torch

from captioning.data.vocab import Vocabulary
from captioning.model import fused_check
from captioning.model.accelerator import accelerator_for
from captioning.model.decoding import Captions, beam_search, decode, greedy, repeated_ngrams
from captioning.model.paper import AdditiveScore, AttentionDecoder, SoftAttention
from tests.work import flops

B, L, D, H, V = 2, 9, 8, 16, 11
PAD, START, END, UNK = Vocabulary.pad_id, Vocabulary.start_id, Vocabulary.end_id, Vocabulary.unk_id
UNSAID = (PAD, START, UNK)  # what no search says (unless allow_unk)
SEEDS = [0, 1, 2, 3, 4, 5]


def make_decoder(seed: int, *, sharpness: float = 3.0, embed_dim: int = 8) -> AttentionDecoder:
    """A random decoder; `sharpness` scales the output layer so that captions end at varied lengths."""
    torch.manual_seed(seed)
    attention = SoftAttention(AdditiveScore(annotation_dim=D, hidden_dim=H, attention_dim=8))
    decoder = AttentionDecoder(vocab_size=V, annotation_dim=D, embed_dim=embed_dim, hidden_dim=H,
                               attention=attention, dropout=0.3).eval()
    with torch.no_grad():
        decoder.out.weight.mul_(sharpness)
    return decoder


def make_annotations(seed: int, batch: int = B) -> torch.Tensor:
    return torch.randn(batch, L, D, generator=torch.Generator().manual_seed(100 + seed))


def check_captions(captions: Captions, batch: int, max_length: int) -> None:
    tokens, alphas, lengths = captions.tokens, captions.alphas, captions.lengths
    steps = tokens.shape[1]
    assert tokens.dtype == torch.long and tokens.shape[0] == batch and 1 <= steps <= max_length
    assert alphas.shape == (batch, steps, L)
    assert lengths.shape == (batch,) and captions.scores.shape == (batch,)
    assert (alphas >= 0).all()
    torch.testing.assert_close(alphas.sum(2), torch.ones(batch, steps))
    assert torch.isfinite(captions.scores).all() and (captions.scores <= 0).all()
    for b in range(batch):
        n = int(lengths[b])
        assert (tokens[b, :n] != END).all()
        if n < steps:  # ended: <end>, then only padding
            assert tokens[b, n] == END
            assert (tokens[b, n + 1:] == PAD).all()
        else:
            assert n == steps == max_length  # never ended: ran to the limit


def teacher_forced_score(decoder, annotations, captions):
    """Sum of log-probs of each returned caption (up to and including <end>), and its attention maps."""
    tokens = captions.tokens
    inputs = torch.cat([torch.full_like(tokens[:, :1], START), tokens[:, :-1]], dim=1)
    with torch.no_grad():
        output = decoder(annotations, inputs)
    log_probs = torch.log_softmax(output.logits, 2).gather(2, tokens[..., None])[..., 0]  # [B, T]
    counted = torch.arange(tokens.shape[1])[None] <= captions.lengths[:, None]  # words and the <end>
    return (log_probs * counted).sum(1), output.alphas


@pytest.mark.parametrize("seed", SEEDS[:3])
@pytest.mark.parametrize("search", ["greedy", "beam3"])
def test_outputs_are_well_formed(seed, search):
    decoder, annotations = make_decoder(seed), make_annotations(seed)
    if search == "greedy":
        captions = greedy(decoder, annotations, max_length=7)
    else:
        captions = beam_search(decoder, annotations, beam_size=3, max_length=7)
    check_captions(captions, B, 7)


def test_the_random_models_give_a_mix_of_ended_and_unended_captions():
    """Guards the other tests: they must see captions that end early as well as ones that run to the limit."""
    lengths = torch.cat([greedy(make_decoder(s), make_annotations(s), max_length=7).lengths for s in SEEDS])
    assert (lengths < 7).any() and (lengths == 7).any()


@pytest.mark.parametrize("seed", SEEDS)
def test_beam_size_one_equals_greedy(seed):
    decoder, annotations = make_decoder(seed), make_annotations(seed, batch=3)
    g = greedy(decoder, annotations, max_length=8)
    b = beam_search(decoder, annotations, beam_size=1, max_length=8)
    assert torch.equal(b.tokens, g.tokens)
    assert torch.equal(b.lengths, g.lengths)
    torch.testing.assert_close(b.alphas, g.alphas)
    torch.testing.assert_close(b.scores, g.scores)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("search", ["greedy", "beam1", "beam2", "beam4"])
@pytest.mark.parametrize("no_repeat_ngram", [0, 1])
def test_scores_and_maps_match_teacher_forcing_on_the_returned_caption(seed, search, no_repeat_ngram):
    """The search's bookkeeping (back-pointers, frozen finished beams) returns a consistent hypothesis,
    scored with the model's own log-probabilities where words were blocked (not renormalized)."""
    decoder, annotations = make_decoder(seed), make_annotations(seed)
    if search == "greedy":
        captions = greedy(decoder, annotations, max_length=8, no_repeat_ngram=no_repeat_ngram)
    else:
        captions = beam_search(decoder, annotations, beam_size=int(search[4:]), max_length=8,
                               no_repeat_ngram=no_repeat_ngram)
    scores, alphas = teacher_forced_score(decoder, annotations, captions)
    torch.testing.assert_close(captions.scores, scores, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(captions.alphas, alphas, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("beam_size", [1, 3])
def test_batched_beam_search_equals_one_image_at_a_time(seed, beam_size):
    decoder, annotations = make_decoder(seed), make_annotations(seed, batch=3)
    batched = beam_search(decoder, annotations, beam_size=beam_size, max_length=8)
    for b in range(3):
        alone = beam_search(decoder, annotations[b:b + 1], beam_size=beam_size, max_length=8)
        steps = alone.tokens.shape[1]  # alone may stop earlier than the batch
        assert torch.equal(batched.tokens[b, :steps], alone.tokens[0])
        assert (batched.tokens[b, steps:] == PAD).all()
        assert batched.lengths[b] == alone.lengths[0]
        torch.testing.assert_close(batched.scores[b], alone.scores[0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(batched.alphas[b, :steps], alone.alphas[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("seed", SEEDS[:4])
def test_beam_search_as_wide_as_the_vocabulary_is_exact_over_two_words(seed):
    """With K = V and two steps, beam search keeps every first word, so it must find the best caption."""
    decoder, annotations = make_decoder(seed, sharpness=1.0), make_annotations(seed)
    with torch.no_grad():
        memory, state = decoder.start(annotations)
        first, state, _ = decoder.next_word(memory, state, torch.full((B,), START))
        first = torch.log_softmax(first, 1)  # [B, V]
        best = []
        for b in range(B):
            candidates = [float(first[b, END])]  # <end> at once
            for w in range(V):
                if w in (END, *UNSAID):
                    continue
                rows = torch.tensor([b])
                second, _, _ = decoder.next_word(memory.select(rows), state.select(rows), torch.tensor([w]))
                second = torch.log_softmax(second, 1)[0]
                second[list(UNSAID)] = float("-inf")
                candidates.append(float(first[b, w] + second.max()))
            best.append(max(candidates))
    beam = beam_search(decoder, annotations, beam_size=V, max_length=2)
    g = greedy(decoder, annotations, max_length=2)
    torch.testing.assert_close(beam.scores, torch.tensor(best), rtol=1e-5, atol=1e-5)
    assert (beam.scores >= g.scores - 1e-5).all()


@pytest.mark.parametrize("seed", SEEDS[:3])
def test_a_model_that_cannot_end_still_gets_a_full_length_caption(seed):
    decoder, annotations = make_decoder(seed), make_annotations(seed)
    with torch.no_grad():
        decoder.out.bias[END] = -1e4
    for captions in (beam_search(decoder, annotations, beam_size=3, max_length=6),
                     beam_search(decoder, annotations, beam_size=3, max_length=6, length_penalty=1.0),
                     greedy(decoder, annotations, max_length=6)):
        assert captions.tokens.shape == (B, 6)
        assert (captions.tokens != END).all()
        assert captions.lengths.tolist() == [6] * B
        assert torch.isfinite(captions.scores).all()
        check_captions(captions, B, 6)


def markov_decoder(next_word: dict[int, dict[int, float]]) -> AttentionDecoder:
    """A real decoder whose next-word distribution depends on the previous word only, as given.

    embed_dim = V, the embedding row of word w holds log p(. | w), and the output layer passes it
    through unchanged (the hidden-state and context paths are zeroed).
    """
    decoder = make_decoder(0, embed_dim=V)
    table = torch.full((V, V), math.log(1e-3))
    for previous, probs in next_word.items():
        rest = (1.0 - sum(probs.values())) / (V - len(probs))
        table[previous] = math.log(rest)
        for word, p in probs.items():
            table[previous, word] = math.log(p)
    with torch.no_grad():
        decoder.embed.weight.copy_(table)
        decoder.out.weight.copy_(torch.eye(V))
        decoder.out.bias.zero_()
        for layer in (decoder.out_h, decoder.out_z):
            layer.weight.zero_()
        decoder.out_h.bias.zero_()
    return decoder


def test_length_penalty_changes_the_ranking_in_a_constructed_case():
    # from <start>: <end> 0.5, "w" 0.45; after "w": <end> 0.9.
    # raw scores: [<end>] = log .5 = -0.69 beats [w <end>] = log .45 + log .9 = -0.90;
    # divided by (words + 1): -0.69 / 1 loses to -0.90 / 2 = -0.45.
    w = 4
    decoder = markov_decoder({START: {END: 0.5, w: 0.45}, w: {END: 0.9, w: 0.05}})
    annotations = make_annotations(0)
    raw = beam_search(decoder, annotations, beam_size=2, max_length=5, length_penalty=0.0)
    assert raw.tokens[:, 0].tolist() == [END, END]
    assert raw.lengths.tolist() == [0, 0]
    torch.testing.assert_close(raw.scores, torch.full((B,), math.log(0.5)))
    normalized = beam_search(decoder, annotations, beam_size=2, max_length=5, length_penalty=1.0)
    assert normalized.tokens[:, :2].tolist() == [[w, END]] * B
    assert normalized.lengths.tolist() == [1, 1]
    torch.testing.assert_close(normalized.scores, torch.full((B,), math.log(0.45) + math.log(0.9)))  # raw sum
    check_captions(normalized, B, 5)
    # greedy takes the locally best first word
    assert greedy(decoder, annotations, max_length=5).tokens[:, 0].tolist() == [END, END]


@pytest.mark.parametrize("long_first, longer_wins", [(0.3, True), (0.15, False)])
def test_length_normalization_divides_by_words_plus_one_and_alone_decides(long_first: float,
                                                                          longer_wins: bool) -> None:
    """"s <end>" (1 word) against "l m n <end>" (3 words); the longer one's first word is less likely.

    Raw scores: S = log .5 + log .99 and G = log p + 3 log .99, S > G, so without normalization the
    short caption wins. Divided by (words + 1): the long one wins iff G / 4 > S / 2, i.e. G / S < 2.
    p = .3: G / S = 1.76, the long one wins (dividing by words + 2 would give 5/3 < 1.76: short).
    p = .15: G / S = 2.74, the short one still wins (dividing by words alone would give 3 > 2.74: long).
    """
    short, first, second, third = 4, 5, 6, 7
    decoder = markov_decoder({START: {short: 0.5, first: long_first}, short: {END: 0.99},
                              first: {second: 0.99}, second: {third: 0.99}, third: {END: 0.99}})
    annotations = make_annotations(0)
    s = math.log(0.5) + math.log(0.99)
    g = math.log(long_first) + 3 * math.log(0.99)
    assert s > g and (g / s < 2) == longer_wins  # the hand ranking above

    raw = beam_search(decoder, annotations, beam_size=2, max_length=6, length_penalty=0.0)
    assert raw.tokens[:, :2].tolist() == [[short, END]] * B
    torch.testing.assert_close(raw.scores, torch.full((B,), s))
    normalized = beam_search(decoder, annotations, beam_size=2, max_length=6, length_penalty=1.0)
    if longer_wins:
        assert normalized.tokens[:, :4].tolist() == [[first, second, third, END]] * B
        assert normalized.lengths.tolist() == [3] * B
        torch.testing.assert_close(normalized.scores, torch.full((B,), g))  # the raw sum is returned
    else:
        assert normalized.tokens[:, :2].tolist() == [[short, END]] * B
        assert normalized.lengths.tolist() == [1] * B


def test_length_normalization_of_a_beam_that_never_ended_divides_by_its_words_alone():
    """decode.length_penalty divides a beam's score by the tokens it sums: words + 1 where <end> was
    emitted, the words alone where max_length cut the beam first (its score has no <end> term).

    "s <end>" scores S = log .5 + log .99 over 2 tokens; "l m n", cut at max_length 3, scores
    G = log .3 + 2 log .99 over 3. G / 3 = -0.408 < S / 2 = -0.352: the short one wins. Dividing the
    cut beam by words + 1 = 4 (G / 4 = -0.306) would pick it instead."""
    short, first, second, third = 4, 5, 6, 7
    decoder = markov_decoder({START: {short: 0.5, first: 0.3}, short: {END: 0.99},
                              first: {second: 0.99}, second: {third: 0.99}, third: {END: 0.99}})
    s, g = math.log(0.5) + math.log(0.99), math.log(0.3) + 2 * math.log(0.99)
    assert g / 3 < s / 2 < g / 4  # the hand ranking above
    normalized = beam_search(decoder, make_annotations(0), beam_size=2, max_length=3, length_penalty=1.0)
    assert normalized.tokens[:, :2].tolist() == [[short, END]] * B


@pytest.mark.parametrize("length_penalty", [0.0, 0.7, 2.0])
def test_length_penalty_values_give_valid_captions(length_penalty):
    decoder, annotations = make_decoder(1), make_annotations(1)
    check_captions(beam_search(decoder, annotations, beam_size=3, max_length=6, length_penalty=length_penalty), B, 6)


@pytest.mark.parametrize("fused", [True, False])
def test_image_side_work_is_done_once_per_image_not_per_beam_or_step(fused):
    """The keys W_a a_i and the initial state (h_0, c_0) depend on the image alone: decoding T words
    costs one `start` of the images' batch plus T steps of equal cost (in floating-point operations,
    tests/work.py), and a step's work is per row (B * K rows: a 4-beam step costs 4 greedy steps).
    Redoing the image side per beam would add to the first part; redoing it per step would add the
    same per-image work to every step, whatever K."""
    decoder, annotations = make_decoder(0), make_annotations(0, batch=3)
    decoder.accelerator = accelerator_for(decoder, enabled=fused)
    fused_check.prove_grouped_step(decoder, annotations)  # the fast path's one-time check, not counted
    with torch.no_grad():
        decoder.out.bias[END] = -1e4  # no caption ends: every search runs its max_length steps
        once = flops(decoder.start, annotations)
    assert once > 0
    searches = {"greedy": lambda steps: greedy(decoder, annotations, max_length=steps)}
    for beam_size in (1, 4):
        searches[f"beam{beam_size}"] = lambda steps, k=beam_size: beam_search(decoder, annotations, beam_size=k,
                                                                              max_length=steps)
    per_step = {}
    for name, search in searches.items():
        total = {steps: flops(search, steps) for steps in (1, 2, 5)}
        per_step[name] = total[2] - total[1]
        assert total[5] == total[1] + 4 * per_step[name], name  # every step costs the same
        assert total[1] - per_step[name] == once, name  # and the image side is one start of the batch
    assert per_step["greedy"] > 0
    assert per_step["beam1"] == per_step["greedy"] and per_step["beam4"] == 4 * per_step["greedy"]


def test_decode_dispatches_on_beam_size():
    decoder, annotations = make_decoder(2), make_annotations(2)
    g = greedy(decoder, annotations, max_length=6)
    one = decode(decoder, annotations, beam_size=1, max_length=6)
    assert torch.equal(one.tokens, g.tokens)
    b = beam_search(decoder, annotations, beam_size=3, max_length=6, length_penalty=0.5)
    three = decode(decoder, annotations, beam_size=3, max_length=6, length_penalty=0.5)
    assert torch.equal(three.tokens, b.tokens)
    torch.testing.assert_close(three.scores, b.scores)


def test_decoding_leaves_the_decoder_untouched_and_needs_no_grad():
    decoder, annotations = make_decoder(0), make_annotations(0)
    before = {k: v.clone() for k, v in decoder.state_dict().items()}
    captions = beam_search(decoder, annotations.requires_grad_(True), beam_size=2, max_length=5)
    assert not captions.alphas.requires_grad and not captions.scores.requires_grad
    for key, value in decoder.state_dict().items():
        assert torch.equal(value, before[key]), key


def said_twice(words: list[int], n: int) -> bool:
    """Whether some n consecutive words occur twice in `words` (a reference, written apart from the code)."""
    grams = [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]
    return len(grams) != len(set(grams))


def caption_words(captions: Captions) -> list[list[int]]:
    return [captions.tokens[b, : int(captions.lengths[b])].tolist() for b in range(captions.tokens.shape[0])]


@pytest.mark.parametrize("seed", SEEDS[:4])
@pytest.mark.parametrize("n", [1, 2, 3])
def test_repeated_ngrams_bans_exactly_the_words_that_would_repeat_an_ngram(seed, n):
    generator = torch.Generator().manual_seed(seed)
    history = torch.randint(0, 3, (6, 12), generator=generator)  # a small vocabulary: many repeats
    banned = repeated_ngrams(history, n, 4)
    for row, words in enumerate(history.tolist()):
        grams = {tuple(words[i:i + n]) for i in range(len(words) - n + 1)}
        for word in range(4):
            assert bool(banned[row, word]) == (tuple([*words[len(words) - n + 1:], word][-n:]) in grams), (row, word)
    assert banned.any() and not banned.all()  # the random histories give the check something to see
    assert not repeated_ngrams(history[:, : n - 1], n, 4).any()  # fewer than n words: nothing to repeat


@pytest.mark.parametrize("search", ["greedy", "beam3"])
@pytest.mark.parametrize("n", [1, 2, 3])
def test_no_repeat_ngram_keeps_every_caption_free_of_a_repeated_ngram(search, n):
    """A decoder that loops ("a b a b ...") says each n-gram once at most with the block on."""
    a, b = 4, 5
    decoder = markov_decoder({START: {a: 0.9}, a: {b: 0.9}, b: {a: 0.9}})
    annotations = make_annotations(0)

    def run(block: int) -> Captions:
        if search == "greedy":
            return greedy(decoder, annotations, max_length=10, no_repeat_ngram=block)
        return beam_search(decoder, annotations, beam_size=3, max_length=10, no_repeat_ngram=block)

    assert all(said_twice(words, n) for words in caption_words(run(0)))  # it does loop without the block
    blocked = run(n)
    assert not any(said_twice(words, n) for words in caption_words(blocked))
    check_captions(blocked, B, 10)
    assert blocked.tokens[0, :n].tolist() == [a, b, a][:n]  # up to the block, the model's own choice


@pytest.mark.parametrize("search", ["greedy", "beam3"])
@pytest.mark.parametrize("allow_unk", [False, True])
def test_no_search_says_pad_or_start_nor_unk_unless_allowed(search, allow_unk):
    """A decoder that prefers <unk>, <start> and <pad> above every word still says only words."""
    decoder, annotations = make_decoder(1), make_annotations(1)
    with torch.no_grad():
        decoder.out.bias[UNK] = 50.0
        decoder.out.bias[START] = 40.0
        decoder.out.bias[PAD] = 30.0
    if search == "greedy":
        captions = greedy(decoder, annotations, max_length=6, allow_unk=allow_unk)
    else:
        captions = beam_search(decoder, annotations, beam_size=3, max_length=6, allow_unk=allow_unk)
    said = {word for words in caption_words(captions) for word in words}
    assert not said & {PAD, START}
    assert (UNK in said) == allow_unk
    check_captions(captions, B, 6)


@pytest.mark.parametrize("beam_size", [1, 3, 5])
def test_no_repeat_ngram_follows_each_beam_through_its_reorderings(beam_size):
    """Random decoders repeat themselves; the block looks at each hypothesis's own words, whichever
    beam they came down through."""
    n, captions = 2, []
    for seed in SEEDS:
        decoder, annotations = make_decoder(seed, sharpness=1.5), make_annotations(seed, batch=4)
        with torch.no_grad():
            decoder.out.bias[END] = -1e4  # long captions: more to repeat
        free = beam_search(decoder, annotations, beam_size=beam_size, max_length=12)
        assert any(said_twice(words, n) for words in caption_words(free))  # the block has work to do
        captions += caption_words(beam_search(decoder, annotations, beam_size=beam_size, max_length=12,
                                              no_repeat_ngram=n))
    assert not any(said_twice(words, n) for words in captions)


def test_a_search_that_cannot_end_early_never_asks_the_device_whether_it_has():
    """With min_length = max_length no beam can say <end> before the last word, so the loop reads
    nothing back to stop early: no trip to the host, and a search that a CUDA graph can hold.
    With a shorter min_length it asks once a step past it."""
    from tests.syncs import counting_syncs

    decoder, annotations = make_decoder(3), make_annotations(3)
    fused_check.prove_grouped_step(decoder, annotations)  # the fast path's one check, not the search's work
    with counting_syncs() as fixed:
        captions = beam_search(decoder, annotations, beam_size=3, max_length=6, min_length=6)
    assert fixed.total == 0, fixed.sites
    assert captions.tokens.shape[1] == 6
    with counting_syncs() as free:
        beam_search(decoder, annotations, beam_size=3, max_length=6, min_length=2)
    assert 1 <= free.total <= 4, free.sites


def test_a_search_of_fixed_length_replays_as_one_graph(monkeypatch):
    """What benchmarks/gpu/gpu.py's beam part captures: the whole search, recorded once on the CPU's
    stand-in for CUDA graphs (tests/cuda_graphs.py), then replayed on new annotations copied in, gives
    the eager search's captions, maps and scores for each."""
    from tests.cuda_graphs import cpu_cuda_graphs

    graphs = cpu_cuda_graphs(monkeypatch)
    decoder, annotations = make_decoder(3), make_annotations(3, batch=4)
    fused_check.prove_grouped_step(decoder, annotations)

    def search() -> Captions:
        with torch.no_grad():
            return beam_search(decoder, annotations, beam_size=3, max_length=6, min_length=6)

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = search()
    for seed in range(3):
        annotations.copy_(make_annotations(10 + seed, batch=4))
        graph.replay()
        want = search()
        for name in ("tokens", "alphas", "lengths", "scores", "locations"):
            torch.testing.assert_close(getattr(captured, name), getattr(want, name), msg=name)
    assert len({tuple(row) for row in captured.tokens.tolist()}) > 1  # the images' captions differ
    assert graphs.replays == [3]
