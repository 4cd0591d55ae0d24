#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets (standard library only):

  fuzz/corpus/cact/            the fixture .cact files, truncations of each at its
                               structural boundaries, and small synthesized models
                               (same layout, tiny geometry) that run fast
  fuzz/corpus/tokenizer_blob/  the fixtures' tokenizer blobs, truncations, and a
                               16-piece blob

Usage: python3 fuzz/make_corpus.py   (from anywhere; the corpus is not committed)
"""

import hashlib
import math
import random
import struct
from pathlib import Path

FUZZ = Path(__file__).resolve().parent
ROOT = FUZZ.parent
FIXTURES = [
    ROOT / "tests/fixtures/m48.cact",
    ROOT / "tests/fixtures/m64.cact",
    ROOT / "tests/fixtures/m96.cact",
    ROOT / "tests/fixtures/m64w.cact",
    ROOT / "runner/demo/needle-demo.cact",
]
HEADER = 120
RECORD = 44
ALIGN = 64
TAG = 0x05E12A83


def write(directory, name, data):
    directory.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha1(data).hexdigest()[:12]
    if not any(directory.glob(f"*-{digest}")):
        (directory / f"{name}-{digest}").write_bytes(data)


def directory_of(b):
    n, cb_len = struct.unpack_from("<2I", b, 4)
    dir_start = HEADER + 4 * cb_len
    records = [struct.unpack_from("<BBH4IQQII", b, dir_start + i * RECORD) for i in range(n)]
    return dir_start, records


# --- a tiny model, laid out like upstream export.py writes one -----------------

def f16(x):
    return struct.pack("<e", x)


def tokenizer_blob():
    pieces = [
        (0.0, 2, "<pad>"), (0.0, 2, "</s>"), (0.0, 2, "<s>"), (0.0, 1, "<unk>"),
        (0.0, 3, "<|im_start|>"), (0.0, 3, "<|im_end|>"),
        (0.0, 4, "<0x0A>"), (0.0, 4, "<0x41>"), (0.0, 4, "<0xC3>"),
        (-1.0, 0, "\u2581"), (-2.0, 0, "a"), (-3.0, 0, "b"), (-4.0, 0, "\u2581a"),
        (-5.0, 0, "ab"), (-6.0, 0, "\u2581ab"), (-7.0, 0, "\u00f6"),
    ]
    out = struct.pack("<5IBBH", len(pieces), 0, 1, 2, 3, 1, 1, 0)
    for score, kind, text in pieces:
        t = text.encode()
        out += struct.pack("<fBH", score, kind, len(t)) + t
    return out, len(pieces)


def tiny_model(rng, codebooks, heads, with_site, cq_plan):
    tok, vocab = tokenizer_blob()
    d, n_heads, kv_heads, layers, hd = 8, 2, 1, 1, 4
    lanes, slots, sub, tables, taps = 2, 2, 2, 2, 2
    orders = [2, 3]
    sites = [0] if with_site else []
    hada = 1 << (d - 1).bit_length()
    q, kv = n_heads * hd, kv_heads * hd
    shapes = [("embedding", [vocab, d])]
    shapes += [(f"layer{i:02}.{n}", s) for i in range(layers) for n, s in [
        ("norm_in", [d]), ("q_proj", [q, d]), ("k_proj", [kv, d]), ("v_proj", [kv, d]),
        ("q_norm", [hd]), ("k_norm", [hd]), ("gate_proj", [q, d]), ("out_proj", [d, q]),
        ("post_norm", [d]), ("attn_gate", [1]), ("pre_hada", [d]),
        ("d1", [hada]), ("d2", [hada]), ("d3", [hada])]]
    shapes += [("mhc_a_pre", [layers]), ("mhc_a_post", [layers]), ("mhc_a_res", [layers]),
               ("mhc_b_pre", [layers, lanes]), ("mhc_b_post", [layers, lanes]),
               ("mhc_b_res", [layers, lanes, lanes]),
               ("mhc_phi_pre", [layers * lanes, lanes * d]),
               ("mhc_phi_post", [layers * lanes, lanes * d]),
               ("mhc_phi_res", [layers * lanes * lanes, lanes * d])]
    for s in range(len(sites)):
        shapes += [(f"engram{s}.tables", [tables * slots, sub]),
                   (f"engram{s}.key_proj", [d, tables * sub]),
                   (f"engram{s}.value_proj", [d, tables * sub]),
                   (f"engram{s}.taps", [taps, d])]
    shapes.append(("final_norm", [d]))
    tensors = []  # (dtype, shape, group, bits, blob)
    n_cq = 0
    for name, shape in shapes:
        if len(shape) == 2 and cq_plan:
            bits, group = cq_plan[n_cq % len(cq_plan)]
            n_cq += 1
            out, in_dim = shape
            in_pad = -(-in_dim // group) * group
            ibits = 2 if bits == 5 else bits
            if bits == 5:
                packed = bytes(rng.choice([0x00, 0xD3, 0x3C, 0x4F]) for _ in range(out * in_pad // 4))
            else:
                packed = bytes(rng.randrange(256) for _ in range(out * in_pad * ibits // 8))
            norms = b"".join(f16(rng.uniform(0.1, 2.0)) for _ in range(out * in_pad // group))
            tensors.append((3, shape, group, bits, packed + norms))
        else:
            count = math.prod(shape)
            if rng.random() < 0.5:
                tensors.append((1, shape, 0, 0, b"".join(f16(rng.uniform(-1, 1)) for _ in range(count))))
            else:
                tensors.append((2, shape, 0, 0, struct.pack(f"<{count}f", *(rng.uniform(-1, 1) for _ in range(count)))))
    if heads:
        tensors.append((1, [len(heads)], 0, 0, b"".join(f16(float(h)) for h in heads)))
        for _ in heads:
            probes, out = 2, 3
            tensors.append((1, [probes, d], 0, 0, f16(0.5) * (probes * d)))
            tensors.append((2, [out, probes * d], 0, 0, struct.pack("<f", 0.25) * (out * probes * d)))
            tensors.append((1, [out], 0, 0, f16(0.0) * out))
    tensors.append((4, [], 0, 0, tok))

    fields = [TAG, len(tensors), 28, 0, 8, vocab, d, n_heads, kv_heads, layers, hd, 32, hada,
              lanes, slots, sub, tables, taps, 1, len(orders)] + orders + [0] * (4 - len(orders))
    fields += [len(sites)] + sites + [0] * (4 - len(sites))
    header = struct.pack("<29If", *fields, 10000.0) + codebooks
    data_start = len(header) + RECORD * len(tensors)
    offset = -(-data_start // ALIGN) * ALIGN
    directory, blobs = b"", bytearray(offset)
    for dtype, shape, group, bits, blob in tensors:
        dims = shape + [0] * (4 - len(shape))
        directory += struct.pack("<BBH4IQQII", dtype, len(shape), 0, *dims, offset, len(blob), group, bits)
        blobs += blob
        offset += len(blob)
        if dtype != 4:  # the tokenizer ends the file, as upstream writes it
            pad = -offset % ALIGN
            blobs += bytes(pad)
            offset += pad
    out = bytearray(header + directory) + blobs[len(header) + len(directory):]
    return bytes(out)


def main():
    cact_dir, tok_dir = FUZZ / "corpus/cact", FUZZ / "corpus/tokenizer_blob"
    m48 = FIXTURES[0].read_bytes()
    codebooks = m48[HEADER:HEADER + 28 * 4]
    for path in FIXTURES:
        b = path.read_bytes()
        stem = path.stem
        write(cact_dir, stem, b)
        dir_start, records = directory_of(b)
        data_start = dir_start + RECORD * len(records)
        tok = records[-1]
        blob = b[tok[7]:tok[7] + tok[8]]
        cuts = {4, HEADER // 2, HEADER, dir_start, dir_start + RECORD * len(records) // 2,
                data_start, records[0][7] + records[0][8] // 2, tok[7], tok[7] + 100, len(b) - 1}
        for cut in sorted(cuts):
            write(cact_dir, f"{stem}-cut{cut}", b[:cut])
        write(tok_dir, stem, blob)
        for cut in (4, 24, 31, len(blob) // 2, len(blob) - 1):
            write(tok_dir, f"{stem}-cut{cut}", blob[:cut])

    rng = random.Random(2)
    plans = {
        "tiny": dict(heads=[], with_site=True, cq_plan=[(4, 8)]),
        "tiny-cq": dict(heads=[1], with_site=True, cq_plan=[(2, 8), (3, 16), (5, 8), (4, 32)]),
        "tiny-heads": dict(heads=[2, 1], with_site=False, cq_plan=[(5, 16), (2, 8)]),
        "tiny-fp": dict(heads=[2], with_site=True, cq_plan=[]),
    }
    for name, plan in plans.items():
        model = tiny_model(rng, codebooks, **plan)
        write(cact_dir, name, model)
        dir_start, records = directory_of(model)
        write(cact_dir, f"{name}-cut", model[:records[-1][7] + 30])
    tok, _ = tokenizer_blob()
    write(tok_dir, "tiny", tok)
    print(f"wrote {len(list(cact_dir.iterdir()))} cact and "
          f"{len(list(tok_dir.iterdir()))} tokenizer_blob seeds under {FUZZ / 'corpus'}")


if __name__ == "__main__":
    main()
