#!/usr/bin/env python3
"""Writes llamacpp.gguf with llama.cpp's own GGUF writer and, beside it,
llamacpp.json: what llama.cpp's reader says of that file (version,
alignment, data offset, each tensor's type, dims, offset and size, each
key's type). TestLlamaCppFile checks the Go reader says the same.

The library is libggml-base.so from the npm package
@node-llama-cpp/linux-x64@3.21.1 (llama.cpp as node-llama-cpp 3.21.1 builds
it). Run: python3 make_llamacpp.py path/to/libggml-base.so
"""
import ctypes as C
import json
import os
import sys

L = C.CDLL(sys.argv[1])
here = os.path.dirname(os.path.abspath(__file__))
out = os.path.join(here, "llamacpp.gguf")

class InitParams(C.Structure):
    _fields_ = [("mem_size", C.c_size_t), ("mem_buffer", C.c_void_p), ("no_alloc", C.c_bool)]

L.ggml_init.restype = C.c_void_p
L.ggml_init.argtypes = [InitParams]
L.ggml_new_tensor.restype = C.c_void_p
L.ggml_new_tensor.argtypes = [C.c_void_p, C.c_int, C.c_int, C.POINTER(C.c_int64)]
L.ggml_set_name.restype = C.c_void_p
L.ggml_set_name.argtypes = [C.c_void_p, C.c_char_p]
L.ggml_nbytes.restype = C.c_size_t
L.ggml_nbytes.argtypes = [C.c_void_p]
L.ggml_blck_size.restype = C.c_int64
L.ggml_type_size.restype = C.c_size_t
L.ggml_type_name.restype = C.c_char_p
L.gguf_init_empty.restype = C.c_void_p
L.gguf_free.argtypes = [C.c_void_p]
for t, ct in [("u8", C.c_uint8), ("i8", C.c_int8), ("u16", C.c_uint16), ("i16", C.c_int16),
              ("u32", C.c_uint32), ("i32", C.c_int32), ("f32", C.c_float), ("u64", C.c_uint64),
              ("i64", C.c_int64), ("f64", C.c_double), ("bool", C.c_bool), ("str", C.c_char_p)]:
    getattr(L, "gguf_set_val_" + t).argtypes = [C.c_void_p, C.c_char_p, ct]
L.gguf_set_arr_data.argtypes = [C.c_void_p, C.c_char_p, C.c_int, C.c_void_p, C.c_size_t]
L.gguf_set_arr_str.argtypes = [C.c_void_p, C.c_char_p, C.POINTER(C.c_char_p), C.c_size_t]
L.gguf_add_tensor.argtypes = [C.c_void_p, C.c_void_p]
L.gguf_set_tensor_data.argtypes = [C.c_void_p, C.c_char_p, C.c_void_p]
L.gguf_write_to_file.restype = C.c_bool
L.gguf_write_to_file.argtypes = [C.c_void_p, C.c_char_p, C.c_bool]

class GGUFInitParams(C.Structure):
    _fields_ = [("no_alloc", C.c_bool), ("ctx", C.c_void_p)]

L.gguf_init_from_file.restype = C.c_void_p
L.gguf_init_from_file.argtypes = [C.c_char_p, GGUFInitParams]
for f, r in [("gguf_get_version", C.c_uint32), ("gguf_get_alignment", C.c_size_t),
             ("gguf_get_data_offset", C.c_size_t), ("gguf_get_n_kv", C.c_int64),
             ("gguf_get_n_tensors", C.c_int64)]:
    getattr(L, f).restype = r
    getattr(L, f).argtypes = [C.c_void_p]
for f, r in [("gguf_get_key", C.c_char_p), ("gguf_get_kv_type", C.c_int), ("gguf_get_arr_type", C.c_int),
             ("gguf_get_arr_n", C.c_size_t), ("gguf_get_tensor_name", C.c_char_p),
             ("gguf_get_tensor_offset", C.c_size_t), ("gguf_get_tensor_type", C.c_int),
             ("gguf_get_tensor_size", C.c_size_t)]:
    getattr(L, f).restype = r
    getattr(L, f).argtypes = [C.c_void_p, C.c_int64]

# The types llama.cpp can size (ggml_blck_size > 0), up to GGML_TYPE_COUNT.
types = [t for t in range(43) if L.ggml_blck_size(t) > 0]

ctx = L.ggml_init(InitParams(1 << 20, None, True))
g = L.gguf_init_empty()

L.gguf_set_val_str(g, b"general.architecture", b"test")
# general.alignment is left at its default: this writer lays out tensors at
# its own alignment (32) whatever the key says, so 64 makes a file its reader refuses.
L.gguf_set_val_u8(g, b"test.u8", 200)
L.gguf_set_val_i8(g, b"test.i8", -100)
L.gguf_set_val_u16(g, b"test.u16", 60000)
L.gguf_set_val_i16(g, b"test.i16", -30000)
L.gguf_set_val_u32(g, b"test.u32", 4000000000)
L.gguf_set_val_i32(g, b"test.i32", -2000000000)
L.gguf_set_val_f32(g, b"test.f32", 0.5)
L.gguf_set_val_u64(g, b"test.u64", 18000000000000000000)
L.gguf_set_val_i64(g, b"test.i64", -9000000000000000000)
L.gguf_set_val_f64(g, b"test.f64", -0.25)
L.gguf_set_val_bool(g, b"test.bool", True)
L.gguf_set_val_str(g, b"test.str", "héllo {{ messages }}".encode())
arrs = [(5, C.c_int32, [1, -2, 3]), (6, C.c_float, [0.5, -1.5]), (0, C.c_uint8, [0, 255]),
        (10, C.c_uint64, [1, 2**63]), (11, C.c_int64, [-1]), (12, C.c_double, [2.5]),
        (7, C.c_bool, [True, False, True]), (3, C.c_int16, [-7, 7])]
for gt, ct, vals in arrs:
    buf = (ct * len(vals))(*vals)
    L.gguf_set_arr_data(g, ("test.arr_%d" % gt).encode(), gt, C.cast(buf, C.c_void_p), len(vals))
strs = [b"a", b"", b"\xc4\xa0the", b"<|im_end|>"]
L.gguf_set_arr_str(g, b"test.arr_str", (C.c_char_p * len(strs))(*strs), len(strs))

shapes = []
for t in types:
    shapes.append(("t.%s" % L.ggml_type_name(t).decode(), t, [2 * L.ggml_blck_size(t), 3]))
shapes += [("vec", 0, [5]), ("cube", 1, [4, 3, 2]), ("hyper", 30, [2, 1, 3, 2]), ("empty", 0, [0, 7])]
keep = []
for i, (name, t, ne) in enumerate(shapes):
    arr = (C.c_int64 * len(ne))(*ne)
    tensor = L.ggml_new_tensor(ctx, t, len(ne), arr)
    L.ggml_set_name(tensor, name.encode())
    L.gguf_add_tensor(g, tensor)
    n = L.ggml_nbytes(tensor)
    data = (C.c_uint8 * max(n, 1))(*[(i * 31 + j) & 0xFF for j in range(max(n, 1))])
    keep.append(data)
    L.gguf_set_tensor_data(g, name.encode(), C.cast(data, C.c_void_p))
assert L.gguf_write_to_file(g, out.encode(), False)
L.gguf_free(g)

# What llama.cpp's reader says of the file.
r = L.gguf_init_from_file(out.encode(), GGUFInitParams(True, None))
assert r
base = L.gguf_get_data_offset(r)
want = {
    "version": L.gguf_get_version(r),
    "alignment": L.gguf_get_alignment(r),
    "data_offset": base,
    "kv": [],
    "tensors": [],
}
for i in range(L.gguf_get_n_kv(r)):
    kv = {"key": L.gguf_get_key(r, i).decode(), "type": L.gguf_get_kv_type(r, i)}
    if kv["type"] == 9:
        kv["elem"] = L.gguf_get_arr_type(r, i)
        kv["n"] = L.gguf_get_arr_n(r, i)
    want["kv"].append(kv)
for i, (name, t, ne) in enumerate(shapes):
    assert L.gguf_get_tensor_name(r, i).decode() == name
    want["tensors"].append({
        "name": name, "type": L.gguf_get_tensor_type(r, i), "dims": ne,
        "offset": base + L.gguf_get_tensor_offset(r, i), "size": L.gguf_get_tensor_size(r, i),
        "block": L.ggml_blck_size(t), "block_bytes": L.ggml_type_size(t), "seed": i,
    })
with open(os.path.join(here, "llamacpp.json"), "w") as fh:
    json.dump(want, fh, indent=1)
    fh.write("\n")
