"""python -m experiments.extrapolation --config=configs/extrapolation.py --workdir=runs/extrapolation

How far past its training length does each position encoding hold? One `small` model per encoding
(same data, budget, seed and size, trained at length L = train.seq_len), each evaluated on the
validation plays at context L, 2L, 4L and 8L; the RoPE model also with linear, NTK-aware and YaRN
scaling applied at inference time (factor = context / L, no retraining). `rope`, `alibi`,
`sinusoidal` and `t5` are also trained with seeds 1 and 2 (`train.seed`), for the seed spread beside
the windows' bootstrap intervals; the runner skips finished points, so the sweep can run in parts.
Render the page with `python -m experiments.report --workdir=runs/extrapolation --out=results`.

A quick run of the whole pipeline (minutes on a laptop CPU; the numbers mean nothing):
`python -m experiments.extrapolation --config=configs/extrapolation.py:tiny
--config.tokenizer.vocab_size=512 --config.train.steps=20 --config.train.warmup_steps=5
--config.train.checkpoint_every=20 --config.eval.max_tokens=2048 --workdir=/tmp/extrapolation_quick`.
"""

from ml_collections import config_dict

from decodelab.experiment import product
from decodelab.experiment.presets import model_section, train_section

ENCODINGS = ("learned", "sinusoidal", "t5", "alibi", "rope", "nope")
FACTORS = (1, 2, 4, 8)
ROPE_SCALINGS = ("linear", "ntk", "yarn")
# The encodings trained again with more seeds (the claims rest on them), and those seeds.
SEEDED = ("rope", "alibi", "sinusoidal", "t5")
MORE_SEEDS = (1, 2)


def get_config(arg: str | None = None) -> config_dict.ConfigDict:
    config = config_dict.ConfigDict()
    # Experiment name: rows of other experiments are refused in the same workdir.
    config.experiment = "extrapolation"
    # Seed of every model's initialisation and data order (the same for all encodings).
    config.seed = 0
    # Tokenizer trained on the training plays.
    config.tokenizer = config_dict.ConfigDict(dict(vocab_size=4096, model_type="bpe"))
    # Model: the `small` preset (or the preset named after the colon); the sweep sets `position`.
    config.model = model_section(arg or "small")
    # Training: L = seq_len = the model's max_seq_len, so `learned` has exactly L positions.
    config.train = train_section(steps=1200, checkpoint_every=300)
    config.eval = config_dict.ConfigDict(dict(
        # Evaluation context = factor x train.seq_len.
        factor=1,
        # RoPE scaling applied at inference time only ("none", "linear", "ntk", "yarn").
        rope_scaling="none",
        # Leading tokens of the validation stream scored (the same tokens at every length).
        max_tokens=65536,
        # Windows per forward pass.
        batch_size=8,
    ))
    return config


def get_sweep(arg: str | None = None) -> list[dict]:
    del arg
    plain = product({"model.position": list(ENCODINGS), "eval.factor": list(FACTORS)})
    scaled = product({"model.position": ["rope"], "eval.rope_scaling": list(ROPE_SCALINGS),
                      "eval.factor": [f for f in FACTORS if f > 1]})
    # Appended after the first seed's points, so a workdir of the first seed resumes into these;
    # one model at a time, each RoPE model's scaled points right after its plain ones, so that a
    # sweep stopped between models (its workdir's cached models lost) never has to train a model
    # again for the points it left.
    reseeded = []
    for seed in MORE_SEEDS:
        for position in SEEDED:
            reseeded += product({"train.seed": [seed], "model.position": [position],
                                 "eval.factor": list(FACTORS)})
            if position == "rope":
                reseeded += product({"train.seed": [seed], "model.position": ["rope"],
                                     "eval.rope_scaling": list(ROPE_SCALINGS),
                                     "eval.factor": [f for f in FACTORS if f > 1]})
    return plain + scaled + reseeded
