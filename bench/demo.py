"""The whole pipeline on a synthetic rollout batch: advantages, Datums,
metrics, timed against the module it replaces (an evsys-style plain-Python
port) and, when installed, tinker-cookbook; then end to end, up to the bytes
of a forward_backward request, with list and numpy model input, encoded by
tinker_rl_data.encode_forward_backward and, beside it, by tinker's own encoder. The contract's
reference (plain Python that checks every value) is a labelled last line.

    python bench/demo.py [workload]        (default: single_turn_long)
    python bench/demo.py --check [workload]   only check the name
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "bench"), str(ROOT / "tests")]

from workloads import WORKLOADS  # noqa: E402  (stdlib only at import)

USAGE = "usage: python bench/demo.py [workload]; workloads: " + ", ".join(WORKLOADS)


def parse(argv: list[str]) -> tuple[str, bool]:
    """(workload, check only); a bad name exits with status 2 and the list."""
    check = "--check" in argv
    args = [a for a in argv if a != "--check"]
    if any(a in ("-h", "--help") for a in args):
        print(USAGE)
        raise SystemExit(0)
    if len(args) > 1:
        print(f"demo.py: expected one workload, got {len(args)}: {' '.join(args)}\n{USAGE}", file=sys.stderr)
        raise SystemExit(2)
    name = args[0] if args else "single_turn_long"
    if name not in WORKLOADS:
        print(f"demo.py: unknown workload {name!r}; the workloads are:", file=sys.stderr)
        for w in WORKLOADS.values():
            print(f"  {w.name:18} {w.groups} groups x {w.samples} samples x {w.turns} turn(s), "
                  f"prompt {w.prompt} / completion {w.completion} tokens", file=sys.stderr)
        raise SystemExit(2)
    return name, check


def median_time(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
        del result
    return statistics.median(times)


def line(label: str, seconds: float, n_pos: int, ours: float | None = None) -> str:
    text = f"  {label:38} {seconds * 1e3:9.1f} ms {seconds / n_pos * 1e9:8.1f} ns/position"
    if ours is not None:
        text += f"   tinker_rl_data is {seconds / ours:5.1f}x faster"
    return text


def main() -> None:
    name, check = parse(sys.argv[1:])
    if check:
        return

    import e2e
    import evsys_style
    from support import reference
    import tinker_rl_data as trd
    from workloads import positions, to_cookbook

    def pipeline(module, groups, **kw):
        advantages = module.compute_advantages(groups)
        return module.assemble_training_data(groups, advantages, **kw)

    groups = WORKLOADS[name].build()
    n_pos, n_datums = positions(groups)
    datums, metadata = pipeline(trd, groups)
    metrics = trd.compute_trajectory_metrics(groups)
    print(f"workload {name}: {len(datums)} datums ({n_datums} expected), {n_pos:,} positions")
    for key, value in metrics.items():
        print(f"  {key} = {value:g}")
    del datums, metadata
    feat = e2e.features()

    print("\ncompute_advantages + assemble_training_data (median of 5; ns per position of the per-turn rows):")
    ours = median_time(lambda: pipeline(trd, groups), 5)
    print(line("tinker_rl_data", ours, n_pos))
    port = median_time(lambda: pipeline(evsys_style, groups), 3)
    print(line("evsys-style port (the module replaced)", port, n_pos, ours))
    if feat["tinker_cookbook"] is None:
        from tinker_cookbook.rl import data_processing as cb

        cb_groups = to_cookbook(groups)
        theirs = median_time(lambda: pipeline(cb, cb_groups), 1)
        print(line("tinker-cookbook 0.6.1 (same rollouts)", theirs, n_pos, ours))
        if feat["trd_cookbook"] is None:
            from tinker_rl_data import cookbook as ours_cb

            mine = median_time(lambda: pipeline(ours_cb, cb_groups), 5)
            print(f"  {'tinker_rl_data.cookbook (same objects)':38} {mine * 1e3:9.1f} ms "
                  f"{mine / n_pos * 1e9:8.1f} ns/position   {theirs / mine:5.1f}x faster than tinker-cookbook")
        del cb_groups
    else:
        print("  tinker-cookbook 0.6.1: not installed, not compared (bash scripts/install_cookbook.sh)")

    ours_enc = feat["wire"] is None
    print("\nend to end, rollouts to request bytes (median of 5; "
          + ("tinker_rl_data's encoder, as after tinker_rl_data.install(), and tinker's own beside):"
             if ours_enc else "tinker's forward_backward encoding):"))
    routes = [("list model input", {})]
    if feat["numpy_tokens"] is None:
        routes.append(('model_input_tokens="numpy"', {"model_input_tokens": "numpy"}))
    else:
        print(f'  model_input_tokens="numpy"             {e2e.NA}')
    first = None
    for label, kw in routes:
        route = e2e.Route(label, trd.compute_advantages, lambda g, a, kw=kw: trd.assemble_training_data(g, a, **kw)[0])
        m = e2e.measure(route, groups, 5)
        text = line(label, m["total"], n_pos) + f"   {m['enc_share'] * 100:.0f}% in {m['encoder']} encoder"
        if ours_enc:
            text += (f"\n  {'  with tinker' + chr(39) + 's encoder instead':38} {m['total_tinker'] * 1e3:9.1f} ms "
                     f"{m['total_tinker'] / n_pos * 1e9:8.1f} ns/position   encoding {m['enc_tinker'] * 1e3:.1f} ms "
                     f"vs {m['enc'] * 1e3:.1f} ms: {m['enc_tinker'] / m['enc']:.1f}x")
        if first is not None:
            text += f"\n  {'':38} {first['total'] / m['total']:.2f}x faster than list model input"
        first = first or m
        print(text)

    t0 = time.perf_counter()
    pipeline(reference, groups)
    spec = time.perf_counter() - t0
    print("\nfor reference only, not the module replaced: the contract reference (tests/support/reference.py,")
    print("plain Python checking every value), one run:")
    print(line("contract reference", spec, n_pos, ours))


if __name__ == "__main__":
    main()
