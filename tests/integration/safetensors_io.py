"""Minimal safetensors reading and writing with numpy (no torch), for the tests that look into or
rewrite model and optimizer files."""
import json
import struct

import numpy as np


def read_safetensors(path):
    """Minimal safetensors reader (numpy); returns ({name: array}, metadata)."""
    with open(path, "rb") as f:
        data = f.read()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + length])
    metadata = header.pop("__metadata__", {})
    base = 8 + length
    dtypes = {"F32": np.float32, "I32": np.int32, "F64": np.float64, "I64": np.int64}
    out = {}
    for name, entry in header.items():
        begin, end = entry["data_offsets"]
        out[name] = np.frombuffer(data[base + begin:base + end], dtype=dtypes[entry["dtype"]]).reshape(entry["shape"])
    return out, metadata


def write_safetensors(path, tensors, metadata=None):
    """Minimal safetensors writer for I32/F32 numpy arrays (and string `metadata`)."""
    header, blobs, offset = ({"__metadata__": metadata} if metadata else {}), [], 0
    for name, array in tensors.items():
        array = np.ascontiguousarray(array)
        dtype = {np.dtype(np.int32): "I32", np.dtype(np.float32): "F32"}[array.dtype]
        raw = array.tobytes()
        header[name] = {"dtype": dtype, "shape": list(array.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * ((8 - (8 + len(text)) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))
