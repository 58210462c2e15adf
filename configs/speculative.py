"""python -m experiments.speculative --config=configs/speculative.py --workdir=runs/speculative

Speculative decoding of the `small` target with three drafters: the `draft` preset trained on the
corpus, the same preset distilled from the target (KL to its logits, DistillSpec), and model-free
prompt lookup (n-gram). Each point is one (drafter, gamma, temperature, batch size): its acceptance
statistics, the measured cost ratio c, the theory's tokens per call and speed-up from them, and the
wall-clock speed-up over target-only `dl.generate` with the same prompts, parameters, seeds and
cache size, measured in the same run (medians of interleaved repetitions after a warm-up).
Render the page with `python -m experiments.report --workdir=runs/speculative --out=results`.
A quick look: `--config.new_tokens=32 --config.repeats=1 --config.target.train.steps=50
--config.draft.train.steps=50`.

On a real target (a pretrained preset, e.g. SmolLM2-135M-Instruct), with prompt lookup and the
`draft` preset trained on the corpus in the target's own tokens (its 49152-token vocabulary):

    python -m experiments.speculative --config=configs/speculative.py:smollm2-135m \
        --workdir=runs/speculative_smollm2
    python -m experiments.report --workdir=runs/speculative_smollm2 --out=results

(the page: `results/speculative_smollm2-135m.md`).

The prompts are plain-text windows of the test plays in the target's tokens (no chat turn: the
instruct model continues the text), and the sweep is smaller (batch 1, fewer gammas and
temperatures, fewer and shorter requests): ~35 s a point (estimated) on 2 busy CPU cores
(SmolLM2 decodes ~40 tokens/s at batch 1), ~10 minutes for the 16 points after ~4 minutes of
draft training.
"""

from ml_collections import config_dict

from decodelab.experiment import product
from decodelab.presets import (PRETRAINED_MODELS, check_config_arg, model_section,
                               train_section)

DRAFTERS = ("draft", "distilled", "ngram")
GAMMAS = (1, 2, 3, 4, 5, 6, 7, 8)
TEMPERATURES = (0.0, 0.7, 1.0)
BATCH_SIZES = (1, 8)
# The sweep of a pretrained target (its decode steps are ~30x dearer than `small`'s).
PRETRAINED_DRAFTERS = ("draft", "ngram")
PRETRAINED_GAMMAS = (1, 2, 4, 6)
PRETRAINED_TEMPERATURES = (0.0, 0.7)
PRETRAINED_BATCH_SIZES = (1,)


def get_config(arg: str | None = None) -> config_dict.ConfigDict:
    check_config_arg(arg)
    config = config_dict.ConfigDict()
    # Experiment name: rows of other experiments are refused in the same workdir.
    config.experiment = "speculative"
    # Seed of the requests: prompt i of a point is sampled with seed `seed + i`.
    config.seed = 0
    # Tokenizer trained on the training plays, shared by every model.
    config.tokenizer = config_dict.ConfigDict(dict(vocab_size=4096, model_type="bpe"))
    # The target: `small` with the shared recipe, shortened to fit the study's time budget.
    config.target = config_dict.ConfigDict(dict(
        model=model_section("small"), train=train_section(steps=800, checkpoint_every=200)))
    # The draft model (~3.7x fewer parameters), trained on the corpus; the distilled draft has the
    # same architecture and budget but learns the target's distributions.
    config.draft = config_dict.ConfigDict(dict(
        model=model_section("draft"), train=train_section(steps=800, checkpoint_every=200)))
    # Distillation: the temperature of both distributions in the KL.
    config.distill_temperature = 1.0
    # Prompt lookup: longest and shortest n-gram searched for.
    config.ngram = config_dict.ConfigDict(dict(max_ngram=3, min_ngram=1))
    # Which drafter proposes: "draft", "distilled" or "ngram".
    config.drafter = "draft"
    # Proposals per round.
    config.gamma = 4
    # Sampling temperature of both target and draft (0 = greedy).
    config.temperature = 0.0
    # Requests decoded together; the prompts are run in consecutive batches of this size.
    config.batch_size = 1
    # Prompts: evenly spaced windows of `prompt_tokens` tokens of the held-out test plays.
    config.num_prompts = 8
    config.prompt_tokens = 32
    # Output tokens per request (no EOS: every request generates exactly this many).
    config.new_tokens = 128
    # Cache slots beyond prompt + output, the same for every gamma (and for the baseline), so
    # every point decodes with the same cache size: the largest gamma of the sweep.
    config.cache_slack = max(GAMMAS)
    # Timed repetitions of the speculative run and of the baseline, interleaved, after a warm-up;
    # medians are reported.
    config.repeats = 3
    # Output tokens of the generate runs that time one decode step of each model (for c).
    config.step_tokens = 64
    if arg is not None:
        # The real model is the target (its training section is not used); the draft preset is
        # trained on the corpus in the target's tokens (49152: ~0.75 s per step of 16 x 128
        # tokens on 2 CPU cores, ~4 minutes in all).
        config.tokenizer = config_dict.ConfigDict(dict(pretrained=arg))
        config.target.model = model_section(arg)
        config.draft.train = train_section(steps=300, checkpoint_every=100)
        # Fewer, shorter requests and repetitions: a SmolLM2 decode step takes ~20 ms.
        config.num_prompts = 4
        config.new_tokens = 32
        config.repeats = 2
        config.step_tokens = 32
    return config


def get_sweep(arg: str | None = None) -> list[dict]:
    if arg in PRETRAINED_MODELS:
        return product({"drafter": list(PRETRAINED_DRAFTERS),
                        "batch_size": list(PRETRAINED_BATCH_SIZES),
                        "temperature": list(PRETRAINED_TEMPERATURES),
                        "gamma": list(PRETRAINED_GAMMAS)})
    return product({"drafter": list(DRAFTERS), "batch_size": list(BATCH_SIZES),
                    "temperature": list(TEMPERATURES), "gamma": list(GAMMAS)})
