"""python -m experiments.sampling --config=configs/sampling.py --workdir=runs/sampling

What do the decoding strategies the seed describes do to text, measured against the true
continuation? The `small` model (the generator) continues held-out prompts (paragraph starts spread
through the three test plays) with each strategy below, several samples per prompt with fixed seeds;
a larger model (the `scorer` preset, same tokenizer and data) judges the samples. One point per
strategy, plus the `human` point: the same metrics on the true continuation of each prompt. Beside
the seed's strategies: llama.cpp's samplers (DRY and XTC against the repetition penalty at t 0.7,
dynamic temperature, Mirostat v1 / v2) and the search-style methods (contrastive search, DoLa,
classifier-free guidance). Render the page with
`python -m experiments.report --workdir=runs/sampling --out=results`.

On a real instruct model (a pretrained preset, e.g. SmolLM2-135M-Instruct):

    python -m experiments.sampling --config=configs/sampling.py:smollm2-135m \
        --workdir=runs/sampling_smollm2

The model is both generator and scorer (the only real model installed: its perplexity is its own
judgement of the text, not an outside one), and each prompt is a chat turn asking it to continue
the passage (`prompts.instruction`).
"""

from ml_collections import config_dict

from decodelab.experiment.presets import check_config_arg, model_section, train_section

# The user turn of a pretrained instruct model's prompts, before the passage.
INSTRUCTION = ("Continue this passage from a play by Shakespeare. Reply with the next lines only, "
               "in the same style.")

# name -> decode settings (fields of config.decode). "sample" uses generate() with SamplingParams
# (and classifier-free guidance or DoLa where set); "beam" uses beam_search() and "contrastive"
# contrastive_search() (deterministic: one continuation per prompt, repeated as its samples);
# "human" scores the true continuation.
STRATEGIES: dict[str, dict] = {
    "human": dict(method="human"),
    "greedy": dict(temperature=0.0),
    "beam 4": dict(method="beam", beam_width=4),
    # Beam search's best hypotheses end the play early (EOS); this one must fill the budget.
    "beam 4, no early EOS": dict(method="beam", beam_width=4, min_new_tokens=64),
    "temperature 0.3": dict(temperature=0.3),
    "temperature 0.7": dict(temperature=0.7),
    "temperature 1.0": dict(temperature=1.0),
    "temperature 1.5": dict(temperature=1.5),
    "top-k 5": dict(top_k=5),
    "top-k 40": dict(top_k=40),
    "top-p 0.8": dict(top_p=0.8),
    "top-p 0.95": dict(top_p=0.95),
    "min-p 0.05": dict(min_p=0.05),
    "min-p 0.1": dict(min_p=0.1),
    "typical 0.9": dict(typical_p=0.9),
    # Combinations people use: a cooled nucleus, a cooled top-k, and min-p's high-temperature claim.
    "t 0.7 + top-p 0.95": dict(temperature=0.7, top_p=0.95),
    "t 0.8 + top-k 40": dict(temperature=0.8, top_k=40),
    "t 1.0 + top-k 40 + top-p 0.95": dict(top_k=40, top_p=0.95),
    "t 1.5 + min-p 0.1": dict(temperature=1.5, min_p=0.1),
    # Against repetition at t 0.7: the repetition penalty, llama.cpp's DRY and XTC (their usual
    # values; DRY's breakers llama.cpp's default strings).
    "t 0.7 + repetition 1.2": dict(temperature=0.7, repetition_penalty=1.2),
    "t 0.7 + DRY 0.8": dict(temperature=0.7, dry_multiplier=0.8),
    "t 0.7 + XTC 0.5 / 0.1": dict(temperature=0.7, xtc_probability=0.5, xtc_threshold=0.1),
    "dynamic t 1.0 +- 0.5": dict(temperature=1.0, dynatemp_range=0.5),
    # Mirostat steers each token's surprise (bits) to tau: llama.cpp's default 5, and 3.
    "Mirostat v2 tau 3": dict(mirostat=2, mirostat_tau=3.0),
    "Mirostat v2 tau 5": dict(mirostat=2, mirostat_tau=5.0),
    "Mirostat v1 tau 5": dict(mirostat=1, mirostat_tau=5.0),
    # Search-style methods: contrastive search (Su et al. 2022's alpha 0.6, k 4), DoLa over the
    # upper half of the layers (greedy) and classifier-free guidance against the prompt's last
    # token (transformers' default negative prompt), sampled at t 0.7.
    "contrastive 0.6, k 4": dict(method="contrastive", penalty_alpha=0.6, top_k=4),
    "DoLa high (greedy)": dict(temperature=0.0, dola_layers="high"),
    "CFG 1.5, t 0.7": dict(temperature=0.7, guidance_scale=1.5),
}


def get_config(arg: str | None = None) -> config_dict.ConfigDict:
    check_config_arg(arg)
    config = config_dict.ConfigDict()
    # Experiment name: rows of other experiments are refused in the same workdir.
    config.experiment = "sampling"
    # Seed of both models' training; sample j of prompt i is drawn with seed `seed + j * P + i`.
    config.seed = 0
    # Tokenizer trained on the training plays, shared by the generator and the scorer.
    config.tokenizer = config_dict.ConfigDict(dict(vocab_size=4096, model_type="bpe"))
    # The model whose decoding is studied: `small`, trained with the shared recipe for 600 steps
    # (not 1500) so that the whole study regenerates in well under 30 minutes on 2 shared cores.
    config.generator = config_dict.ConfigDict(dict(
        model=model_section("small"), train=train_section(steps=600)))
    # The judge: a larger model on the same tokenizer and data, with a lower validation
    # perplexity than the generator's (about 62 against 74).
    config.scorer = config_dict.ConfigDict(dict(
        model=model_section("scorer"), train=train_section(steps=800, checkpoint_every=200)))
    config.prompts = config_dict.ConfigDict(dict(
        # Prompts per test play, starting at paragraphs spread evenly from 10% to 90% of the play.
        per_play=8,
        # Tokens of each prompt, and of each continuation (generated, or the true one).
        prompt_tokens=48,
        new_tokens=64,
        # Samples per prompt (seeds differ; greedy and beam search repeat themselves).
        samples=4,
    ))
    config.decode = config_dict.ConfigDict(dict(
        # The strategy's label in the table (a key of STRATEGIES).
        name="human",
        # "sample" (generate with the fields below), "beam", "contrastive" or "human".
        method="sample",
        # SamplingParams fields (neutral values disable a processor; top_k is also contrastive
        # search's candidates per step).
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        min_p=0.0,
        typical_p=1.0,
        repetition_penalty=1.0,
        # llama.cpp's DRY (its defaults but the multiplier), XTC, dynamic temperature, Mirostat.
        dry_multiplier=0.0,
        dry_base=1.75,
        dry_allowed_length=2,
        dry_penalty_last_n=-1,
        xtc_probability=0.0,
        xtc_threshold=0.1,
        dynatemp_range=0.0,
        dynatemp_exponent=1.0,
        mirostat=0,
        mirostat_tau=5.0,
        mirostat_eta=0.1,
        # No EOS before this many new tokens (beam search and sampling alike).
        min_new_tokens=0,
        # generate's classifier-free guidance scale (1: off, plain decoding) and DoLa's layers
        # ("": off; "low", "high").
        guidance_scale=1.0,
        dola_layers="",
        # contrastive_search's degeneration penalty.
        penalty_alpha=0.6,
        # beam_search fields: beams per prompt and the GNMT length penalty alpha.
        beam_width=4,
        length_penalty=0.6,
    ))
    config.eval = config_dict.ConfigDict(dict(
        # A generated token whose probability under the generator is below this is "improbable"
        # (the seed's "bad or terrible" words).
        improbable_below=0.01,
        # Sequences per scoring forward pass.
        batch_size=32,
    ))
    if arg is not None:
        # A real instruct model generates and judges; its training sections only set the
        # validation windows' length (nothing is trained).
        config.generator.model = model_section(arg)
        config.scorer.model = model_section(arg)
        # One section for both roles, so the model is loaded and evaluated once.
        config.scorer.train = train_section(**config.generator.train.to_dict())
        # The chat turn each prompt is wrapped in (quality.held_out_prompts).
        config.prompts.instruction = INSTRUCTION
    return config


def get_sweep(arg: str | None = None) -> list[dict]:
    del arg
    return [{"decode.name": name, **{f"decode.{k}": v for k, v in settings.items()}}
            for name, settings in STRATEGIES.items()]
