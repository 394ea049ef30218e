#!/usr/bin/env python3
"""Seed corpora for the libFuzzer targets (scripts/fuzz.sh): small valid inputs of each format,
written from scratch (the tests' fixtures are megabytes; a fuzzer mutates small files faster).
Usage: fuzz_seeds.py OUT_DIR REPO_DIR"""
import json
import os
import struct
import sys

out, repo = sys.argv[1], sys.argv[2]


def write(target, name, data):
    d = os.path.join(out, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


# safetensors: 8-byte header length, JSON header, data
def safetensors(tensors):
    header, blob = {}, b""
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(blob), len(blob) + len(raw)]}
        blob += raw
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + blob


write("fuzz_safetensors", "two", safetensors([
    ("a.weight", "F32", [2, 3], struct.pack("<6f", *range(6))),
    ("b.weight", "BF16", [4], b"\x80\x3f" * 4),
]))
write("fuzz_safetensors", "fp8", safetensors([
    ("w", "F8_E4M3", [2, 4], bytes(range(8))),
    ("w_scale_inv", "F32", [1, 1], struct.pack("<f", 0.5)),
]))
write("fuzz_safetensors", "empty", safetensors([]))


# GGUF v3: magic, version, tensor count, kv count, kvs, tensor infos, aligned data
def gguf_str(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def gguf(kvs, tensors):
    out_b = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs))
    for key, typ, val in kvs:
        out_b += gguf_str(key) + struct.pack("<I", typ)
        if typ == 4:  # uint32
            out_b += struct.pack("<I", val)
        elif typ == 8:  # string
            out_b += gguf_str(val)
        elif typ == 9:  # array of strings
            out_b += struct.pack("<IQ", 8, len(val)) + b"".join(gguf_str(v) for v in val)
    data, infos = b"", b""
    for name, ggml_type, dims, raw in tensors:
        while len(data) % 32:
            data += b"\0"
        infos += gguf_str(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims)
        infos += struct.pack("<IQ", ggml_type, len(data))
        data += raw
    head = out_b + infos
    while len(head) % 32:
        head += b"\0"
    return head + data


q8_block = struct.pack("<e", 0.25) + bytes(range(32))  # Q8_0: f16 scale + 32 int8
write("fuzz_gguf", "small", gguf(
    [("general.architecture", 8, "qwen3moe"), ("general.alignment", 4, 32),
     ("tokenizer.ggml.tokens", 9, ["a", "b", "<|im_end|>"])],
    [("token_embd.weight", 0, [4, 2], struct.pack("<8f", *range(8))),  # F32, ne = [4, 2]
     ("blk.0.ffn_down.weight", 8, [32, 2], q8_block * 2)]))              # Q8_0

# config.json: the fixtures' own
for model in sorted(os.listdir(os.path.join(repo, "tests/data"))):
    p = os.path.join(repo, "tests/data", model, "config.json")
    if os.path.isfile(p):
        with open(p, "rb") as f:
            write("fuzz_model_config", model, f.read())

# tokenizer.json: a tiny byte-level BPE in the Hugging Face layout
vocab = {chr(c) if 33 <= c < 127 else f"<0x{c:02X}>": i for i, c in enumerate(range(256))}
tok = {
    "version": "1.0",
    "added_tokens": [{"id": 256, "content": "<|im_start|>", "special": True, "single_word": False,
                      "lstrip": False, "rstrip": False, "normalized": False}],
    "normalizer": {"type": "NFC"},
    "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "\\s+|\\w+|[^\\s\\w]+"}, "behavior": "Isolated",
         "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]},
    "decoder": {"type": "ByteLevel"},
    "model": {"type": "BPE", "vocab": vocab, "merges": [], "byte_fallback": False},
}
write("fuzz_tokenizer_json", "tiny", json.dumps(tok))
