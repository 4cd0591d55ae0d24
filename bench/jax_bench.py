#!/usr/bin/env python
"""Time upstream JAX (`needle.model.decode.forward_cached`) on a `.cact`, on CPU.

    .venv/bin/python bench/jax_bench.py MODEL.cact 32 256 1024 --decode-past 64 1024 \
        [--threads 1] [--steps 16] [--reps 3]

Loads the file with upstream `read_export` (dequantized float32), rebuilds the flax
parameter tree with `tests/fixtures/make_fixtures.rebuild_params`, and calls the jitted
`forward_cached` the way upstream `generate_cached` does: caches of `max_len` positions,
the token history in `hist`, `kv_window` from the file. Compilation is excluded: every
shape is run once before it is timed.

* prefill T: `max_len = T`, T tokens from position 0; best of `--reps`.
* decode after P past tokens: `max_len = P + steps + 1`, the first P cache positions
  filled with random keys/values (decode cost does not depend on their values), then one
  warm-up step and `steps` timed one-token steps, each followed by the host-side argmax
  and history update that `generate_cached` does.

Compiling `forward_cached` for the full-size model takes minutes per shape (27 unrolled
layers), so compiled executables are kept in JAX's persistent compilation cache
(`--cache-dir`, default target/bench/jax-cache): the first run pays for them once.

Prints one JSON object on stdout.
"""
import argparse
import os
import sys
import time


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("cact")
    ap.add_argument("prefill", type=int, nargs="+", help="prefill lengths")
    ap.add_argument("--decode-past", type=int, nargs="+", default=[64, 1024])
    ap.add_argument("--threads", type=int, default=1, choices=(1, 2))
    ap.add_argument("--steps", type=int, default=16, help="timed decode steps")
    ap.add_argument("--reps", type=int, default=3, help="prefill repetitions (best is kept)")
    ap.add_argument("--cache-dir", default=None,
                    help="JAX persistent compilation cache (default: target/bench/jax-cache)")
    return ap.parse_args()


ARGS = parse_args()
os.environ["JAX_PLATFORMS"] = "cpu"
if ARGS.threads == 1:
    os.environ["XLA_FLAGS"] = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
else:
    os.environ["XLA_FLAGS"] = f"--xla_cpu_multi_thread_eigen=true intra_op_parallelism_threads={ARGS.threads}"
for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[var] = str(ARGS.threads)
os.environ["NEEDLE_TELEMETRY"] = "0"
os.environ["DO_NOT_TRACK"] = "1"

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "fixtures"))

import json  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import needle.model.decode as dec  # noqa: E402
from needle.model.architecture import TransformerConfig, precompute_rope_freqs  # noqa: E402
from needle.model.export import read_export  # noqa: E402
from make_fixtures import rebuild_params, to_jax  # noqa: E402

jax.config.update("jax_compilation_cache_dir",
                  ARGS.cache_dir or os.path.join(ROOT, "target", "bench", "jax-cache"))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def vm_hwm_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def reset_hwm():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


class Peaks:
    """VmHWM bookkeeping: the whole process, and the timed sections only (compiled
    executables resident, compilation itself excluded)."""

    def __init__(self):
        self.process = 0
        self.run = 0

    def start(self):
        self.process = max(self.process, vm_hwm_bytes())
        reset_hwm()

    def stop(self):
        self.run = max(self.run, vm_hwm_bytes())


def config_of(meta):
    orders = tuple(meta["engram_orders"])
    return TransformerConfig(
        vocab_size=meta["vocab_size"], d_model=meta["d_model"], num_heads=meta["num_heads"],
        num_kv_heads=meta["num_kv_heads"], num_layers=meta["num_layers"],
        attn_dim=meta["head_dim"] * meta["num_heads"], max_seq_len=meta["max_seq_len"],
        mhc_lanes=meta["mhc_lanes"], engram_slots=meta["engram_slots"],
        engram_orders=orders, engram_heads=meta["num_engram_tables"] // len(orders),
        engram_layers=tuple(meta["engram_layers"]), rope_theta=meta["rope_theta"],
        kv_window=meta["kv_window"], kv_bits=meta["kv_bits"],
        dtype="float32", flash=False, remat=False)


def main():
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    meta, ts = read_export(ARGS.cact)
    cfg = config_of(meta)
    params = to_jax(rebuild_params(ts, cfg))
    jax.block_until_ready(params)
    del ts
    load_s = time.perf_counter() - t0
    peaks = Peaks()

    head_dim = meta["head_dim"]
    dcfg = dec.decode_cfg(cfg, kv_window=meta["kv_window"])
    vocab = meta["vocab_size"]

    def tokens(n):
        return rng.integers(4, vocab, size=n).astype(np.int32)

    def run(toks, kc, vc, pos, cos, sin, hist, valid):
        logits, kc, vc = dec.forward_cached(params, dcfg, toks, kc, vc, jnp.asarray(pos, jnp.int32),
                                            cos, sin, None, False, hist, valid, None)
        return logits, kc, vc

    cache_dir = jax.config.jax_compilation_cache_dir

    def cache_entries():
        try:
            return len(os.listdir(cache_dir))
        except OSError:
            return 0

    prefill = {}
    compile_s = {}
    compiled = {}
    for T in ARGS.prefill:
        cos, sin = precompute_rope_freqs(head_dim, T, cfg.rope_theta)
        kc, vc = dec.init_kv_cache(cfg, 1, T)
        ids = tokens(T)
        toks = jnp.asarray(ids[None])
        hist = jnp.asarray(ids[None])
        valid = jnp.ones((1, T), bool)
        entries = cache_entries()
        t = time.perf_counter()
        jax.block_until_ready(run(toks, kc, vc, 0, cos, sin, hist, valid))
        first = time.perf_counter() - t
        compiled[f"prefill_{T}"] = cache_entries() > entries
        best = float("inf")
        peaks.start()
        for _ in range(ARGS.reps):
            t = time.perf_counter()
            jax.block_until_ready(run(toks, kc, vc, 0, cos, sin, hist, valid))
            best = min(best, time.perf_counter() - t)
        peaks.stop()
        prefill[str(T)] = {"seconds": best, "tokens_per_s": T / best}
        compile_s[f"prefill_{T}"] = max(first - best, 0.0)

    decode = {}
    for P in ARGS.decode_past:
        max_len = P + ARGS.steps + 1
        cos, sin = precompute_rope_freqs(head_dim, max_len, cfg.rope_theta)
        kv_shape = (cfg.num_layers, 1, cfg.num_kv_heads, max_len, head_dim)
        filled = np.zeros(kv_shape, np.float32)
        filled[:, :, :, :P] = rng.standard_normal(kv_shape[:3] + (P, head_dim)).astype(np.float32)
        kc = jnp.asarray(filled)
        vc = jnp.asarray(filled[::-1].copy())
        hist = jnp.zeros((1, max_len), jnp.int32).at[0, :P].set(jnp.asarray(tokens(P)))
        valid = jnp.ones((1, max_len), bool)
        nxt, pos = int(tokens(1)[0]), P

        def step(nxt, pos, kc, vc, hist):
            hist = hist.at[0, pos].set(nxt)
            logits, kc, vc = run(jnp.asarray([[nxt]], jnp.int32), kc, vc, pos, cos, sin, hist, valid)
            return int(jnp.argmax(logits[0, -1])), kc, vc, hist

        entries = cache_entries()
        t = time.perf_counter()
        nxt, kc, vc, hist = step(nxt, pos, kc, vc, hist)
        compile_s[f"decode_{P}"] = time.perf_counter() - t
        compiled[f"decode_{P}"] = cache_entries() > entries
        pos += 1
        peaks.start()
        t = time.perf_counter()
        for _ in range(ARGS.steps):
            nxt, kc, vc, hist = step(nxt, pos, kc, vc, hist)
            pos += 1
        secs = time.perf_counter() - t
        peaks.stop()
        compile_s[f"decode_{P}"] = max(compile_s[f"decode_{P}"] - secs / ARGS.steps, 0.0)
        decode[str(P)] = {"steps": ARGS.steps, "seconds": secs, "tokens_per_s": ARGS.steps / secs}

    print(json.dumps({
        "threads": ARGS.threads,
        "jax": jax.__version__,
        "load_seconds": load_s,
        "compile_seconds": compile_s,
        "compiled": compiled,
        "prefill": prefill,
        "decode": decode,
        "peak_rss_bytes": max(peaks.process, vm_hwm_bytes()),
        "peak_rss_run_bytes": peaks.run,
    }))


if __name__ == "__main__":
    main()
