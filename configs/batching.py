"""python -m experiments.batching --config=configs/batching.py --workdir=runs/batching

Static, dynamic and continuous batching on one slot engine: the same `small`-preset model (random
weights: see experiments/batching.py for why), the same 8 slots, the same seeded Poisson traces, at
several arrival rates, with fixed and with long-tailed output lengths; each point replays 5 traces
(`replays`), so that its throughput has an interval over replays. Then chunked prefill:
continuous batching on a trace with long prompts (slots of 512 tokens), each prompt prefilled
whole or in chunks of 16 or 64 tokens between decode rounds. Render the page with
`python -m experiments.report --workdir=runs/batching --out=results`.
"""

from ml_collections import config_dict

from decodelab.experiment import product
from decodelab.experiment.presets import model_section

POLICIES = ("static", "dynamic", "continuous")
RATES = (2.0, 6.0, 16.0, 64.0)  # requests/s; 64 is far past what 8 slots serve (saturation)
OUTPUTS = ("fixed", "long_tail")
CHUNKS = (0, 16, 64)  # prefill chunk of the long-prompt points (0: whole prompts)
LONG_RATES = (6.0, 64.0)  # requests/s of the long-prompt points: moderate load, saturation


def get_config(arg: str | None = None) -> config_dict.ConfigDict:
    config = config_dict.ConfigDict()
    # Experiment name: rows of other experiments are refused in the same workdir.
    config.experiment = "batching"
    # Seed of the model's random weights and of replay 0's trace (the same trace for every policy).
    config.seed = 0
    # Each point replays `replays` traces drawn with trace seeds `seed`, `seed + 1`, ... (replay r
    # of every policy replays the same trace); the model's random weights keep `seed`.
    config.replays = 5
    # Model: the `small` preset (or the preset named after the colon), random weights.
    config.model = model_section(arg or "small")
    # Vocabulary of the random model (the size the `small` studies' tokenizer has).
    config.vocab_size = 4096
    config.engine = config_dict.ConfigDict(dict(
        # Slots (rows of the shared cache), the same for every policy.
        num_slots=8,
        # Cache slots per row: prompt + output must fit (the model's position table).
        max_len=128,
        # Decode rounds per engine call (one host round trip per call).
        steps_per_call=2,
        # Prompt tokens each waiting prompt enters per engine call (chunked prefill); 0: whole.
        prefill_chunk=0,
    ))
    # Batching policy: static | dynamic | continuous.
    config.policy = "continuous"
    # Dynamic batching: the oldest waiting request waits at most this many seconds for batch-mates.
    config.dynamic_max_wait = 0.25
    config.trace = config_dict.ConfigDict(dict(
        # Requests per trace.
        num_requests=64,
        # Poisson arrival rate, requests per second.
        rate=8.0,
        # Which prompt-length distribution: "short" or "long" (the two below).
        prompts="short",
        # Prompt lengths (tokens): uniform on 4..16.
        prompt_short=dict(kind="uniform", low=4, high=16),
        # Median 48, a long tail capped at 384 (with outputs <= 112, slots of 512 tokens).
        prompt_long=dict(kind="lognormal", median=48.0, sigma=1.0, cap=384),
        # Which output-length distribution: "fixed" or "long_tail" (the two below).
        output="long_tail",
        # Every request answers 32 tokens.
        output_fixed=dict(kind="fixed", length=32),
        # Median 20, mean ~32, capped at 112 (prompt + output <= max_len): a few long answers.
        output_long_tail=dict(kind="lognormal", median=20.0, sigma=1.0, cap=112),
        # Sampling of every request (each request has its own seed: id + 1000).
        temperature=0.8,
        top_p=0.95,
    ))
    return config


def get_sweep(arg: str | None = None) -> list[dict]:
    del arg
    policies = product({"trace.output": list(OUTPUTS), "trace.rate": list(RATES),
                        "policy": list(POLICIES)})
    # Long prompts need a longer position table and slots (random weights: nothing to retrain).
    long_prompts = product({"trace.prompts": ["long"], "model.max_seq_len": [512],
                            "engine.max_len": [512], "trace.rate": list(LONG_RATES),
                            "engine.prefill_chunk": list(CHUNKS)})
    return policies + long_prompts
