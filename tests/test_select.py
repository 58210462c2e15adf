"""``decodelab.sampling.select`` against sort-based float64 references: each truncation through
``process_logits`` on adversarial rows (ties, flat rows, banned tokens, all mass on one token,
subnormal probabilities, V not a multiple of 128), accepting every answer float32 rounding may
give where a boundary mass is within 1e-6 of p or a statistic within 1e-5 of its cutoff (such
rows counted); ``largest_cut``'s cut and passes; ``sortable``'s order; the draw's exactness
(chi-square at significance 1e-3; fixed seeds, so the outcome is deterministic)."""

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats

import decodelab as dl
from decodelab import sampling
from decodelab.sampling import select

SIGNIFICANCE = 1e-3
MASS_TOL = 1e-6  # a float64 boundary mass this close to p may fall either way in float32
CUTOFF_TOL = 1e-5  # relative: a statistic this close to its cutoff may fall either way
MAX_PASSES = 96  # largest_cut's documented bound

_process = jax.jit(sampling.process_logits)
_processed_logprobs = jax.jit(sampling.processed_logprobs)
_draw = jax.jit(sampling.draw)
_cut = jax.jit(select.largest_cut)


def empty_history(B: int, V: int) -> sampling.History:
    """Every row with no tokens: no penalty applies."""
    zeros = jnp.zeros((B,), jnp.int32)
    return sampling.History(tokens=jnp.zeros((B, 1), jnp.int32), prompt_lengths=zeros,
                            lengths=zeros, eos_mask=jnp.zeros((V,), bool))


def kept(logits: np.ndarray, **setting) -> np.ndarray:
    """``[B, V]`` bool: the tokens the library leaves finite."""
    B, V = logits.shape
    out = _process(jnp.asarray(logits, jnp.float32), dl.SamplingParams(**setting).per_row(B, V),
                   empty_history(B, V))
    return np.asarray(out) > -np.inf


# --- Sort-based references in float64 (one row) -----------------------------------------------


def log_softmax64(x: np.ndarray) -> np.ndarray:
    z = x.astype(np.float64) - x.max()
    return z - np.log(np.exp(z).sum())


def softmax64(x: np.ndarray) -> np.ndarray:
    return np.exp(log_softmax64(x))


def entropy64(p: np.ndarray) -> float:
    return float(-(p[p > 0] * np.log(p[p > 0])).sum())


def ref_top_k(x: np.ndarray, k: int) -> list[np.ndarray]:
    """The first k of a stable descending sort (lowest ids first among ties): one answer."""
    keep = np.isin(np.arange(len(x)), np.argsort(-x.astype(np.float64), kind="stable")[:k])
    return [keep & (x > -np.inf)]


def ref_top_mass(order: np.ndarray, p: np.ndarray, target: float) -> list[np.ndarray]:
    """The smallest set of tied groups, largest ``order`` first, whose float64 mass reaches
    ``target`` (all tokens if none does); then every other prefix of groups that float32 rounding
    may give instead: one whose mass through its last group is within MASS_TOL of the target or
    above it, and before its last group within MASS_TOL of it or below. The exact answer first."""
    allowed = order > -np.inf
    negated, group = np.unique(-order[allowed], return_inverse=True)
    values = -negated  # the distinct values, largest first (-0.0 and 0.0 one group)
    through = np.cumsum(np.bincount(group, weights=p[allowed]))  # float64 prefix sums of groups
    last = int(np.argmax(through >= target)) if through[-1] >= target else len(values) - 1
    before = np.concatenate([[0.0], through[:-1]])
    near = (through >= target - MASS_TOL) & (before < target + MASS_TOL)
    near[-1] |= through[-1] < target + MASS_TOL  # all tokens: the float32 total may fall short
    options = [last] + [j for j in np.flatnonzero(near) if j != last]
    return [order >= values[j] for j in options]


def ref_top_p(x: np.ndarray, top_p: float) -> list[np.ndarray]:
    return ref_top_mass(x.astype(np.float64), softmax64(x), top_p)


def ref_typical(x: np.ndarray, typical_p: float) -> list[np.ndarray]:
    logp = log_softmax64(x)  # finite for every allowed token, even where p underflows
    p = np.exp(logp)
    closeness = np.where(x > -np.inf, -np.abs(-logp - entropy64(p)), -np.inf)
    return ref_top_mass(closeness, p, typical_p)


def ref_cutoff(stat: np.ndarray, threshold: float, always=np.False_) -> list[np.ndarray]:
    """``stat >= threshold`` (or ``always``); with the alternative where a statistic within
    CUTOFF_TOL of the threshold falls the other way."""
    keep = (stat >= threshold) | always
    close = (np.abs(stat - threshold) <= CUTOFF_TOL * abs(threshold)) & (stat != threshold)
    return [keep] if not (close & ~always).any() else [keep, keep ^ (close & ~always)]


def ref_probability_cutoff(name: str, x: np.ndarray, v: float) -> list[np.ndarray]:
    """min-p: p >= v max p; epsilon: p >= v; eta: p >= min(v, sqrt(v) e^-H); the last two
    always keep the most probable."""
    p = softmax64(x)
    if name == "min_p":
        return ref_cutoff(p, v * p.max())
    threshold = v if name == "epsilon" else min(v, np.sqrt(v) * np.exp(-entropy64(p)))
    return ref_cutoff(p, threshold, p >= p.max())


def ref_top_n_sigma(x, n):
    """logit >= max - n std, over the allowed logits."""
    finite = x[x > -np.inf].astype(np.float64)
    return ref_cutoff(x.astype(np.float64), finite.max() - n * finite.std())


# --- Adversarial rows -------------------------------------------------------------------------


def adversarial_rows(V: int, seed: int = 0) -> np.ndarray:
    """``[R, V]`` float32 rows that stress the cuts."""
    rng = np.random.default_rng(seed)
    normal = rng.normal(size=V)
    banned = rng.random(V) < 0.3
    banned[rng.integers(V)] = False
    rows = [
        normal * 2,
        np.round(normal * 1.5),  # ties everywhere: a handful of values
        np.round(normal * 0.3) * 0.7,  # ties, one group holding most tokens
        np.zeros(V),  # flat
        np.full(V, 0.3),  # flat at a value whose sums round
        np.where(banned, -np.inf, normal * 3),  # banned tokens
        np.where(banned, -np.inf, np.round(normal)),  # banned tokens and ties
        np.where(np.arange(V) == rng.integers(V), 1.5, -np.inf),  # one allowed token
        np.concatenate([[0.0], np.full(V - 1, -100.0)]),  # the rest subnormal (or 0 in float32)
        np.concatenate([[0.0], -103.0 - np.arange(V - 1)]),
        np.concatenate([[60.0], np.zeros(V - 1)]),  # one token holds all the mass
        np.where(np.arange(V) % 3 == 0, 0.0, -5.0),  # two tied groups
        -np.arange(V, dtype=np.float64) * 0.05,  # geometric probabilities
        normal * 30,  # large logits, a few tokens hold the mass
    ]
    return np.stack(rows).astype(np.float32)


VOCABS = [1000, 4097, pytest.param(49152, marks=pytest.mark.slow)]

SWEEPS = {  # name -> (per-row values tried, the reference); rows cycle through the values
    "top_k": ([0, 1, 2, 5, 50, 999, 4096, 49151, 60000], ref_top_k),
    "top_p": ([1.0, 0.5, 0.9, 0.3, 0.999, 0.9999, float(np.float32(1 - 2**-24)), 1e-6, 0.95],
              ref_top_p),
    "typical_p": ([1.0, 0.5, 0.9, 0.2, 0.999, 0.9999, 1e-6, 0.95], ref_typical),
    "min_p": ([0.0, 0.1, 0.5, 1.0, 1e-3, 0.9, 1e-20], partial(ref_probability_cutoff, "min_p")),
    "epsilon": ([0.0, 1e-4, 1e-3, 0.01, 0.1, 0.5, 0.9], partial(ref_probability_cutoff, "epsilon")),
    "eta": ([0.0, 1e-4, 1e-3, 0.01, 0.1, 0.5], partial(ref_probability_cutoff, "eta")),
    "top_n_sigma": ([0.0, 0.5, 1.0, 2.0, 3.0, 10.0], ref_top_n_sigma),
}
# Boundaries on random rows: p close to 1 puts many tiny tokens within MASS_TOL of the boundary.
RANDOM_SWEEPS = {"top_p": [0.3, 0.5, 0.7, 0.9, 0.95], "typical_p": [0.2, 0.5, 0.7, 0.9, 0.95]}
NEUTRAL = {name: p.neutral for name, p in sampling.PARAMETERS.items()}


def compare(name: str, logits: np.ndarray, values: list) -> tuple[int, list]:
    """Run processor ``name`` with per-row ``values`` (rotated over the rows, so each row meets
    each value) and check every row against its reference; returns (rows checked, [(row, value)]
    where float32 rounding could decide)."""
    reference = SWEEPS[name][1]
    B, V = logits.shape
    ambiguous = []
    for shift in range(len(values)):
        row_values = [values[(b + shift) % len(values)] for b in range(B)]
        got = kept(logits, **{name: row_values})
        for b, v in enumerate(row_values):
            finite = logits[b] > -np.inf
            if v == NEUTRAL[name] or (name == "top_k" and v >= V):
                options = [finite]  # off: every allowed token stays
            else:
                stored = v if name == "top_k" else float(np.float32(v))  # as RowParams holds it
                options = [o & finite for o in reference(logits[b], stored)]
            assert any((got[b] == o).all() for o in options), (
                f"{name}={v} row {b}: kept {np.flatnonzero(got[b])[:20]}, reference "
                f"{np.flatnonzero(options[0])[:20]} ({options[0].sum()} tokens)")
            ambiguous += [(b, v)] * (len(options) > 1)
    return B * len(values), ambiguous


@pytest.mark.parametrize("V", VOCABS)
@pytest.mark.parametrize("name", list(SWEEPS))
def test_each_truncation_keeps_the_sort_based_set_on_adversarial_rows(name, V):
    rows, ambiguous = compare(name, adversarial_rows(V), SWEEPS[name][0])
    print(f"{name} V={V}: {len(ambiguous)} of {rows} rows where rounding may decide: {ambiguous}")


@pytest.mark.parametrize("name", ["top_p", "typical_p", "min_p", "eta", "top_n_sigma"])
def test_float32_rounding_rarely_decides_on_random_rows(name):
    """On smooth random rows fewer than 1% of boundaries are within rounding of the setting."""
    rng = np.random.default_rng(1)
    logits = (rng.normal(size=(64, 1000)) * rng.uniform(0.5, 4, size=(64, 1))).astype(np.float32)
    values = RANDOM_SWEEPS.get(name) or [v for v in SWEEPS[name][0] if v != NEUTRAL[name]]
    rows, ambiguous = compare(name, logits, values)
    print(f"{name}: {len(ambiguous)} of {rows} random rows where float32 rounding could decide")
    assert len(ambiguous) < 0.01 * rows


# --- largest_cut: the documented cut, in a bounded number of passes ----------------------------


def ref_cut(keys: np.ndarray, weights: np.ndarray, target: float) -> int:
    """``max{k : weight at or above k >= target}``, else the smallest key (integer weights)."""
    values = np.unique(keys)
    reach = np.array([weights[keys >= v].sum() for v in values]) >= target
    return int(values[reach].max() if reach.any() else values.min())


def sortable64(x) -> np.ndarray:
    return np.asarray(select.sortable(jnp.asarray(x, jnp.float32)))


def adversarial_keys(V: int) -> list[np.ndarray]:
    """``[V]`` int32 key rows that stress the search: extremes, ties, uneven spacing."""
    rng, tiny, big = np.random.default_rng(2), 1e-45, np.finfo(np.float32).max
    return [
        sortable64(rng.choice([-np.inf, np.inf, -big, big, tiny, -tiny, 0.0, 1.0], V)),
        sortable64(np.full(V, 0.3)),  # one tied group
        sortable64(np.where(rng.random(V) < 0.5, -np.inf, np.inf)),  # two groups, far apart
        sortable64(2.0 ** -rng.integers(0, 149, V)),  # every binade, subnormals included
        sortable64(np.round(rng.normal(size=V) * 2)),  # ties everywhere
        sortable64(np.exp(rng.normal(size=V) * 20)),  # spacing uneven by many binades
        rng.integers(-2**31, 2**31 - 1, V, endpoint=True).astype(np.int32),  # any int32
        -np.arange(V, dtype=np.int32),  # distinct, evenly spaced integers
    ]


@pytest.mark.parametrize("V", [1, 7, 1000])
def test_largest_cut_is_the_documented_cut_within_the_pass_bound(V):
    rng, most = np.random.default_rng(V), 0
    for keys in adversarial_keys(V):
        for weights in [None, rng.integers(0, 4, V), np.eye(1, V, rng.integers(V))[0] * 5]:
            w = np.ones(V) if weights is None else weights.astype(np.float64)
            targets = np.array([0.5, 1, w.sum(), w.sum() + 1, max(1, w.sum() // 2), V // 3 + 1])
            rows = jnp.asarray(np.broadcast_to(w, (6, V)), jnp.float32)
            cut, passes = _cut(jnp.asarray(np.broadcast_to(keys, (6, V))),
                               None if weights is None else rows, jnp.asarray(targets, jnp.float32),
                               jnp.asarray(np.arange(6) != 3))  # row 3 off: its smallest key
            expected = [ref_cut(keys, w, t) for t in targets[:3]] + [keys.min()] + [
                ref_cut(keys, w, t) for t in targets[4:]]
            np.testing.assert_array_equal(np.asarray(cut), expected)
            most = max(most, int(passes))
    print(f"V={V}: at most {most} passes on adversarial rows")
    assert most <= MAX_PASSES


@pytest.mark.parametrize("V", [4096, pytest.param(49152, marks=pytest.mark.slow)])
def test_largest_cut_needs_few_passes_on_smooth_rows(V):
    """Normal logits, a random k (top-k) or mass (top-p): each row alone stops far below the
    bound; prints the mean pass count."""
    rng, on = np.random.default_rng(3), jnp.ones((1,), bool)
    counts = {"top_k": [], "top_p": []}
    for _ in range(16):
        logits = jnp.asarray(rng.normal(size=(1, V)) * rng.uniform(0.5, 3), jnp.float32)
        keys, p = select.sortable(logits), jax.nn.softmax(logits, axis=-1)
        k = jnp.asarray([rng.integers(1, V)], jnp.float32)
        mass = jnp.asarray([rng.uniform(0.05, 0.99)], jnp.float32) * jnp.sum(p, axis=-1)
        counts["top_k"].append(int(_cut(keys, None, k, on)[1]))
        counts["top_p"].append(int(_cut(keys, p, mass, on)[1]))
    for name, passes in counts.items():
        print(f"V={V} {name}: passes mean {np.mean(passes):.1f}, max {max(passes)}")
        assert max(passes) <= 40


def test_keep_top_weight_reaches_a_fraction_of_the_rows_total():
    """Weights 1/2, 1/4, 1/8, 1/16 (total 15/16, every sum exact): the fraction 0.9 of the total
    is 0.84375, which the first three reach (an absolute 0.9 would need all four)."""
    keep = select.keep_top_weight(select.sortable(jnp.asarray([[4.0, 3.0, 2.0, 1.0]])),
                                  jnp.asarray([[0.5, 0.25, 0.125, 0.0625]]), jnp.asarray([0.9]),
                                  jnp.asarray([True]))
    np.testing.assert_array_equal(np.asarray(keep), [[True, True, True, False]])


# --- sortable: integer order is float order ---------------------------------------------------


def test_sortable_preserves_order_ties_zeros_and_unsortable_inverts_it():
    rng = np.random.default_rng(4)
    info = np.finfo(np.float32)
    special = np.array([-np.inf, np.inf, -0.0, 0.0, info.max, info.min, info.tiny, -info.tiny,
                        1e-45, -1e-45, 1e-40, -1e-40, 1.0, -1.0], np.float32)  # 1e-45: subnormal
    bits = rng.integers(0, 2**32, 20000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    x = np.concatenate([special, bits[~np.isnan(bits)], rng.normal(size=2000).astype(np.float32)])
    x = np.sort(np.concatenate([x, x[:500]]))  # ascending, with repeats
    keys = sortable64(x)  # int32
    step = np.diff(keys.astype(np.int64))
    np.testing.assert_array_equal(step > 0, x[1:] > x[:-1])  # strictly larger -> larger key
    np.testing.assert_array_equal(step == 0, x[1:] == x[:-1])  # equal (-0.0 == 0.0) -> one key
    back = np.asarray(select.unsortable(jnp.asarray(keys)))
    same = back.view(np.uint32) == np.where(x == 0, np.float32(0.0), x).view(np.uint32)
    assert same.all()  # bit for bit, subnormals included; -0.0 comes back as 0.0
    image = rng.integers(*sortable64([-np.inf, np.inf]), 20000, endpoint=True).astype(np.int32)
    image = image[image != -1]  # -1: the bits of -0.0, which sortable maps to 0
    np.testing.assert_array_equal(sortable64(select.unsortable(jnp.asarray(image))), image)


# --- draw: exact samples from the kept distribution --------------------------------------------


def draws(logprobs: np.ndarray, n: int, seed: int = 0) -> np.ndarray:
    """``[V]`` log-probabilities -> ``[V]`` counts of ``n`` draws, each from its own key."""
    keys = jax.random.split(jax.random.key(seed), n)
    rows = jnp.broadcast_to(jnp.asarray(logprobs, jnp.float32), (n, logprobs.shape[-1]))
    return np.bincount(np.asarray(_draw(rows, keys)), minlength=logprobs.shape[-1])


def assert_fits(counts: np.ndarray, logprobs: np.ndarray) -> None:
    """Chi-square goodness of fit at SIGNIFICANCE (tokens expected fewer than 5 times pooled);
    a token of probability 0 is never drawn."""
    p = np.exp(logprobs.astype(np.float64))
    assert counts[p == 0].sum() == 0, np.flatnonzero(counts * (p == 0))
    observed, expected = counts[p > 0], p[p > 0] / p.sum() * counts.sum()
    rare = expected < 5
    if rare.any():
        observed = np.append(observed[~rare], observed[rare].sum())
        expected = np.append(expected[~rare], expected[rare].sum())
    if len(observed) > 1:
        assert scipy.stats.chisquare(observed, expected).pvalue > SIGNIFICANCE


DRAW_V = 40  # three blocks of 16, the last one partial
DRAW_LOGITS = (np.random.default_rng(5).normal(size=DRAW_V) * 1.5).astype(np.float32)
TIED_LOGITS = np.where(np.arange(DRAW_V) % 5 == 0, -np.inf,
                       np.round(DRAW_LOGITS)).astype(np.float32)  # ties and banned tokens
DRAW_SETTINGS = [(False, {name: v}) for name, v in [
    ("temperature", 0.7), ("top_k", 5), ("top_p", 0.8), ("min_p", 0.1), ("typical_p", 0.9),
    ("epsilon", 0.02), ("eta", 0.05), ("top_n_sigma", 1.0)]] + [  # top-k 7 splits a tied group:
        (True, {}), (True, {"top_k": 7}), (True, {"top_p": 0.6, "temperature": 1.3})]


@pytest.mark.parametrize("i, tied, setting", [(i, *s) for i, s in enumerate(DRAW_SETTINGS)],
                         ids=[("tied " if t else "") + str(s) for t, s in DRAW_SETTINGS])
def test_draws_fit_the_kept_distribution_of_each_processor(i, tied, setting):
    logits = TIED_LOGITS if tied else DRAW_LOGITS
    lp = np.asarray(_processed_logprobs(logits[None], dl.SamplingParams(**setting).per_row(
        1, DRAW_V), empty_history(1, DRAW_V)))[0]
    assert_fits(draws(lp, 30000, seed=i), lp)


@pytest.mark.parametrize("V", [1, 7, 1000, 4097])
def test_draws_fit_at_any_vocabulary_size_and_one_allowed_token_is_always_drawn(V):
    rng = np.random.default_rng(V)
    logits = rng.normal(size=V)
    heavy = np.unique([0, V // 2, V - 2, V - 1])[-min(V, 4):]  # ends of blocks, the last partial
    logits[heavy] += 7.0
    logits[rng.random(V) < 0.2] = -np.inf
    logits[V - 1] = 7.5
    lp = np.asarray(jax.nn.log_softmax(jnp.asarray(logits, jnp.float32)))
    assert_fits(draws(lp, min(20000, 10**7 // V)), lp)  # [n, V] stays below 40 MB
    for token, rest in [(t, r) for t in np.unique([0, V // 2, V - 1]) for r in [-np.inf, -200.0]]:
        one = np.where(np.arange(V) == token, 0.0, rest)  # -200: a probability 0 in float32
        assert draws(one, 500, seed=int(token))[token] == 500


def test_a_rows_draw_depends_only_on_its_row_and_key():
    rng, V = np.random.default_rng(6), 1000
    logits = jnp.asarray(np.where(rng.random((24, V)) < 0.1, -np.inf, rng.normal(size=(24, V))
                                  * rng.uniform(0.3, 3, size=(24, 1))), jnp.float32)
    keys = jax.random.split(jax.random.key(7), 24)
    together = np.asarray(_draw(logits, keys))
    order = rng.permutation(24)
    others = jnp.asarray(rng.normal(size=(9, V)) * 5, jnp.float32)
    mixed = _draw(jnp.concatenate([logits[order], others]),
                  jnp.concatenate([keys[order], jax.random.split(jax.random.key(8), 9)]))
    np.testing.assert_array_equal(np.asarray(mixed)[:24], together[order])
    alone = [int(_draw(logits[b:b + 1], keys[b:b + 1])[0]) for b in range(0, 24, 5)]
    np.testing.assert_array_equal(alone, together[::5])
    grid = _draw(logits.reshape(4, 6, V), keys.reshape(4, 6))  # [..., V] rows: the same draws
    np.testing.assert_array_equal(np.asarray(grid).reshape(-1), together)


def test_a_draw_s_total_is_the_rows_logsumexp_and_its_tokens_are_draw_s():
    """``draw_with_total``: the tokens of ``draw`` (on the logits, or on their log-softmax up to
    its rounding), and ``logsumexp`` of each row from the draw's own sums, -inf for a row that
    allows no token; the drawn token's logprob is its logit less the total."""
    rng, V = np.random.default_rng(9), 1000
    logits = np.where(rng.random((12, V)) < 0.2, -np.inf,
                      rng.normal(size=(12, V)) * rng.uniform(0.3, 30, size=(12, 1)) + 50.0)
    logits[3] = -np.inf  # no allowed token
    logits = jnp.asarray(logits, jnp.float32)
    keys = jax.random.split(jax.random.key(10), 12)
    token, total = map(np.asarray, jax.jit(sampling.draw_with_total)(logits, keys))
    np.testing.assert_array_equal(token, np.asarray(_draw(logits, keys)))
    assert total[3] == -np.inf
    some = np.arange(12) != 3  # the rows with an allowed token
    np.testing.assert_allclose(total[some], np.asarray(jax.nn.logsumexp(logits, axis=-1))[some],
                               rtol=1e-6)
    chosen = np.take_along_axis(np.asarray(logits), token[:, None], axis=1)[some, 0]
    lp = np.asarray(jax.nn.log_softmax(logits, axis=-1))
    reference = np.take_along_axis(lp, token[:, None], axis=1)[some, 0]
    np.testing.assert_allclose(chosen - total[some], reference, atol=1e-4)


def test_a_token_of_probability_zero_is_never_drawn_where_block_sums_round():
    """Blocks of 16: token 0 holds a < 1; block 1, banned token 16 and token 17 (holding 1).
    Where a + 1 rounds up, (a + 1) - 1 > a, and a draw that began block 1 at that difference
    gave token 16 for a point in between. Searches rows and seeds (u = m 2^-23) for such points."""
    x0 = np.unique(np.float32(np.log(0.7)) + np.arange(1 << 14, dtype=np.float32) * 1e-7)
    a = np.asarray(jax.jit(jnp.exp)(jnp.asarray(x0)))  # token 0's mass, as the draw computes it
    total = a + np.float32(1)
    wanted = {}  # m -> row whose window [a, (a + 1) - 1) holds fl(m 2^-23 * total)
    for j in np.flatnonzero(total - 1 > a):
        m0 = int(a[j] / (2.0**-23 * float(total[j])))
        for m in range(m0 - 2, m0 + 3):
            if a[j] <= np.float32(m * 2.0**-23) * total[j] < total[j] - 1:
                wanted.setdefault(m, j)
    seeds = jnp.arange(1 << 16, dtype=jnp.uint32)
    u = np.asarray(jax.vmap(lambda s: jax.random.uniform(jax.random.key(s), ()))(seeds))
    hits = [(s, wanted[m]) for s, m in enumerate(np.round(u * 2**23).astype(int)) if m in wanted]
    assert len(hits) >= 4  # the search found such points
    rows = np.full((len(hits), 32), -np.inf, np.float32)
    rows[:, 0], rows[:, 17] = x0[[j for _, j in hits]], 0.0
    keys = jax.vmap(jax.random.key)(jnp.asarray([s for s, _ in hits], jnp.uint32))
    np.testing.assert_array_equal(np.asarray(_draw(jnp.asarray(rows), keys)), 17)


# --- A few largest entries without a sort ---------------------------------------------------------


def test_argmax_is_jnp_argmax_ties_zeros_and_nan_rows_included():
    """``sampling.argmax`` (float32 ids): the lowest index of the maximum, ``-0.0`` tied with
    ``0.0``; a NaN row gives an index in range; an axis of 2^24 or more ids is refused (float32
    holds every integer below it exactly)."""
    rng = np.random.default_rng(11)
    rows = np.round(rng.normal(size=(16, 4099)) * 2).astype(np.float32)  # ties everywhere
    rows[3] = -np.inf
    rows[4, [7, 9]] = np.inf
    rows[5] = np.where(rng.random(4099) < 0.5, -0.0, 0.0) - 1.0 * (np.arange(4099) % 2)
    got = np.asarray(jax.jit(sampling.argmax)(jnp.asarray(rows)))
    np.testing.assert_array_equal(got, np.argmax(rows, axis=-1))
    nan = np.asarray(jax.jit(sampling.argmax)(jnp.full((2, 5), jnp.nan)))
    assert ((0 <= nan) & (nan < 5)).all()
    with pytest.raises(ValueError, match="2\\^24"):
        jax.eval_shape(sampling.argmax, jax.ShapeDtypeStruct((1, 1 << 24), jnp.float32))


@pytest.mark.parametrize("k", [1, 3, 8])
def test_largest_is_lax_top_k_ties_and_infinities_included(k):
    """Descending values, ties to the lower id, ``-inf`` entries after every finite one (in id
    order) when a row has fewer than k finite entries: ``lax.top_k``'s result on every row but
    one, where ``-0.0`` and ``0.0`` tie as in ``argmax`` (``lax.top_k`` orders them)."""
    rng = np.random.default_rng(k)
    x = rng.integers(-3, 4, (64, 40)).astype(np.float32)  # many ties
    x[::3] = rng.normal(size=(22, 40)).astype(np.float32)
    x[1, :] = -np.inf
    x[2, 5:] = -np.inf  # 5 finite entries
    x[4, 10] = np.inf
    x[5, :] = 0.0
    x[5, ::2] = -0.0  # -0.0 and 0.0 tie: the lower id first
    values, ids = select.largest(jnp.asarray(x), k)
    want_values, want_ids = map(np.array, jax.lax.top_k(jnp.asarray(x), k))
    want_ids[5] = np.arange(k)  # the zeros of either sign, in id order
    np.testing.assert_array_equal(np.asarray(ids), want_ids)
    assert int(ids[5, 0]) == int(jnp.argmax(jnp.asarray(x[5])))
    np.testing.assert_array_equal(np.asarray(values), np.asarray(want_values))
    assert ids.dtype == jnp.int32 and values.shape == (64, k)


def test_largest_compiles_to_no_sort_and_refuses_k_out_of_range():
    import programs

    found = programs.primitives(lambda x: select.largest(x, 4), jnp.zeros((2, 4096)))
    assert not {"sort", "top_k"} & set(found), found
    for k in (0, 41):
        with pytest.raises(ValueError, match=rf"k must be in \[1, 40\].*got {k}"):
            select.largest(jnp.zeros((2, 40)), k)
