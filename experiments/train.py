"""Train a tokenizer and a model on the bundled corpus; report validation perplexity, greedy and
sampled continuations of held-out prompts, and a short text-quality table of a few strategies
against the true continuations.

    python -m experiments.train --config=configs/train.py --workdir=runs/train [--resume]

On several hosts, start it once per host with the same flags plus ``--coordinator_address=HOST:PORT
--num_processes=N --process_id=I`` (``I`` = 0 .. N-1), a mesh over every host's devices
(``--config.mesh.data=N --config.mesh.model=<devices per host>``) and a ``--workdir`` every host
sees: the processes train as one, process 0 writes the cache files and ``summary.json``, and each
process reports on its own copy of the trained model.
"""

from __future__ import annotations

import jax
import numpy as np
from absl import flags, logging

from decodelab import experiment, sharding
from decodelab.checks import check_path
from decodelab.decode.generation import generate
from decodelab.decode.request import DecodeOptions
from decodelab.experiment import artefacts as pipeline
from decodelab.measure import quality
from decodelab.sampling.params import SamplingParams
from decodelab.text import data
from decodelab.text.tokenizer import Tokenizer
from decodelab.train import trainer as train

_CONFIG = experiment.define_config_file("config", "configs/train.py", "Training config file.")
_WORKDIR = flags.DEFINE_string("workdir", "runs/train", "Folder for the summary and the cached "
                               "tokenizer and checkpoints (see decodelab/experiment/artefacts.py).")
_RESUME = flags.DEFINE_bool("resume", False, "Reuse or continue this config's checkpoints in "
                            "--workdir (without it, existing checkpoints are an error).")
sharding.define_flags()  # --coordinator_address --num_processes --process_id: several hosts


def quality_table(model, tokenizer: Tokenizer, pairs, report) -> dict[str, dict]:
    """Print and return the text-quality metrics of a few strategies and of the true continuations
    (a short version of results/sampling.md, scored by the model itself)."""
    prompts = [quality.HeldOutPrompt("", p, t) for p, t in pairs]
    settings = report.quality
    strategies = {name: quality.Sampled(SamplingParams(**params.to_dict()))
                  for name, params in settings.strategies.items()}
    strategies["human"] = quality.Human()
    rows = {}
    for name, strategy in strategies.items():
        samples = strategy.continuations(model, prompts, new_tokens=report.new_tokens,
                                         samples=settings.samples, seed=report.seed,
                                         eos_id=tokenizer.eos_id)
        rows[name] = quality.quality_row(prompts, samples, tokenizer=tokenizer, generator=model,
                                         params=strategy.params, batch_size=16)
    columns = [("ppl_generator", "ppl", "{:.1f}", "perplexity of the texts under this model "
                "(lower: more expected)"),
               ("distinct_2", "distinct-2", "{:.3f}", "distinct token pairs / all pairs in a "
                "text (higher: more varied)"),
               ("repetition_4", "rep-4", "{:.3f}", "share of a text's 4-token runs that repeat "
                "an earlier one (lower: less looping)"),
               ("self_bleu", "self-BLEU", "{:.1f}", "BLEU of each sample against the others of "
                "its prompt (lower: more diverse)"),
               ("top1_rate", "top-1", "{:.2f}", "share of tokens that were the model's most "
                "likely next token"),
               ("mean_length", "length", "{:.1f}", "mean tokens per text")]
    print(f"\n=== text quality: {len(prompts)} prompts x {settings.samples} samples "
          f"(perplexity under this model; see results/sampling.md) ===")
    print(f"{'strategy':<16}" + "".join(f"{header:>11}" for _, header, _, _ in columns))
    for name, row in rows.items():
        cells = ["n/a" if row[k] is None else fmt.format(row[k]) for k, _, fmt, _ in columns]
        print(f"{name:<16}" + "".join(f"{cell:>11}" for cell in cells))
    for _, header, _, meaning in columns:
        print(f"  {header}: {meaning}")
    return rows


def main(argv) -> None:
    sharding.initialize_from_flags()
    logging.set_verbosity(logging.WARNING)  # Orbax logs every checkpoint step at INFO
    config = _CONFIG.value
    workdir = check_path("--workdir", _WORKDIR.value, "directory", write=True)

    train_cfg = train.TrainConfig(**config.train.to_dict())
    mesh = sharding.mesh_from_config(config.mesh)
    result = pipeline.load_or_train(config.tokenizer, config.model, train_cfg, workdir,
                                    resume=_RESUME.value, mesh=mesh)
    tokenizer, model_cfg = result.tokenizer, result.model.config
    # The report decodes one prompt per test play, a batch the data axis need not divide: it runs
    # tensor parallel only, on this process's devices (each process of a multi-process run
    # reports on its own copy of the model).
    model = (result.model if mesh is None else sharding.shard(
        result.model, sharding.make_mesh(model=config.mesh.model, devices=jax.local_devices())))
    print(f"model: {model_cfg.num_params():,} parameters, trained {result.step} steps\n"
          f"checkpoint: model, tokenizer = decodelab.load_checkpoint("
          f"{str(result.directory / 'checkpoints')!r})")

    windows = data.eval_windows(data.token_stream(tokenizer, "validation"), train_cfg.seq_len)
    metrics = train.evaluate(model, windows, config.report.eval_batch_size)
    print(f"validation: loss {metrics['loss']:.4f} nats/token, perplexity {metrics['perplexity']:.2f}"
          f" over {metrics['tokens']:,} tokens at context {train_cfg.seq_len}")

    # One prompt per test play, from the paragraph nearest its middle (the opening is a title
    # page and a cast list).
    pairs = [(p.tokens, p.reference) for p in quality.held_out_prompts(
        tokenizer, per_document=1, prompt_tokens=config.report.prompt_tokens,
        new_tokens=config.report.new_tokens)]
    prompts = [p for p, _ in pairs]
    # One generate call per strategy; each prompt keeps its own seed (config.report.seed + i).
    strategies = {"greedy": SamplingParams.greedy(), **{
        name: SamplingParams(**settings.to_dict())
        for name, settings in config.report.sampling.items()}}
    outputs = {name: generate(model, prompts, params, config.report.new_tokens,
                              seed=config.report.seed,
                              options=DecodeOptions(eos_ids=[tokenizer.eos_id]))
               for name, params in strategies.items()}
    samples = []
    for i, (prompt, truth) in enumerate(pairs):
        sample = {"prompt": tokenizer.decode(prompt), "reference": tokenizer.decode(truth)}
        print("\n=== prompt (held-out play) ===\n" + sample["prompt"])
        for name, out in outputs.items():
            sample[name] = tokenizer.decode(out.token_lists()[i])
            mean_logprob = float(np.mean(out.logprobs[i, :out.lengths[i]]))
            print(f"--- {name} (mean log-prob {mean_logprob:.2f}, "
                  f"finish: {out.finish_reason[i]}) ---\n{sample[name]}")
        print("--- true continuation ---\n" + sample["reference"])
        samples.append(sample)
    table = quality_table(model, tokenizer, pairs, config.report)
    summary = {"validation": metrics, "steps": result.step, "model_config": model_cfg.to_dict(),
               "train_config": train_cfg.to_dict(), "samples": samples, "quality": table,
               "history": result.history}
    if jax.process_index() == 0:
        (workdir / "summary.json").write_text(experiment.json_dumps(summary, indent=2))


if __name__ == "__main__":
    experiment.run_program(main)
