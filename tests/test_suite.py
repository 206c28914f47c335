"""Suite validation and expansion: every bad input is refused before anything runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_cli

from tpbench.suite import (
    CASE_KEYS,
    MAX_CASES,
    Machine,
    SuiteError,
    expand,
    labels,
    load,
    measured_overrides,
    parse,
    refuse_repeated_sets,
    select,
    varying_keys,
    with_overrides,
)

CPU = Machine(gpus=0)
REPO = Path(__file__).resolve().parent.parent

BASE = """
[suite]
name = "t"
[defaults]
world_size = 2
steps = 3
[sweep]
algorithm = ["ddp", "zero_no_overlap"]
bucket_cap_mb = [1, 4]
"""


def test_grid_expansion_and_stable_ids():
    cases = expand(parse(BASE, "t.toml"), CPU)
    assert len(cases) == 4
    again = expand(parse(BASE, "t.toml"), CPU)
    assert [c.case_id for c in cases] == [c.case_id for c in again]
    assert len({c.case_id for c in cases}) == 4
    assert varying_keys(cases) == ["algorithm", "bucket_cap_mb"]


def test_irrelevant_dimension_is_collapsed():
    # shard_buckets means nothing to ddp or zero_no_overlap: it must not double their cases.
    suite = parse(BASE + "shard_buckets = [false, true]\n", "t.toml")
    cases = expand(suite, CPU)
    assert len(cases) == 4
    assert all(c.shard_buckets is None for c in cases)


def test_auto_resolves_to_two_gloo_ranks_on_cpu_and_gpus_with_nccl():
    cpu = expand(parse('[sweep]\nalgorithm = ["ddp"]\n'), CPU)[0]
    assert (cpu.world_size, cpu.backend, cpu.device) == (2, "gloo", "cpu")
    gpu = expand(parse('[defaults]\ninterconnect = "nccl-default"\n'), Machine(gpus=4))[0]
    assert (gpu.world_size, gpu.backend, gpu.device) == (4, "nccl", "cuda")


def test_ids_ignore_budget_keys_but_not_measured_parameters():
    a = expand(parse("[defaults]\ntimeout_s = 10\nrepeats = 2\n"), CPU)[0]
    b = expand(
        parse("[defaults]\ntimeout_s = 20\nrepeats = 5\nsteps = 7\nslowdown_pct = 10\n[capture]\nprofiler_steps = 0\n"),
        CPU,
    )[0]
    c = expand(parse("[defaults]\nbucket_cap_mb = 4\n"), CPU)[0]
    assert a.case_id == b.case_id != c.case_id
    # A budget key the suite sweeps keeps its cases apart within the run.
    swept = expand(parse("[sweep]\nsteps = [4, 8]\n"), CPU)
    assert len({c.case_id for c in swept}) == 2


def test_overrides_replace_sweeps_and_defaults_and_reach_tables():
    suite = with_overrides(
        parse(BASE, "t.toml"), ["bucket_cap_mb=25", "steps=9", "workloads.mlp.width=32", "capture.profiler_steps=0"]
    )
    cases = expand(suite, CPU)
    assert {c.bucket_cap_mb for c in cases} == {25}
    assert all(c.steps == 9 and dict(c.workload_params)["width"] == 32 and c.profiler_steps == 0 for c in cases)
    assert len(cases) == 2


def test_overrides_reach_the_table_of_a_workload_named_by_a_dotted_import_path(monkeypatch):
    """``--set workloads.NAME.KEY`` for the worked example's ``examples.own_model.bench:build`` (refused
    before: its dots were taken for more levels), bare or quoted as in TOML; a KEY alone is refused."""
    monkeypatch.chdir(REPO)  # the factory is imported from where tpbench runs
    suite = load(REPO / "examples" / "own_model" / "suite.toml")
    for name in ("examples.own_model.bench:build", '"examples.own_model.bench:build"'):
        cases = expand(with_overrides(suite, [f"workloads.{name}.width=64"]), CPU)
        assert {dict(c.workload_params)["width"] for c in cases} == {64}
    with pytest.raises(SuiteError, match="expected KEY, capture.KEY or workloads.NAME.KEY"):
        with_overrides(suite, ["workloads.width=64"])


def test_a_set_list_or_table_that_is_not_toml_is_refused_not_taken_for_a_word():
    """``--set 'algorithm=[ddp]'`` (a list's strings unquoted) was taken for the bare word "[ddp]" and
    refused as "[sweep] algorithm[0]: ... got '[ddp]'", as if a list of one odd name had been given.
    A value that opens a list or a table must parse as TOML; bare words stay strings."""
    with pytest.raises(SuiteError, match=r"--set algorithm=\[ddp\]: not a TOML list; .* its strings quoted"):
        with_overrides(parse(BASE, "t.toml"), ["algorithm=[ddp]"])
    cases = expand(with_overrides(parse(BASE, "t.toml"), ["algorithm=ddp"]), CPU)
    assert {c.algorithm for c in cases} == {"ddp"}


def test_a_key_set_twice_to_two_values_is_refused_naming_both(capsys):
    """``--set steps=5 --set steps=6`` ran 6 steps without a word, the 5 dropped. Refused now (exit 2)
    in one line naming the key and both values; the same value twice changes nothing and passes."""
    zero = str(REPO / "suites" / "zero.toml")
    assert run_cli(["validate", zero, "--set", "steps=5", "--set", "steps=6"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--set steps=6: steps is already set to 5 (--set steps=5); give each key once" in err
    assert len(err.splitlines()) == 1
    assert run_cli(["validate", zero, "--set", "steps=5", "--set", "steps = 5"]) == 0


def test_a_key_set_twice_is_refused_however_its_path_is_spelt():
    """``--set workloads.gpt.n_layer=2 --set 'workloads."gpt".n_layer=3'`` set one key twice (``--set``
    reads a quoted NAME as the bare one) but passed: the keys were compared as typed. They are compared
    as ``--set`` reads them now."""
    with pytest.raises(SuiteError, match=r"n_layer=3: workloads.\"gpt\".n_layer is already set to 2 \(--set wo"):
        refuse_repeated_sets(["workloads.gpt.n_layer=2", 'workloads."gpt".n_layer=3'])
    with pytest.raises(SuiteError, match="steps =6: steps is already set to 5"):
        refuse_repeated_sets(["steps=5", " steps =6"])
    refuse_repeated_sets(["workloads.gpt.n_layer=2", "workloads.'gpt'.n_layer=2", "capture.trace_windows=2"])


def test_filters():
    cases = expand(parse(BASE, "t.toml"), CPU)
    assert {c.algorithm for c in select(cases, ["algorithm=ddp"])} == {"ddp"}
    assert len(select(cases, ["bucket_cap_mb=1|4", "algorithm!=ddp"])) == 2
    assert select(cases, [f"id={cases[0].case_id[:6]}"]) == [cases[0]]
    with pytest.raises(SuiteError, match="--filter nope=1: unknown key;"):
        select(cases, ["nope=1"])


def test_a_negative_filter_that_excludes_nothing_is_refused_as_a_typo():
    """A ``KEY!=V`` whose value no case has (a typo) kept every case, silently: the sweep ran the cases
    the user meant to drop."""
    cases = expand(parse(BASE, "t.toml"), CPU)
    assert select(cases, ["algorithm!=nope"]) == cases  # without a suite to name, as compare filters a run
    with pytest.raises(SuiteError, match=r"t.toml: --filter algorithm!=nope: no case has that value, so it excl"):
        select(cases, ["algorithm!=nope"], where="t.toml")
    assert select(cases, ["algorithm!=ddp"], where="t.toml") == [c for c in cases if c.algorithm != "ddp"]


def test_a_boolean_filter_takes_the_labels_spelling_as_the_suites():
    """Labels print Python's ``shard_buckets=True``; ``--filter shard_buckets=True`` copied from a dry run
    was refused ("no case matches"): it only took TOML's ``true``. Both spell the value now, for a
    boolean key only: a string key's ``True`` stays the word."""
    suite = parse(BASE.replace("bucket_cap_mb = [1, 4]", "shard_buckets = [true, false]"), "t.toml")
    cases = expand(with_overrides(suite, ["algorithm=hook_with_zero_step"]), CPU)
    sharded = [c for c in cases if c.shard_buckets]
    assert "shard_buckets=True" in labels([cases])[0][sharded[0].case_id]
    for spelled in ("True", "true"):
        assert select(cases, [f"shard_buckets={spelled}"], where="t.toml") == sharded
    assert select(cases, ["shard_buckets!=False"], where="t.toml") == sharded
    with pytest.raises(SuiteError, match="--filter algorithm=True: no case matches"):
        select(cases, ["algorithm=True"], where="t.toml")


def test_a_boolean_set_takes_the_labels_spelling_as_the_suites():
    """``--filter shard_buckets=True`` took the labels' spelling but ``--set shard_buckets=True`` was
    refused ("expected true or false, got 'True'"), so a value copied from a dry run's table worked in
    one and not the other. ``--set`` takes it too now, for a boolean key only: a string key's ``True``
    stays the word, and a run's settings spell the value alike however it was typed."""
    suite = parse(BASE.replace("bucket_cap_mb = [1, 4]", "shard_buckets = [true, false]"), "t.toml")
    for label, toml in (("True", "true"), ("False", "false")):
        assert (
            with_overrides(suite, [f"shard_buckets={label}"]).sweep
            == with_overrides(suite, [f"shard_buckets={toml}"]).sweep
        )
    assert measured_overrides(["shard_buckets=True"]) == measured_overrides(["shard_buckets=true"])
    refuse_repeated_sets(["shard_buckets=True", "shard_buckets=true"])  # one value, spelled twice
    assert with_overrides(suite, ["algorithm=True"]).sweep["algorithm"] == ["True"]


def test_every_bad_input_of_the_catalogue_is_refused_by_the_library():
    """The same catalogue the CLI is tested with (tests/data/bad_suites), at the library level."""
    for path in sorted((REPO / "tests" / "data" / "bad_suites").glob("*.toml")):
        expected = path.read_text().splitlines()[0].removeprefix("# expect: ")
        with pytest.raises(SuiteError) as e:
            expand(load(path), Machine(gpus=0, max_ranks=8, max_cases=MAX_CASES, capacity="2 cores, 4 GiB"))
        assert str(e.value).startswith(f"{path}: ") and expected in str(e.value), path


def test_missing_file():
    with pytest.raises(SuiteError, match="no such suite file"):
        load("/nonexistent/suite.toml")


@pytest.mark.ranks
def test_cli_unknown_key_exits_2_names_key_and_writes_nothing(tmp_path):
    suite = tmp_path / "bad.toml"
    suite.write_text("[defaults]\nstepz = 3\n")
    out = tmp_path / "results"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tpbench",
            "sweep",
            str(suite),
            "--out",
            str(out),
            "--reports-dir",
            str(tmp_path / "reports"),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert "bad.toml" in proc.stderr and "stepz" in proc.stderr and "expected one of" in proc.stderr
    assert not out.exists() and not (tmp_path / "reports").exists()


def test_shipped_suites_validate():
    for path in sorted((REPO / "suites").glob("*.toml")):
        assert expand(load(path), CPU), path


ZERO = """
[defaults]
world_size = 2
warmup_steps = 3
[sweep]
algorithm = ["zero_no_overlap", "hook_with_zero_step", "hook_with_zero_step_interleaved"]
parameters_as_bucket_view = [false, true]
"""


def test_parameters_as_bucket_view_doubles_only_zero_no_overlap():
    # PyTorch ignores it with overlap_with_ddp (the ZeRO hooks): collapsed there, never run twice.
    cases = expand(parse(ZERO, "t.toml"), CPU)
    by_algo = {
        a: [c.parameters_as_bucket_view for c in cases if c.algorithm == a] for a in {c.algorithm for c in cases}
    }
    assert sorted(by_algo["zero_no_overlap"]) == [False, True]
    assert by_algo["hook_with_zero_step"] == by_algo["hook_with_zero_step_interleaved"] == [None]
    assert len({c.case_id for c in cases}) == 4


def test_new_keys_at_their_old_behaviour_keep_case_ids():
    # Stored runs from before these keys ran unpacked with bucket_cap_mb and no list: same cases.
    plain = expand(parse(BASE, "t.toml"), CPU)
    explicit = expand(parse(BASE.replace("steps = 3", "steps = 3\nparameters_as_bucket_view = false"), "t.toml"), CPU)
    assert [c.case_id for c in plain] == [c.case_id for c in explicit]


def test_bucketing_keys_validate_sweep_and_collapse():
    suite = parse(
        '[defaults]\nworld_size = 2\n[sweep]\nalgorithm = ["ddp", "zero_no_overlap"]\n'
        'bucket_cap_mb = ["default", 1]\nbucket_cap_mb_list = [[1, 25], [4.0, 25]]\n',
        "t.toml",
    )
    cases = expand(suite, CPU)
    # bucket_cap_mb_list replaces bucket_cap_mb in DDP: the two caps collapse into one case per list.
    assert len(cases) == 4
    assert {c.bucket_cap_mb for c in cases} == {None}
    assert sorted(map(tuple, {tuple(c.bucket_cap_mb_list) for c in cases})) == [(1, 25), (4, 25)]
    default = expand(parse('[defaults]\nbucket_cap_mb = "default"\n'), CPU)[0]
    assert default.bucket_cap_mb == "default" and default.bucket_cap_mb_list is None
    assert select([default], ["bucket_cap_mb=default"]) == [default]
    # --set: a list of lists sweeps a list key, a flat list sets it.
    swept = expand(with_overrides(parse(BASE, "t.toml"), ["bucket_cap_mb_list=[[1, 25], [2]]"]), CPU)
    assert {tuple(c.bucket_cap_mb_list) for c in swept} == {(1, 25), (2,)}
    assert {
        tuple(c.bucket_cap_mb_list) for c in expand(with_overrides(parse(BASE), ["bucket_cap_mb_list=[1,25]"]), CPU)
    } == {(1, 25)}
    for bad, expected in [
        ('bucket_cap_mb = "auto"', 'or "default"'),
        ("bucket_cap_mb_list = []", "a non-empty list of megabytes"),
        ('bucket_cap_mb_list = [1, "x"]', "a non-empty list of megabytes"),
        ("parameters_as_bucket_view = 1", "true or false"),
    ]:
        with pytest.raises(SuiteError, match=expected):
            parse(f"[defaults]\n{bad}\n", "t.toml")


def test_bucket_cap_mb_list_refused_on_a_torch_without_it(monkeypatch):
    # This venv's torch takes bucket_cap_mb_list; an older one cannot be installed beside it, so the
    # version the suite reads from torch's package metadata is replaced by 2.12's.
    from tpbench import suite as suite_module

    monkeypatch.setattr(suite_module, "torch_version", lambda: (2, 12))
    text = "[defaults]\nbucket_cap_mb_list = [1, 25]\n"
    with pytest.raises(
        SuiteError, match=r"t.toml: \[defaults\] bucket_cap_mb_list: expected torch >= 2.13.*installed torch is 2.12"
    ):
        expand(parse(text, "t.toml"), CPU)
    assert expand(parse('[defaults]\nbucket_cap_mb = "default"\n', "t.toml"), CPU)  # the rest still runs


def test_cases_from_before_the_packed_key_keep_their_ids():
    # The ids a suite of these algorithms had before parameters_as_bucket_view existed (it is False
    # for zero_no_overlap, collapsed for the others): runs from then still match case by case.
    suite = parse(
        '[defaults]\nwarmup_steps = 3\n[sweep]\nalgorithm = ["ddp", "zero_no_overlap", "hook_with_zero_step"]\n'
    )
    before = {"ddp": "ea105e14acf2", "zero_no_overlap": "51093eadc7d9", "hook_with_zero_step": "f80838c023e1"}
    assert {c.algorithm: c.case_id for c in expand(suite, CPU)} == before


@pytest.mark.parametrize(
    ("key", "said"),
    [
        ("algorithm", "[defaults] algorithm: expected one of ddp, "),
        ("interconnect", "[defaults] interconnect: unknown interconnect 'nope'"),
    ],
)
def test_a_value_set_on_the_command_line_that_the_expansion_refuses_says_with_set(tmp_path, key, said):
    """``--set algorithm=nope`` said "s.toml: algorithm: expected one of ...": the reader looked for
    'nope' in a file that has none. Every other --set value already said "s.toml (with --set)"."""
    from tpbench import sweep

    suite = tmp_path / "s.toml"
    suite.write_text('[defaults]\nworld_size = 2\nbackend = "gloo"\ndevice = "cpu"\n')
    with pytest.raises(SuiteError) as e:
        sweep.prepare(suite, [f"{key}=nope"])
    assert str(e.value).startswith(f"{suite} (with --set): {said}")


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ('[sweep]\nalgorithm = ["ddp", "nope"]\n', "t.toml: [sweep] algorithm[1]: expected one of ddp, "),
        (
            '[defaults]\nworld_size = 2\n[sweep]\nfault = ["none", "crash:5"]\n',
            't.toml: [sweep] fault[1]: expected "none"',
        ),
        ('[defaults]\nworkload = "nope"\n', "t.toml: [defaults] workload: expected one of "),
        (
            "[defaults]\nworld_size = 6\n[sweep]\nranks_per_node = [2, 4]\n",
            "t.toml: [sweep] ranks_per_node[1]: expected a",
        ),
        (
            "[defaults]\nwarmup_steps = 0\n[sweep]\nslowdown_pct = [0, 10]\n",
            "t.toml: [sweep] slowdown_pct[1]: expected",
        ),
    ],
)
def test_a_combination_refused_names_the_table_and_value_as_per_key_errors_do(text, said):
    """Expansion said "t.toml: algorithm: expected one of ...", where per-key errors say
    "t.toml: [sweep] algorithm[1]: ...": in a suite of many lists the reader had to find the value."""
    with pytest.raises(SuiteError) as e:
        expand(parse(text, "t.toml"), CPU)
    assert str(e.value).startswith(said), str(e.value)


def test_post_local_sgd_that_never_switches_is_labelled_ddp_and_still_selected_by_its_key():
    """A post-local SGD case with start_localSGD_iter = "never" is plain DDP (no hook registered). The
    Verdicts called it "DDP", while every label (convergence legend, time-to-target table, tune's claim
    and table, the CLI's tables) called it "post_localSGD_hook start_localSGD_iter=never", one more
    post-local SGD setting. The label now says "DDP"; its --filter value is unchanged."""
    text = BASE.replace('algorithm = ["ddp", "zero_no_overlap"]\nbucket_cap_mb = [1, 4]', "")
    text = text.replace("[defaults]", '[defaults]\nalgorithm = "post_localSGD_hook"\nranks_per_node = 1')
    cases = expand(parse(text + 'start_localSGD_iter = ["never", 1]\nbucket_cap_mb = [1, 4]\n', "t.toml"), CPU)
    named = labels([cases])[0]
    never = select(cases, ["start_localSGD_iter=never"])
    assert sorted(named[c.case_id] for c in never) == ["DDP bucket_cap_mb=1", "DDP bucket_cap_mb=4"]
    switching = [named[c.case_id] for c in cases if c not in never]
    assert sorted(switching) == [
        "post_localSGD_hook bucket_cap_mb=1 start_localSGD_iter=1",
        "post_localSGD_hook bucket_cap_mb=4 start_localSGD_iter=1",
    ]


def test_plain_ddp_keeps_the_nodes_that_split_a_non_iid_workloads_data():
    """markov's non_iid = "node" gives each node of ranks_per_node ranks its own part of the chain. A
    DDP case (start_localSGD_iter = "never", or algorithm ddp) had ranks_per_node dropped as a
    post-local SGD key, so its ranks built their data as one node of the whole world: suites/localsgd.toml's
    DDP baseline trained on IID data while every post-local SGD case trained on the 2-node split, and the
    report's "ends 0.037 nats above DDP's held-out loss" compared two tasks. Every case now keeps it."""
    suite = load(REPO / "suites" / "localsgd.toml")
    cases = expand(suite, CPU)
    assert any(c.start_localSGD_iter == "never" for c in cases)
    assert {c.ranks_per_node for c in cases} == {2}
    ddp = expand(with_overrides(suite, ['algorithm="ddp"']), CPU)
    assert {c.ranks_per_node for c in ddp} == {2}
    # Where the data does not depend on the nodes, DDP's cases still collapse across ranks_per_node.
    iid = expand(with_overrides(suite, ['workloads.markov.non_iid="none"', 'algorithm="ddp"']), CPU)
    assert [c.ranks_per_node for c in iid] == [None]


def test_eval_every_beyond_the_steps_a_repeat_trains_is_refused():
    """eval_every 20 with steps = 12 (suites/localsgd.toml --set steps=12) evaluated no held-out loss:
    the report dropped its Convergence section and said only "no held-out loss was evaluated
    (eval_every)", as if eval_every were 0. Refused before the sweep; the last trained step still counts."""
    suite = load(REPO / "suites" / "localsgd.toml")
    with pytest.raises(SuiteError, match=r"eval_every: expected 0 \(never\) or at most 12 .* got 20"):
        expand(with_overrides(suite, ["steps=12"]), CPU)
    assert expand(with_overrides(suite, ["steps=61", "eval_every=61"]), CPU)  # 60: its latest switch


@pytest.mark.parametrize("workload", ["markov", "gpt"])
def test_a_negative_chain_seed_is_refused_at_validation(workload):
    """numpy refuses a negative seed for the chain: without the check every case failed on its ranks."""
    suite = with_overrides(parse(BASE, "t.toml"), [f"workload={workload}", f"workloads.{workload}.chain_seed=-1"])
    with pytest.raises(SuiteError, match=rf"t.toml: \[workloads.{workload}\]: chain_seed must be >= 0, got -1"):
        expand(suite, CPU)


FACTORY = """
import torch
from tpbench.workloads import Bench


def build(ctx, dropout: float = 0.1, shift: int = 3, width: int = 4) -> Bench:
    model = torch.nn.Sequential(torch.nn.Linear(width, 2), torch.nn.Dropout(dropout)).to(ctx.device)
    x = torch.zeros(ctx.batch_size, width, device=ctx.device) + shift
    y = torch.zeros(ctx.batch_size, dtype=torch.long, device=ctx.device)
    return Bench(model=model, train_batch=lambda step: (x, y), loss=torch.nn.functional.cross_entropy)
"""


def test_a_factorys_own_parameters_take_any_finite_value_of_their_type(tmp_path, monkeypatch):
    """A positive default of the user's factory is not a range: a dropout of 0.1 set to 0, or a
    shift of 3 set to -2, was refused as "expected a finite value > 0"; NaN still is refused."""
    (tmp_path / "zero_ok.py").write_text(FACTORY)
    monkeypatch.chdir(tmp_path)  # the factory is imported from where tpbench runs
    text = BASE.replace("steps = 3\n", 'steps = 3\nworkload = "zero_ok:build"\n') + '[workloads."zero_ok:build"]\n'
    cases = expand(parse(text + "dropout = 0.0\nshift = -2\n"), CPU)
    assert {(dict(c.workload_params)["dropout"], dict(c.workload_params)["shift"]) for c in cases} == {(0.0, -2)}
    with pytest.raises(SuiteError, match=r'\[workloads."zero_ok:build"\] dropout: expected a finite value, got nan'):
        parse(text + "dropout = nan\n")


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (
            "[sweep]\nbucket_cap_mbb = [1, 4]",
            "t.toml: [sweep] bucket_cap_mbb: unknown key; did you mean bucket_cap_mb?",
        ),
        ("[defaults]\nstesp = 5", "t.toml: [defaults] stesp: unknown key; did you mean steps?"),
        ("[capture]\nprofiler_step = 2", "[capture] profiler_step: unknown key; did you mean profiler_steps?"),
        ("[workloads.gpt]\nblocksize = 32", "[workloads.gpt] blocksize: unknown key; did you mean block_size?"),
        ("[sweeep]\nsteps = [5]", "t.toml: sweeep: unknown table; did you mean sweep?"),
        ('[suite]\nnmae = "x"', "t.toml: [suite] nmae: unknown key; did you mean name?"),
    ],
)
def test_an_unknown_key_names_the_closest_one_before_the_list(text, said):
    """A misspelt key was answered with all 35 keys a case has, the one meant somewhere among them;
    the closest is named first, as a mistyped command or option is."""
    with pytest.raises(SuiteError) as e:
        parse(text, "t.toml")
    assert said in str(e.value) and "expected one of" in str(e.value)


def test_an_unknown_key_with_nothing_close_guesses_nothing():
    with pytest.raises(SuiteError) as e:
        parse("[defaults]\nzzzz = 5", "t.toml")
    assert "did you mean" not in str(e.value) and "unknown key; expected one of algorithm" in str(e.value)


def test_an_unknown_filter_key_names_the_suite_file_the_closest_key_and_the_keys_cases_have():
    """``--filter bukcet_cap_mb=4`` named neither the suite nor said it as ``--set``'s unknown key is
    ("suites/zero.toml (with --set): [defaults] bukcet_cap_mb: unknown key; did you mean ..."): now
    the file first, as the filter's other errors are, then ``--set``'s words."""
    cases = expand(parse(BASE, "t.toml"), CPU)
    with pytest.raises(SuiteError) as e:
        select(cases, ["bukcet_cap_mb=4"], where="suites/zero.toml")
    said = "suites/zero.toml: --filter bukcet_cap_mb=4: unknown key; did you mean bucket_cap_mb? expected one of id, "
    assert str(e.value).startswith(said) and str(e.value).endswith(", ".join(CASE_KEYS)), str(e.value)
