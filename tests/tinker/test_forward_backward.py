"""tinker_rl_data.tinker.forward_backward (contract §10): the request bytes against tinker's
own encoder, `forward_backward_request_to_proto(request)` with
`forward_only` set, serialized deterministically (its default bytes order
map entries by hash, so differ between processes) and parsed back."""

from __future__ import annotations

import asyncio
import copy
import pickle
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np
import pytest
import tinker
import zstandard
from hypothesis import given
from hypothesis import strategies as st
from tinker import types
from tinker.proto import tinker_public_pb2 as public_pb
from tinker.proto.request_conv import forward_backward_request_to_proto
from tinker.proto import request_conv
from tinker.resources import training
from tinker.resources.training import AsyncTrainingResource

from conftest import groups

import tinker_rl_data
from tinker_rl_data import cookbook
from tinker_rl_data.patch import transaction
from tinker_rl_data.tinker import request_bytes
from tinker_rl_data.patch.report import TESTED_VERSIONS
from tinker_rl_data import encode_forward_backward

INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)


def tinkers_message(request, forward_only=False):
    message = forward_backward_request_to_proto(request)
    message.forward_only = forward_only
    return message


def tinkers_bytes(request, forward_only=False) -> bytes:
    return tinkers_message(request, forward_only).SerializeToString(deterministic=True)


def assert_same_as_tinker(request, forward_only=False):
    ours = encode_forward_backward(request, forward_only=forward_only)
    expected = tinkers_message(request, forward_only)
    assert public_pb.ForwardBackwardRequest.FromString(ours) == expected
    assert ours == expected.SerializeToString(deterministic=True)
    return ours


def request_of(data, loss_fn="importance_sampling", loss_fn_config=None, model_id="model", seq_id=1):
    return types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(data=data, loss_fn=loss_fn, loss_fn_config=loss_fn_config),
        model_id=model_id,
        seq_id=seq_id,
    )


def text_chunk(tokens):
    # model_construct: keeps the tokens as given (pydantic would make a list of ints)
    return types.EncodedTextChunk.model_construct(tokens=tokens)


# --------------------------------------------------------------------------
# Strategies: requests with every kind of field tinker encodes

INT_DTYPES = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", ">i4", ">i8", "<u2", "bool"]


@st.composite
def token_sequences(draw):
    """Token values in a list, a tuple (exact ints, or with numpy ints and
    bools that tinker's numpy conversion takes) or an integer or bool array
    of any dtype, byte order and stride (values wrap into the dtype, as
    numpy's int32 conversion wraps them); now and then a float64 or 2-D
    array, which numpy converts for tinker."""
    values = draw(st.lists(st.one_of(st.integers(0, 1000), st.integers(*INT32), st.sampled_from(INT32)), max_size=12))
    kind = draw(st.sampled_from(["list", "tuple", "mixed list", "array"]))
    if kind == "list":
        return values
    if kind == "tuple":
        return tuple(values)
    if kind == "mixed list":
        return [draw(st.sampled_from([v, np.int64(v), np.int32(v)])) for v in values] + draw(
            st.lists(st.booleans(), max_size=2)
        )
    dtype = np.dtype(draw(st.sampled_from(INT_DTYPES + ["float64"])))
    step = draw(st.sampled_from([1, 1, 2, -1]))
    base = np.array(values * abs(step), dtype=np.int64).astype(dtype)
    if draw(st.integers(0, 9)) == 0 and len(base) % 2 == 0:
        return base.reshape(2, -1)
    return base[::step]


image_bytes = st.binary(max_size=300)


@st.composite
def chunks(draw):
    kind = draw(st.sampled_from(["text", "text", "text", "image", "dmel"]))
    if kind == "text":
        return text_chunk(draw(token_sequences()))
    if kind == "image":
        expected = draw(st.one_of(st.none(), st.integers(0, 5000), st.sampled_from(INT32)))
        fmt = draw(st.sampled_from(["png", "jpeg"]))
        return types.ImageChunk(data=draw(image_bytes), format=fmt, expected_tokens=expected)
    return types.DmelChunk(dmel=draw(image_bytes))


FLOAT_SOURCES = ["float32", "float64", "float16", "int32", "int64", "uint8", "bool", ">f4"]
INT_SOURCES = ["int64", "int32", "int8", "uint16", "float64", "bool", ">i8"]


@st.composite
def tensors(draw):
    """TensorData float32 / int64, from arrays of the dtypes tinker casts,
    with and without shape, 1-D or 2-D, contiguous or not, dense or CSR."""
    dtype = draw(st.sampled_from(["float32", "int64"]))
    n = draw(st.integers(0, 12))
    if dtype == "float32":
        values = draw(st.lists(st.floats(-1e6, 1e6, allow_nan=False, width=32), min_size=n, max_size=n))
        source = draw(st.sampled_from(FLOAT_SOURCES))
    else:
        values = draw(st.lists(st.integers(-(2**40), 2**40), min_size=n, max_size=n))
        source = draw(st.sampled_from(INT_SOURCES))
    with np.errstate(all="ignore"):  # the cast from the drawn values to `source` may overflow; any values do
        array = np.array(values, dtype=np.float64 if dtype == "float32" else np.int64).astype(source)
    layout = draw(st.sampled_from(["1-D", "2-D", "strided", "from_numpy"]))
    if layout == "strided":
        array = np.repeat(array, 2)[::2]
    if layout == "2-D" and n % 2 == 0:
        array = array.reshape(2, n // 2)
    if layout == "from_numpy" and array.dtype.kind in "fi":
        return types.TensorData.from_numpy(array)
    if draw(st.integers(0, 4)) == 0:
        rows = draw(st.integers(1, 3))
        crow = draw(st.lists(st.integers(0, n), min_size=rows + 1, max_size=rows + 1))
        col = draw(st.lists(st.integers(0, 2**40), min_size=n, max_size=n))
        index_kind = draw(st.sampled_from([list, tuple, lambda v: [np.int64(x) for x in v]]))
        return types.TensorData(
            data=array.ravel(), dtype=dtype, shape=[rows, n], sparse_crow_indices=index_kind(crow),
            sparse_col_indices=index_kind(col),
        )
    shape = list(array.shape) if draw(st.booleans()) else None
    td = types.TensorData(data=array, dtype=dtype, shape=shape)
    if draw(st.integers(0, 5)) == 0:
        # An array tinker still casts when it encodes (TensorData's own
        # constructor casts on the way in; a subclass or user code may not).
        object.__setattr__(td, "_numpy", array)
    return td


sequence_ids = st.text(min_size=1, max_size=8)


@st.composite
def spans(draw):
    kind = draw(st.sampled_from([types.PromptProvenanceSpan, types.SampledProvenanceSpan]))
    return kind(
        sequence_id=draw(sequence_ids),
        offset=draw(st.one_of(st.integers(0, 100), st.integers(0, INT64[1]))),
        length=draw(st.one_of(st.integers(0, 100), st.integers(0, INT64[1]))),
    )


keys = st.one_of(
    st.sampled_from(["target_tokens", "logprobs", "advantages", "mask", "weights", "a", "ab", "", "é"]), st.text(max_size=4)
)


@st.composite
def datums(draw):
    model_input = types.ModelInput(chunks=draw(st.lists(chunks(), max_size=4)))
    loss_fn_inputs = draw(st.dictionaries(keys, tensors(), max_size=4))
    with_spans = draw(st.booleans())
    return types.Datum(
        model_input=model_input,
        loss_fn_inputs=loss_fn_inputs,
        model_input_spans=draw(st.lists(spans(), max_size=3)) if with_spans else None,
        loss_fn_input_spans=draw(st.lists(spans(), max_size=3)) if with_spans else None,
    )


config_values = st.one_of(
    st.floats(allow_nan=False),
    st.integers(-(2**53), 2**53),
    st.text(max_size=6),
    st.booleans(),
    st.floats(-10, 10).map(np.float64),
)


@st.composite
def requests(draw):
    return request_of(
        draw(st.lists(datums(), max_size=4)),
        loss_fn=draw(st.one_of(st.sampled_from(["importance_sampling", "ppo", "cross_entropy"]), st.text(max_size=5))),
        loss_fn_config=draw(st.one_of(st.none(), st.dictionaries(keys, config_values, max_size=4))),
        model_id=draw(st.text(max_size=12)),
        seq_id=draw(st.one_of(st.none(), st.integers(*INT32), st.sampled_from([0, *INT32]))),
    )


@given(requests(), st.booleans())
def test_bytes_equal_tinkers_deterministic_bytes_and_parse_to_its_message(request, forward_only):
    assert_same_as_tinker(request, forward_only)


@given(requests())
def test_the_request_is_not_modified(request):
    before = pickle.dumps(request)
    token_objects = [c.tokens for d in request.forward_backward_input.data for c in d.model_input.chunks if hasattr(c, "tokens")]
    encode_forward_backward(request)
    assert pickle.dumps(request) == before
    after = [c.tokens for d in request.forward_backward_input.data for c in d.model_input.chunks if hasattr(c, "tokens")]
    assert all(a is b for a, b in zip(token_objects, after))


# --------------------------------------------------------------------------
# Our own Datums


@given(groups(max_groups=3), st.sampled_from(["list", "numpy"]), st.booleans())
def test_datums_of_assemble_training_data_encode_as_tinker_encodes_them(batch, tokens, merge_turns):
    advantages = tinker_rl_data.compute_advantages(batch)
    datums, _ = tinker_rl_data.assemble_training_data(
        batch, advantages, model_input_tokens=tokens, merge_turns=merge_turns
    )
    assert_same_as_tinker(request_of(datums))


@dataclass
class Action:  # tinker-cookbook's TokensWithLogprobs, read by attribute
    tokens: list
    maybe_logprobs: list | None
    sequence_id: str | None = None

    @property
    def logprobs(self) -> list | None:
        return self.maybe_logprobs


@dataclass
class Transition:
    ob: Any
    ac: Action
    reward: float = 0.0
    episode_done: bool = False
    metrics: dict = field(default_factory=dict)


@dataclass
class Trajectory:
    transitions: list
    final_ob: Any = None


@dataclass
class TrajectoryGroup:
    trajectories_G: list
    final_rewards_G: list
    metrics_G: list


@st.composite
def cookbook_batches(draw):
    """Cookbook-shaped groups (as tinker_rl_data.cookbook reads them; no
    tinker_cookbook needed): observations that extend the sequence so far
    or not, text and image chunks, every action with a sequence_id."""
    out = []
    for g in range(draw(st.integers(1, 3))):
        trajectories = []
        for t in range(draw(st.integers(1, 3))):
            sequence: list[int] = []
            transitions = []
            for u in range(draw(st.integers(1, 3))):
                extend = sequence and draw(st.booleans())
                new = draw(st.lists(st.integers(0, 2**31 - 1), min_size=1, max_size=6))
                prompt = sequence + new if extend else new
                chunks = [types.EncodedTextChunk(tokens=prompt)]
                if draw(st.integers(0, 4)) == 0:
                    chunks.append(types.ImageChunk(data=b"\x89PNG", format="png", expected_tokens=2))
                    prompt = []  # the next observation does not extend this one
                completion = draw(st.lists(st.integers(0, 2**31 - 1), min_size=1, max_size=6))
                logprobs = [-0.5] * len(completion)
                transitions.append(
                    Transition(types.ModelInput(chunks=chunks), Action(completion, logprobs, f"s{g}.{t}.{u}"))
                )
                sequence = prompt + completion
            trajectories.append(Trajectory(transitions, types.ModelInput.empty()))
        rewards = draw(st.lists(st.floats(-1, 1), min_size=len(trajectories), max_size=len(trajectories)))
        out.append(TrajectoryGroup(trajectories, rewards, [{} for _ in trajectories]))
    return out


@given(cookbook_batches(), st.booleans())
def test_datums_of_the_cookbook_drop_in_with_provenance_encode_as_tinker_encodes_them(batch, provenance):
    advantages = [[r - sum(g.final_rewards_G) / len(g.final_rewards_G) for r in g.final_rewards_G] for g in batch]
    datums, _ = cookbook.assemble_training_data(batch, advantages, include_provenance=provenance)
    assert any(d.model_input_spans for d in datums) == provenance
    assert_same_as_tinker(request_of(datums, loss_fn_config={"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}))


def test_a_large_request_written_with_the_gil_released():
    rng = np.random.default_rng(0)
    data = []
    for _ in range(40):
        tokens = rng.integers(0, 150_000, 8_000)
        data.append(
            types.Datum(
                model_input=types.ModelInput.from_ints(tokens[:-1].tolist()),
                loss_fn_inputs={
                    "target_tokens": types.TensorData.from_numpy(tokens[1:]),
                    "logprobs": types.TensorData.from_numpy(rng.random(7_999, dtype=np.float32)),
                },
            )
        )
    assert len(assert_same_as_tinker(request_of(data))) > 2**20


def test_map_entries_of_every_key_order_and_empty_values():
    td = types.TensorData(data=np.zeros(0, np.float32), dtype="float32")
    datum = types.Datum(model_input=types.ModelInput(chunks=[]), loss_fn_inputs={k: td for k in ["ab", "a", "", "b", "é"]})
    config = {"ab": 0.0, "a": "", "": -0.0, "b": 1, "zz": "x"}
    assert_same_as_tinker(request_of([datum, datum], loss_fn_config=config, model_id="", loss_fn="", seq_id=0))


# --------------------------------------------------------------------------
# What tinker refuses: the same exception class, with where


def tinkers_error(request, forward_only=False) -> BaseException:
    with pytest.raises(Exception) as theirs:
        tinkers_message(request, forward_only)
    return theirs.value


def assert_refused_like_tinker(request, where, forward_only=False):
    """Our exception: tinker's class, its message with where in front (or,
    for a class that cannot be made from a message alone, tinker's message
    and where as a note)."""
    theirs = tinkers_error(request, forward_only)
    with pytest.raises(type(theirs)) as ours:
        encode_forward_backward(request, forward_only=forward_only)
    assert type(ours.value) is type(theirs)
    if isinstance(theirs, UnicodeError):
        assert str(ours.value) == str(theirs)
        assert ours.value.__notes__ == [f"at {where}"]
    else:
        assert str(ours.value) == f"{where}: {theirs}"
        assert ours.value.__cause__ is not None and type(ours.value.__cause__) is type(theirs)


def ok_datum(*chunks, **inputs):
    return types.Datum(model_input=types.ModelInput(chunks=list(chunks) or [types.EncodedTextChunk(tokens=[1, 2])]),
                       loss_fn_inputs=inputs)


def test_a_chunk_type_tinker_does_not_encode():
    pointer = types.ImageAssetPointerChunk(format="png", location="a.png", expected_tokens=3)
    request = request_of([ok_datum(), ok_datum(types.EncodedTextChunk(tokens=[5]), pointer)])
    assert_refused_like_tinker(request, "datum 1, model_input chunk 1")


def test_a_tensor_dtype_tinker_does_not_encode():
    td = types.TensorData(data=[1.0], dtype="float32")
    object.__setattr__(td, "dtype", "bfloat16")
    assert_refused_like_tinker(request_of([ok_datum(), ok_datum(weights=td)]), "datum 1, loss_fn_inputs['weights']")


def test_csr_without_column_indices():
    td = types.TensorData(data=[1, 2], dtype="int64", shape=[1, 4], sparse_crow_indices=[0, 2])
    assert_refused_like_tinker(request_of([ok_datum(target_tokens=td)]), "datum 0, loss_fn_inputs['target_tokens']")


@pytest.mark.parametrize("token", [2**31, -(2**31) - 1, 2**70, 1.5j, None, "x"])
def test_a_token_numpy_will_not_make_an_int32_in_a_list(token):
    request = request_of([ok_datum(), ok_datum(), ok_datum(text_chunk([1, 2, token]))])
    assert_refused_like_tinker(request, "datum 2, model_input chunk 0")


@pytest.mark.parametrize("seq_id", [2**31, -(2**31) - 1, True, 1.0, "1"])
def test_a_seq_id_out_of_int32_or_not_an_int(seq_id):
    assert_refused_like_tinker(request_of([ok_datum()], seq_id=seq_id), "seq_id")


def test_request_fields_protobuf_refuses():
    assert_refused_like_tinker(request_of([], model_id=3), "model_id")
    assert_refused_like_tinker(request_of([], model_id="\ud800"), "model_id")
    assert_refused_like_tinker(request_of([], loss_fn=None), "loss_fn")
    assert_refused_like_tinker(request_of([], loss_fn_config={"a": "x", 3: 1.0}), "loss_fn_config[3]")
    assert_refused_like_tinker(request_of([], loss_fn_config={"a": object()}), "loss_fn_config['a']")
    assert_refused_like_tinker(request_of([], loss_fn_config={"a": "\ud800"}), "loss_fn_config['a']")
    assert_refused_like_tinker(request_of([ok_datum()]), "forward_only", forward_only=None)


def test_a_loss_input_key_protobuf_refuses():
    datum = ok_datum()
    object.__setattr__(datum, "loss_fn_inputs", {7: types.TensorData(data=[1.0], dtype="float32")})
    assert_refused_like_tinker(request_of([datum]), "datum 0, loss_fn_inputs[7]")


def test_a_span_field_protobuf_refuses():
    span = types.SampledProvenanceSpan(sequence_id="s", offset=0, length=1)
    object.__setattr__(span, "offset", 2**63)
    datum = ok_datum()
    object.__setattr__(datum, "model_input_spans", [span])
    object.__setattr__(datum, "loss_fn_input_spans", [span, span])
    assert_refused_like_tinker(request_of([datum]), "datum 0, model_input_spans[0]")


def test_forward_only_as_protobuf_takes_it():
    request = request_of([ok_datum()])
    for value in [0, 1, 2, np.bool_(True)]:
        assert_same_as_tinker(request, forward_only=value)


def tensor_whose_dtype(read):
    """A TensorData whose ``dtype`` runs ``read()`` (user code, as a
    property of a subclass can)."""

    class Odd(types.TensorData):
        @property
        def dtype(self):  # type: ignore[override]
            return read()

    td = object.__new__(Odd)
    for name, value in [("shape", None), ("sparse_crow_indices", None), ("sparse_col_indices", None),
                        ("_numpy", np.ones(2, np.float32))]:
        object.__setattr__(td, name, value)
    return td


def test_an_exception_class_that_takes_no_message_alone_gets_where_as_a_note():
    def read():
        raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "bad")

    request = request_of([ok_datum(), ok_datum(weights=tensor_whose_dtype(read))])
    with pytest.raises(UnicodeDecodeError, match="bad") as raised:
        encode_forward_backward(request)
    assert raised.value.__notes__ == ["at datum 1, loss_fn_inputs['weights']"]


def test_keyboard_interrupt_is_not_rewrapped():
    def read():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt) as raised:
        encode_forward_backward(request_of([ok_datum(weights=tensor_whose_dtype(read))]))
    assert raised.value.args == () and not hasattr(raised.value, "__notes__")


def test_user_code_run_while_reading_may_change_the_request():
    """A property that empties a token list read after it: no crash, and
    the bytes are those of the request as each part was read."""
    later = [5, 6, 7]

    def read():
        later.clear()
        return "float32"

    request = request_of([ok_datum(weights=tensor_whose_dtype(read)), ok_datum(text_chunk(later))])
    body = encode_forward_backward(request)
    assert later == []
    assert body == tinkers_bytes(request)


# --------------------------------------------------------------------------
# install(): tinker's forward_backward sends our bytes, tested at its HTTP layer


@pytest.fixture
def client_factory():
    """AsyncTinker clients whose HTTP goes to a local transport that keeps
    each request (a real tinker client; nothing of tinker is patched)."""
    from tinker._client import AsyncTinker

    sent: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        request.read()
        sent.append(request)
        return httpx.Response(200, json={"request_id": f"r{len(sent)}"})

    def make(compress: bool):
        return AsyncTinker(
            api_key="tml-test",
            base_url="http://127.0.0.1:9",
            http_client=httpx.AsyncClient(transport=httpx.MockTransport(handler)),
            _client_config=types.ClientConfigResponse(proto_compress_fwdbwd=compress),
        )

    yield make, sent
    tinker_rl_data.uninstall()


def send(client, request, forward_only):
    async def go():
        async with client:
            return await client.training.forward_backward(request=request, forward_only=forward_only)

    return asyncio.run(go())


def body_of(sent: httpx.Request) -> bytes:
    if sent.headers.get("content-encoding") == "zstd":
        return zstandard.ZstdDecompressor().decompress(sent.content)
    return sent.content


HEADERS_THAT_VARY = {"x-idempotency-key", "content-length"}


# tinker's response parsing calls pydantic's deprecated `construct`
@pytest.mark.filterwarnings("ignore::pydantic.warnings.PydanticDeprecatedSince20")
@pytest.mark.parametrize("compress", [False, True])
@pytest.mark.parametrize("forward_only", [False, True])
def test_install_makes_tinker_send_our_bytes(client_factory, compress, forward_only):
    make, sent = client_factory
    batch = [ok_datum(types.EncodedTextChunk(tokens=list(range(50))), target_tokens=types.TensorData.from_numpy(np.arange(50)),
                      weights=types.TensorData.from_numpy(np.ones(50, np.float32)))] * 3
    request = request_of(batch, loss_fn_config={"clip": 0.2})
    original = AsyncTrainingResource.forward_backward

    theirs = send(make(compress), request, forward_only)
    tinker_rl_data.install()
    assert AsyncTrainingResource.forward_backward is original  # tinker's method runs as it is
    assert training.forward_backward_request_to_proto is not request_conv.forward_backward_request_to_proto
    ours = send(make(compress), request, forward_only)
    assert type(ours) is type(theirs) and ours.request_id == "r2"

    (before, after) = sent
    assert before.url == after.url and before.method == after.method == "POST"
    assert {k: v for k, v in before.headers.items() if k not in HEADERS_THAT_VARY} == {
        k: v for k, v in after.headers.items() if k not in HEADERS_THAT_VARY
    }
    assert ("content-encoding" in after.headers) == compress
    expected = tinkers_message(request, forward_only)
    assert public_pb.ForwardBackwardRequest.FromString(body_of(before)) == expected  # tinker's, for reference
    assert body_of(after) == expected.SerializeToString(deterministic=True)

    tinker_rl_data.uninstall()
    assert training.forward_backward_request_to_proto is request_conv.forward_backward_request_to_proto
    send(make(compress), request, forward_only)
    assert public_pb.ForwardBackwardRequest.FromString(body_of(sent[2])) == expected


def test_the_installed_builder_gives_tinkers_message_to_any_other_use():
    request = request_of([ok_datum(types.EncodedTextChunk(tokens=[1, 2, 3]))], loss_fn_config={"clip": 0.2})
    tinker_rl_data.install()
    try:
        built = training.forward_backward_request_to_proto(request)
        built.forward_only = True
        assert built.SerializeToString() == tinkers_bytes(request, forward_only=True)
        assert built.model_id == "model" and built.forward_only  # read from tinker's message
        built.model_id = "other"  # set on it: the bytes are now that message's
        expected = tinkers_message(request, forward_only=True)
        expected.model_id = "other"
        assert public_pb.ForwardBackwardRequest.FromString(built.SerializeToString()) == expected
    finally:
        tinker_rl_data.uninstall()


def test_install_twice_is_harmless_and_uninstall_restores_the_original():
    original = training.forward_backward_request_to_proto
    tinker_rl_data.install()
    replaced = training.forward_backward_request_to_proto
    tinker_rl_data.install()
    assert training.forward_backward_request_to_proto is replaced is not original
    assert transaction.installed("wire")
    tinker_rl_data.uninstall()
    assert training.forward_backward_request_to_proto is original
    tinker_rl_data.uninstall()
    assert training.forward_backward_request_to_proto is original and not transaction.installed("wire")


def test_an_untested_tinker_installs_with_one_warning(monkeypatch):
    assert tinker.__version__ in TESTED_VERSIONS["tinker"]
    monkeypatch.setattr(tinker, "__version__", "0.99.0")
    with pytest.warns(tinker_rl_data.InstallWarning, match=r"tinker 0\.99\.0 is not a version the tests ran against") as caught:
        report = tinker_rl_data.install()
    tinker_rl_data.uninstall()
    wire_pieces = [p.title for p in request_bytes.FEATURE.pieces]
    assert len(caught) == 1 and [title for title, _ in report.installed] == wire_pieces


def test_install_and_uninstall_are_public_but_not_in_all():
    # (at the package's level, beside the list of every feature they report on)
    assert tinker_rl_data.install.__module__ == tinker_rl_data.uninstall.__module__ == "tinker_rl_data"
    assert tinker_rl_data.__all__ == [
        "DatumMetadata", "assemble_training_data", "compute_advantages", "compute_trajectory_metrics"
    ]


def test_deep_copies_encode_the_same():
    request = request_of([ok_datum(text_chunk(np.arange(4, dtype=np.int32)), target_tokens=types.TensorData.from_numpy(np.arange(4)))])
    assert encode_forward_backward(copy.deepcopy(request)) == encode_forward_backward(request) == tinkers_bytes(request)



def test_a_bytes_field_over_protobufs_limit_is_refused_like_tinker():
    # upb serializes no bytes field of 2**31 bytes or more (the request as a
    # whole may be longer): tinker's encoder raises protobuf's EncodeError
    # ("Failed to serialize proto"; not run here: it takes 17 GB and 90 s).
    # The encoder refuses it with that class before allocating the result.
    from google.protobuf.message import EncodeError

    request = request_of([ok_datum(types.DmelChunk(dmel=bytes(2**31)))])
    with pytest.raises(EncodeError, match="a bytes field of 2147483648 bytes is over protobuf's limit"):
        encode_forward_backward(request)


def test_cookbook_install_without_tinker_cookbook_installs_the_encoder_and_says_why():
    import subprocess
    import sys

    code = """
import sys, warnings
sys.modules["tinker_cookbook"] = None
import tinker_rl_data.cookbook as c
from tinker_rl_data.features import declared
n = sum(p.requires == "tinker_cookbook" for f in declared() if f.default for p in f.pieces)  # the defaults
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    report = c.install()
import tinker
lean_sample = ["sample calls run lean"] if tuple(map(int, tinker.__version__.split(".")[:2])) >= (0, 38) else []
assert [t for t, _ in report.installed] == [
    "forward_backward request bytes", "sample request bytes", "step requests sent lean", "future polls sent lean",
    "request futures freed when dropped", *lean_sample], report
older = [entry for entry in report.left if "ours reproduces" in entry[1]]  # the sample path before tinker 0.38
assert [entry for entry in report.left if entry not in older] == [
    (f"tinker-cookbook pieces ({n})", "tinker_cookbook is not importable")], report.left
assert [title for title, _ in older] == ([] if lean_sample else ["sample calls run lean"]), older
assert [str(w.message) for w in caught] == [
    f"tinker_rl_data: tinker-cookbook pieces ({n}) not installed: tinker_cookbook is not importable"], caught
"""
    subprocess.run([sys.executable, "-c", code], check=True)
