"""python -m experiments.constrained --config=configs/constrained.py --workdir=runs/constrained

How much does per-token masking distort a model's distribution, and when? Each task point asks
the model for a date, a yes/no answer, a small JSON object or a list of numbers (TASKS), samples
it masked by the task's pattern and estimates the exact constrained distribution
(``decodelab.measure.constrained``); the automaton point builds three patterns (AUTOMATA) on the
model's vocabulary. (What a constrained step costs: ``configs/bench_decode.py:constrained``.) The
default is a tiny random model over a small trained tokenizer (the program end to
end in about a minute, numbers without meaning); the real study is SmolLM2-135M-Instruct:

    python -m experiments.constrained --config=configs/constrained.py:smollm2-135m \
        --workdir=runs/constrained_smollm2
    python -m experiments.report --workdir=runs/constrained_smollm2 --out=results
"""

import json

from ml_collections import config_dict

from decodelab.experiment.presets import check_config_arg, model_section

# Digits are spelled [0-9]: outlines-core's \d also matches other scripts' digits.
DATE = r"[0-9]{4}-[0-9]{2}-[0-9]{2}"
# name -> (instruction, pattern kind, pattern); a JSON schema as its JSON text.
TASKS = {
    "date": ("When did the first person walk on the Moon? Answer with the date only, as "
             "YYYY-MM-DD.", "regex", DATE),
    "yes/no": ("Is the Pacific the largest ocean on Earth? Answer yes or no.", "regex",
               r"(yes|no)"),
    "json": ("Give a JSON object describing a fictional person, with a name and an age.",
             "json_schema", json.dumps({
                 "type": "object", "properties": {
                     "name": {"type": "string", "maxLength": 12},
                     "age": {"type": "integer", "minimum": 0, "maximum": 120}},
                 "required": ["name", "age"]})),
    "numbers": ("List three small prime numbers, separated by commas.", "regex",
                r"[0-9]{1,2}(, [0-9]{1,2}){2}"),
}
# The automaton rows: name -> (kind, pattern), built on the model's vocabulary.
AUTOMATA = {
    "date": ("regex", DATE),
    "email": ("regex", r"[a-z0-9._]{1,16}@[a-z0-9]{1,12}\.(com|org|net)"),
    "schema": ("json_schema", json.dumps({
        "type": "object", "properties": {
            "id": {"type": "integer"},
            "status": {"enum": ["open", "closed", "pending"]},
            "owner": {"type": "object", "properties": {
                "name": {"type": "string", "maxLength": 16},
                "role": {"enum": ["admin", "user"]}}, "required": ["name", "role"]},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 8},
                     "maxItems": 3}},
        "required": ["id", "status", "owner", "tags"]})),
}


def get_config(arg: str | None = None) -> config_dict.ConfigDict:
    check_config_arg(arg)
    config = config_dict.ConfigDict()
    # Experiment name: rows of other experiments are refused in the same workdir.
    config.experiment = "constrained"
    # "task" or "automaton": what the point measures.
    config.point = "task"
    # Seed of the random model and of the samples (output i of a sampler: seed + offset + i).
    config.seed = 0
    # The tokenizer: trained on the corpus (byte fallback: every pattern can be spelled), or a
    # pretrained model's.
    config.tokenizer = config_dict.ConfigDict(dict(vocab_size=400, model_type="bpe"))
    # The model: the `tiny` preset with random weights, or a pretrained model.
    config.model = model_section("tiny")
    # The task of a task point (a key of TASKS) and its fields.
    config.task = config_dict.ConfigDict(dict(name="date", instruction=TASKS["date"][0],
                                              kind="regex", pattern=TASKS["date"][2]))
    config.sampling = config_dict.ConfigDict(dict(
        # Outputs drawn masked (importance-weighted into the exact side), and unconstrained
        # (the measured match rate).
        masked=32, unconstrained=32,
        # New tokens at most per output; rows per generate call.
        new_tokens=24, batch_size=32))
    # The automaton point's patterns: name -> [kind, pattern].
    config.automata = config_dict.ConfigDict({k: list(v) for k, v in AUTOMATA.items()})
    if arg is not None:
        config.tokenizer = config_dict.ConfigDict(dict(pretrained=arg))
        config.model = model_section(arg)
        config.sampling.update(dict(masked=640, unconstrained=320, new_tokens=32,
                                    batch_size=64))
    return config


def get_sweep(arg: str | None = None) -> list[dict]:
    del arg
    return ([{"point": "automaton"}]
            + [{"point": "task", "task.name": name, "task.instruction": instruction,
                "task.kind": kind, "task.pattern": pattern}
               for name, (instruction, kind, pattern) in TASKS.items()])
