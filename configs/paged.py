"""python -m experiments.paged --config=configs/paged.py --workdir=runs/paged

Paged KV memory against padded slots at one fixed KV memory budget (`memory_tokens` tokens of keys
and values): (a) static batching on padded slots, each request reserving `max_len` slots, so
`memory_tokens // max_len` slots; (b) continuous batching on the same padded slots; (c) continuous
batching on a paged pool of the same `memory_tokens` (pages of `page_size`), admitting requests
while their pages fit and preempting the newest when the pool runs out (up to `paged_slots`
running). The reservation ratio `max_len / mean request length` is swept through `max_len` (2, 4,
8 and 16 times the trace's ~42-token mean request, rounded to whole pages), each at a moderate and
a saturating arrival rate; every point replays `replays` traces (replay r of every arm replays the
same trace). The `step` points time one decode round of the engine with every slot running, at
the batch sizes the arms reach: what a bigger batch costs per step on this machine. Render the
page with `python -m experiments.report --workdir=runs/paged --out=results`
(`results/paged.md`).

The model is the `small` preset with random weights and a 1024-position table (speed does not
depend on weight values; requests run their whole budget, no EOS), as in configs/batching.py.
"""

from ml_collections import config_dict

from decodelab.experiment import product
from decodelab.experiment.presets import model_section

ARMS = ("static", "continuous", "paged")
# Slots per request: 2, 4, 8 and 16 times the ~42-token mean request (prompt + output), in pages.
MAX_LENS = (96, 176, 336, 672)
RATES = (16.0, 64.0)  # requests/s: moderate load and saturation
STEP_BATCHES = (1, 2, 3, 6, 11, 21, 32, 48, 64)  # the `step` points' batch sizes


def get_config(arg: str | None = None) -> config_dict.ConfigDict:
    config = config_dict.ConfigDict()
    # Experiment name: rows of other experiments are refused in the same workdir.
    config.experiment = "paged"
    # Seed of the model's random weights and of replay 0's trace.
    config.seed = 0
    # Replays per point (trace seeds seed, seed + 1, ...): throughput intervals over replays.
    config.replays = 3
    # Model: the `small` preset (or the one named after the colon), random weights, a position
    # table long enough for the longest reservation.
    config.model = model_section(arg or "small")
    config.model.max_seq_len = max(MAX_LENS)
    config.vocab_size = 4096
    # KV memory every arm gets, in tokens (keys and values of every layer for that many tokens).
    config.memory_tokens = 2048
    # Slots of the paged pool's pages.
    config.page_size = 16
    # Rows of the paged engine's state: the most requests it runs at once.
    config.paged_slots = 64
    # Which arm: static | continuous (padded slots of max_len) | paged | step (decode cost).
    config.arm = "paged"
    # Slots reserved per request by the padded arms, and the longest request every arm takes.
    config.max_len = 336
    # Decode rounds per engine call.
    config.steps_per_call = 2
    # The `step` points: slots, all running, and timed engine calls of steps_per_call rounds.
    config.step_batch = 8
    config.step_calls = 20
    config.trace = config_dict.ConfigDict(dict(
        num_requests=128,
        rate=64.0,
        # Prompt lengths (tokens): uniform on 4..16.
        prompt=dict(kind="uniform", low=4, high=16),
        # Outputs: log-normal, median 20, sigma 1 (mean ~32), capped at 112 or at max_len - 16,
        # whichever is smaller (a request must fit its reservation).
        output=dict(kind="lognormal", median=20.0, sigma=1.0, cap=112),
        # Sampling: temperature only. With random weights the logits are nearly uniform, so
        # top-p 0.95 keeps most of the 4096 tokens, more than its top-k candidates, and falls
        # back to sorting the whole vocabulary for every row at every step, a per-row cost a
        # trained model rarely pays (a first run with top-p 0.95 measured a decode round at
        # 2.8 ms for 1 row and 98 ms for 64: ~1.5 ms more per row).
        temperature=0.8,
        top_p=1.0,
    ))
    # The published comparison the page sets its decomposition beside (Anyscale's benchmark of
    # continuous batching: OPT-13B, fp16, on one A100-40GB; prompts of 512 tokens, outputs drawn
    # from an exponential distribution capped at 1536; vLLM against Hugging Face's static
    # batching, 23x). The mean output is not published: `mean_output` is an assumption.
    config.published = config_dict.ConfigDict(dict(
        gain=23.0, n_layers=40, d_model=5120, params=12.85e9, bytes_per_value=2,
        gpu_memory_gb=40.0, bandwidth_gbs=1555.0, workspace_gb=2.0, prompt=512,
        output_cap=1536, mean_output=256.0))
    return config


def get_sweep(arg: str | None = None) -> list[dict]:
    del arg
    arms = product({"max_len": list(MAX_LENS), "trace.rate": list(RATES), "arm": list(ARMS)})
    steps = product({"arm": ["step"], "step_batch": list(STEP_BATCHES)})
    return arms + steps
