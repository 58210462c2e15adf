"""python -m experiments.speculative --config=configs/speculative.py --workdir=runs/speculative

Speculative decoding of the `medium` target (~27M parameters, trained exactly as in
`configs/quantization.py`: same tokenizer, model and training sections, so the same cache key) with
three drafters: the `draft` preset trained on the corpus, the same preset distilled from the target
(KL to its logits, DistillSpec), and model-free prompt lookup (n-gram); plus a `small` row set with
the same drafters for comparison (the previous study's target, each row's page of its own). Each
point is one (target, drafter, gamma, temperature, batch size): its acceptance statistics, the
measured cost ratio c, the verify cost v(gamma) and the per-round overhead measured alone, the
theory's tokens per call and both predictions from them, and the wall-clock speed-up over
target-only `dl.generate` with the same prompts, parameters, seeds and cache size, measured in the
same run (medians of interleaved repetitions after a warm-up); the rows keep per-prompt counts and
per-repetition seconds so that a later bootstrap can resample prompts.
Render the pages with `python -m experiments.report --workdir=runs/speculative --out=results`
(`results/speculative.md` for `medium`, `results/speculative_small.md` for `small`).

Reusing the `medium` model trained for the quantization study: the trained models are cached per
workdir under a key of the tokenizer, model and training sections (`decodelab.experiment.artefacts`), and these
are the quantization study's, so copying its entries saves the training (~1000 steps):
`mkdir -p runs/speculative && cp -r runs/quantization/tokenizers runs/quantization/models
runs/speculative/`.

Distillation against `medium`: each step runs the teacher's forward pass on 16 x 128 tokens, which
costs far more than the draft's own step, so DISTILL_STEPS = 300 steps are used (the shared
recipe otherwise, checkpointed every 100). Timed over 10 steps (after 2 that compile) on the 2 CPU
cores: 3.8 s a step under a 1-minute load average of ~13 (other work running), i.e. ~19 minutes
for the 300 steps on that busy machine (9.5 minutes on a quiet one); the `draft` preset's own 800
steps take a few minutes. The sweep: 80 `medium` points (72 plus 8 with a second training
seed), measured at 74-185 s each (median 137 s; 3 paired repetitions of 8 prompts x 128 tokens, 5
round-robin repetitions of the costs, and compiles: a model-drafter point spends ~40 s in warm-up
and its first compile, ~40 s timing and ~70 s on the costs, a prompt-lookup point ~110 s) on 2
quiet CPU cores, 3 h 08 min of point wall time with the seed-1 models' training; and 36 `small`
points (54 minutes, with their models' training). The whole sweep: 4 h 01 min of point wall time.
The points are ordered batch 1 greedy, batch 1 sampled, batch 8 greedy, then 8 points with a
second training seed of each model drafter (for the distillation claim; ~13 minutes of training),
then batch 8 sampled: the run is resumable, so it can be done in parts (finished points are kept).

A quick look (two training steps per model; two `medium` points at temperature 0.7: the distilled
draft at batch 1, prompt lookup at batch 8; the `small` rows set their own training steps):
`--config.new_tokens=16 --config.repeats=1 --config.step_tokens=4 --config.target.train.steps=2
--config.target.train.warmup_steps=0 --config.draft.train.steps=2
--config.draft.train.warmup_steps=0 --config.distill_train.steps=2
--config.distill_train.warmup_steps=0 --sweep_shard=25/42`.

On a real target (a pretrained preset, e.g. SmolLM2-135M-Instruct), with prompt lookup and the
`draft` preset trained on the corpus in the target's own tokens (its 49152-token vocabulary):

    python -m experiments.speculative --config=configs/speculative.py:smollm2-135m \
        --workdir=runs/speculative_smollm2
    python -m experiments.report --workdir=runs/speculative_smollm2 --out=results

(the page: `results/speculative_smollm2-135m.md`).

The prompts are plain-text windows of the test plays in the target's tokens (no chat turn: the
instruct model continues the text), and the sweep is smaller (batch 1, fewer gammas and
temperatures, fewer and shorter requests). Measured on 2 quiet CPU cores (SmolLM2 decodes ~40
tokens/s at batch 1): 45 minutes of point wall time for the 16 points, ~8 of them the draft's
300 training steps inside the first point and ~2.3 minutes each point after it (most of it
the round-robin cost timing: 5 repetitions of each of the target step, draft step, proposal,
verify pass and round).
"""

from ml_collections import config_dict

from decodelab.experiment import product
from decodelab.experiment.presets import (MODEL_PRESETS, PRETRAINED_MODELS, check_config_arg,
                                          model_section, train_section)

DRAFTERS = ("draft", "distilled", "ngram")
GAMMAS = (1, 2, 3, 4, 6, 8)
TEMPERATURES = (0.0, 0.7)
BATCH_SIZES = (1, 8)
# Distillation steps against `medium` (see the docstring for what they cost).
DISTILL_STEPS = 300
# The `small` row set: the previous study's target and recipe (800 steps, the draft distilled for
# as many), at batch 1.
SMALL_TARGET = {**{f"target.model.{k}": v for k, v in MODEL_PRESETS["small"].items()},
                "target.train.steps": 800, "target.train.checkpoint_every": 200,
                "distill_train.steps": 800, "distill_train.checkpoint_every": 200}
SMALL_BATCH_SIZES = (1,)
# One more training seed of each model drafter (the distillation claim then rests on two pairs of
# drafts, not one): the seed's field per drafter, and the points run with seed 1 (batch 1, both
# temperatures, these gammas): ~3 minutes of draft training, ~10 of distillation and 8 points.
DRAFT_SEED_FIELDS = {"draft": "draft.train.seed", "distilled": "distill_train.seed"}
SEED_GAMMAS = (2, 4)
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
    # The target: `medium` trained exactly as in configs/quantization.py (the same cache key).
    config.target = config_dict.ConfigDict(dict(
        model=model_section("medium"), train=train_section(steps=1000, checkpoint_every=250)))
    # The draft model (~3.7x fewer parameters), trained on the corpus; the distilled draft has the
    # same architecture and budget but learns the target's distributions.
    config.draft = config_dict.ConfigDict(dict(
        model=model_section("draft"), train=train_section(steps=800, checkpoint_every=200)))
    # Distillation: the same preset trained on the target's distributions, with this schedule.
    config.distill_train = train_section(steps=DISTILL_STEPS, checkpoint_every=100)
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
    # Batch 1 greedy first (the headline targets), then batch 1 sampled, then batch 8: a sweep
    # run in parts has its most wanted rows first.
    medium = product({"batch_size": list(BATCH_SIZES), "temperature": list(TEMPERATURES),
                      "drafter": list(DRAFTERS), "gamma": list(GAMMAS)})
    small = product({"batch_size": list(SMALL_BATCH_SIZES), "temperature": list(TEMPERATURES),
                     "drafter": list(DRAFTERS), "gamma": list(GAMMAS)})
    reseeded = [{"batch_size": 1, "temperature": t, "drafter": d, "gamma": g, field: 1}
                for t in TEMPERATURES for d, field in DRAFT_SEED_FIELDS.items()
                for g in SEED_GAMMAS]
    # The second seed before batch 8 sampled (no target rests on those rows).
    split = medium.index({"batch_size": BATCH_SIZES[-1], "temperature": TEMPERATURES[-1],
                          "drafter": DRAFTERS[0], "gamma": GAMMAS[0]})
    return (medium[:split] + reseeded + medium[split:]
            + [{**SMALL_TARGET, **point} for point in small])
