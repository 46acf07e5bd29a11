"""A PyTorch model timed on the CPU, eager and under `torch.compile`, in a process of its own.

Run as `python -m mlirrl_jax.models.torch_time REQUEST.json OUT.json`; `models.optimize`
starts it once per thread count, pinned to that many cores (the affinity is set before torch
starts its thread pool) with `torch.set_num_threads`. Each mode: a warm-up (for
`torch.compile`, its compilation, timed apart), then calls until 10 repeats and 1 second, the
median kept, the same rule as the project's kernels (`measure.timing`). The output of each mode
is compared with eager's, so that a wrong compilation is not a time.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

MIN_REPEATS, MIN_TIME_S = 10, 1.0


def _median_ms(call) -> tuple[float, int]:
    samples = []
    while len(samples) < MIN_REPEATS or sum(samples) < MIN_TIME_S:
        start = time.perf_counter()
        call()
        samples.append(time.perf_counter() - start)
    samples.sort()
    return samples[len(samples) // 2] * 1e3, len(samples)


def main(request_path: str, out_path: str) -> None:
    request = json.loads(Path(request_path).read_text())
    threads = int(request["threads"])
    os.sched_setaffinity(0, request["cores"][:threads])
    import numpy as np
    import torch

    from mlirrl_jax.models.lower import example_input, torch_module

    torch.set_num_threads(threads)
    model = torch_module(request["source"]).eval()
    example = torch.from_numpy(example_input(request["input_shape"]))
    result: dict = {"threads": threads, "torch": torch.__version__}
    with torch.no_grad():
        expected = model(example).numpy()
        result["eager_ms"], result["eager_repeats"] = _median_ms(lambda: model(example))
        if request.get("compile", True):
            try:
                compiled = torch.compile(model)
                start = time.perf_counter()
                got = compiled(example).numpy()
                result["compile_s"] = time.perf_counter() - start
                error = float(np.abs(got - expected).max() / max(np.abs(expected).max(), 1e-30))
                result["compile_error"] = error
                if error > 1e-3:
                    result["compile_failed"] = f"its output differs from eager's ({error:.1e})"
                else:
                    result["compile_ms"], result["compile_repeats"] = _median_ms(
                        lambda: compiled(example)
                    )
            except Exception as exc:  # a compiler failure is a result, named
                result["compile_failed"] = " ".join(str(exc).split())[:300]
    Path(out_path).write_text(json.dumps(result))


if __name__ == "__main__":
    main(*sys.argv[1:3])
