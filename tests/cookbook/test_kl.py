"""tinker-cookbook's KL penalty passes (tinker_rl_data.cookbook.kl) against the real
tinker-cookbook 0.6.1: rl.metrics's incorporate_kl_penalty, compute_post_kl,
score_sequences, _full_sequence_inputs, discounted_future_sum_vectorized and
distillation.train_on_policy's incorporate_kl_penalty.

Differential: random Datums (masks, empty masks, int64 masks, image chunks,
a teacher per Datum, several datasets) are scored by a fake sampling client
that answers at once with tinker SampleResponses, through the cookbook's own
function and through ours, on copies. The outcomes must be the same: the
same exception class, or the same requests, usage, metric keys, and
advantages bit-identical (also against an independent numpy float32
reference given our mean); every metric equal to the cookbook's. Datums run from 0 positions to past torch's parallel
grain (32768), with contiguous, strided and int64 masks. Inputs the
trainer makes must take the native path (no fallback).

Needs tinker_cookbook; skipped where it is absent, except when
TINKER_RL_DATA_REQUIRE_COOKBOOK=1 (CI).
"""

from __future__ import annotations

import asyncio
import copy
import logging
import math
import sys

import numpy as np
import pytest

from conftest import cookbook_unavailable

try:
    import torch
    from tinker_cookbook.distillation import train_on_policy
    from tinker_cookbook.rl import metrics, train
except ImportError as exc:
    cookbook_unavailable(exc)

import tinker
from hypothesis import given
from hypothesis import strategies as st
from tinker.types import EncodedTextChunk, ImageChunk

from tinker_rl_data.errors import ProbeFailed
from tinker_rl_data import _core, rows
from tinker_rl_data.cookbook import kl as _kl

# The cookbook's own functions, read before anything could replace them.
COOKBOOK = {
    "incorporate_kl_penalty": metrics.incorporate_kl_penalty,
    "compute_post_kl": metrics.compute_post_kl,
    "score_sequences": metrics.score_sequences,
    "_full_sequence_inputs": metrics._full_sequence_inputs,
    "discounted_future_sum_vectorized": metrics.discounted_future_sum_vectorized,
    "distillation": train_on_policy.incorporate_kl_penalty,
}
assert all(not getattr(f, "_tinker_rl_data_native", False) for f in COOKBOOK.values())


# --------------------------------------------------------------------------
# the fake service


class Ready:
    def __init__(self, value):
        self.value = value

    async def _get(self):
        return self.value

    def coroutine(self):
        return self._get()

    def result(self):
        return self.value


class FakeClient:
    """Answers each scoring call at once with the next of ``answers`` (a
    function of the call's index and prompt), recording the calls."""

    def __init__(self, answer):
        self.answer = answer
        self.calls = []

    def _respond(self, kind, prompt, kwargs):
        i = len(self.calls)
        self.calls.append((kind, prompt, kwargs))
        return self.answer(i, prompt)

    def sample(self, prompt, num_samples, sampling_params, include_prompt_logprobs=False, **rest):
        kwargs = dict(num_samples=num_samples, sampling_params=sampling_params.model_dump(),
                      include_prompt_logprobs=include_prompt_logprobs, **rest)
        return Ready(self._respond("sample", prompt, kwargs))

    async def sample_async(self, *args, **kwargs):
        return await self.sample(*args, **kwargs).coroutine()

    def compute_logprobs(self, prompt, prompt_logprobs_last_n=None):
        response = self._respond("compute_logprobs", prompt, {"last_n": prompt_logprobs_last_n})
        return Ready(response.prompt_logprobs if isinstance(response, tinker.SampleResponse) else response)


def response(scores: np.ndarray, form: str, cached: int, sampled: int) -> tinker.SampleResponse:
    sequence = tinker.SampledSequence(
        stop_reason="length", sequence_id="s", tokens_np=np.arange(sampled, dtype=np.int32),
        logprobs_np=np.zeros(sampled, np.float32),
    )
    if form == "list":  # built from lists, as from JSON
        listed = [None if math.isnan(v) else float(v) for v in scores.tolist()]
        return tinker.SampleResponse(sequences=[sequence], _prompt_logprobs_list=listed, prompt_cache_hit_tokens=cached)
    r = tinker.SampleResponse(sequences=[sequence], prompt_logprobs_np=scores.copy(), prompt_cache_hit_tokens=cached)
    if form == "cached":  # its list already made
        assert r.prompt_logprobs is not None
    return r


# --------------------------------------------------------------------------
# strategies

finite32 = st.floats(-20.0, 0.0, width=32, allow_nan=False, allow_infinity=False)
mask_values = st.sampled_from([0.0, 1.0, 1.0, 1.0, 0.5])


# Around where torch's float32 sum changes shape (4 accumulators, 8 or 16
# lanes, 16 rows per level).
LONG = [8, 15, 16, 17, 31, 32, 33, 64, 65, 127, 255, 513, 1025]


@st.composite
def datum(draw, plain: bool):
    if draw(st.integers(0, 3)) == 0:
        return draw(long_datum(plain))
    n = draw(st.integers(1 if plain else 0, 10))
    tokens = [draw(st.integers(0, 50_000)) for _ in range(n + 1)]
    chunks = [EncodedTextChunk(tokens=tokens[:n])]
    if n >= 3 and draw(st.booleans()):
        k = draw(st.integers(1, n - 1))
        image = ImageChunk(data=b"\x89PNG", format="png", expected_tokens=1)
        chunks = [EncodedTextChunk(tokens=tokens[:k]), image, EncodedTextChunk(tokens=tokens[k + 1 : n])]
    empty = draw(st.integers(0, 4)) == 0
    mask = np.array([0.0 if empty else draw(mask_values) for _ in range(n)], np.float32)
    logprobs = np.array([draw(finite32) for _ in range(n)], np.float32) * mask
    advantages = np.array([draw(st.floats(-3, 3, width=32)) for _ in range(n)], np.float32) * mask
    mask_tensor = tinker.TensorData.from_numpy(mask)
    if not plain and draw(st.integers(0, 5)) == 0:
        mask_tensor = tinker.TensorData.from_numpy(mask.astype(np.int64))  # an int64 mask
    inputs = {
        "target_tokens": tinker.TensorData.from_numpy(np.array(tokens[1:], np.int64)),
        "logprobs": tinker.TensorData.from_numpy(logprobs),
        "advantages": tinker.TensorData.from_numpy(advantages),
        "mask": mask_tensor,
    }
    return tinker.Datum(model_input=tinker.ModelInput(chunks=chunks), loss_fn_inputs=inputs)


def make_datum(tokens, logprobs, advantages, mask_tensor):
    n = len(tokens) - 1
    inputs = {
        "target_tokens": tinker.TensorData.from_numpy(np.array(tokens[1:], np.int64)),
        "logprobs": tinker.TensorData.from_numpy(logprobs),
        "advantages": tinker.TensorData.from_numpy(advantages),
        "mask": mask_tensor,
    }
    return tinker.Datum(model_input=tinker.ModelInput(chunks=[EncodedTextChunk(tokens=tokens[:n])]), loss_fn_inputs=inputs)


@st.composite
def long_datum(draw, plain: bool):
    """A Datum of up to ~1000 positions, values from a seeded generator;
    its mask contiguous, strided (a float32 view) or int64."""
    n = draw(st.one_of(st.sampled_from(LONG), st.integers(11, 1100)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    tokens = [int(t) for t in rng.integers(0, 50_000, n + 1)]
    mask = rng.choice(np.array([0.0, 1.0, 1.0, 1.0, 0.5], np.float32), n)
    logprobs = (-rng.exponential(3.0, n)).astype(np.float32) * mask
    advantages = rng.standard_normal(n).astype(np.float32) * mask
    form = "contiguous" if plain else draw(st.sampled_from(["contiguous", "contiguous", "strided", "int64"]))
    if form == "strided":
        mask_tensor = tinker.TensorData.from_numpy(np.repeat(mask, 2)[::2])
        assert n <= 1 or mask_tensor.to_torch().stride() == (2,)
    elif form == "int64":
        mask_tensor = tinker.TensorData.from_numpy((mask > 0.7).astype(np.int64))
    else:
        mask_tensor = tinker.TensorData.from_numpy(mask)
    return make_datum(tokens, logprobs, advantages, mask_tensor)


@st.composite
def scored_batches(draw, plain: bool = False):
    """Datums, and per Datum the service's answer: its prompt logprobs
    (NaN at position 0), in which form, cache hits and tokens sampled."""
    data = draw(st.lists(datum(plain), min_size=1 if plain else 0, max_size=5))
    answers = []
    for d in data:
        n = d.model_input.length + 1
        if n > 12:
            rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
            scores = (-rng.exponential(3.0, n)).astype(np.float32)
        else:
            scores = np.array([draw(finite32) for _ in range(n)], np.float32)
        scores[0] = np.nan
        form = draw(st.sampled_from(["np", "np", "list", "cached"]))
        if not plain:
            odd = draw(st.integers(0, 12))
            if odd == 0 and n > 2:
                scores[draw(st.integers(1, n - 1))] = np.nan  # an unscored position: torch refuses None
            elif odd == 1:
                scores = scores[:-1] if n > 1 else scores  # one short: torch broadcasts or raises
        answers.append((scores, form, draw(st.integers(0, n)), draw(st.integers(0, 2))))
    return data, answers


def client(answers):
    return FakeClient(lambda i, prompt: response(*answers[i]))


# --------------------------------------------------------------------------
# comparing


def run(coroutine):
    try:
        return "ok", asyncio.run(coroutine)
    except Exception as e:  # noqa: BLE001 - the class is compared
        return "raised", type(e)


def advantages(data):
    return [d.loss_fn_inputs["advantages"] for d in data]


def same_bits(a, b) -> bool:
    return all(x.dtype == y.dtype and x.to_numpy().tobytes() == y.to_numpy().tobytes() for x, y in zip(a, b, strict=True))


def same_metrics(ours: dict, theirs: dict) -> bool:
    """Equal, key for key and in order (NaN for NaN)."""
    return list(ours) == list(theirs) and all(
        (math.isnan(v) and math.isnan(ours[k])) or (ours[k] == v and type(ours[k]) is type(v)) for k, v in theirs.items()
    )


def reference_advantages(d, scores, coef, gamma, avg=None):
    """Independent float32 reference of the cookbook's per-token terms
    (numpy float32 scalars, one operation at a time)."""
    f = np.float32
    s = d.loss_fn_inputs["logprobs"].to_numpy().astype(np.float32)
    m = d.loss_fn_inputs["mask"].to_numpy().astype(np.float32)
    b = scores[1:].astype(np.float32)
    diff = (s - b) * m
    terms = (f(coef) * m) * (f(avg) - diff) if avg is not None else (f(-coef) * m) * diff
    if gamma > 0:
        out, running = np.empty_like(terms), f(0.0)
        for t in range(len(terms) - 1, -1, -1):
            running = f(terms[t] + f(f(gamma) * running))
            out[t] = running
        terms = out
    return d.loss_fn_inputs["advantages"].to_numpy().astype(np.float32) + terms


@pytest.fixture
def fallbacks(monkeypatch):
    """The fallbacks taken, by (module, name)."""
    taken = []
    original = _kl.left_to

    def record(function, name, why):
        taken.append((name, str(why)))
        return original(function, name, why)

    monkeypatch.setattr(_kl, "left_to", record)
    return taken


# --------------------------------------------------------------------------
# rl.metrics.incorporate_kl_penalty


def check_base_penalty(batch, coef, gamma):
    data, answers = batch
    theirs_data, ours_data = copy.deepcopy(data), copy.deepcopy(data)
    theirs_client, ours_client = client(answers), client(answers)
    theirs = run(COOKBOOK["incorporate_kl_penalty"](theirs_data, theirs_client, coef, gamma))
    ours = run(_kl.incorporate_kl_penalty(ours_data, ours_client, coef, gamma))
    assert ours[0] == theirs[0], (ours, theirs)
    assert repr(ours_client.calls) == repr(theirs_client.calls)
    if theirs[0] == "raised":
        assert ours[1] is theirs[1]
        return
    (m_theirs, usage_theirs), (m_ours, usage_ours) = theirs[1], ours[1]
    assert usage_ours == usage_theirs
    assert list(m_ours) == list(m_theirs) == ["kl_policy_base"]
    assert same_metrics(m_ours, m_theirs), (m_ours, m_theirs)
    assert same_bits(advantages(ours_data), advantages(theirs_data))
    return ours_data, answers


@given(scored_batches(), st.sampled_from([0.0, 0.1, 1.0, 2.5]), st.sampled_from([0.0, 0.9, 0.5, -1.0]))
def test_incorporate_kl_penalty_matches_the_cookbook(batch, coef, gamma):
    check_base_penalty(batch, coef, gamma)


@given(scored_batches(plain=True), st.sampled_from([0.1, 1.0]), st.sampled_from([0.0, 0.9]))
def test_incorporate_kl_penalty_is_native_and_exact(batch, coef, gamma):
    data, answers = batch
    ours_data = copy.deepcopy(data)
    metrics_ours, _ = asyncio.run(_kl.incorporate_kl_penalty(ours_data, client(answers), coef, gamma))
    for d, new, (scores, *_) in zip(data, advantages(ours_data), answers):
        expected = reference_advantages(d, scores, coef, gamma, avg=metrics_ours["kl_policy_base"])
        assert new.dtype == "float32" and new.shape == [len(expected)]
        assert new.to_numpy().tobytes() == expected.tobytes()
    # No fallback: the native pass writes every Datum itself.
    again = copy.deepcopy(data)
    mean, _, _ = _core.kl_penalty(
        again, [response(*a) for a in answers], teacher=False, coef=coef, gamma=gamma or None,
        direct=rows.direct(), summing=_core.TorchSum(_kl._summing(), _kl._torch_sum),
    )
    assert same_bits(advantages(again), advantages(ours_data))


@pytest.mark.parametrize("threads", [1, 2])
def test_datums_past_torchs_grain_are_summed_by_torch(threads, fallbacks):
    # From 32768 positions on, torch sums in chunks by thread: our pass
    # asks torch for those sums, contiguous or strided.
    rng = np.random.default_rng(41)
    data, answers = [], []
    for n, form in [(40_000, "contiguous"), (20, "contiguous"), (33_000, "strided"), (32_768, "int64"), (32_767, "strided")]:
        mask = rng.choice(np.array([0.0, 1.0, 1.0, 0.5], np.float32), n)
        logprobs = (-rng.exponential(3.0, n) * 10.0 ** rng.integers(-3, 3, n)).astype(np.float32) * mask
        mask_tensor = {
            "contiguous": tinker.TensorData.from_numpy(mask),
            "strided": tinker.TensorData.from_numpy(np.repeat(mask, 3)[::3]),
            "int64": tinker.TensorData.from_numpy((mask > 0.7).astype(np.int64)),
        }[form]
        tokens = [int(t) for t in rng.integers(0, 50_000, n + 1)]
        data.append(make_datum(tokens, logprobs, rng.standard_normal(n).astype(np.float32), mask_tensor))
        scores = (-rng.exponential(3.0, n + 1)).astype(np.float32)
        scores[0] = np.nan
        answers.append((scores, "np", 0, 1))
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for coef in (0.5, 2.0):
            check_base_penalty((data, answers), coef, 0.0)
        teachers = [FakeClient(lambda i, p, a=a: response(*a)) for a in answers]
        ours_data = copy.deepcopy(data)
        ours = asyncio.run(_kl.distillation_incorporate_kl_penalty(ours_data, teachers, [0, 1, 0, 1, 1], 1.0, 0.0))
        teachers = [FakeClient(lambda i, p, a=a: response(*a)) for a in answers]
        theirs_data = copy.deepcopy(data)
        theirs = asyncio.run(COOKBOOK["distillation"](theirs_data, teachers, [0, 1, 0, 1, 1], 1.0, 0.0))
        assert same_metrics(ours, theirs), (ours, theirs)
        assert same_bits(advantages(ours_data), advantages(theirs_data))
    finally:
        torch.set_num_threads(previous)
    assert fallbacks == []


def test_an_unreproduced_sum_leaves_the_penalty_to_the_cookbook(monkeypatch, fallbacks):
    monkeypatch.setattr(_kl, "_lanes", "torch's float32 sum under CPU capability X is not reproduced")
    data = _kl._probe_data()
    ours_data, theirs_data = copy.deepcopy(data), copy.deepcopy(data)
    ours = asyncio.run(_kl.incorporate_kl_penalty(ours_data, _kl._ProbeClient(), 0.5, 0.9))
    theirs = asyncio.run(COOKBOOK["incorporate_kl_penalty"](theirs_data, _kl._ProbeClient(), 0.5, 0.9))
    assert ours == theirs and same_bits(advantages(ours_data), advantages(theirs_data))
    assert fallbacks == [("incorporate_kl_penalty", "torch's float32 sum under CPU capability X is not reproduced")]
    with pytest.raises(ProbeFailed, match="capability X"):
        _kl.probe_incorporate_kl_penalty(COOKBOOK["incorporate_kl_penalty"], _kl.incorporate_kl_penalty)


# --------------------------------------------------------------------------
# distillation.train_on_policy.incorporate_kl_penalty


@given(scored_batches(), st.sampled_from([1.0, 0.5, 3]), st.sampled_from([0.0, 0.9]), st.data())
def test_distillation_penalty_matches_the_cookbook(batch, coef, gamma, data_strategy):
    data, answers = batch
    indices = data_strategy.draw(st.lists(st.integers(0, 2), min_size=len(data), max_size=len(data)))
    theirs_data, ours_data = copy.deepcopy(data), copy.deepcopy(data)
    # One teacher per Datum, each answering its own Datum.
    theirs_teachers = [FakeClient(lambda i, p, a=a: response(*a)) for a in answers]
    ours_teachers = [FakeClient(lambda i, p, a=a: response(*a)) for a in answers]
    theirs = run(COOKBOOK["distillation"](theirs_data, theirs_teachers, indices, coef, gamma))
    ours = run(_kl.distillation_incorporate_kl_penalty(ours_data, ours_teachers, indices, coef, gamma))
    assert ours[0] == theirs[0], (ours, theirs)
    assert [repr(t.calls) for t in ours_teachers] == [repr(t.calls) for t in theirs_teachers]
    if theirs[0] == "raised":
        assert ours[1] is theirs[1]
        return
    assert same_metrics(ours[1], theirs[1]), (ours[1], theirs[1])
    assert same_bits(advantages(ours_data), advantages(theirs_data))


# --------------------------------------------------------------------------
# compute_post_kl, score_sequences, _full_sequence_inputs


@given(scored_batches())
def test_compute_post_kl_matches_the_cookbook(batch):
    data, answers = batch
    theirs_client, ours_client = client(answers), client(answers)
    theirs = run(COOKBOOK["compute_post_kl"](data, theirs_client))
    ours = run(_kl.compute_post_kl(data, ours_client))
    assert ours[0] == theirs[0], (ours, theirs)
    assert repr(ours_client.calls) == repr(theirs_client.calls)
    if theirs[0] == "raised":
        assert ours[1] is theirs[1]
        return
    assert ours[1][1] == theirs[1][1]
    assert list(ours[1][0]) == list(theirs[1][0])
    assert same_metrics(ours[1][0], theirs[1][0]), (ours[1][0], theirs[1][0])


@given(scored_batches())
def test_score_sequences_and_full_sequences_match_the_cookbook(batch):
    data, answers = batch
    theirs = run_sync(COOKBOOK["_full_sequence_inputs"], data)
    ours = run_sync(_kl.full_sequence_inputs, data)
    assert ours[0] == theirs[0]
    if theirs[0] == "raised":
        assert ours[1] is theirs[1]
        return
    for a, b in zip(ours[1], theirs[1], strict=True):
        assert type(a) is type(b) and a == b and a.model_fields_set == b.model_fields_set
        assert [type(c) for c in a.chunks] == [type(c) for c in b.chunks]
        assert [c.model_fields_set for c in a.chunks] == [c.model_fields_set for c in b.chunks]
        assert all(x is y for x, y in zip(a.chunks[:-1], b.chunks[:-1]))
    sequences = ours[1]
    theirs_client, ours_client = client(answers), client(answers)
    theirs_scores = asyncio.run(COOKBOOK["score_sequences"](theirs_client, sequences))
    ours_scores = asyncio.run(_kl.score_sequences(ours_client, sequences))
    assert repr(ours_scores) == repr(theirs_scores)
    assert repr(ours_client.calls) == repr(theirs_client.calls)


def run_sync(function, *args):
    try:
        return "ok", function(*args)
    except Exception as e:  # noqa: BLE001
        return "raised", type(e)


# --------------------------------------------------------------------------
# discounted_future_sum_vectorized


@given(
    st.lists(st.floats(-1e4, 1e4, width=32), max_size=200),
    st.one_of(st.sampled_from([0.0, 0.9, 0.99, 1.0, 0.5]), st.floats(0.0, 1.5)),
    st.sampled_from([torch.float32, torch.float64]),
)
def test_discounted_future_sum_is_bit_identical(values, gamma, dtype):
    x = torch.tensor(values, dtype=dtype)
    theirs = COOKBOOK["discounted_future_sum_vectorized"](x, gamma)
    ours = _kl.discounted_future_sum_vectorized(x, gamma)
    assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
    assert ours.numpy().tobytes() == theirs.numpy().tobytes()


def test_discounted_future_sum_leaves_other_tensors_to_the_cookbook(fallbacks):
    x = torch.arange(6, dtype=torch.float32)
    odds = [
        (x[::2], 0.5), (x.reshape(2, 3), 0.5), (torch.tensor(2.0), 0.5),
        (torch._neg_view(torch.arange(4, dtype=torch.float32)), 0.5),
        (torch.ones(3, dtype=torch.float16), 0.5), (torch.ones(3, dtype=torch.bfloat16), 0.5),
        (x.requires_grad_(), 0.5), (torch.arange(4), 0.5), (x.detach(), 1),
    ]
    for odd, gamma in odds:
        theirs = run_sync(COOKBOOK["discounted_future_sum_vectorized"], odd, gamma)
        ours = run_sync(_kl.discounted_future_sum_vectorized, odd, gamma)
        assert ours[0] == theirs[0]
        if theirs[0] == "ok":
            assert torch.equal(ours[1], theirs[1]) and ours[1].dtype == theirs[1].dtype
    assert len(fallbacks) == len(odds)


# --------------------------------------------------------------------------
# fallbacks, logging, probes


def test_a_fallback_sends_no_request_twice_and_logs_once(caplog, monkeypatch):
    from tinker_rl_data import errors

    monkeypatch.setattr(errors, "_logged", set())
    data = [copy.deepcopy(d) for d in _kl._probe_data()]
    scores = [np.full(d.model_input.length + 1, -1.0, np.float32) for d in data]
    for s in scores:
        s[0] = np.nan
    scores[0][2] = np.nan  # an unscored position: torch.tensor refuses the None
    answers = [(s, "np", 0, 1) for s in scores]
    with caplog.at_level(logging.INFO, logger="tinker_rl_data"):
        for _ in range(2):
            fake = client(answers)
            with pytest.raises(RuntimeError, match="NoneType"):
                asyncio.run(_kl.incorporate_kl_penalty(copy.deepcopy(data), fake, 1.0, 0.0))
            assert len(fake.calls) == len(data)
    logged = [r for r in caplog.records if "incorporate_kl_penalty" in r.getMessage()]
    assert len(logged) == 1 and logged[0].levelno == logging.INFO


class Resizing(tinker.SampleResponse):
    """A response whose ``prompt_logprobs`` first resizes an earlier
    Datum's array (reallocating its memory), as user code read mid-pass
    may."""

    victim: np.ndarray | None = None
    new_len = 3

    @property
    def prompt_logprobs(self):
        victim = type(self).victim
        if victim is not None and len(victim) != self.new_len:
            victim.resize(self.new_len, refcheck=False)
        return tinker.SampleResponse.prompt_logprobs.__get__(self)


@pytest.mark.parametrize("new_len", [3, 4000])
@pytest.mark.parametrize(
    "pass_, key",
    [("penalty", "logprobs"), ("penalty", "mask"), ("penalty", "advantages"), ("post", "logprobs"), ("post", "mask")],
)
def test_an_array_resized_while_the_datums_are_read_is_no_crash(key, new_len, pass_, fallbacks):
    """The arrays found are read only once all are found, with no Python
    code run: one resized in between is seen as changed (the cookbook's
    function then takes the call), never read through a stale pointer."""
    base = _kl._probe_data()
    outcomes = []
    for function in (COOKBOOK, None):
        data = copy.deepcopy(base)
        answers = [_kl._probe_response(metrics._full_sequence_inputs([d])[0]) for d in data]

        class Hostile(Resizing):
            victim = data[0].loss_fn_inputs[key].to_numpy()

        Hostile.new_len = new_len
        last = answers[-1]
        answers[-1] = Hostile(sequences=last.sequences, prompt_logprobs_np=last.prompt_logprobs_np,
                              prompt_cache_hit_tokens=last.prompt_cache_hit_tokens)
        fake = FakeClient(lambda i, prompt, answers=answers: answers[i])
        if pass_ == "penalty":
            f = COOKBOOK["incorporate_kl_penalty"] if function else _kl.incorporate_kl_penalty
            outcomes.append(run(f(data, fake, 0.5, 0.9)))
        else:
            f = COOKBOOK["compute_post_kl"] if function else _kl.compute_post_kl
            outcomes.append(run(f(data, fake)))
        outcomes[-1] = (outcomes[-1][0], outcomes[-1][1] if outcomes[-1][0] == "raised" else None, advantages(data))
    (theirs_end, theirs_class, theirs_adv), (ours_end, ours_class, ours_adv) = outcomes
    assert (ours_end, ours_class) == (theirs_end, theirs_class)
    assert same_bits(ours_adv, theirs_adv)
    assert any("changed while it was read" in why for _, why in fallbacks), fallbacks


def test_the_trainer_path_takes_no_fallback(fallbacks):
    data = _kl._probe_data()
    asyncio.run(_kl.incorporate_kl_penalty(copy.deepcopy(data), _kl._ProbeClient(), 0.5, 0.9))
    asyncio.run(_kl.compute_post_kl(data, _kl._ProbeClient()))
    teachers = [_kl._ProbeClient() for _ in data]
    asyncio.run(_kl.distillation_incorporate_kl_penalty(copy.deepcopy(data), teachers, [0, 1, 0, 1], 1.0, 0.0))
    _kl.discounted_future_sum_vectorized(torch.ones(5), 0.9)
    assert fallbacks == []


def kl_pieces():
    return list(_kl.PIECES)


def test_probes_pass_on_the_originals_and_catch_a_difference():
    originals = {
        ("tinker_cookbook.rl.metrics", "incorporate_kl_penalty"): COOKBOOK["incorporate_kl_penalty"],
        ("tinker_cookbook.rl.metrics", "compute_post_kl"): COOKBOOK["compute_post_kl"],
        ("tinker_cookbook.rl.metrics", "score_sequences"): COOKBOOK["score_sequences"],
        ("tinker_cookbook.rl.metrics", "_full_sequence_inputs"): COOKBOOK["_full_sequence_inputs"],
        ("tinker_cookbook.rl.metrics", "discounted_future_sum_vectorized"): COOKBOOK["discounted_future_sum_vectorized"],
        ("tinker_cookbook.distillation.train_on_policy", "incorporate_kl_penalty"): COOKBOOK["distillation"],
    }
    assert {(p.module, p.name) for p in kl_pieces()} == set(originals)
    for piece in kl_pieces():
        original = originals[(piece.module, piece.name)]
        piece.probe(original, piece.make(original))

    async def off_by_one(data_D, client, coef, gamma):
        out = await _kl.incorporate_kl_penalty(data_D, client, coef, gamma)
        d = data_D[0].loss_fn_inputs
        d["advantages"] = tinker.TensorData.from_numpy(d["advantages"].to_numpy() + np.float32(1e-3))
        return out

    with pytest.raises(ProbeFailed):
        _kl.probe_incorporate_kl_penalty(COOKBOOK["incorporate_kl_penalty"], off_by_one)
    with pytest.raises(ProbeFailed):
        _kl.probe_discounted_future_sum_vectorized(
            COOKBOOK["discounted_future_sum_vectorized"], lambda x, g: _kl.discounted_future_sum_vectorized(x, g * 0.999)
        )


def test_install_puts_ours_wherever_the_cookbook_function_was():
    """Every cookbook module holding one of the functions (``rl.train``
    imports the penalty passes, distillation the discounted sum) holds ours
    after install, and the cookbook's again after uninstall."""
    from tinker_rl_data import cookbook

    holders = {
        (p.module, p.name): [
            m for m in list(sys.modules.values())
            if getattr(m, "__name__", "").startswith("tinker_cookbook.")
            and getattr(m, p.name, None) is getattr(__import__(p.module, fromlist=["_"]), p.name)
        ]
        for p in kl_pieces()
    }
    assert train in holders[("tinker_cookbook.rl.metrics", "incorporate_kl_penalty")]
    assert train_on_policy in holders[("tinker_cookbook.rl.metrics", "discounted_future_sum_vectorized")]
    cookbook.install(wire=False, gc=False)
    try:
        for (home, name), modules in holders.items():
            for module in modules:
                assert getattr(module, name).__module__.startswith("tinker_rl_data."), (module.__name__, name)
    finally:
        cookbook.uninstall()
    assert train.incorporate_kl_penalty is metrics.incorporate_kl_penalty is COOKBOOK["incorporate_kl_penalty"]
    assert train_on_policy.incorporate_kl_penalty is COOKBOOK["distillation"]
