"""Experiments: sweeps expand and shard exactly, overrides are checked by name, rows carry their
provenance and are written whole, a killed sweep resumes to every point exactly once, and every bad
input is refused with the culprit named.

Program-level behaviour (flags, kill and resume) runs tests/fixtures/toy_experiment.py in a
subprocess; everything else calls the library in-process with tiny point functions.
"""

import hashlib
import json
import math
import os
import pathlib
import runpy
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from ml_collections import config_dict

from decodelab import experiment, report

REPO = pathlib.Path(__file__).resolve().parents[1]
TOY = ["tests/fixtures/toy_experiment.py", "--config=tests/fixtures/toy_config.py"]


def toy_config(**changes) -> config_dict.ConfigDict:
    fields = dict(experiment="toy", seed=0, model=dict(width=8, position="rope"),
                  eval=dict(length=16))
    config = config_dict.ConfigDict({**fields, **changes})
    config.lock()
    return config


def measure(config, ctx):
    """A point function: a closed form of the config."""
    return {"loss": config.model.width + config.eval.length / 16, "name": config.model.position}


def _interruptible():
    # A shell starts background jobs with SIGINT ignored, and a child inherits that (Python then
    # installs no KeyboardInterrupt handler): give the program Ctrl-C as a terminal would.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_toy(*args, workdir):
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
    return subprocess.Popen([sys.executable, *TOY, f"--workdir={workdir}", *args], cwd=REPO,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_interruptible)


def run_toy(*args, workdir, config=None):
    command = [sys.executable, *TOY, f"--workdir={workdir}", *args]
    if config is not None:
        command[2] = f"--config={config}"
    return subprocess.run(command, cwd=REPO, env=dict(os.environ, JAX_PLATFORMS="cpu",
                                                      PYTHONPATH=str(REPO)),
                          capture_output=True, text=True, timeout=60)


def toy_sweep_hashes(**overrides) -> set[str]:
    """The config hashes of the toy program's default sweep (tests/fixtures/toy_config.py)."""
    config = experiment.apply_overrides(_toy_fixture_config(), overrides)
    sweep = experiment.load_sweep(REPO / "tests/fixtures/toy_config.py")
    return {p.config_hash for p in experiment.expand(config, sweep)}


def _toy_fixture_config():
    config = runpy.run_path(str(REPO / "tests/fixtures/toy_config.py"))["get_config"]()
    config.lock()
    return config


def lines_of(workdir) -> list[str]:
    text = (pathlib.Path(workdir) / "rows.jsonl").read_text()
    assert text.endswith("\n")
    return text.splitlines()


# --- Sweeps as data ------------------------------------------------------------------------------


def test_product_varies_the_last_axis_fastest():
    assert experiment.product({"model.position": ["rope", "alibi"]}, seed=[0, 1]) == [
        {"model.position": "rope", "seed": 0}, {"model.position": "rope", "seed": 1},
        {"model.position": "alibi", "seed": 0}, {"model.position": "alibi", "seed": 1}]


def test_zipped_pairs_the_ith_values():
    assert experiment.zipped({"a.b": [1, 2]}, c=["x", "y"]) == [{"a.b": 1, "c": "x"},
                                                                 {"a.b": 2, "c": "y"}]


def test_cross_merges_one_point_of_each_sweep():
    positions = experiment.product(p=["learned"]) + experiment.product(p=["rope"], s=["yarn"])
    assert experiment.cross(positions, experiment.product(n=[1, 2])) == [
        {"p": "learned", "n": 1}, {"p": "learned", "n": 2},
        {"p": "rope", "s": "yarn", "n": 1}, {"p": "rope", "s": "yarn", "n": 2}]


@pytest.mark.parametrize("build, message", [
    (lambda: experiment.zipped(a=[1, 2], b=[1]), "zipped axes must have equal lengths"),
    (lambda: experiment.product(a="rope"), "axis 'a' must be a list of values"),
    (lambda: experiment.product(a=[]), "axis 'a' must have at least one value"),
    (lambda: experiment.product({"a": [1]}, a=[2]), "axis 'a' is given twice"),
    (lambda: experiment.cross([{"a": 1}], [{"a": 2}]), r"disjoint keys, got \['a'\]"),
])
def test_malformed_sweeps_are_refused(build, message):
    with pytest.raises(ValueError, match=message):
        build()


# --- Configs and points --------------------------------------------------------------------------


def test_overrides_set_dotted_keys_on_a_copy():
    base = toy_config()
    point = experiment.apply_overrides(base, {"model.position": "alibi", "eval.length": 64})
    assert (point.model.position, point.eval.length) == ("alibi", 64)
    assert (base.model.position, base.eval.length) == ("rope", 16)


@pytest.mark.parametrize("overrides, message", [
    ({"model.postion": "alibi"}, r"'model.postion' does not exist.*no field 'postion'"),
    ({"modle.width": 3}, r"override key 'modle.width' does not exist.*no field 'modle'"),
    ({"model.width.x": 3}, r"'model.width.x' does not exist.*model.width is a value"),
    ({"model": {"width": 3}}, "override key 'model' names a section"),
    ({"model.width": "wide"}, r"override model.width='wide' has the wrong type"),
    ({"experiment": "other"}, "must not override 'experiment'"),
])
def test_a_bad_override_is_refused_by_name(overrides, message):
    with pytest.raises(ValueError, match=message):
        experiment.apply_overrides(toy_config(), overrides)


def test_config_hash_is_sha256_of_canonical_json():
    expected = hashlib.sha256(b'{"a":1,"b":{"c":[1,2],"d":0.5}}').hexdigest()[:16]
    assert experiment.config_hash({"b": {"d": 0.5, "c": [1, 2]}, "a": 1}) == expected
    assert experiment.config_hash(config_dict.ConfigDict({"a": 1, "b": {"c": [1, 2], "d": 0.5}})) \
        == expected


def test_the_same_config_reached_two_ways_has_one_hash():
    a = experiment.apply_overrides(toy_config(), {"eval.length": 32})
    b = experiment.apply_overrides(toy_config(eval=dict(length=32)), {})
    assert experiment.config_hash(a) == experiment.config_hash(b)


def test_a_field_added_after_rows_were_kept_leaves_their_hashes_at_its_old_value():
    before = experiment.expand(toy_config(), [{}, {"eval.length": 32}])
    grown = toy_config(head=False, added_fields=dict(head=False))
    after = experiment.expand(grown, [{}, {"eval.length": 32}, {"head": True}])
    # The kept points keep their hashes; the point that sets the new field is a new one.
    assert [p.config_hash for p in after[:2]] == [p.config_hash for p in before]
    assert after[2].config_hash not in {p.config_hash for p in before}
    # Without the record, the new field is a field like any other.
    plain = experiment.expand(toy_config(head=False), [{}])
    assert plain[0].config_hash != before[0].config_hash


@pytest.mark.parametrize("added, message", [
    (dict(missing=False), "names 'missing', which is not a top-level field"),
    (dict(model=dict(width=8)), "must name a field holding a value"),
])
def test_added_fields_must_name_top_level_fields(added, message):
    with pytest.raises(ValueError, match=message):
        experiment.expand(toy_config(head=False, added_fields=added), [{}])


def test_a_sweep_point_must_not_override_the_record_of_added_fields():
    with pytest.raises(ValueError, match="must not override 'added_fields.head'"):
        experiment.expand(toy_config(head=False, added_fields=dict(head=False)),
                          [{"added_fields.head": True}])


def test_expand_refuses_two_points_with_one_config():
    with pytest.raises(ValueError, match="sweep points 0 and 1 give the same config"):
        experiment.expand(toy_config(), [{"model.width": 8}, {}])


def test_a_sweep_point_naming_a_missing_key_is_refused_with_its_index():
    with pytest.raises(ValueError, match=r"sweep point 1 .*'eval.lenght' does not exist"):
        experiment.expand(toy_config(), [{"eval.length": 8}, {"eval.lenght": 9}])


@pytest.mark.parametrize("changes, message", [
    (dict(experiment="has space"), "config.experiment must be a name"),
    (dict(seed="0"), "config.seed must be an int"),
])
def test_base_config_needs_an_experiment_name_and_an_int_seed(changes, message):
    with pytest.raises(ValueError, match=message):
        experiment.expand(toy_config(**changes), [{}])


@pytest.mark.parametrize("count", [1, 2, 3, 5, 12])
def test_shards_partition_the_sweep(count):
    points = experiment.expand(toy_config(), experiment.product(
        {"model.width": [1, 2, 3], "eval.length": [8, 16, 32, 64]}))
    shards = [experiment.shard(points, i, count) for i in range(count)]
    indices = [p.index for s in shards for p in s]
    assert sorted(indices) == list(range(12))  # the union is the sweep, no point twice
    assert all(p.index % count == i for i, s in enumerate(shards) for p in s)


@pytest.mark.parametrize("text", ["2/2", "3/2", "-1/2", "0/0", "1", "a/b", "1/2/3", ""])
def test_a_bad_shard_is_refused(text):
    with pytest.raises(ValueError, match="sweep_shard"):
        experiment.parse_shard(text)


def test_load_sweep_without_get_sweep_is_the_base_config(tmp_path):
    path = tmp_path / "plain.py"
    path.write_text("def get_config(arg=None):\n    return None\n")
    assert experiment.load_sweep(path) == [{}]


def test_load_sweep_passes_the_config_argument(tmp_path):
    path = tmp_path / "argued.py"
    path.write_text("def get_sweep(arg='none'):\n    return [{'seed': int(arg)}]\n")
    assert experiment.load_sweep(path, "7") == [{"seed": 7}]


# --- Runner, rows and provenance -----------------------------------------------------------------


def test_rows_carry_every_provenance_field(tmp_path):
    sweep = experiment.product(**{"model.position": ["rope", "alibi"]})
    rows = experiment.run(toy_config(), sweep, measure, tmp_path, progress=False,
                          command="python -m experiments.toy --workdir=w")
    assert len(rows) == 2 and lines_of(tmp_path) == [json.dumps(r) for r in rows]
    row = rows[1]
    assert set(experiment.ROW_FIELDS) <= set(row)
    assert set(row["provenance"]) == set(experiment.PROVENANCE_FIELDS)
    assert row["experiment"] == "toy" and row["seed"] == 0 and row["sweep_index"] == 1
    assert row["overrides"] == {"model.position": "alibi"}
    assert row["config"]["model"] == {"width": 8, "position": "alibi"}
    assert row["config_hash"] == experiment.config_hash(row["config"])
    assert row["metrics"] == {"loss": 9.0, "name": "alibi"}
    assert row["wall_time_s"] >= 0 and row["start_time"].endswith("+00:00")
    prov = row["provenance"]
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    assert prov["git_commit"] == head and isinstance(prov["git_dirty"], bool)
    assert prov["command"] == "python -m experiments.toy --workdir=w"
    assert prov["backend"] == "cpu" and prov["device_kind"] and prov["cpu_count"] == os.cpu_count()
    assert all(prov[f"{n}_version"] for n in ("python", "jax", "jaxlib", "flax"))


def test_cpu_seconds_count_this_process_and_the_machine():
    before = experiment.cpu_seconds()
    deadline = time.process_time() + 0.3
    while time.process_time() < deadline:  # burn 0.3 s of this process's CPU
        pass
    after = experiment.cpu_seconds()
    own = after[1] - before[1]
    assert own >= 0.29
    # The machine's busy time includes this process's (to /proc/stat's 10 ms ticks, per core).
    assert after[0] - before[0] >= own - 0.05 * os.cpu_count()


def test_a_row_records_the_cpu_time_other_processes_took(tmp_path, monkeypatch):
    from decodelab.experiment import runner
    # (machine, own) CPU seconds at the start and the end of each point.
    readings = iter([(100.0, 10.0), (103.0, 11.5), (200.0, 20.0), (200.5, 21.0), None, None])
    monkeypatch.setattr(runner, "cpu_seconds", lambda: next(readings))
    sweep = experiment.product({"eval.length": [8, 16, 32]})
    rows = experiment.run(toy_config(), sweep, measure, tmp_path, progress=False)
    assert rows[0]["other_cpu_s"] == 1.5  # 3 s busy, 1.5 s of it this process's
    assert rows[1]["other_cpu_s"] == 0.0  # tick rounding never makes it negative
    assert "other_cpu_s" not in rows[2]  # no /proc/stat: not recorded
    timed = [dict(rows[0], wall_time_s=3.0), dict(rows[1], wall_time_s=1.0), rows[2]]
    assert report.other_cores(timed) == [0.5, 0.0]
    # A point of a millisecond (computed, not measured): one 10 ms tick is no reading.
    assert report.other_cores([dict(rows[0], wall_time_s=0.001)]) == []
    assert report.provenance_lines(timed, command="c")[2].endswith(
        "; other processes kept 0.25 cores busy on average during a point of the 2 that recorded "
        "it over 0.5 s or more (at most 0.50).")


def test_points_run_on_a_shared_machine_are_named_and_run_again_on_request(tmp_path,
                                                                         monkeypatch):
    from decodelab.experiment import runner

    def slow(config, ctx):  # long enough (0.5 s) for a reading of the other processes' CPU time
        time.sleep(0.5)
        return measure(config, ctx)

    # (machine, own) CPU seconds: point 0 sees other processes take a core for 0.5 s or more
    # (shared), point 1 sees none; on the rerun point 0 is quiet.
    readings = iter([(100.0, 10.0), (101.0, 10.0), (200.0, 20.0), (200.5, 20.5),
                     (300.0, 30.0), (300.0, 30.0)])
    monkeypatch.setattr(runner, "cpu_seconds", lambda: next(readings))
    sweep = experiment.product({"eval.length": [8, 16]})
    with pytest.warns(UserWarning, match=r"1 of 2 points ran while other processes kept 0.25 "
                      r"cores or more busy.*point 0 \(\d.\d\d cores\); run the same command "
                      r"with --rerun_shared"):
        first = experiment.run(toy_config(), sweep, slow, tmp_path, progress=False)
    assert runner.shared(first[0]) >= 1.0 and runner.shared(first[1]) is None
    with pytest.warns(UserWarning, match="1 of 2 points ran while"):  # kept, and still named
        again = experiment.run(toy_config(), sweep, slow, tmp_path, progress=False)
    assert again == first
    rerun = experiment.run(toy_config(), sweep, slow, tmp_path, progress=False,
                           options=runner.SweepOptions(rerun_shared=True))
    assert rerun[0]["other_cpu_s"] == 0.0 and rerun[0]["start_time"] >= first[0]["start_time"]
    assert rerun[1] == first[1]  # only the shared point ran again
    assert lines_of(tmp_path) == [json.dumps(r) for r in rerun]  # in the old row's place
    assert next(readings, None) is None


def test_git_state_outside_a_repository_is_unknown(tmp_path):
    assert experiment.git_state(tmp_path) == ("unknown", None)


def test_rerunning_skips_points_that_have_rows(tmp_path):
    calls = []

    def counting(config, ctx):
        calls.append(ctx.point.index)
        return measure(config, ctx)

    sweep = experiment.product({"eval.length": [8, 16, 32]})
    experiment.run(toy_config(), sweep[:2], counting, tmp_path, progress=False)
    rows = experiment.run(toy_config(), sweep, counting, tmp_path, progress=False)
    assert calls == [0, 1, 2]
    assert [r["overrides"]["eval.length"] for r in rows] == [8, 16, 32]


def test_metrics_are_converted_to_plain_json_values(tmp_path):
    def numpy_metrics(config, ctx):
        return {"f": np.float32(0.5), "i": np.int64(3), "none": None, "flag": np.bool_(True)}

    (row,) = experiment.run(toy_config(), [{}], numpy_metrics, tmp_path, progress=False)
    assert row["metrics"] == {"f": 0.5, "i": 3, "none": None, "flag": True}
    assert type(row["metrics"]["i"]) is int


def test_per_unit_values_are_kept_as_lists_of_numbers(tmp_path):
    def per_unit(config, ctx):
        return {"window_nll": np.array([1.5, 2.0], np.float32),
                "per_prompt": {"tokens": (np.int64(3), 4), "hits": [0.5, 1]},
                "tpot_s": [np.float32(0.5), None, 2]}

    (row,) = experiment.run(toy_config(), [{}], per_unit, tmp_path, progress=False)
    assert row["metrics"] == {"window_nll": [1.5, 2.0],
                              "per_prompt": {"tokens": [3, 4], "hits": [0.5, 1]},
                              "tpot_s": [0.5, None, 2]}
    assert experiment.read_rows(tmp_path)[0]["metrics"] == row["metrics"]


@pytest.mark.parametrize("metrics, message", [
    ([1.0], "point_fn must return a dict of metrics, got list"),
    ({"loss": math.inf}, "metric 'loss' must be finite, got inf"),
    ({"loss": {1, 2}}, "metric 'loss' must be a number, str, bool or None .*, got set"),
    ({"loss": [1, "a"]}, "metric 'loss' holds per-unit values, which must all be numbers or None"),
    ({"loss": [1.0, math.nan]}, "metric 'loss' must be finite, got nan"),
    ({"per": {"tokens": [[1]]}}, "metric 'per.tokens' must be a number, str, bool or None"),
])
def test_bad_metrics_are_refused_and_nothing_is_written(tmp_path, metrics, message):
    with pytest.raises(ValueError, match=message):
        experiment.run(toy_config(), [{}], lambda config, ctx: metrics, tmp_path, progress=False)
    assert experiment.read_rows(tmp_path) == []


def test_a_workdir_that_is_a_file_is_refused(tmp_path):
    path = tmp_path / "file"
    path.write_text("")
    with pytest.raises(ValueError, match="workdir must be a directory, got a file"):
        experiment.run(toy_config(), [{}], measure, path, progress=False)


def test_an_empty_workdir_is_refused_not_taken_for_the_current_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="workdir must be a non-empty path"):
        experiment.run(toy_config(), [{}], measure, "", progress=False)
    assert list(tmp_path.iterdir()) == []


def test_a_workdir_under_a_file_is_refused_before_any_point_runs(tmp_path):
    (tmp_path / "file").write_text("")
    calls = []
    with pytest.raises(ValueError, match=f"workdir must be a folder this process can write, got "
                                         f"'{tmp_path}/file/w'"):
        experiment.run(toy_config(), [{}], lambda c, ctx: calls.append(c) or {}, tmp_path / "file/w",
                       progress=False)
    assert calls == []


@pytest.fixture
def read_only_folder(tmp_path):
    """A folder nobody may add files to, root included (``chattr +i``; ``chmod`` for others)."""
    folder = tmp_path / "read_only"
    folder.mkdir()
    if os.geteuid() == 0:
        made = subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode == 0
        undo = ["chattr", "-i", str(folder)]
    else:
        folder.chmod(0o555)
        made, undo = True, ["chmod", "755", str(folder)]
    if not made:
        pytest.skip("chattr +i is not available on this file system (needed to deny root writes)")
    yield folder
    subprocess.run(undo, check=True)


def test_a_read_only_workdir_is_refused_naming_the_lock_file_before_any_point_runs(
        read_only_folder):
    calls = []
    with pytest.raises(ValueError, match=f"cannot write '{read_only_folder}/rows.jsonl.lock'"):
        experiment.run(toy_config(), [{}], lambda c, ctx: calls.append(c) or {}, read_only_folder,
                       progress=False)
    assert calls == []


def test_json_dumps_writes_null_for_non_finite_floats():
    value = {"loss": math.nan, "history": [1.5, math.inf, {"x": -math.inf}], "n": 2}
    text = experiment.json_dumps(value)
    assert text == '{"loss": null, "history": [1.5, null, {"x": null}], "n": 2}'


def test_rows_of_another_experiment_in_the_workdir_are_refused(tmp_path):
    experiment.run(toy_config(experiment="other"), [{}], measure, tmp_path, progress=False)
    with pytest.raises(ValueError, match=r"holds rows of experiment \['other'\], not 'toy'"):
        experiment.run(toy_config(), [{}], measure, tmp_path, progress=False)


def test_a_torn_last_line_is_skipped_with_a_warning_and_its_point_runs_again(tmp_path):
    sweep = experiment.product({"eval.length": [8, 16]})
    rows = experiment.run(toy_config(), sweep, measure, tmp_path, progress=False)
    whole = (tmp_path / "rows.jsonl").read_text()
    (tmp_path / "rows.jsonl").write_text(whole[:-40])  # the second row cut short, as by a crash
    with pytest.warns(UserWarning, match=r"rows.jsonl:2 is a torn last line .*runs again"):
        assert experiment.read_rows(tmp_path) == rows[:1]
    ran = []
    with pytest.warns(UserWarning, match="torn last line"):
        again = experiment.run(toy_config(), sweep, lambda c, ctx: ran.append(ctx.point.index)
                               or measure(c, ctx), tmp_path, progress=False)
    assert ran == [1] and [r["config_hash"] for r in again] == [r["config_hash"] for r in rows]
    assert len(lines_of(tmp_path)) == 2  # the torn line is gone with the next write


def test_reading_refuses_a_broken_line_before_the_last_with_its_number(tmp_path):
    experiment.run(toy_config(), [{}], measure, tmp_path, progress=False)
    text = (tmp_path / "rows.jsonl").read_text()
    (tmp_path / "rows.jsonl").write_text('{"experiment": "toy", "config\n' + text)
    with pytest.raises(ValueError, match=r"rows.jsonl:1 is not a JSON row"):
        experiment.read_rows(tmp_path)


def test_reading_refuses_a_line_that_is_not_a_row(tmp_path):
    (tmp_path / "rows.jsonl").write_text('{"experiment": "toy"}\n')
    with pytest.raises(ValueError, match=r"rows.jsonl:1 is not a result row: it lacks"):
        experiment.read_rows(tmp_path)


def test_a_leftover_temporary_file_is_removed_by_the_next_write(tmp_path):
    stale = tmp_path / ".rows.jsonl.killed.tmp"
    stale.write_text('{"half a row')
    experiment.run(toy_config(), [{}], measure, tmp_path, progress=False)
    assert not stale.exists() and len(experiment.read_rows(tmp_path)) == 1


def test_merge_rows_keeps_each_hash_once_and_refuses_two_experiments(tmp_path):
    sweep = experiment.product({"eval.length": [8, 16, 32]})
    a = experiment.run(toy_config(), sweep, measure, tmp_path / "a",
                       options=experiment.SweepOptions(0, 2), progress=False)
    b = experiment.run(toy_config(), sweep, measure, tmp_path / "b",
                       options=experiment.SweepOptions(1, 2), progress=False)
    merged = experiment.merge_rows(a, b, a)
    assert sorted(r["sweep_index"] for r in merged) == [0, 1, 2]
    assert experiment.add_rows(tmp_path / "merged", merged) == 3
    assert experiment.add_rows(tmp_path / "merged", b) == 0
    other = experiment.run(toy_config(experiment="other"), [{}], measure, tmp_path / "c",
                           progress=False)
    with pytest.raises(ValueError, match=r"one experiment to merge, got \['other', 'toy'\]"):
        experiment.merge_rows(a, other)


def test_write_rows_replaces_the_file_and_a_sweep_resumes_from_the_copy(tmp_path):
    sweep = experiment.product({"eval.length": [8, 16, 32]})
    first = experiment.run(toy_config(), sweep[:2], measure, tmp_path / "run", progress=False)
    path = experiment.write_rows(tmp_path / "kept", first + first)
    assert path == tmp_path / "kept" / "rows.jsonl"
    assert experiment.read_rows(tmp_path / "kept") == first
    experiment.write_rows(tmp_path / "kept", first[:1])
    assert experiment.read_rows(tmp_path / "kept") == first[:1]
    with pytest.raises(ValueError, match=r"ROW_FIELDS, got one without \['metrics'\]"):
        experiment.write_rows(tmp_path / "kept", [{k: v for k, v in first[0].items()
                                                   if k != "metrics"}])
    assert experiment.read_rows(tmp_path / "kept") == first[:1]
    # A fresh workdir seeded with the kept rows runs only the points they lack.
    (tmp_path / "fresh").mkdir()
    shutil.copy(path, tmp_path / "fresh" / "rows.jsonl")
    ran = []
    rows = experiment.run(toy_config(), sweep, lambda c, ctx: ran.append(c.eval.length)
                          or measure(c, ctx), tmp_path / "fresh", progress=False)
    assert ran == [16, 32] and len(rows) == 3


def test_concurrent_writers_sharing_a_workdir_lose_no_row(tmp_path):
    template = experiment.run(toy_config(), [{}], measure, tmp_path / "template", progress=False)[0]
    (tmp_path / "template.json").write_text(json.dumps(template))
    writer = (
        "import json, sys\n"
        "from decodelab import experiment\n"
        f"row = json.load(open({str(tmp_path / 'template.json')!r}))\n"
        "for i in range(15):\n"
        "    experiment.add_rows(sys.argv[1], [dict(row, config_hash=f'{sys.argv[2]}-{i}')])\n"
    )
    writers = [subprocess.Popen([sys.executable, "-c", writer, str(tmp_path / "shared"), str(w)])
               for w in range(4)]
    assert all(w.wait(timeout=60) == 0 for w in writers)
    hashes = [r["config_hash"] for r in experiment.read_rows(tmp_path / "shared")]
    assert sorted(hashes) == sorted(f"{w}-{i}" for w in range(4) for i in range(15))


# --- The program: flags, bad input, kill and resume ----------------------------------------------


def test_command_line_overrides_reach_every_point(tmp_path):
    done = run_toy("--config.model.width=3", "--sweep_shard=1/4", workdir=tmp_path)
    assert done.returncode == 0, done.stderr
    rows = experiment.read_rows(tmp_path)
    assert [r["sweep_index"] for r in rows] == [1, 5]
    assert all(r["metrics"]["width"] == 3 for r in rows)
    assert {r["config_hash"] for r in rows} <= toy_sweep_hashes(**{"model.width": 3})
    assert "--config.model.width=3" in rows[0]["provenance"]["command"]


BAD_INPUT = {  # args (after the toy's --config and --workdir), status, stderr's one line holds
    "typo": (["--config.experiment_typo=1"], 2, "the config has no field 'experiment_typo'; "
             "did you mean experiment?"),
    "nested typo": (["--config.model.widht=3"], 2, "--config.model.widht: model has no field "
                    "'widht'; did you mean model.width? (model's fields: position, width)"),
    "section typo": (["--config.modle.width=3"], 2, "did you mean model.width?"),
    "wrong type": (["--config.model.width=nan"], 2,
                   "--config.model.width=nan: model.width must be an int, got 'nan'"),
    "unknown flag": (["--wrokdir=x"], 2, "Unknown command line flag 'wrokdir'. Did you mean: "
                     "workdir ?"),
    "positional": (["--config.model.width=3", "extra"], 2, "takes flags only (--name=value), got "
                   "the positional argument(s) ['extra']"),
    "no file": (["--config=tests/fixtures/no_such_config.py"], 2,
                "--config=tests/fixtures/no_such_config.py: the config file does not exist"),
    "bad sweep": (["--config=tests/fixtures/toy_config.py:bad_key"], 1,
                  "'model.depth' does not exist in the config: model has no field 'depth'"),
    "shard": (["--sweep_shard=2/2"], 1,
              "sweep_shard i/n must have n >= 1 and i in 0..n-1, got '2/2'"),
    "shard text": (["--sweep_shard=half"], 1, "sweep_shard must look like i/n"),
    "processes": (["--num_processes=2"], 1, "--num_processes=2 needs --coordinator_address"),
    "nan": (["--config.sleep_s=nan"], 1, "config field sleep_s must be a finite number, got nan"),
    "train typo": (["--config.train.lr=nan"], 2, "--config.train.lr: train has no field 'lr'; "
                   "did you mean train.learning_rate?"),
}
TRACEBACK = {  # the same mistakes with the traceback let through
    "flag": (["--sweep_shard=2/2", "--verbose"], {}),
    "env": (["--config.model.widht=3"], {"DECODELAB_TRACEBACK": "1"}),
}


def run_programs(cases: list[dict]) -> list[dict]:
    """Run each case (``{"argv": [...], "env": {...}}``) as a program, all in one process that
    imports JAX once (tests/fixtures/toy_runs.py): its exit status, stdout and stderr."""
    done = subprocess.run([sys.executable, "tests/fixtures/toy_runs.py"], cwd=REPO,
                          input=json.dumps(cases), capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO)))
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def bad_runs(tmp_path_factory) -> dict[str, dict]:
    workdir = tmp_path_factory.mktemp("bad")
    cases = {name: {"argv": [*TOY, f"--workdir={workdir / name}", *args]}
             for name, (args, _, _) in BAD_INPUT.items() if name != "train typo"}
    cases["train typo"] = {"argv": ["experiments.train", f"--workdir={workdir / 'train'}",
                                    *BAD_INPUT["train typo"][0]]}
    cases |= {f"traceback {name}": {"argv": [*TOY, f"--workdir={workdir / name}", *args],
                                    "env": env} for name, (args, env) in TRACEBACK.items()}
    # One sweep run twice in one workdir, the second time with another width (in order).
    shared, report_out = f"--workdir={workdir / 'sweep'}", f"--out={workdir / 'report'}"
    cases |= {f"sweep {name}": {"argv": argv} for name, argv in {
        "first": [*TOY, shared],
        "other width": [*TOY, shared, "--config.model.width=3"],
        "extended": [*TOY, shared, "--config.model.width=3", "--extend_sweep"],
        "report": ["experiments.report", shared, report_out, "--where=model.width=3"],
        "report none": ["experiments.report", shared, report_out, "--where=model.width=5"],
    }.items()}
    results = run_programs(list(cases.values()))
    done = {name: dict(result, rows=(workdir / name / "rows.jsonl").exists())
            for name, result in zip(cases, results)}
    done["sweep rows"] = experiment.read_rows(workdir / "sweep")
    done["kept rows"] = experiment.read_rows(workdir / "report" / "rows" / "sweep")
    return done


@pytest.mark.parametrize("name", list(BAD_INPUT))
def test_bad_program_input_fails_in_one_line_naming_the_culprit(bad_runs, name):
    _, status, message = BAD_INPUT[name]
    done = bad_runs[name]
    assert done["status"] == status, done["stderr"]
    assert done["stderr"].startswith("error: ") and done["stderr"].count("\n") == 1
    assert message in done["stderr"]
    assert not done["rows"]


@pytest.mark.parametrize("name", list(TRACEBACK))
def test_verbose_or_the_environment_switch_shows_the_traceback(bad_runs, name):
    done = bad_runs[f"traceback {name}"]
    assert done["status"] == 1 and "Traceback (most recent call last)" in done["stderr"]


def test_the_program_refuses_a_workdir_that_is_a_file(tmp_path):
    (tmp_path / "file").write_text("")
    done = run_toy(workdir=tmp_path / "file")
    assert done.returncode != 0 and "workdir must be a directory, got a file" in done.stderr


def test_the_program_refuses_rows_of_another_experiment(tmp_path):
    experiment.run(toy_config(experiment="other"), [{}], measure, tmp_path, progress=False)
    done = run_toy(workdir=tmp_path)
    assert done.returncode != 0 and "holds rows of experiment ['other']" in done.stderr


def test_a_rerun_with_other_settings_is_refused_until_the_sweep_is_extended(bad_runs):
    assert bad_runs["sweep first"]["status"] == 0
    refused = bad_runs["sweep other width"]
    assert refused["status"] == 1 and refused["stderr"].count("\n") == 1
    assert ("holds 6 rows of sweep 'toy_config.py' run with other settings (model.width was 8, "
            "now 3)") in refused["stderr"]
    assert "new --workdir" in refused["stderr"] and "--extend_sweep" in refused["stderr"]
    assert bad_runs["sweep extended"]["status"] == 0, bad_runs["sweep extended"]["stderr"]
    widths = [row["config"]["model"]["width"] for row in bad_runs["sweep rows"]]
    assert widths == [8] * 6 + [3] * 6
    assert {row["sweep"] for row in bad_runs["sweep rows"]} == {"toy_config.py"}


def test_the_report_renders_the_rows_where_flags_pick(bad_runs):
    assert bad_runs["sweep report"]["status"] == 0, bad_runs["sweep report"]["stderr"]
    assert [row["config"]["model"]["width"] for row in bad_runs["kept rows"]] == [3] * 6
    none = bad_runs["sweep report none"]
    assert none["status"] == 1
    assert none["stderr"] == ("error: where ['model.width=5'] matches none of the 12 rows; they "
                              "hold model.width: [3, 8]\n")


def test_one_sweep_with_other_settings_is_refused_in_the_library_and_collides_in_a_table(
        tmp_path):
    sweep = experiment.product({"eval.length": [8, 16]})
    experiment.run(toy_config(), sweep, measure, tmp_path, progress=False)
    wider, ran = toy_config(model=dict(width=4, position="rope")), []
    with pytest.raises(ValueError, match=r"holds 2 rows of this sweep run with other settings "
                                         r"\(model.width was 8, now 4\)"):
        experiment.run(wider, sweep, lambda c, ctx: ran.append(c), tmp_path, progress=False)
    assert ran == []
    named = experiment.run(wider, sweep, measure, tmp_path, progress=False,
                           options=experiment.SweepOptions(name="other.py"))
    assert [row["sweep"] for row in named] == ["other.py"] * 2  # another sweep shares the workdir
    rows = experiment.read_rows(tmp_path)
    with pytest.raises(ValueError, match=r"the rows differ in model.width \(8 and 4\), sweep "
                                         r"\(n/a and other.py\): pick one with `where` "
                                         r"\(experiments.report --where=model.width=8\)"):
        report.pivot_table(rows, index="eval.length", columns="model.position", values="loss")
    assert report.parse_where(["eval.length=8", "model.position=rope", "x=null"]) == {
        "eval.length": 8, "model.position": "rope", "x": None}
    picked = report.select_where(rows, ["model.width=4", "sweep=other.py"])
    assert [r["overrides"]["eval.length"] for r in picked] == [8, 16]
    with pytest.raises(ValueError, match="where must be KEY=VALUE"):
        report.parse_where(["model.width"])


def wait_for_rows(workdir, count, process, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows_file = pathlib.Path(workdir) / "rows.jsonl"
        if rows_file.exists() and len(lines_of(workdir)) >= count:
            return
        assert process.poll() is None, process.communicate()
        time.sleep(0.05)
    raise AssertionError(f"no {count} rows within {timeout} s")


def test_a_killed_sweep_resumes_to_every_point_exactly_once(tmp_path):
    # Points from index 2 on wait for a release file: the kill lands after exactly 2 rows.
    args = ["--config.hold_from=2"]
    process = start_toy(*args, workdir=tmp_path)
    wait_for_rows(tmp_path, 2, process)
    process.send_signal(signal.SIGKILL)
    process.communicate()
    before = lines_of(tmp_path)
    assert len(before) == 2
    (tmp_path / "release").write_text("")
    done = run_toy(*args, workdir=tmp_path)
    assert done.returncode == 0, done.stderr
    after = lines_of(tmp_path)
    assert after[:2] == before  # finished points were kept, not rerun
    rows = [json.loads(line) for line in after]  # every line is a whole row
    assert [r["sweep_index"] for r in rows] == list(range(6))
    assert {r["config_hash"] for r in rows} == toy_sweep_hashes(hold_from=2)


def test_ctrl_c_keeps_finished_points_and_says_how_to_continue(tmp_path):
    process = start_toy("--config.hold_from=1", workdir=tmp_path)
    wait_for_rows(tmp_path, 1, process)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == 130
    assert "run the same command again to continue" in stderr
    assert [r["sweep_index"] for r in experiment.read_rows(tmp_path)] == [0]


def test_shards_sharing_a_workdir_together_run_the_whole_sweep(tmp_path):
    shards = [start_toy("--config.sleep_s=0.1", f"--sweep_shard={i}/3", workdir=tmp_path)
              for i in range(3)]
    for process in shards:
        _, stderr = process.communicate(timeout=60)
        assert process.returncode == 0, stderr
    rows = experiment.read_rows(tmp_path)
    assert sorted(r["sweep_index"] for r in rows) == list(range(6))
    assert {r["config_hash"] for r in rows} == toy_sweep_hashes(sleep_s=0.1)
