#!/usr/bin/env python
"""Write a full-size Needle 2 `.cact` with random weights, for the benchmark.

    .venv/bin/python bench/make_full_model.py target/bench/needle-base.cact
    .venv/bin/python bench/make_full_model.py target/bench/needle-shipped.cact --shipped

`--shipped` writes the published `needle2.cact`'s quantization and window instead: 2-bit
weights and `kv_window` 256 (what upstream 2.0.15's `write_export` writes for it).

Geometry: upstream `PRESETS["base"]` (d_model 512, 8 heads, 4 kv heads, 27 layers,
engram layers (2, 15)) with vocab 8192, engram_slots 8192, max_seq_len 2048, float32.
Weights: `model.init` with a fixed seed, then `make_fixtures.perturb` (Gaussian noise
on every leaf, so no norm scale, gate or diagonal is at its degenerate init value).
Written by upstream `write_export` (W4, group 128, kv_window = effective_kv_window; with
`--shipped` W2 and kv_window 256).

`write_export` embeds a tokenizer only when given one, and our reader requires the RAW
tokenizer blob with exactly `vocab` pieces. Training an 8192-piece SentencePiece model
needs a large corpus, so `SyntheticVocab` stands in: the four control/unknown pieces
and the chat markers at upstream's ids, the 256 byte pieces, then distinct lowercase
pieces with decreasing scores. It answers the handful of `sp` calls that
`export._tokenizer_blob` makes; it is a vocabulary dump, not a trained tokenizer.

Does nothing when OUT exists.
"""
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
os.environ["NEEDLE_TELEMETRY"] = "0"
os.environ["DO_NOT_TRACK"] = "1"

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "fixtures"))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import flax  # noqa: E402
import numpy as np  # noqa: E402

import needle.model.export as ex  # noqa: E402
from needle.model.architecture import (  # noqa: E402
    PRESETS, SimpleAttentionNetwork, TransformerConfig, effective_kv_window)
from needle.model.tokenizer import CHAT_MARKERS, PAD_ID, EOS_ID, BOS_ID, UNK_ID  # noqa: E402
from make_fixtures import perturb  # noqa: E402

SEED = 20
BITS = 4
GROUP = 128
SHIPPED_BITS = 2
SHIPPED_KV_WINDOW = 256


def base_config():
    return TransformerConfig(**PRESETS["base"], vocab_size=8192, engram_slots=8192,
                             max_seq_len=2048, dtype="float32", flash=False, remat=False)


class SyntheticVocab:
    """The `sp` side of a SentencePiece processor, over a fixed list of pieces."""

    CONTROL, UNKNOWN, BYTE, NORMAL = "control", "unknown", "byte", "normal"

    def __init__(self, size):
        specials = {PAD_ID: "<pad>", EOS_ID: "</s>", BOS_ID: "<s>", UNK_ID: "<unk>"}
        pieces = [(specials[i], self.UNKNOWN if i == UNK_ID else self.CONTROL)
                  for i in range(len(specials))]
        pieces += [(m, self.NORMAL) for m in CHAT_MARKERS]
        pieces += [(f"<0x{b:02X}>", self.BYTE) for b in range(256)]
        letters = "abcdefghijklmnopqrstuvwxyz"
        k = 0
        while len(pieces) < size:
            word, n = "", k
            while True:
                word = letters[n % 26] + word
                n = n // 26 - 1
                if n < 0:
                    break
            pieces.append(("\u2581" + word if k % 2 else word, self.NORMAL))
            k += 1
        self.pieces = pieces[:size]

    def GetPieceSize(self):
        return len(self.pieces)

    def IdToPiece(self, i):
        return self.pieces[i][0]

    def IsControl(self, i):
        return self.pieces[i][1] == self.CONTROL

    def IsUnknown(self, i):
        return self.pieces[i][1] == self.UNKNOWN

    def IsByte(self, i):
        return self.pieces[i][1] == self.BYTE

    def GetScore(self, i):
        return 0.0 if self.pieces[i][1] != self.NORMAL else -float(i)


class SyntheticTokenizer:
    """What `write_export` reads of a tokenizer: `vocab_size` and `sp`."""

    def __init__(self, size):
        self.sp = SyntheticVocab(size)
        self.vocab_size = size


def main():
    args = sys.argv[1:]
    shipped = "--shipped" in args
    args = [a for a in args if a != "--shipped"]
    if len(args) != 1:
        sys.exit(f"usage: {sys.argv[0]} OUT.cact [--shipped]")
    out = args[0]
    if os.path.exists(out):
        print(f"{out} exists, nothing to do")
        return
    t0 = time.time()
    cfg = base_config()
    model = SimpleAttentionNetwork(cfg)
    tokens = jnp.ones((1, 8), jnp.int32)
    params = jax.jit(lambda k: model.init(k, tokens)["params"])(jax.random.PRNGKey(SEED))
    params = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float32), flax.core.unfreeze(params))
    params = {k: v for k, v in params.items() if k in ("embedding", "stack") or k.startswith("engrams_")}
    params = perturb(params, cfg, SEED)
    kv_window = SHIPPED_KV_WINDOW if shipped else int(effective_kv_window(cfg))
    bits = SHIPPED_BITS if shipped else BITS
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    tmp = out + ".tmp"
    info = ex.write_export(params, cfg, tmp, bits=bits, group=GROUP,
                           tokenizer=SyntheticTokenizer(cfg.vocab_size), kv_window=kv_window)
    os.replace(tmp, out)
    print(f"wrote {out}: {info['bytes'] / 1e6:.1f} MB, {info['tensors']} tensors, "
          f"{bits}-bit, kv_window {kv_window}, {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()
