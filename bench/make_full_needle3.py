#!/usr/bin/env python
"""Write a full-size Needle 3 `.cact` with random weights, for the benchmark.

    .venv-needle3/bin/python bench/make_full_needle3.py OUT.cact

Geometry: upstream `TransformerConfig()` defaults of cactus-needle 3.2.8 (vocab 16384,
d_model 768, 12 heads / 2 kv heads, qk head 48, v head 64, 20 layers, 4 lanes, QKV conv
3 taps, global layers 4/9/14/19 and a 1024-token window elsewhere, five engram sites of
18432 slots, the three probe heads), float32. Weights: `model.init` with a fixed seed
(random, untrained: the numbers this file is for are speed, size and load time). Written
by upstream `write_export` (CQ4, group 128, kv_window = effective_kv_window), with the
SentencePiece tokenizer of the Needle 3 fixtures (fewer pieces than the vocabulary, which
Needle 3 allows).

Needs the venv of tests/fixtures/needle3 (cactus-needle==3.2.8). Does nothing when OUT exists.
"""
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["NEEDLE_TELEMETRY"] = "0"
os.environ["DO_NOT_TRACK"] = "1"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from needle.model.architecture import (  # noqa: E402
    SimpleAttentionNetwork, TransformerConfig, effective_kv_window)
from needle.model.export import write_export  # noqa: E402
from needle.model.tokenizer import SANTokenizer  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEED = 30


def main(out):
    if os.path.exists(out):
        return
    start = time.time()
    cfg = TransformerConfig(dtype="float32", flash=False, remat=False)
    model = SimpleAttentionNetwork(cfg)
    tokens = jnp.zeros((1, 8), jnp.int32)
    params = model.init(jax.random.PRNGKey(SEED), tokens)["params"]
    for method in ("forward_confidence", "forward_router", "forward_embedding"):
        extra = model.init(jax.random.PRNGKey(SEED + 1), tokens, method=method)["params"]
        params = {**extra, **params}
    tokenizer = SANTokenizer(os.path.join(ROOT, "tests/fixtures/needle3/tokenizer.model"))
    tmp = out + ".tmp"
    info = write_export(params, cfg, tmp, tokenizer=tokenizer,
                        kv_window=effective_kv_window(cfg))
    os.replace(tmp, out)
    print(f"wrote {out}: {info['bytes']} bytes, {info['tensors']} tensors "
          f"in {time.time() - start:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1])
