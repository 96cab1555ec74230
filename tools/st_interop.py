#!/usr/bin/env python3
"""st_interop.py - safetensors interoperability check between pipeline's C
reader/writer (core/src/safetensors.c) and the reference Python package
`safetensors` (https://github.com/huggingface/safetensors).

Usage:
  st_interop.py write PATH       write the reference tensors with
                                 safetensors.numpy.save_file (no BF16: numpy
                                 has no bfloat16)
  st_interop.py write_bf16 PATH  write one BF16 tensor with
                                 safetensors.torch.save_file; exits 3 when torch
                                 is not installed
  st_interop.py read PATH        read a file written by pipeline (by the test
                                 tests/core/test_safetensors.c) with
                                 safetensors.safe_open and check every tensor,
                                 dtype, shape and the metadata

Exit status: 0 ok, 1 mismatch (printed), 2 usage, 3 a needed module missing.

The tensors (same table in tests/core/test_safetensors.c; element i is the
row-major index):
  a_f32  F32 [2,3,4]  (i % 13) * 0.25 - 1.5
  b_f16  F16 [5]      (i % 13) * 0.25 - 1.5
  c_f64  F64 [3,2]    (i % 13) * 0.25 - 1.5
  d_i32  I32 [7]      i * 1000 - 3000
  e_i64  I64 [2,2]    i * 2**40 - 5
  f_u8   U8  [10]     (i * 37) % 256
  g_scl  F32 []       42.5
  h_emp  F32 [0,3]    (empty)
  i_bf16 BF16 [3,3]   (i % 13) * 0.25 - 1.5   (read; write_bf16 only)
Metadata: producer = "python-safetensors" (written here) or "pipeline"
(expected when reading), note = 'quote " and unicode \u00fc'.
"""
import json
import sys

import numpy as np

NOTE = 'quote " and unicode \u00fc'

SPEC = [
    ("a_f32", "F32", (2, 3, 4)),
    ("b_f16", "F16", (5,)),
    ("c_f64", "F64", (3, 2)),
    ("d_i32", "I32", (7,)),
    ("e_i64", "I64", (2, 2)),
    ("f_u8", "U8", (10,)),
    ("g_scl", "F32", ()),
    ("h_emp", "F32", (0, 3)),
]
BF16 = ("i_bf16", "BF16", (3, 3))

NP = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I32": np.int32,
      "I64": np.int64, "U8": np.uint8}


def expected(name, dtype, shape):
    """Reference values as float64 (ints exactly representable except i64,
    which is built in int64)."""
    n = int(np.prod(shape)) if shape else 1
    i = np.arange(n, dtype=np.int64)
    if name == "g_scl":
        v = np.array([42.5])
    elif dtype in ("F32", "F16", "F64", "BF16"):
        v = (i % 13) * 0.25 - 1.5
    elif dtype == "I32":
        v = i * 1000 - 3000
    elif dtype == "I64":
        v = i * (1 << 40) - 5
    elif dtype == "U8":
        v = (i * 37) % 256
    else:
        raise ValueError(dtype)
    return v.reshape(shape)


def cmd_write(path):
    from safetensors.numpy import save_file
    tensors = {name: expected(name, dt, shape).astype(NP[dt]) for name, dt, shape in SPEC}
    save_file(tensors, path, metadata={"producer": "python-safetensors", "note": NOTE})
    return 0


def cmd_write_bf16(path):
    try:
        import torch
        from safetensors.torch import save_file
    except ImportError:
        print("st_interop: torch not installed, cannot write BF16")
        return 3
    name, dt, shape = BF16
    t = torch.tensor(expected(name, dt, shape), dtype=torch.bfloat16)
    save_file({name: t}, path, metadata={"producer": "python-safetensors", "note": NOTE})
    return 0


def bf16_raw(path, name):
    """Decode a BF16 tensor without torch: raw bytes -> u16 -> f32."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        hdr = json.loads(f.read(n))
        b, e = hdr[name]["data_offsets"]
        f.seek(8 + n + b)
        u = np.frombuffer(f.read(e - b), dtype="<u2").astype(np.uint32) << 16
    return u.view(np.float32).reshape(hdr[name]["shape"])


def cmd_read(path):
    from safetensors import safe_open
    errors = []
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        hdr = json.loads(f.read(n))
    if n % 8:
        errors.append(f"header length {n} is not a multiple of 8")
    with safe_open(path, framework="numpy") as st:
        meta = st.metadata() or {}
        if meta.get("producer") != "pipeline":
            errors.append(f"metadata producer: expected 'pipeline', found {meta.get('producer')!r}")
        if meta.get("note") != NOTE:
            errors.append(f"metadata note: expected {NOTE!r}, found {meta.get('note')!r}")
        keys = set(st.keys())
        for name, dt, shape in SPEC + [BF16]:
            if name not in keys:
                errors.append(f"tensor {name}: missing")
                continue
            if hdr[name]["dtype"] != dt:
                errors.append(f"tensor {name}: dtype expected {dt}, found {hdr[name]['dtype']}")
                continue
            if dt == "BF16":
                try:
                    import torch  # noqa: F401
                    with safe_open(path, framework="pt") as pt:
                        got = pt.get_tensor(name).float().numpy()
                except ImportError:
                    got = bf16_raw(path, name)
            else:
                got = st.get_tensor(name)
                if got.dtype != NP[dt]:
                    errors.append(f"tensor {name}: numpy dtype {got.dtype}, expected {NP[dt]}")
            want = expected(name, dt, shape)
            if tuple(got.shape) != tuple(shape):
                errors.append(f"tensor {name}: shape expected {list(shape)}, found {list(got.shape)}")
                continue
            if dt == "I64":
                ok = np.array_equal(got.astype(np.int64), want.astype(np.int64))
            else:
                ok = np.array_equal(got.astype(np.float64), want.astype(np.float64))
            if not ok:
                errors.append(f"tensor {name}: values differ: expected {want.ravel()[:8]}, "
                              f"found {got.ravel()[:8]}")
        extra = keys - {s[0] for s in SPEC + [BF16]}
        if extra:
            errors.append(f"unexpected tensors {sorted(extra)}")
    for e in errors:
        print(f"st_interop: {path}: {e}")
    if not errors:
        print(f"st_interop: {path}: {len(SPEC) + 1} tensors and metadata match")
    return 1 if errors else 0


def main(argv):
    if len(argv) != 3 or argv[1] not in ("write", "write_bf16", "read"):
        print(__doc__)
        return 2
    try:
        import safetensors  # noqa: F401
    except ImportError:
        print("st_interop: python module 'safetensors' not installed")
        return 3
    return {"write": cmd_write, "write_bf16": cmd_write_bf16, "read": cmd_read}[argv[1]](argv[2])


if __name__ == "__main__":
    sys.exit(main(sys.argv))
