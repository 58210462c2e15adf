"""python -m experiments.prefix --config=configs/prefix.py --workdir=runs/prefix

Prefix sharing on the paged engine, with it and without (`sharing`: the prefix cache on and a
request's samples in one `Request(n=)`, or the cache off and n separate requests), three
workloads (`workload`): `trace`, `num_requests` requests arriving together, one shared
`system`-token prompt and a `question`-token question each; `passk`, one prompt of `system +
question` tokens drawn n = 1..32 times; `hit`, one request on a fresh engine (a miss) and then
one with the same system prompt and another question (a hit). Every point serves its workload
`reps` times on a fresh engine after an untimed run that compiles its programs. Render the page
with `python -m experiments.report --workdir=runs/prefix --out=results` (`results/prefix.md`).

The model is the `small` preset with random weights (speed does not depend on weight values;
requests run their whole budget, no EOS). `:tiny` is a minutes-free variant for tests.
"""

from ml_collections import config_dict

from decodelab.experiment import product
from decodelab.experiment.presets import model_section

SAMPLES = (1, 2, 4, 8, 16, 32)  # the passk workload's n


def get_config(arg: str | None = None) -> config_dict.ConfigDict:
    tiny = arg == "tiny"
    config = config_dict.ConfigDict()
    # Experiment name: rows of other experiments are refused in the same workdir.
    config.experiment = "prefix"
    # Seed of the model's random weights and of the prompts.
    config.seed = 0
    # Timed repetitions per point (each on a fresh engine): the intervals resample them.
    config.reps = 2 if tiny else 20
    # Model: the `small` preset (or the one named after the colon), random weights.
    config.model = model_section("tiny" if tiny else (arg or "small"))
    config.vocab_size = 256 if tiny else 4096
    # Which workload: trace | passk | hit (module docstring); and the passk workload's n.
    config.workload = "trace"
    config.n = 8
    # The prefix cache on and samples in one request (True), or neither (False).
    config.sharing = True
    # Tokens: the shared system prompt, each question, each output.
    config.system = 24 if tiny else 256
    config.question = 8 if tiny else 32
    config.output = 4 if tiny else 32
    # The trace workload's requests, all arriving at once.
    config.num_requests = 4 if tiny else 16
    # The engine: rows (the most samples at once), pool pages of page_size, decode rounds per call.
    config.num_slots = 4 if tiny else 32
    config.page_size = 8 if tiny else 16
    # One decode round per engine call: a first token is delivered as soon as it exists (more
    # rounds per call would add their time to every time to first token, hit or miss alike).
    config.steps_per_call = 1
    config.max_len = 48 if tiny else 320
    config.model.max_seq_len = config.max_len
    # The GPU of the roofline prediction (stated, not measured): an H100 SXM's HBM3 bandwidth and
    # dense bf16 FLOP/s, and the model it prefills (Llama-3-8B's parameters, 16-bit).
    config.gpu = config_dict.ConfigDict(dict(name="H100 SXM", bandwidth=3.35e12, flops=989e12,
                                             params=8.03e9, requests=16))
    return config


def get_sweep(arg: str | None = None) -> list[dict]:
    samples = SAMPLES[:3] if arg == "tiny" else SAMPLES
    return (product({"workload": ["trace"], "sharing": [True, False]}) + [{"workload": "hit"}]
            + product({"workload": ["passk"], "n": list(samples), "sharing": [True, False]}))
