#!/usr/bin/env python3
"""Which fp32 GEMM library for Crucible's matrix products, measured on one model's own shapes:
OpenBLAS, BLIS and oneDNN as Debian ships them (libopenblas-openmp-dev, libblis-dev with
libblis4-openmp, libdnnl-dev (a dependency of Crucible itself): `scripts/install-deps.sh
libblis-dev libblis4-openmp`), each called once per product on all threads, against Crucible's own
tiled products on the libraries its `auto` rule picks (kernels::matmul_forward / matmul_backward,
the ones the trainer runs; kernels/cpu/gemm_library.h).

    python3 bench/gemm_libraries.py [--flavor small] [--rows 4096] [--repeats 5] [--rounds 3]

For each linear-layer shape (rows = batch x seq tokens): forward out = inp @ W^T, backward dinp =
dout @ W plus dweight = dout^T @ inp. Each library runs in its own process (build/gemm_<library>,
built by CMake where the library is present), the libraries take turns for --rounds rounds, and
the best GFLOP/s of each (library, shape, product) over every repeat and round is kept. Printed:
the per-shape table, each library's time for one step's products (the shapes weighted by how
often a step runs them), and whether its bits depend on the thread count (a library whose do
cannot be used as it is: Crucible's products must give the same bits on any thread count).
"""
import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from llama_flavors import FLAVORS

ROOT = Path(__file__).resolve().parent.parent
BUILD = Path(os.environ.get("CRUCIBLE_BUILD", ROOT / "build"))
LIBRARIES = ["crucible", "openblas", "blis", "dnnl"]


def shapes_of(flavor):
    """(C, OC, count per step) of every linear layer and the head."""
    f = FLAVORS[flavor]
    dim, heads, kv, ffn, vocab, layers = f["dim"], f["heads"], f["kv"], f["ffn"], f["vocab"], f["layers"]
    kv_dim = dim // heads * kv
    return [(dim, dim, 2 * layers), (dim, kv_dim, 2 * layers), (dim, ffn, 2 * layers),
            (ffn, dim, layers), (dim, vocab, 1)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flavor", default="small", choices=FLAVORS)
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    args = parser.parse_args()
    present = [lib for lib in LIBRARIES if (BUILD / f"gemm_{lib}").exists()]
    missing = [lib for lib in LIBRARIES if lib not in present]
    print(f"phase=start flavor={args.flavor} rows={args.rows} threads={args.threads} "
          f"libraries={','.join(present)}" + (f" missing={','.join(missing)}" if missing else ""), flush=True)
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), BLIS_NUM_THREADS=str(args.threads))
    best = {}  # (lib, C, OC, product) -> gflops
    independent = {}
    for round_ in range(args.rounds):
        for lib in present[round_ % len(present):] + present[:round_ % len(present)]:
            for c, oc, _ in shapes_of(args.flavor):
                out = subprocess.run([BUILD / f"gemm_{lib}", str(args.rows), str(c), str(oc), str(args.repeats)],
                                     capture_output=True, text=True, env=env, check=True).stdout
                for line in out.splitlines():
                    r = json.loads(line)
                    key = (lib, c, oc, r["product"])
                    best[key] = max(best.get(key, 0), r["gflops"])
                    independent[key] = independent.get(key, True) and r["thread_independent"]
        print(f"phase=round {round_ + 1}/{args.rounds} load={os.getloadavg()[0]:.2f}", flush=True)

    def backward_rate(lib, c, oc):
        if (lib, c, oc, "backward") in best:
            return best[(lib, c, oc, "backward")]
        flops = 2.0 * args.rows * c * oc
        return 2 * flops / (flops / best[(lib, c, oc, "dinp")] + flops / best[(lib, c, oc, "dweight")])

    print("\n| shape (rows x in -> out) | " + " | ".join(f"{lib} fwd / bwd" for lib in present) + " |")
    print("|---|" + "---|" * len(present))
    step_seconds = {lib: 0.0 for lib in present}
    for c, oc, count in shapes_of(args.flavor):
        cells = []
        for lib in present:
            fwd, bwd = best[(lib, c, oc, "forward")], backward_rate(lib, c, oc)
            cells.append(f"{fwd:.1f} / {bwd:.1f}")
            flops = 2.0 * args.rows * c * oc
            step_seconds[lib] += count * (flops / fwd + 2 * flops / bwd) / 1e9
        print(f"| {args.rows} x {c} -> {oc} | " + " | ".join(cells) + " |")
    print("\n| library | one step's products | vs crucible | bits independent of threads |")
    print("|---|---|---|---|")
    for lib in present:
        same = all(v for (l, *_), v in independent.items() if l == lib)
        ratio = step_seconds["crucible"] / step_seconds[lib] if "crucible" in step_seconds else float("nan")
        print(f"| {lib} | {1000 * step_seconds[lib]:.1f} ms | {ratio:.2f}x | {'yes' if same else 'NO'} |")


if __name__ == "__main__":
    sys.exit(main())
