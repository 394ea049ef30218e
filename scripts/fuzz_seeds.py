#!/usr/bin/env python3
"""Seed corpora for the libFuzzer targets (scripts/fuzz.sh): small valid inputs of each format.
Model files are written from scratch (the tests' fixtures are megabytes; a fuzzer mutates small
files faster); chat templates, batch lines, ZeroMQ requests, API request bodies, Files API
uploads, Batch API bodies and SQL rows come from the tests' data, the examples and the schemas.
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

# fuzz_checkpoint_index: an index naming two shards, a NUL, the cut between them, the shards
shard1 = safetensors([("a.weight", "F32", [2, 3], struct.pack("<6f", *range(6)))])
shard2 = safetensors([("b.weight", "BF16", [4], b"\x80\x3f" * 4)])
index = json.dumps({"metadata": {"total_size": 32}, "weight_map": {
    "a.weight": "shard-00001.safetensors", "b.weight": "shard-00002.safetensors"}})
write("fuzz_checkpoint_index", "two_shards",
      index.encode() + b"\0" + struct.pack("<H", len(shard1)) + shard1 + shard2)

# GGUF v3: magic, version, tensor count, kv count, kvs, tensor infos, aligned data
def gguf_str(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def gguf(kvs, tensors, raw_kvs=b"", n_raw=0):
    """A GGUF v3 file; raw_kvs: n_raw key/value records already encoded, put first."""
    out_b = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs) + n_raw) + raw_kvs
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

# fuzz_gguf_model: the Q4_K_M fixture's metadata (architecture keys, a 1,024-token byte-level
# BPE vocabulary with merges) and Qwen3's chat template, no tensors; once as one file, once as
# a split model of two parts (the target's input layout: a mode byte, then for a split the cut
# position and both parts).
def gguf_kvs(path):
    """The raw key/value section of a GGUF file and its count."""
    with open(path, "rb") as f:
        b = f.read()
    n_kv = struct.unpack_from("<Q", b, 16)[0]
    off = 24
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

    def skip(typ, off):
        if typ == 8:
            return off + 8 + struct.unpack_from("<Q", b, off)[0]
        if typ == 9:
            et, n = struct.unpack_from("<IQ", b, off)
            off += 12
            for _ in range(n):
                off = skip(et, off)
            return off
        return off + sizes[typ]
    for _ in range(n_kv):
        off = skip(8, off)
        off = skip(struct.unpack_from("<I", b, off)[0], off + 4)
    return b[24:off], n_kv


def gguf_kv_str(key, val):
    return gguf_str(key) + struct.pack("<I", 8) + gguf_str(val)


kvs, n_kv = gguf_kvs(os.path.join(repo, "tests/data/qwen3moe_tiny_q4km/qwen3moe_tiny_q4km.gguf"))
# hidden 256 → 8, so the embedding (ne [hidden, 1024] F16) is 16 KB
hidden_key = gguf_str("qwen3moe.embedding_length") + struct.pack("<I", 4)
at = kvs.index(hidden_key) + len(hidden_key)
kvs = kvs[:at] + struct.pack("<I", 8) + kvs[at + 4:]
embd = ("token_embd.weight", 1, [8, 1024], bytes(8 * 1024 * 2))
with open(os.path.join(repo, "tests/data/qwen3-tokenizer/tokenizer_config.json")) as f:
    kvs += gguf_kv_str("tokenizer.chat_template", json.load(f)["chat_template"])
    n_kv += 1
write("fuzz_gguf_model", "one", b"\0" + gguf([], [embd], kvs, n_kv))
part1 = gguf([("split.no", 4, 0), ("split.count", 4, 2)], [], kvs, n_kv)
part2 = gguf([("split.no", 4, 1), ("split.count", 4, 2)], [embd])
write("fuzz_gguf_model", "split", b"\1" + struct.pack("<H", len(part1)) + part1 + part2)

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

# Chat templates: the real ones the tests render (tests/data/chat_templates) and Qwen3's own,
# each followed by a NUL and a user message (the target's input layout).
tdir = os.path.join(repo, "tests/data/chat_templates")
for name in sorted(os.listdir(tdir)):
    if name.endswith(".jinja"):
        with open(os.path.join(tdir, name), "rb") as f:
            write("fuzz_chat_template", name, f.read() + b"\0What is top-k routing?")
with open(os.path.join(repo, "tests/data/qwen3-tokenizer/tokenizer_config.json"), "rb") as f:
    write("fuzz_chat_template", "qwen3", json.load(f)["chat_template"].encode() + b"\0hi")
write("fuzz_chat_template", "features",
      "{%- macro m(x) -%}{{ x | tojson }}{%- endmacro -%}"
      "{%- for msg in messages if msg.role != 'tool' -%}{{ loop.index }}:{{ m(msg) }}"
      "{%- if msg.tool_calls %}{% for c in msg.tool_calls %}{{ c.function.name | upper }}"
      "{% endfor %}{% endif %}{% set ns = namespace(n=0) %}{% set ns.n = ns.n + 1 %}"
      "{%- endfor -%}{{ bos_token ~ (tools | length) ~ strftime_now('%Y') }}"
      "{%- if add_generation_prompt %}{{ 'x'.join(['a', 'b'])[1:] }}{% endif %}")

# OpenAI Batch lines: the example file, line by line and whole, and the refused shapes the tests
# name (both max_tokens spellings, duplicate and NUL keys).
with open(os.path.join(repo, "examples/demo_batch.jsonl"), "rb") as f:
    batch = f.read()
write("fuzz_batch_line", "demo_batch", batch)
for i, line in enumerate(batch.splitlines()):
    write("fuzz_batch_line", f"demo_{i}", line)
head = '{"custom_id":"c","method":"POST","url":"/v1/chat/completions","body":{' \
       '"messages":[{"role":"user","content":"hi"}],'
write("fuzz_batch_line", "both_max", head + '"max_tokens":5,"max_completion_tokens":9}}')
write("fuzz_batch_line", "dup_key", head + '"max_tokens":5,"max_tokens":9}}')
write("fuzz_batch_line", "nul_key", head + '"top_p\\u0000":1}}')
write("fuzz_batch_line", "completions",
      '{"custom_id":"a/b","method":"POST","url":"/v1/completions","body":{"prompt":"Once",'
      '"stop":["\\n"],"seed":7,"top_k":40,"n":1,"stream":false}}\r\n\n')

# ZeroMQ requests: the schema's examples, one per file.
with open(os.path.join(repo, "schemas/zmq-request.json"), "rb") as f:
    for i, ex in enumerate(json.load(f)["examples"]):
        write("fuzz_zmq_request", f"example_{i}", json.dumps(ex))
write("fuzz_zmq_request", "full_job", json.dumps({
    "v": 1, "cmd": "submit", "id": "f", "batch_id": "b", "jobs": [{
        "prompt": "p", "key": "k", "custom_id": "c", "model": "m", "priority": -3,
        "max_tokens": 9, "temperature": 0.5, "top_p": 0.9, "top_k": 5, "seed": 1,
        "stop": ["a", "b"], "max_attempts": 2}]}))


# OpenAI API request bodies (fuzz_api_request): the first byte picks the endpoint ('0' chat,
# '1' completions), the rest is the body, as the tests and OpenAI's SDKs send them.
def api(name, kind, body):
    write("fuzz_api_request", name, kind + json.dumps(body))


msgs = [{"role": "system", "content": "Answer in one line."},
        {"role": "user", "content": "What is a mixture of experts?"}]
api("chat_min", "0", {"model": "demo", "messages": [{"role": "user", "content": "Hi"}]})
api("chat_all", "0", {
    "model": "demo", "messages": msgs, "temperature": 0.5, "top_p": 0.9, "top_k": 40, "seed": -7,
    "stop": "END", "max_completion_tokens": 12, "n": 1, "stream": True,
    "stream_options": {"include_usage": True, "continuous_usage_stats": False},
    "chat_template_kwargs": {"enable_thinking": False}, "user": "u1"})
api("chat_parts", "0", {"model": "demo", "messages": [
    {"role": "developer", "content": [{"type": "text", "text": "Be brief."}], "name": "ops"},
    {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
    {"role": "assistant", "content": "ok"}]})
# What SDKs and Dify send by default, and fields only some servers take (refused here).
api("chat_defaults", "0", {
    "model": "demo", "messages": msgs, "max_tokens": 64, "presence_penalty": 0,
    "frequency_penalty": 0.0, "logprobs": False, "top_logprobs": 0, "logit_bias": {},
    "response_format": {"type": "text"}, "stop": ["\n\n", "###"], "temperature": None,
    "stream": False, "stream_options": None, "chat_template_kwargs": None})
api("chat_refused", "0", {
    "model": "demo", "messages": msgs + [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
    "tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "properties": {"x": {"type": "string"}}}}}],
    "tool_choice": "auto", "response_format": {"type": "json_schema", "json_schema": {}},
    "logit_bias": {"50256": -100}, "logprobs": True, "top_logprobs": 5})
api("chat_both_max", "0", {"model": "demo", "messages": msgs, "max_tokens": 5,
                           "max_completion_tokens": 9})
write("fuzz_api_request", "chat_dup_key",
      '0{"model":"demo","messages":[{"role":"user","content":"hi"}],"seed":1,"seed":2}')
api("completion_min", "1", {"model": "demo", "prompt": "Once upon a time"})
api("completion_all", "1", {
    "model": "demo", "prompt": ["Once"], "max_tokens": 3, "top_k": -1, "stop": ["a", "b"],
    "echo": False, "best_of": 1, "suffix": None, "seed": 9223372036854775807, "n": 1,
    "stream": True, "stream_options": {"include_usage": True}, "logprobs": None,
    "user": "u\u00e9"})
api("completion_refused", "1", {"model": "gpt-3.5-turbo-instruct", "prompt": [1, 2, 3],
                                "echo": True, "best_of": 2, "suffix": "end"})


# Producer rows (fuzz_sql_row's "column=value" lines): schemas/example_external_insert.sql's two
# rows and the contract-breaking rows of tests/queue/test_external_rows.cpp.
def row(**cols):
    return "".join(f"{k}={v}\n" for k, v in cols.items())


write("fuzz_sql_row", "example_1", row(
    client_key="nightly-report-0001", batch_id="nightly-report",
    prompt="Summarize the causes of the 1929 crash.", max_tokens="i:200", temperature="r:0.7"))
write("fuzz_sql_row", "example_2", row(
    client_key="nightly-report-0002", batch_id="nightly-report", priority="i:5",
    prompt_kind="chat", max_tokens="i:64", stop='["\\\\n\\\\n"]',
    prompt='[{"role":"system","content":"Answer in one line."},'
           '{"role":"user","content":"What is a mixture of experts?"}]'))
write("fuzz_sql_row", "kwargs", row(
    prompt_kind="chat", prompt='[{"role":"user","content":"hi"}]',
    chat_template_kwargs='{"enable_thinking":false}', seed="i:-1", top_k="i:3", top_p="r:0.5"))
write("fuzz_sql_row", "expired_lease", row(
    prompt="p", state="running", lease_owner="dead", lease_expires_at="i:0", attempts="i:1"))
write("fuzz_sql_row", "min_enqueued", row(prompt="p", enqueued_at="i:-9223372036854775808"))
write("fuzz_sql_row", "special_text", row(prompt="<|im_start|>user\\x00\\xff"))
write("fuzz_sql_row", "keyed", row(client_key="k", payload_hash="00", lease_token="i:-1",
                                   prompt="p"))
for i, (cols) in enumerate([
        dict(prompt="p", max_tokens="i:-5"), dict(prompt="p", max_tokens="lots"),
        dict(prompt="p", prompt_kind="image"),
        dict(prompt='[{"role":"user"}]', prompt_kind="chat"),
        dict(prompt="{oops", prompt_kind="chat"), dict(prompt="p", temperature="r:9.0"),
        dict(prompt="p", stop='"END"'), dict(prompt=""), dict(prompt="x:00ff"),
        dict(prompt="p", attempts="i:3"), dict(id="i:9223372036854775807", prompt="p")]):
    write("fuzz_sql_row", f"bad_{i}", row(**cols))


# Files API uploads (fuzz_multipart): the Content-Type header value, a newline, the body; the
# shapes tests/service/test_openai_api.cpp and test_openai_http.cpp send, curl's and Python
# requests' spellings, and refused ones.
def multipart(name, ct, parts, close="--B--\r\n", pre=""):
    body = pre
    for headers, content in parts:
        body += "--B\r\n" + "".join(h + "\r\n" for h in headers) + "\r\n" + content + "\r\n"
    write("fuzz_multipart", name, (ct + "\n" + body + close).encode("latin-1"))


cd = "Content-Disposition: form-data; "
line = ('{"custom_id":"a","method":"POST","url":"/v1/completions",'
        '"body":{"model":"demo","prompt":"hi","max_tokens":2}}')
multipart("upload", "multipart/form-data; boundary=B", [
    ([cd + 'name="purpose"'], "batch"),
    ([cd + 'name="file"; filename="requests.jsonl"', "Content-Type: application/jsonl"],
     line + "\n" + line.replace('"a"', '"b"') + "\n")])
multipart("quoted_boundary", 'Multipart/Form-Data; charset=utf-8; boundary="B"', [
    ([cd + 'filename="a; name=x.jsonl"; name="file"'], "line1\r\n--Bx\r\nline2\n"),
    (["content-disposition:form-data;name=purpose"], "batch")], pre="preamble\r\n")
multipart("binary", "multipart/form-data; boundary=B", [
    ([cd + 'name="file"; filename="\xe9\xff.bin"'], "\x00\xff\r\n\r\n--"),
    ([cd + "name=purpose", "X-Other: 1"], "")])
multipart("no_close", "multipart/form-data; boundary=B", [([cd + 'name="a"'], "x")], close="")
multipart("attachment", "multipart/form-data; boundary=B",
          [(["Content-Disposition: attachment"], "x")])
multipart("no_name", "multipart/form-data; boundary=B", [(["X: y"], "x")])
multipart("many", "multipart/form-data; boundary=B",
          [([cd + f'name="p{i}"'], str(i)) for i in range(17)])
write("fuzz_multipart", "not_multipart", "application/json\n{}")


# Batch API bodies (fuzz_batch_create): POST /v1/batches as the SDKs and
# tests/service/test_openai_http.cpp send them, and the refused shapes.
def batch_create(name, body):
    write("fuzz_batch_create", name, body if isinstance(body, str) else json.dumps(body))


good = {"input_file_id": "file-abc123", "endpoint": "/v1/chat/completions",
        "completion_window": "24h"}
batch_create("min", good)
batch_create("metadata", dict(good, endpoint="/v1/completions",
                              metadata={"customer_id": "user_123", "batch_description": "x" * 512,
                                        "k" * 64: "\u00e9\u4e2d"}))
batch_create("metadata_null", dict(good, metadata=None))
batch_create("metadata_17", dict(good, metadata={f"k{i}": "v" for i in range(17)}))
batch_create("metadata_number", dict(good, metadata={"k": 1}))
batch_create("window", dict(good, completion_window="1h"))
batch_create("endpoint", dict(good, endpoint="/v1/embeddings"))
batch_create("unknown", dict(good, priority=5))
batch_create("missing", {"endpoint": "/v1/completions", "completion_window": "24h"})
batch_create("dup_key", '{"input_file_id":"a","input_file_id":"b","endpoint":"/v1/completions",'
                        '"completion_window":"24h"}')
batch_create("not_object", "[1,2]")

# fuzz_http: the bytes of one connection to the target's routes (tests/fuzz/fuzz_http.cpp)
http_seeds = {
    "get": b"GET /open HTTP/1.1\r\nHost: x\r\n\r\n",
    "param_head": b"HEAD /items/abc?x=1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    "echo": b"POST /echo HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer key-1\r\n"
            b"Content-Type: text/plain\r\nContent-Length: 5\r\n\r\nhello",
    "chunked": b"POST /echo HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer key-1\r\n"
               b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n3;ext=1\r\n abc\r\n0\r\nTrailer: t\r\n\r\n",
    "pipelined": b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\nGET /body/3 HTTP/1.1\r\nHost: x\r\n\r\n"
                 b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi"
                 b"DELETE /open HTTP/1.0\r\n\r\n",
    "too_large": b"POST /echo HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer key-1\r\n"
                 b"Expect: 100-continue\r\nContent-Length: 4096\r\n\r\n" + b"x" * 64,
}
for name, data in http_seeds.items():
    write("fuzz_http", name, data)
