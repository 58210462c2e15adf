"""Mirostat v1 and v2: bad settings are refused naming the field; v2 keeps the tokens of surprise
at most mu and draws exactly from them; v1 keeps floor(k) of its Zipf estimate (and its limits);
on identical logits and tokens the kept sets and probabilities equal llama.cpp's own samplers'
within 1e-6 step after step (where the ``llamacpp`` extra is installed), so the mu sequences
agree; each row's mu is carried through ``generate`` (every recorded log-probability is the one
of the cut at the mu its earlier tokens left), and through the serving engine, where a slot's
mu starts afresh with each request and a preempted request resumes with its own.
Speculative Mirostat's distribution is tested with the other losslessness tests
(test_speculative.py)."""

import ctypes
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats
from flax import nnx

import decodelab as dl
from decodelab import sampling
from decodelab.sampling import mirostat
from decodelab.serving import Request, SlotEngine

SIGNIFICANCE = 1e-3  # a correct sampler fails a statistical test with this probability


# --- Bad input ------------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs, message", [
    (dict(mirostat=3), r"mirostat must be an int in \[0, 2\] \(0 disables it, 1 is Mirostat v1, "
                       r"2 is Mirostat v2\), got 3"),
    (dict(mirostat=-1), r"mirostat must be an int in \[0, 2\] .*, got -1"),
    (dict(mirostat=1.0), r"mirostat must be an int or one per row, got 1.0"),
    (dict(mirostat=[0, 1, 5]), r"mirostat\[2\] must be an int in \[0, 2\] .*, got 5"),
    (dict(mirostat_tau=0.0), r"mirostat_tau must be in \(0, 64\] \(bits\), got 0.0"),
    (dict(mirostat_tau=65.0), r"mirostat_tau must be in \(0, 64\] \(bits\), got 65.0"),
    (dict(mirostat_tau=float("nan")), r"mirostat_tau must be in \(0, 64\] \(bits\), got nan"),
    (dict(mirostat_eta=-0.1), r"mirostat_eta must be in \[0, 1\] \(0 keeps mu at 2 \* tau\), "
                              r"got -0.1"),
    (dict(mirostat_eta=1.5), r"mirostat_eta must be in \[0, 1\] .*, got 1.5"),
    (dict(mirostat_eta="fast"), r"mirostat_eta must be a number or one per row, got 'fast'"),
])
def test_bad_settings_are_refused_naming_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message):
        dl.SamplingParams(**kwargs)


def test_mirostat_is_the_last_processor():
    """Its mu learns from the surprise of the token drawn from the processed distribution, which
    must therefore be its own output: no processor may follow it."""
    assert isinstance(sampling.PROCESSORS[-1], mirostat.Mirostat)
    assert list(sampling.PARAMETERS)[-3:] == ["mirostat", "mirostat_tau", "mirostat_eta"]


def test_the_defaults_are_llama_cpps():
    params = dl.SamplingParams()
    assert (params.mirostat, params.mirostat_tau, params.mirostat_eta) == (0, 5.0, 0.1)


# --- The cut at a given mu ------------------------------------------------------------------------


@jax.jit
def _cut(logits, params, mu):
    return mirostat.truncated(logits, params, mu)


def cut(version: int, logits: np.ndarray, mu) -> np.ndarray:
    """``[B, V]`` renormalised probabilities of Mirostat ``version``'s cut at ``mu [B]``."""
    rows, V = logits.shape
    params = dl.SamplingParams(mirostat=version).per_row(rows, V)
    out = _cut(jnp.asarray(logits, jnp.float32), params, jnp.asarray(mu, jnp.float32))
    return np.exp(np.asarray(jax.nn.log_softmax(out, axis=-1), np.float64))


def test_v2_keeps_the_tokens_whose_surprise_is_at_most_mu():
    """Probabilities 1/2, 1/4, 1/8, 1/16, 1/16 (surprises 1, 2, 3, 4, 4 bits): mu 0.5 keeps the
    most probable alone, 2.5 two tokens, 3.5 three, 4.5 all; each renormalised."""
    p = np.asarray([0.5, 0.25, 0.125, 0.0625, 0.0625])
    got = cut(2, np.tile(np.log(p), (4, 1)), [0.5, 2.5, 3.5, 4.5])
    for row, n in enumerate([1, 2, 3, 5]):
        np.testing.assert_allclose(got[row], np.r_[p[:n] / p[:n].sum(), np.zeros(5 - n)],
                                   rtol=0, atol=1e-6)


def test_v1_keeps_floor_k_of_its_zipf_estimate():
    """Probabilities proportional to 1 / (i + 1)^2 over 16 tokens (in a shuffled id order): the
    estimate is s = 2, so k = (2^mu / (1 - 1/16))^(1/2): 1.03, 2.07, 4.13, 8.26 and 33 at mu
    0, 2, 4, 6 and 10, keeping the 1, 2, 4, 8 and all 16 most probable tokens."""
    V = 16
    order = np.random.default_rng(0).permutation(V)  # order[i]: the id of the i-th largest
    logits = np.empty(V)
    logits[order] = -2.0 * np.log(np.arange(1, V + 1))
    got = cut(1, np.tile(logits, (5, 1)), [0.0, 2.0, 4.0, 6.0, 10.0])
    for row, n in enumerate([1, 2, 4, 8, 16]):
        assert set(np.flatnonzero(got[row])) == set(order[:n])
        np.testing.assert_allclose(got[row], np.where(np.isin(np.arange(V), order[:n]),
                                                      np.exp(logits), 0.0)
                                   / np.exp(logits[order[:n]]).sum(), rtol=0, atol=1e-6)


def test_v1_at_its_limits():
    """A huge mu keeps every token (k is computed in log space: llama.cpp's powf overflows and
    its int conversion of the infinite k is undefined); a row with one allowed token keeps it;
    a flat row (s = 0) keeps all when 2^mu > V - 1, else the one lowest id."""
    V = 16
    rng = np.random.default_rng(1)
    logits = np.stack([rng.standard_normal(V), np.where(np.arange(V) == 5, 0.0, -np.inf),
                       np.zeros(V), np.zeros(V)])
    got = cut(1, logits, [200.0, 3.0, 5.0, 3.0])
    assert [int(np.count_nonzero(row)) for row in got] == [V, 1, V, 1]
    assert got[1, 5] == got[3, 0] == 1.0


def test_v2_draws_at_a_fixed_mu_are_exactly_its_kept_distribution():
    """eta 0 holds mu at 2 tau = 5 bits: 4,000 draws (each row its own key) from a random row of
    64 tokens fall on the tokens of probability >= 1/32 only, distributed as their renormalised
    probabilities (chi-square at SIGNIFICANCE)."""
    rows, V = 4000, 64
    logits = np.tile(2.0 * np.random.default_rng(2).standard_normal(V).astype(np.float32),
                     (rows, 1))
    params = dl.SamplingParams(mirostat=2, mirostat_tau=2.5, mirostat_eta=0.0)
    zeros = jnp.zeros((rows,), jnp.int32)
    history = sampling.History(tokens=jnp.zeros((rows, 1), jnp.int32), prompt_lengths=zeros,
                               lengths=zeros, eos_mask=jnp.zeros((V,), bool))
    logprobs = jax.jit(sampling.processed_logprobs)(jnp.asarray(logits),
                                                    params.per_row(rows, V), history)
    keys = sampling.row_keys(sampling.batch_keys(0, rows), zeros)
    counts = np.bincount(np.asarray(sampling.draw(logprobs, keys)), minlength=V)
    p = np.exp(logits[0].astype(np.float64) - logits[0].max())
    p /= p.sum()
    support = -np.log2(p) <= 5.0
    assert 3 <= support.sum() < V and counts[~support].sum() == 0
    expected = p[support] / p[support].sum() * rows
    assert scipy.stats.chisquare(counts[support], expected).pvalue > SIGNIFICANCE


# --- llama.cpp's own samplers ---------------------------------------------------------------------


def llama_cpp_step(llama, sampler, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """Apply a llama.cpp sampler to one row of logits: the ids it keeps, their probabilities and
    the id it selects (drawn with its own generator)."""
    data = np.zeros(len(logits), np.dtype([("id", np.intc), ("logit", np.single),
                                           ("p", np.single)], align=True))
    data["id"], data["logit"] = np.arange(len(logits)), logits
    array = llama.llama_token_data_array(data=data.ctypes.data_as(llama.llama_token_data_p),
                                         size=len(logits), selected=-1, sorted=False)
    llama.llama_sampler_apply(sampler, ctypes.byref(array))
    kept = data[:array.size]
    return kept["id"].copy(), kept["p"].copy(), int(data["id"][array.selected])


@pytest.mark.parametrize("version, tau, eta", [(1, 3.0, 0.1), (2, 3.0, 0.1), (1, 4.0, 0.3),
                                               (2, 5.0, 0.5)])
def test_kept_sets_and_probabilities_equal_llama_cpps_step_after_step(version, tau, eta):
    """200 steps over random logits of 1,000 tokens (scales 1 to 4): llama.cpp's Mirostat picks
    each token with its own generator and moves its own mu; decodelab's mu moves by the same
    token's log-probability under decodelab's cut. At every step the kept sets are equal and the
    probabilities agree within 1e-6, so the two mu sequences agree (v2's kept set is a step
    function of mu, v1's k a monotone one); the sets vary (the test is not vacuous)."""
    llama = pytest.importorskip("llama_cpp.llama_cpp", reason="the llamacpp extra")
    V = 1000
    sampler = (llama.llama_sampler_init_mirostat(V, 1234, tau, eta, mirostat.M) if version == 1
               else llama.llama_sampler_init_mirostat_v2(1234, tau, eta))
    params = dl.SamplingParams(mirostat=version, mirostat_tau=tau,
                               mirostat_eta=eta).per_row(1, V)
    mu = mirostat.start_mu(params)
    step = jax.jit(lambda logits, mu: jax.nn.log_softmax(mirostat.truncated(logits, params, mu)))
    rng = np.random.default_rng(version)
    sizes = []
    try:
        for _ in range(200):
            logits = (rng.standard_normal(V) * rng.uniform(1, 4)).astype(np.float32)
            ids, p, token = llama_cpp_step(llama, sampler, logits)
            logprobs = step(jnp.asarray(logits)[None], mu)  # [1, V]
            ours = np.exp(np.asarray(logprobs[0], np.float64))
            assert set(np.flatnonzero(ours)) == set(ids)
            np.testing.assert_allclose(ours[ids], p, rtol=0, atol=1e-6)
            sizes.append(len(ids))
            mu = mirostat.advanced_mu(mu, logprobs[:, token], params, jnp.ones((1,), bool))
    finally:
        llama.llama_sampler_free(sampler)
    assert min(sizes) < 10 < max(sizes)


# --- Carried by the loops -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tiny_config):
    return dl.Transformer(tiny_config.replace(position="rope"), rngs=nnx.Rngs(0))


LN2 = math.log(2.0)
PROMPT = [5, 17, 300, 2]
MIXED = dl.SamplingParams(temperature=[0.5, 0.5, 0.5, 0.0], mirostat=[2, 1, 0, 2],
                          mirostat_tau=3.0, mirostat_eta=0.5)


def mu_path(logprobs: np.ndarray, tau: float, eta: float) -> np.ndarray:
    """``[T]`` float32: mu before each token, from 2 tau, moved by each recorded logprob."""
    mu = [np.float32(2 * tau)]
    for lp in logprobs[:-1]:
        mu.append(np.float32(mu[-1] - eta * (-lp / LN2 - tau)))
    return np.asarray(mu, np.float32)


def teacher_forced(model, prompt, tokens, params: dl.SamplingParams, mu) -> np.ndarray:
    """``[T, V]`` log-probabilities of the processed distribution before each of ``tokens``,
    each at its ``mu`` (``[T]``), from one forward pass over the whole sequence."""
    sequence = jnp.asarray([list(prompt) + list(tokens)], jnp.int32)
    T, P = len(tokens), len(prompt)
    logits = model(sequence)[0, P - 1:P - 1 + T]  # [T, V]
    zeros = jnp.zeros((T,), jnp.int32)
    history = sampling.History(tokens=jnp.zeros((T, 1), jnp.int32), prompt_lengths=zeros,
                               lengths=zeros, eos_mask=jnp.zeros((logits.shape[-1],), bool),
                               mirostat_mu=jnp.asarray(mu, jnp.float32))
    return np.asarray(PROCESSED_LOGPROBS(logits, params.per_row(T, logits.shape[-1]), history))


# One compiled chain of processors (op by op it dispatches hundreds of small programs).
PROCESSED_LOGPROBS = jax.jit(sampling.processed_logprobs)


def test_generate_carries_each_rows_mu(tiny):
    """Rows v2, v1, Mirostat off and greedy v2 in one batch: each recorded log-probability is
    the sampled token's under the cut at the mu that the row's earlier tokens left (2 tau,
    moved by each recorded log-probability), never at the start value alone; the greedy row
    gives greedy decoding's tokens."""
    out = dl.generate(tiny, [PROMPT] * 4, MIXED, 24, seed=0)
    moved = 0
    for row in range(2):
        tokens, recorded = out.tokens[row], out.logprobs[row]
        params = dl.SamplingParams(temperature=0.5, mirostat=2 - row, mirostat_tau=3.0)
        mu = mu_path(recorded, 3.0, 0.5)
        logprobs = teacher_forced(tiny, PROMPT, tokens, params, mu)
        np.testing.assert_allclose(logprobs[np.arange(len(tokens)), tokens], recorded, rtol=0,
                                   atol=1e-5)
        at_start = teacher_forced(tiny, PROMPT, tokens, params, np.full(len(tokens), 6.0))
        moved += int(np.sum(np.isfinite(logprobs).sum(-1) != np.isfinite(at_start).sum(-1)))
    assert moved > 0  # the kept sets depend on the carried mu
    greedy = dl.generate(tiny, [PROMPT], dl.SamplingParams.greedy(), 24, seed=0)
    assert out.token_lists()[3] == greedy.token_lists()[0]


def test_a_slot_starts_each_request_afresh_and_equals_generate_alone(tiny):
    """One slot serves a v2 request, then a v1 request: the slot's mu is 2 tau of the second
    once it is admitted (the first's had moved), and each request gets ``generate``'s tokens
    and log-probabilities on it alone."""
    first = Request(id="v2", prompt=PROMPT, max_new_tokens=12, seed=3,
                    params=dl.SamplingParams(temperature=0.5, mirostat=2, mirostat_tau=3.0,
                                             mirostat_eta=0.5))
    second = Request(id="v1", prompt=[9, 9, 40], max_new_tokens=10, seed=4,
                     params=dl.SamplingParams(temperature=0.7, mirostat=1, mirostat_tau=2.0,
                                              mirostat_eta=0.3))
    engine = SlotEngine(tiny, 1, 64)
    done = engine.run([first])
    assert float(engine.state.mirostat_mu[0]) != 6.0
    engine.insert(second)
    engine.prefill()
    assert float(engine.state.mirostat_mu[0]) == 4.0
    done |= engine.run([])
    for request in (first, second):
        ref = dl.generate(tiny, [list(request.prompt)], request.params, request.max_new_tokens,
                          seed=[request.seed], options=dl.DecodeOptions(max_len=64))
        assert done[request.id].tokens == ref.token_lists()[0]
        np.testing.assert_allclose(done[request.id].logprobs, ref.logprobs[0, :ref.lengths[0]],
                                   rtol=0, atol=1e-5)


def test_a_preempted_request_resumes_with_its_own_mu(tiny):
    """Paged memory too small for its 4 slots: requests are preempted and recomputed from
    prompt + tokens, resuming with the mu they had (handed to the host with each call's
    tokens); each ends with ``generate``'s tokens."""
    rng = np.random.default_rng(1)
    requests = [Request(id=i, prompt=rng.integers(0, 512, int(rng.integers(1, 20))).tolist(),
                        max_new_tokens=int(rng.integers(10, 30)), seed=1000 + 7 * i,
                        params=dl.SamplingParams(temperature=0.5, mirostat=1 + i % 2,
                                                 mirostat_tau=3.0, mirostat_eta=0.5))
                for i in range(8)]
    engine = SlotEngine(tiny, 4, 64, kv_tokens=80, page_size=8)
    queue, done, preemptions = list(requests), {}, 0
    while queue or engine.active:
        for _ in range(engine.room(queue)):
            engine.insert(queue.pop(0))
        result = engine.step(2)
        preemptions += len(result.preempted)
        queue[:0] = result.preempted
        done |= {c.request_id: c for c in result.finished}
    assert preemptions >= 3
    # generate's rows are independent (test_decode), so one call holds every reference: each
    # row's seed and Mirostat version, cut at its own budget.
    params = dl.SamplingParams(temperature=0.5, mirostat=[1 + i % 2 for i in range(8)],
                               mirostat_tau=3.0, mirostat_eta=0.5)
    ref = dl.generate(tiny, [list(r.prompt) for r in requests], params,
                      max(r.max_new_tokens for r in requests), seed=[r.seed for r in requests],
                      options=dl.DecodeOptions(max_len=64)).token_lists()
    for request in requests:
        assert done[request.id].tokens == ref[request.id][:request.max_new_tokens], request.id
