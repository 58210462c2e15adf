"""Train a tokenizer and a model on the bundled corpus; report validation perplexity and greedy
and sampled continuations of held-out prompts.

    python -m experiments.train --config=configs/train.py --workdir=runs/train [--resume]
"""

from __future__ import annotations

import json
import pathlib

import numpy as np

from absl import app, flags, logging
from ml_collections import config_flags

from decodelab import data, pipeline, train
from decodelab.decode import generate
from decodelab.sampling import SamplingParams
from decodelab.tokenizer import Tokenizer

_CONFIG = config_flags.DEFINE_config_file("config", "configs/train.py", "Training config file.",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", "runs/train", "Folder for the summary and the cached "
                               "tokenizer and checkpoints (see decodelab/pipeline.py).")
_RESUME = flags.DEFINE_bool("resume", False, "Reuse or continue this config's checkpoints in "
                            "--workdir (without it, existing checkpoints are an error).")


def held_out_prompts(tokenizer: Tokenizer, prompt_tokens: int, new_tokens: int):
    """One (prompt ids, true continuation ids) pair per test play, starting at the paragraph
    nearest the middle of the play (the opening is a title page and a cast list)."""
    pairs = []
    for name, text in sorted(data.split_documents("test").items()):
        start = text.find("\n\n", len(text) // 2) + 2
        ids = tokenizer.encode(text[start:start + 50 * (prompt_tokens + new_tokens)])
        pairs.append((ids[:prompt_tokens], ids[prompt_tokens:prompt_tokens + new_tokens]))
    return pairs


def main(argv) -> None:
    del argv
    logging.set_verbosity(logging.WARNING)  # Orbax logs every checkpoint step at INFO
    config = _CONFIG.value
    workdir = pathlib.Path(_WORKDIR.value)
    if workdir.exists() and not workdir.is_dir():
        raise ValueError(f"--workdir must be a directory, got a file: {str(workdir)!r}")
    workdir.mkdir(parents=True, exist_ok=True)

    train_cfg = train.TrainConfig(**config.train.to_dict())
    result = pipeline.load_or_train(config.tokenizer, config.model, train_cfg, workdir,
                                    resume=_RESUME.value)
    tokenizer, model_cfg = result.tokenizer, result.model.config
    print(f"model: {model_cfg.num_params():,} parameters, trained {result.step} steps; "
          f"checkpoints in {result.directory}")

    windows = data.eval_windows(data.token_stream(tokenizer, "validation"), train_cfg.seq_len)
    metrics = train.evaluate(result.model, windows, config.report.eval_batch_size)
    print(f"validation: loss {metrics['loss']:.4f} nats/token, perplexity {metrics['perplexity']:.2f}"
          f" over {metrics['tokens']:,} tokens at context {train_cfg.seq_len}")

    pairs = held_out_prompts(tokenizer, config.report.prompt_tokens, config.report.new_tokens)
    prompts = [p for p, _ in pairs]
    # One generate call per strategy; each prompt keeps its own seed (config.report.seed + i).
    strategies = {"greedy": SamplingParams.greedy(), **{
        name: SamplingParams(**settings.to_dict())
        for name, settings in config.report.sampling.items()}}
    outputs = {name: generate(result.model, prompts, params, config.report.new_tokens,
                              seed=config.report.seed, eos_ids=[tokenizer.eos_id])
               for name, params in strategies.items()}
    samples = []
    for i, (prompt, truth) in enumerate(pairs):
        sample = {"prompt": tokenizer.decode(prompt), "reference": tokenizer.decode(truth)}
        print("\n=== prompt (held-out play) ===\n" + sample["prompt"])
        for name, out in outputs.items():
            sample[name] = tokenizer.decode(out.token_lists()[i])
            mean_logprob = float(np.mean(out.logprobs[i, :out.lengths[i]]))
            print(f"--- {name} (mean log-prob {mean_logprob:.2f}, "
                  f"{out.finish_reason[i]}) ---\n{sample[name]}")
        print("--- true continuation ---\n" + sample["reference"])
        samples.append(sample)
    summary = {"validation": metrics, "steps": result.step, "model_config": model_cfg.to_dict(),
               "train_config": train_cfg.to_dict(), "samples": samples,
               "history": result.history}
    (workdir / "summary.json").write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    app.run(main)
