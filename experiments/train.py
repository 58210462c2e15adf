"""Train a tokenizer and a model on the bundled corpus; report validation perplexity and greedy
continuations of held-out prompts.

    python -m experiments.train --config=configs/train.py --workdir=runs/train [--resume]
"""

from __future__ import annotations

import json
import pathlib
import tempfile

from absl import app, flags, logging
from ml_collections import config_flags

from decodelab import data, decode, train
from decodelab.presets import build_model_config
from decodelab.tokenizer import Tokenizer

_CONFIG = config_flags.DEFINE_config_file("config", "configs/train.py", "Training config file.",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", "runs/train", "Folder for the tokenizer, checkpoints "
                               "and summary.")
_RESUME = flags.DEFINE_bool("resume", False, "Continue from the latest checkpoint in --workdir.")


def tokenizer_for(workdir: pathlib.Path, vocab_size: int, model_type: str) -> Tokenizer:
    """The workdir's tokenizer, trained on the training plays the first time."""
    path = workdir / "tokenizer.model"
    if path.exists():
        return Tokenizer.load(path)
    with tempfile.TemporaryDirectory() as tmp:
        files = data.write_split_files("train", tmp)
        tokenizer = Tokenizer.train(files, vocab_size=vocab_size, model_type=model_type)
    tokenizer.save(path)
    return tokenizer


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

    tokenizer = tokenizer_for(workdir, config.tokenizer.vocab_size, config.tokenizer.model_type)
    model_cfg = build_model_config(config.model, tokenizer.vocab_size)
    train_cfg = train.TrainConfig(**config.train.to_dict())
    stream = data.token_stream(tokenizer, "train")
    print(f"train tokens: {len(stream):,}; model: {model_cfg.num_params():,} parameters")
    result = train.train(model_cfg, train_cfg, stream, tokenizer=tokenizer,
                         checkpoint_dir=workdir / "checkpoints", resume=_RESUME.value)

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
