"""Hypothesis strategies for random batches of tinker-cookbook 0.6.1's own
types (TrajectoryGroup, Trajectory, Transition, TokensWithLogprobs,
tinker.ModelInput with text and image chunks). Imported by
tests/cookbook/test_data_processing.py and test_step.py only once
tinker_cookbook is known to be importable."""

from __future__ import annotations

import struct
import zlib

import tinker
from hypothesis import strategies as st
from tinker.types import ImageAssetPointerChunk, ImageChunk
from tinker_cookbook.completers import TokensWithLogprobs
from tinker_cookbook.rl.types import Trajectory, TrajectoryGroup, Transition


def png(width: int, height: int, rgb: tuple[int, int, int]) -> bytes:
    """A valid RGB PNG of one colour."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)

    raw = b"".join(b"\x00" + bytes(rgb) * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


IMAGES = [png(1, 1, (255, 0, 0)), png(2, 1, (0, 0, 255))]

# Small token values make "almost extending" observations and equal
# neighbours likely; a few large ones exercise the int64 path.
tokens = st.one_of(st.integers(0, 7), st.integers(0, 2**31 - 1), st.sampled_from([0, 1, 151935, 2**31 - 1]))


@st.composite
def image_chunks(draw, allow_unsized: bool = False):
    """tinker.ImageChunk or ImageAssetPointerChunk; expected_tokens 0..3
    (and, when allowed, None: its ``length`` raises ValueError)."""
    sizes = st.integers(0, 3) if not allow_unsized else st.one_of(st.integers(0, 3), st.none())
    expected = draw(st.one_of(st.integers(1, 3), sizes))
    if draw(st.integers(0, 4)) == 0:
        return ImageAssetPointerChunk(
            format="png", location=draw(st.sampled_from(["a.png", "b.png"])), expected_tokens=expected
        )
    return ImageChunk(data=draw(st.sampled_from(IMAGES)), format="png", expected_tokens=expected)


def flat_elements(allow_unsized: bool = False):
    return st.one_of(tokens, tokens, tokens, image_chunks(allow_unsized))


@st.composite
def model_input(draw, flat):
    """A ModelInput whose flattened form is ``flat`` (ints and image chunks),
    with the text runs split into chunks at random (empty ones included)."""
    chunks: list = []
    text: list[int] = []

    def flush():
        nonlocal text
        if text or draw(st.integers(0, 9)) == 0:
            cut = draw(st.integers(0, len(text)))
            if cut and cut < len(text) and draw(st.booleans()):
                chunks.append(tinker.EncodedTextChunk(tokens=text[:cut]))
                chunks.append(tinker.EncodedTextChunk(tokens=text[cut:]))
            else:
                chunks.append(tinker.EncodedTextChunk(tokens=text))
        text = []

    for elem in flat:
        if isinstance(elem, int):
            text.append(elem)
        else:
            flush()
            chunks.append(elem)
    flush()
    return tinker.ModelInput(chunks=chunks)


def flatten(ob) -> list:
    out: list = []
    for chunk in ob.chunks:
        if isinstance(chunk, tinker.EncodedTextChunk):
            out.extend(chunk.tokens)
        else:
            out.append(chunk)
    return out


@st.composite
def observation(draw, so_far, mode):
    """An observation that extends the sequence so far, repeats it, resets,
    almost extends it (one element changed, or one dropped), is empty, or is
    a proper prefix of it. In "clean" mode a non-extending observation ends
    in a text token, so that no Datum is too short or ends in an image."""
    allow_unsized = mode == "faults"
    new = st.lists(flat_elements(allow_unsized), max_size=5)
    kinds = ["extend", "extend", "extend", "same", "reset", "almost", "empty", "prefix"]
    kind = draw(st.sampled_from(kinds if mode != "clean" else kinds[:-2]))
    extends = False
    if kind == "extend" or not so_far:
        flat = so_far + draw(new)
        extends = bool(so_far)
    elif kind == "same":
        flat = list(so_far)
        extends = True
    elif kind == "reset":
        flat = draw(st.lists(flat_elements(allow_unsized), max_size=8))
    elif kind == "almost":
        flat = so_far + draw(new)
        i = draw(st.integers(0, len(so_far) - 1))
        if draw(st.booleans()):
            del flat[i]
        else:
            flat[i] = draw(flat_elements(allow_unsized))  # may be equal by chance
    elif kind == "empty":
        flat = []
    else:
        flat = so_far[: draw(st.integers(0, len(so_far) - 1))]
    if mode == "clean" and not extends and (not flat or not isinstance(flat[-1], int)):
        flat.append(draw(tokens))
    return draw(model_input(flat))


logprob_values = st.one_of(
    st.floats(-30.0, 0.0), st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, -0.0, -1e-45, -1e300])
)


@st.composite
def action(draw, mode):
    faults = mode == "faults"
    toks = draw(st.lists(tokens, min_size=1 if mode == "clean" else 0, max_size=5))
    n = len(toks)
    if faults and draw(st.integers(0, 5)) == 0:
        maybe_logprobs = None if draw(st.booleans()) else draw(st.lists(logprob_values, max_size=6))
    else:
        maybe_logprobs = draw(st.lists(logprob_values, min_size=n, max_size=n))
    sequence_id = draw(st.one_of(st.sampled_from(["s0", "s1", "sequence-2"]), st.none()))
    if faults and draw(st.integers(0, 9)) == 0:
        sequence_id = ""  # PromptProvenanceSpan/SampledProvenanceSpan reject it
    return TokensWithLogprobs(tokens=toks, maybe_logprobs=maybe_logprobs, sequence_id=sequence_id)


metrics = st.one_of(
    st.just({}),
    st.fixed_dictionaries({"parse_error_masked": st.sampled_from([0.0, 1.0, 1, 0, 0.5, 2.0, 0.9999999, True])}),
    st.fixed_dictionaries({"other": st.just(1.0), "parse_error_masked": st.sampled_from([0.0, 1.0])}),
)
rewards = st.one_of(st.sampled_from([0.0, 1.0, 0.5, -1.0]), st.floats(-10.0, 10.0))


@st.composite
def trajectory(draw, mode: str, max_transitions: int = 4, with_ids: str = "mixed"):
    """A Trajectory. mode: "clean" (no transition makes the cookbook raise),
    "wild" (empty actions and observations: Datums too short or ending in
    an image), "faults" (also missing or mis-sized logprobs, images of
    unknown size, empty sequence_ids). with_ids: "all", "none" or "mixed"
    sequence_ids."""
    transitions = []
    so_far: list = []
    for _ in range(draw(st.integers(0, max_transitions))):
        ob = draw(observation(so_far, mode))
        ac = draw(action(mode))
        if with_ids == "all" and ac.sequence_id is None:
            ac.sequence_id = "s0"
        elif with_ids == "none":
            ac.sequence_id = None
        so_far = flatten(ob) + list(ac.tokens)
        transitions.append(
            Transition(ob=ob, ac=ac, reward=draw(rewards), episode_done=False, metrics=draw(metrics))
        )
    return Trajectory(transitions=transitions, final_ob=tinker.ModelInput(chunks=[]))


@st.composite
def batches(draw, max_groups: int = 3, max_trajectories: int = 3):
    """A list of TrajectoryGroups, all of one mode (see ``trajectory``)."""
    mode = draw(st.sampled_from(["clean", "clean", "clean", "wild", "wild", "faults"]))
    with_ids = draw(st.sampled_from(["mixed", "all", "all", "none"]))
    out = []
    for _ in range(draw(st.integers(0, max_groups))):
        trajs = draw(st.lists(trajectory(mode, with_ids=with_ids), min_size=1, max_size=max_trajectories))
        final = draw(st.lists(rewards, min_size=len(trajs), max_size=len(trajs)))
        out.append(TrajectoryGroup(trajectories_G=trajs, final_rewards_G=final, metrics_G=[{} for _ in trajs]))
    return out
