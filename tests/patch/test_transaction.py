"""The patch layer (tinker_rl_data.patch) as a user meets it:
install() on verified and untested versions, a fork's or a user's function
kept, a failed install leaving nothing, strict and disabled modes, the
report, uninstall restoring exactly, exceptions keeping their class, the
launcher. Runs against whichever tinker / tinker-cookbook pair is installed
(CI runs it on each tested pair)."""

from __future__ import annotations

import functools
import importlib
import os
import re
import subprocess
import sys
import textwrap
import types as pytypes
import warnings
from pathlib import Path

import pytest

from conftest import cookbook_unavailable
from support.signals import signal_reprs_handlers

try:
    import tinker_cookbook
    import torch  # noqa: F401 (the cookbook's data processing imports it)
    from tinker_cookbook.rl import data_processing
    from tinker_cookbook.rl import train as rl_train
except ImportError as exc:
    cookbook_unavailable(exc)

import tinker
from tinker.resources import training

import tinker_rl_data
from tinker_rl_data import InstallError, InstallWarning
from tinker_rl_data import cookbook as ours
from tinker_rl_data import features
from tinker_rl_data.patch import transaction
from tinker_rl_data.patch.report import TESTED_VERSIONS

# (title, module, name, feature) of every piece the tested pairs take by
# default, in install order: tinker-cookbook 0.5.x has no rollout_usage /
# training_usage, and its KL passes score differently (ours reproduce 0.6.1).
_RL = "tinker_cookbook.rl."
_WIRE = [
    ("forward_backward request bytes", "tinker.resources.training", "forward_backward_request_to_proto", "wire"),
    ("sample request bytes", "tinker.resources.sampling", "model_dump", "wire"),
    ("step requests sent lean", "tinker._base_client", "AsyncAPIClient.post", "transport"),
    ("future polls sent lean", "tinker.lib.api_future_impl", "_APIFuture._fetch_via_rest", "transport"),
    ("request futures freed when dropped", "tinker.lib.internal_client_holder",
     "InternalClientHolder.run_coroutine_threadsafe", "transport"),
]
_SAMPLE_PATH = [("sample calls run lean", "tinker", "SamplingClient.sample", "transport")]  # tinker 0.38.0 and later
_DATA = [
    (name, _RL + "data_processing", name, "data")
    for name in ("compute_advantages", "assemble_training_data", "trajectory_to_data", "remove_constant_reward_groups")
]
_STEP_BOTH = [
    ("compute_kl_sample_train", _RL + "metrics", "compute_kl_sample_train", "step"),
    ("compute_trajectory_metrics", _RL + "metric_util", "compute_trajectory_metrics", "step"),
    ("_remove_mask", _RL + "train", "_remove_mask", "step"),
]
_STEP_0_6 = [(name, _RL + "train", name, "step") for name in ("rollout_usage", "training_usage")]
_KL_0_6 = [
    *(
        (name, _RL + "metrics", name, "kl")
        for name in (
            "incorporate_kl_penalty",
            "compute_post_kl",
            "score_sequences",
            "_full_sequence_inputs",
            "discounted_future_sum_vectorized",
        )
    ),
    (
        "distillation.train_on_policy.incorporate_kl_penalty",
        "tinker_cookbook.distillation.train_on_policy",
        "incorporate_kl_penalty",
        "kl",
    ),
]
GC_NAMES = [
    "do_sync_training",
    "do_async_training",
    "do_sync_training_with_stream_minibatch",
    "do_train_step_and_get_sampling_client",
    "do_train_step_streaming_and_get_sampling_client",
]
_GC = [(f"GC held to the step: {name}", _RL + "train", name, "gc") for name in GC_NAMES]


_SIGNAL = [("asyncio.run, no repr of its result (signal._int_to_enum)", "signal", "_int_to_enum", "workers")]
_WORKERS = [("rollout workers install too", _RL + "rollouts", "_run_rollout_sync", "workers")]
_WORKERS += _SIGNAL if signal_reprs_handlers() else []
EXPECTED = {
    "0.6.1": [*_WIRE, *_SAMPLE_PATH, *_DATA, *_STEP_BOTH, *_STEP_0_6, *_KL_0_6, *_GC, *_WORKERS],
    "0.5.8": [*_WIRE, *_DATA, *_STEP_BOTH, *_GC, *_WORKERS],  # with tinker 0.36.0: no sample path piece
}
PRESENT = EXPECTED.get(tinker_cookbook.__version__, EXPECTED["0.6.1"])
PRESENT_TITLES = [title for title, *_ in PRESENT]


def ours_of(name: str, module: str = "tinker_cookbook.rl.data_processing"):
    """What install() put in for ``module.name`` (fitted to the installed
    version's signature: 0.5.x takes no include_provenance)."""
    (record,) = [r for p, r in transaction._installed.items() if p.name == name and p.module == module]
    return record.ours


def expected_left(report) -> list:
    """Pieces left for a reason that is no cause for a warning: a name the
    installed (older) version does not have yet."""
    return [
        entry
        for entry in report.left
        if "(added in " in entry[1] or "ours reproduces" in entry[1] or "without its repr" in entry[1]
    ]


def namespaces() -> dict[str, dict[str, int]]:
    """Every loaded tinker / tinker_cookbook module's names and the ids of
    what they hold: what uninstall() must give back exactly."""
    return {
        name: {k: id(v) for k, v in vars(m).items() if k != "__warningregistry__"}  # tinker's own warnings
        for name, m in list(sys.modules.items())
        if m is not None and name.split(".")[0] in ("tinker", "tinker_cookbook", "signal")
    }


@pytest.fixture
def clean():
    """Nothing installed before; after the test, uninstall() gives back
    exactly the namespaces found before."""
    for feature in features.declared():
        for piece in feature.pieces:
            importlib.import_module(piece.module)
    assert not transaction.installed()
    before = namespaces()
    yield
    tinker_rl_data.uninstall()
    after = namespaces()
    assert {k: v for k, v in after.items() if k in before} == before


def install_quietly(**kwargs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = ours.install(**kwargs)
    return report, [w for w in caught if issubclass(w.category, InstallWarning)]


def verified_pair() -> bool:
    return (
        tinker.__version__ in TESTED_VERSIONS["tinker"]
        and tinker_cookbook.__version__ in TESTED_VERSIONS["tinker_cookbook"]
    )


# --------------------------------------------------------------------------
# The policy


def test_the_verified_pair_installs_every_piece_without_a_warning(clean):
    assert verified_pair(), (tinker.__version__, tinker_cookbook.__version__)
    report, caught = install_quietly()
    assert caught == []
    assert [title for title, _ in report.installed] == PRESENT_TITLES
    assert report.left == expected_left(report) and report.probe_ms > 0
    for title, module, name, _ in PRESENT:
        holder = functools.reduce(getattr, name.split("."), importlib.import_module(module))
        assert holder is ours_of(name, module)
    assert data_processing.assemble_training_data is rl_train.assemble_training_data
    text = str(report)
    assert f"tinker {tinker.__version__} (tested)" in text
    assert re.search(r"^  coalesce +opt-in, not asked", text, re.M)
    for feature in ("wire", "data", "step", "gc", "workers"):
        n = sum(f == feature for *_, f in PRESENT)
        assert re.search(rf"^  {feature} +on, {n} of {n} ", text, re.M), text
    assert str(tinker_rl_data.status()).splitlines()[1:3] == text.splitlines()[1:3]


@pytest.mark.parametrize("package", ["tinker", "tinker_cookbook"])
def test_an_untested_version_whose_probes_pass_installs_with_one_warning(clean, monkeypatch, package):
    untested = sys.modules[package].__version__ + ".post1"  # a release the tests never saw
    monkeypatch.setattr(sys.modules[package], "__version__", untested)
    report, caught = install_quietly()
    assert len(caught) == 1, [str(w.message) for w in caught]
    message = str(caught[0].message)
    assert f"{untested} is not a version the tests ran against" in message and "probes" in message
    assert report.left == expected_left(report) and len(report.installed) == len(PRESENT)
    assert f"{untested} (untested version)" in str(report)


def fork_of(function, new_source: str):
    """A function as a fork of the cookbook would hold it: code compiled
    from the cookbook's own file name, defined in its module."""
    module = sys.modules[function.__module__]
    namespace = dict(vars(module))
    exec(compile(textwrap.dedent(new_source), module.__file__, "exec"), namespace)
    return namespace[function.__name__]


def test_a_forks_changed_function_is_left_alone_and_the_rest_installed(clean, monkeypatch):
    fork = fork_of(
        data_processing.compute_advantages,
        """
        def compute_advantages(trajectory_groups_P):
            out = []
            for g in trajectory_groups_P:
                r = torch.tensor(g.get_total_rewards())
                out.append((r - r.mean()) / (r.std() + 1e-6))  # the fork normalizes
            return out
        """,
    )
    for module in (data_processing, rl_train):
        monkeypatch.setattr(module, "compute_advantages", fork)
    report, caught = install_quietly()
    (forks,) = [entry for entry in report.left if entry[0] == "compute_advantages"]
    assert [str(w.message) for w in caught] == [f"tinker_rl_data: compute_advantages not installed: {forks[1]}"]
    assert "probe failed" in forks[1]
    assert [entry for entry in report.left if entry[0] != "compute_advantages"] == expected_left(report)
    assert data_processing.compute_advantages is fork and rl_train.compute_advantages is fork
    assert data_processing.assemble_training_data is ours_of("assemble_training_data")
    assert len(report.installed) == len(PRESENT) - 1


def test_a_fork_that_changes_nothing_on_the_probes_is_installed(clean, monkeypatch):
    fork = fork_of(
        data_processing.compute_advantages,
        """
        def compute_advantages(trajectory_groups_P):
            advantages_P = []
            for traj_group in trajectory_groups_P:
                rewards_G = torch.tensor(traj_group.get_total_rewards())
                advantages_P.append(rewards_G - rewards_G.mean())
            return advantages_P
        """,
    )
    monkeypatch.setattr(data_processing, "compute_advantages", fork)
    report, caught = install_quietly()
    assert caught == [] and data_processing.compute_advantages is ours_of("compute_advantages")


def test_a_users_function_in_the_home_module_is_kept(clean, monkeypatch):
    def compute_advantages(trajectory_groups_P):  # the user's own, defined here
        return []

    monkeypatch.setattr(data_processing, "compute_advantages", compute_advantages)
    report, caught = install_quietly()
    assert len(caught) == 1 and "not tinker-cookbook's own: kept" in str(caught[0].message)
    assert data_processing.compute_advantages is compute_advantages
    assert data_processing.trajectory_to_data is ours_of("trajectory_to_data")


def test_a_users_patch_of_one_site_is_kept(clean, monkeypatch):
    def users_assemble(*args, **kwargs):
        return data_processing.assemble_training_data(*args, **kwargs)

    monkeypatch.setattr(rl_train, "assemble_training_data", users_assemble)
    report, caught = install_quietly()
    assert caught == []
    assert rl_train.assemble_training_data is users_assemble
    assert data_processing.assemble_training_data is ours_of("assemble_training_data")
    assert "tinker_cookbook.rl.train.assemble_training_data" in report.kept
    tinker_rl_data.uninstall()
    assert rl_train.assemble_training_data is users_assemble


def test_a_users_wrapper_of_tinkers_method_runs_and_sends_our_bytes(clean, monkeypatch):
    from tinker.proto import tinker_public_pb2 as public_pb

    from tinker_rl_data.tinker.forward_backward import _posted_body, _requests

    calls = []
    method = training.AsyncTrainingResource.forward_backward

    async def traced(self, **kwargs):
        calls.append(kwargs["forward_only"])
        return await method(self, **kwargs)

    traced.__wrapped__ = method
    monkeypatch.setattr(training.AsyncTrainingResource, "forward_backward", traced)
    tinker_rl_data.install()
    assert training.AsyncTrainingResource.forward_backward is traced
    request, forward_only = _requests()[0]
    body = _posted_body(traced, request, forward_only)
    from tinker.proto.request_conv import forward_backward_request_to_proto

    message = forward_backward_request_to_proto(request)
    message.forward_only = forward_only
    assert calls == [forward_only]
    assert body == message.SerializeToString(deterministic=True)
    assert public_pb.ForwardBackwardRequest.FromString(body) == message


def test_a_tinker_whose_method_no_longer_calls_the_builder_keeps_its_encoder(clean, monkeypatch):
    async def forward_backward(self, *, request, forward_only=False):  # a changed tinker
        return await self._post("/api/v1/forward_backward", body=b"", options=None, cast_to=None)

    monkeypatch.setattr(training.AsyncTrainingResource, "forward_backward", forward_backward)
    with pytest.warns(InstallWarning, match="no longer builds its message"):
        report = tinker_rl_data.install()
    assert "forward_backward request bytes" not in [title for title, _ in report.installed]
    assert all(p.name != "forward_backward_request_to_proto" for p in transaction._installed)
    from tinker.proto import request_conv

    assert training.forward_backward_request_to_proto is request_conv.forward_backward_request_to_proto


def test_a_missing_name_is_left_with_a_warning(clean, monkeypatch):
    monkeypatch.delattr(rl_train, "_remove_mask")
    report, caught = install_quietly()
    assert ("_remove_mask", "tinker_cookbook.rl.train has no _remove_mask") in report.left
    assert len(caught) == 1 and len(report.installed) == len(PRESENT) - 1


# --------------------------------------------------------------------------
# The transaction


class RefusingModule(pytypes.ModuleType):
    """A loaded cookbook module holding the original whose attributes cannot
    be set: the install fails midway through its replacements."""

    def __setattr__(self, name, value):
        raise AttributeError(f"{self.__name__} is read-only")


@pytest.fixture
def refusing_site(monkeypatch):
    site = RefusingModule("tinker_cookbook._test_refusing")
    vars(site)["remove_mask"] = rl_train._remove_mask
    monkeypatch.setitem(sys.modules, site.__name__, site)
    return site


def test_a_failed_install_leaves_nothing_installed(clean, refusing_site):
    before = namespaces()
    report, caught = install_quietly()
    assert len(caught) == 1 and "nothing installed: AttributeError" in str(caught[0].message)
    assert namespaces() == before and not transaction.installed()
    assert report.installed == []


def test_strict_raises_and_installs_nothing(clean, refusing_site, monkeypatch):
    before = namespaces()
    with pytest.raises(AttributeError, match="read-only"):
        ours.install(strict=True)
    assert namespaces() == before
    monkeypatch.delattr(rl_train, "_remove_mask")
    monkeypatch.setenv("TINKER_RL_DATA_STRICT", "1")
    with pytest.raises(InstallError, match="_remove_mask: tinker_cookbook.rl.train has no _remove_mask"):
        ours.install()
    assert not transaction.installed()


def test_disabled_is_a_no_op_that_says_so(clean, monkeypatch):
    monkeypatch.setenv("TINKER_RL_DATA_DISABLE", "1")
    before = namespaces()
    report = ours.install()
    assert report.disabled and report.installed == [] and namespaces() == before
    assert "disabled by TINKER_RL_DATA_DISABLE=1" in str(report)


def test_install_twice_and_uninstall_by_owner(clean):
    tinker_rl_data.install()
    encoder = training.forward_backward_request_to_proto
    report = ours.install()
    assert training.forward_backward_request_to_proto is encoder and len(report.installed) == len(PRESENT)
    ours.install()
    ours.uninstall()  # the encoder was installed by tinker_rl_data.install(): it stays
    assert training.forward_backward_request_to_proto is encoder
    assert not any(p.requires == "tinker_cookbook" for p in transaction._installed)
    tinker_rl_data.uninstall()
    assert not transaction.installed()


def test_a_module_imported_after_install_gets_ours_and_uninstall_restores_it(clean, monkeypatch):
    ours.install()
    late = pytypes.ModuleType("tinker_cookbook._test_late")
    late.assemble = data_processing.assemble_training_data  # `from ... import` after install
    monkeypatch.setitem(sys.modules, late.__name__, late)
    assert late.assemble is ours_of("assemble_training_data")
    tinker_rl_data.uninstall()
    assert late.assemble is data_processing.assemble_training_data is not ours.assemble_training_data


# --------------------------------------------------------------------------
# Exceptions keep their class


class MyError(ValueError):
    pass


def test_a_users_exception_from_a_property_passes_through_as_it_is():
    from tinker_rl_data.cookbook.probe_inputs import CookbookBatches

    cookbook = CookbookBatches()
    traj = cookbook.trajectories()[0]

    class Exploding:
        def __init__(self, inner):
            self.inner = inner

        @property
        def tokens(self):
            raise MyError("the user's own")

        def __getattr__(self, name):
            return getattr(self.inner, name)

    transition = traj.transitions[0]
    bad = cookbook.transition(ob=transition.ob, ac=Exploding(transition.ac), reward=0.0, episode_done=True)
    group = cookbook.group([cookbook.trajectory(transitions=[bad], final_ob=cookbook.ob())], [0.0])
    with pytest.raises(MyError, match="the user's own") as info:
        ours.assemble_training_data([group], [[0.5]])
    assert type(info.value) is MyError


def test_the_cookbooks_own_error_cases_raise_its_class():
    from tinker_cookbook.exceptions import DataValidationError

    from tinker_rl_data.cookbook.probe_inputs import CookbookBatches

    cookbook = CookbookBatches()
    short = cookbook.traj(cookbook.step(cookbook.ob(), [1]))
    with pytest.raises(DataValidationError, match="need at least 2 tokens"):
        ours.trajectory_to_data(short, 0.5)
    with pytest.raises(DataValidationError, match="need at least 2 tokens"):
        data_processing.trajectory_to_data(short, 0.5)


# --------------------------------------------------------------------------
# The launcher (the docs' tables: test_features.py)


def test_the_launcher_installs_then_runs_a_module_with_its_arguments(tmp_path):
    (tmp_path / "recipe_probe.py").write_text(
        textwrap.dedent(
            """
            import builtins
            import sys
            import recipe_helper  # a sibling: the current directory (-m) or the script's (python script.py)
            import tinker_rl_data
            from tinker_cookbook.rl import data_processing
            assert __name__ == "__main__" and __builtins__ is builtins  # (as under python)
            assert data_processing.assemble_training_data.__module__.startswith("tinker_rl_data.")
            print("argv", sys.argv[1:], len(tinker_rl_data.status().installed))
            """
        )
    )
    (tmp_path / "recipe_helper.py").write_text("")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the module found as python -m finds it
    args = ["-m", "recipe_probe", "model_name=x", "--flag", "-m"]
    console = Path(sys.executable).parent / "tinker-rl-data"
    if not console.exists() and os.environ.get("CI"):
        pytest.fail(f"the console script is not installed beside {sys.executable}")
    launchers = [[sys.executable, "-m", "tinker_rl_data"]]
    launchers += [[str(console)]] if console.exists() else []
    for launcher in launchers:
        done = subprocess.run([*launcher, "run", *args], env=env, capture_output=True, text=True, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == f"argv ['model_name=x', '--flag', '-m'] {len(PRESENT)}"
        assert re.search(r"^  data +on, 4 of 4 ", done.stderr, re.M), done.stderr
    # The KL pieces go in by default (counted above); --no-kl leaves them.
    script = tmp_path / "recipe_probe.py"
    done = subprocess.run(
        [sys.executable, "-m", "tinker_rl_data", "run", "--no-kl", str(script), "a"], capture_output=True, text=True, env=env
    )
    # (tinker-cookbook 0.5.x has no KL pieces to leave: the counts are equal there.)
    without_kl = len([p for p in PRESENT if p[3] != "kl"])
    assert done.returncode == 0 and done.stdout.strip() == f"argv ['a'] {without_kl}", done.stderr


def test_the_launcher_without_a_command_prints_its_usage():
    done = subprocess.run([sys.executable, "-m", "tinker_rl_data"], capture_output=True, text=True)
    assert done.returncode == 2 and "usage: tinker-rl-data run" in done.stderr


def test_the_gc_pieces_go_in_by_default_and_gc_false_leaves_the_collector_alone(clean):
    import gc

    from tinker_rl_data.cookbook import gc_step as _gc_step

    names = GC_NAMES
    originals = {name: getattr(rl_train, name) for name in names}
    ours.install(gc=False)
    assert all(getattr(rl_train, name) is originals[name] for name in names)
    tinker_rl_data.uninstall()
    state = (gc.isenabled(), gc.get_threshold())
    ours.install()
    for name in names:
        assert getattr(rl_train, name).__wrapped__ is originals[name]
    tinker_rl_data.uninstall()
    assert all(getattr(rl_train, name) is originals[name] for name in names)
    assert (gc.isenabled(), gc.get_threshold()) == state and not _gc_step.COLLECTOR.active


# --------------------------------------------------------------------------
# The switches and the report


def test_skip_leaves_out_a_feature_and_a_piece_by_name(clean, monkeypatch):
    remove_mask = rl_train._remove_mask
    loops = [getattr(rl_train, name) for name in GC_NAMES]
    monkeypatch.setenv("TINKER_RL_DATA_SKIP", " gc, _remove_mask")
    report, caught = install_quietly()
    assert caught == []
    installed = [title for title, _ in report.installed]
    assert installed == [t for t, _, _, f in PRESENT if f != "gc" and t != "_remove_mask"]
    assert rl_train._remove_mask is remove_mask and ("_remove_mask", "skipped by TINKER_RL_DATA_SKIP") in report.left
    assert [getattr(rl_train, name) for name in GC_NAMES] == loops
    text = str(report)
    assert re.search(r"^  gc +off \(TINKER_RL_DATA_SKIP\)", text, re.M), text
    assert "skipped by TINKER_RL_DATA_SKIP: _remove_mask" in text


def test_the_report_is_one_line_per_feature_and_its_details_name_every_site(clean):
    report, _ = install_quietly(coalesce=False, kl=False)
    lines = str(report).splitlines()
    features = [line.split()[0] for line in lines[1:] if line.startswith("  ") and not line.startswith("   ")]
    assert features[:8] == ["wire", "transport", "data", "step", "kl", "gc", "coalesce", "workers"]
    assert max(len(line) for line in lines) <= 100
    assert re.search(r"^  kl +off \(not asked\)", str(report), re.M)
    details = report.details()
    for title, sites in report.installed:
        assert f"  in    {title}" in details
        for site in sites:
            assert f"          {site}\n" in details + "\n"
    assert "tinker_cookbook.rl.train.assemble_training_data" in details


def test_gc_headroom_sets_the_guard_of_installs_collector(clean):
    from tinker_rl_data.cookbook import gc_step

    try:
        ours.install(gc_headroom=0.05)
        assert gc_step.COLLECTOR.headroom == 0.05
    finally:
        gc_step.configure()  # back to the defaults for the tests after
    assert gc_step.COLLECTOR.headroom is None  # from the environment, when a loop starts


def test_probes_quiet_their_own_thread_only_and_two_installs_leave_logging_on(clean, monkeypatch):
    """A probe's warnings (the cookbook's, on constant groups) are dropped
    in the thread that probes; another thread's are not, and two installs
    in two threads, their probes overlapping, leave logging as it was."""
    import dataclasses
    import logging
    import threading

    from tinker_rl_data.cookbook import data_processing as ours_data
    from tinker_rl_data.cookbook import step as ours_step

    entered, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    heard: list[str] = []

    class Heard(logging.Handler):
        def emit(self, record):
            heard.append(record.getMessage())

    def probing(probe, mine: threading.Event, then: threading.Event):
        def wrapped(original, ours):
            mine.set()
            logging.getLogger("tinker_cookbook.rl.data_processing").warning("from a probe")
            assert then.wait(60)
            return probe(original, ours)

        return wrapped

    def with_probe(feature, name, probe):
        pieces = tuple(dataclasses.replace(p, probe=probe(p.probe)) if p.name == name else p for p in feature.pieces)
        return dataclasses.replace(feature, pieces=pieces)

    # the first install's probe starts, the second's starts, the first ends, then the second
    data = with_probe(ours_data.FEATURE, "compute_advantages", lambda p: probing(p, entered, second_in))
    step = with_probe(ours_step.FEATURE, "_remove_mask", lambda p: probing(p, second_in, first_out))
    handler = Heard(logging.WARNING)
    logging.getLogger("tinker_cookbook").addHandler(handler)
    try:
        first = threading.Thread(target=lambda: (transaction.install([data], {"data"}, owner="first"), first_out.set()))
        second = threading.Thread(target=lambda: transaction.install([step], {"step"}, owner="second"))
        first.start()
        assert entered.wait(60)
        logging.getLogger("tinker_cookbook.rl.data_processing").warning("from the program")  # while a probe runs
        second.start()
        first.join(120)
        second.join(120)
        assert not first.is_alive() and not second.is_alive()
        assert logging.root.manager.disable == logging.NOTSET
        assert heard == ["from the program"]
    finally:
        logging.getLogger("tinker_cookbook").removeHandler(handler)
        logging.disable(logging.NOTSET)  # (as the old save-and-restore could leave it)
        transaction.uninstall()
