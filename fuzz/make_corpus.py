#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets (standard library only):

  fuzz/corpus/cact/            the fixture .cact files, truncations of each at its
                               structural boundaries, and small synthesized models
                               (same layout, tiny geometry) that run fast; the Needle 3
                               fixtures whole and cut inside their header, directory and blobs
  fuzz/corpus/tokenizer_blob/  the fixtures' tokenizer blobs, truncations, and a
                               16-piece blob
  fuzz/corpus/needle3_export/  the Needle 3 fixtures whole (the target exports what parses)

The header, directory record and tensor walk come from exporter/layout/needle2.json
(rendered from the reader's own declaration, exporter/src/cact/needle2/layout.rs).

Usage: python3 fuzz/make_corpus.py   (from anywhere; the corpus is not committed)
"""

import hashlib
import json
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
LAYOUT = json.loads((ROOT / "exporter/layout/needle2.json").read_text())
HEADER = LAYOUT["header_bytes"]
RECORD = LAYOUT["record_bytes"]
ALIGN = LAYOUT["align"]


def write(directory, name, data):
    directory.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha1(data).hexdigest()[:12]
    if not any(directory.glob(f"*-{digest}")):
        (directory / f"{name}-{digest}").write_bytes(data)


def header_u32(b, name):
    (field,) = (f for f in LAYOUT["header"] if f["name"] == name)
    assert field["type"] == "u32", field
    return struct.unpack_from("<I", b, field["offset"])[0]


def pack(fields, fmt, values):
    """Packs `values` (field name -> scalar or list, arrays padded with zeros) in `fmt`."""
    flat = []
    for field in fields:
        v = values[field["name"]]
        flat += [v] if field["count"] == 1 else list(v) + [0] * (field["count"] - len(v))
    return struct.pack(fmt, *flat)


def unpack_record(b, at):
    """The directory record at `at` as field name -> value (a list for arrays)."""
    flat = iter(struct.unpack_from(LAYOUT["record_format"], b, at))
    return {f["name"]: next(flat) if f["count"] == 1 else [next(flat) for _ in range(f["count"])]
            for f in LAYOUT["record"]}


def directory_of(b):
    n = header_u32(b, "num_tensors")
    dir_start = HEADER + 4 * header_u32(b, "codebook_len")
    records = [unpack_record(b, dir_start + i * RECORD) for i in range(n)]
    return dir_start, records


def walk(geometry):
    """(name, shape) of every tensor from embedding through final_norm."""
    def size(dim):
        return math.prod(1 if f == "1" else geometry[f] for f in dim.split("*"))
    for group in LAYOUT["walk"]:
        copies = 1 if group["count"] is None else geometry[group["count"]]
        for index in range(copies):
            for t in group["tensors"]:
                yield group["name"].format(index=index, tensor=t["name"]), [size(d) for d in t["shape"]]


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
    d = 8
    orders = [2, 3]
    sites = [0] if with_site else []
    geometry = dict(
        vocab=vocab, d_model=d, num_heads=2, num_kv_heads=1, num_layers=1, head_dim=4,
        hada_n=1 << (d - 1).bit_length(), mhc_lanes=2, engram_slots=2, engram_sub_dim=2,
        num_engram_tables=2, engram_conv_taps=2, engram_conv_dilation=1,
        num_engram_orders=len(orders), engram_orders=orders,
        num_engram_sites=len(sites), engram_sites=sites)
    shapes = list(walk(geometry))
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

    fields = dict(geometry, tag=LAYOUT["tag"], num_tensors=len(tensors),
                  codebook_len=LAYOUT["codebook_len"], kv_window=0, kv_bits=8, max_seq_len=32,
                  rope_theta=10000.0)
    header = pack(LAYOUT["header"], LAYOUT["header_format"], fields) + codebooks
    data_start = len(header) + RECORD * len(tensors)
    offset = -(-data_start // ALIGN) * ALIGN
    directory, blobs = b"", bytearray(offset)
    for dtype, shape, group, bits, blob in tensors:
        record = dict(dtype=dtype, ndim=len(shape), pad=0, dims=shape, blob_offset=offset,
                      nbytes=len(blob), group=group, bits=bits)
        directory += pack(LAYOUT["record"], LAYOUT["record_format"], record)
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
    export_dir = FUZZ / "corpus/needle3_export"
    m48 = FIXTURES[0].read_bytes()
    codebooks = m48[HEADER:HEADER + 4 * LAYOUT["codebook_len"]]
    for path in FIXTURES:
        b = path.read_bytes()
        stem = path.stem
        write(cact_dir, stem, b)
        dir_start, records = directory_of(b)
        data_start = dir_start + RECORD * len(records)
        tok = records[-1]
        start, nbytes = tok["blob_offset"], tok["nbytes"]
        blob = b[start:start + nbytes]
        first = records[0]
        cuts = {4, HEADER // 2, HEADER, dir_start, dir_start + RECORD * len(records) // 2,
                data_start, first["blob_offset"] + first["nbytes"] // 2, start, start + 100,
                len(b) - 1}
        for cut in sorted(cuts):
            write(cact_dir, f"{stem}-cut{cut}", b[:cut])
        write(tok_dir, stem, blob)
        for cut in (4, 24, 31, len(blob) // 2, len(blob) - 1):
            write(tok_dir, f"{stem}-cut{cut}", blob[:cut])

    # Needle 3 files (a 196-byte header, the same directory records): whole and cut.
    for path in sorted((ROOT / "tests/fixtures/needle3").glob("*.cact")):
        b = path.read_bytes()
        write(cact_dir, path.stem, b)
        write(export_dir, path.stem, b)
        for cut in (4, 100, 196, 400, len(b) // 2, len(b) - 1):
            write(cact_dir, f"{path.stem}-cut{cut}", b[:cut])

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
        write(cact_dir, f"{name}-cut", model[:records[-1]["blob_offset"] + 30])
    tok, _ = tokenizer_blob()
    write(tok_dir, "tiny", tok)
    print(f"wrote {len(list(cact_dir.iterdir()))} cact, "
          f"{len(list(tok_dir.iterdir()))} tokenizer_blob and "
          f"{len(list(export_dir.iterdir()))} needle3_export seeds under {FUZZ / 'corpus'}")


if __name__ == "__main__":
    main()
