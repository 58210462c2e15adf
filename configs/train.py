"""python -m experiments.train --config=configs/train.py --workdir=runs/train

Train a SentencePiece tokenizer and a model on the bundled Shakespeare corpus, report validation
perplexity and print greedy and sampled continuations of held-out prompts. The argument after the file name
picks the model preset (``configs/train.py:tiny``); every field can be overridden, e.g.
``--config.model.position=alibi --config.train.steps=2000``.
"""

from ml_collections import config_dict

from decodelab.experiment.presets import model_section, train_section


def get_config(arg: str | None = None) -> config_dict.ConfigDict:
    config = config_dict.ConfigDict()
    # Tokenizer trained on the training plays: vocabulary size and SentencePiece algorithm.
    config.tokenizer = config_dict.ConfigDict(dict(vocab_size=4096, model_type="bpe"))
    # Model architecture: a named preset, each field overridable.
    config.model = model_section(arg or "small")
    # Device mesh (decodelab.sharding): rows over `data`, heads and MLP units over `model`;
    # 1 x 1 is one device. E.g. --config.mesh.data=2 --config.mesh.model=4 on 8 devices.
    config.mesh = config_dict.ConfigDict(dict(data=1, model=1))
    # Optimisation: the shared recipe (decodelab.experiment.presets.TRAIN_RECIPE; TrainConfig documents each field).
    config.train = train_section()
    # Report: validation batch size; one held-out prompt per test play, continued greedily and
    # with each sampling setting below (SamplingParams fields), prompt i with seed `seed + i`.
    config.report = config_dict.ConfigDict(dict(
        eval_batch_size=32, prompt_tokens=32, new_tokens=48, seed=0,
        sampling=dict(
            temperature_0_8_top_p_0_95=dict(temperature=0.8, top_p=0.95),
            temperature_1_0_top_k_40=dict(temperature=1.0, top_k=40),
        ),
        # A short text-quality table (the sampling study's metrics, results/sampling.md) over the
        # same prompts: `samples` per prompt for each strategy below, then the true continuation.
        quality=dict(
            samples=4,
            strategies=dict(greedy=dict(temperature=0.0), temperature_0_7=dict(temperature=0.7),
                            top_p_0_95=dict(top_p=0.95)),
        ),
    ))
    return config
