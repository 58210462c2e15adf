"""Train a tokenizer and a model on the bundled corpus; report validation perplexity and greedy
continuations of held-out prompts.

    python -m experiments.train --config=configs/train.py --workdir=runs/train [--resume]
"""

from __future__ import annotations

import json
import pathlib

from absl import app, flags, logging
from ml_collections import config_flags

from decodelab import data, decode, pipeline, train
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
    outputs = decode.greedy(result.model, [p for p, _ in pairs], config.report.new_tokens)
    samples = []
    for (prompt, truth), out in zip(pairs, outputs):
        sample = {"prompt": tokenizer.decode(prompt), "greedy": tokenizer.decode(out),
                  "reference": tokenizer.decode(truth)}
        samples.append(sample)
        print("\n--- prompt (held-out play) ---\n" + sample["prompt"])
        print("--- greedy continuation ---\n" + sample["greedy"])
        print("--- true continuation ---\n" + sample["reference"])
    summary = {"validation": metrics, "steps": result.step, "model_config": model_cfg.to_dict(),
               "train_config": train_cfg.to_dict(), "samples": samples,
               "history": result.history}
    (workdir / "summary.json").write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    app.run(main)
