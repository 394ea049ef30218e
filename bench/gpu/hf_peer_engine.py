"""HF transformers peer of bench_engine_cuda: Qwen3-30B-A3B shape, random init from a config in
bf16 on the GPU, `generate` on 128-token prompts. Decode step = (t(n2) - t(n1)) / (n2 - n1) new
tokens, so prefill and set-up cancel. Kept short (a few steps per batch). Writes JSON."""
import json
import sys
import time

import torch
import transformers
from transformers import AutoModelForCausalLM, Qwen3MoeConfig

PROMPT, N1, N2 = 128, 4, 12


def main(out_path, batches):
    cfg = Qwen3MoeConfig(vocab_size=151936, hidden_size=2048, intermediate_size=6144,
                         moe_intermediate_size=768, num_hidden_layers=48, num_attention_heads=32,
                         num_key_value_heads=4, head_dim=128, num_experts=128,
                         num_experts_per_tok=8, norm_topk_prob=True, rms_norm_eps=1e-6,
                         rope_theta=1e6, max_position_embeddings=40960, tie_word_embeddings=False)
    torch.manual_seed(0)
    t0 = time.time()
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.eval()
    torch.cuda.synchronize()
    res = {"transformers": transformers.__version__, "torch": torch.__version__,
           "init_s": time.time() - t0, "decode_step_ms": {}, "prefill_tok_s": {}}

    def gen(ids, n):
        torch.cuda.synchronize()
        t = time.time()
        with torch.no_grad():
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                           min_new_tokens=n, do_sample=False, pad_token_id=0)
        torch.cuda.synchronize()
        return time.time() - t

    for b in batches:
        ids = torch.randint(0, cfg.vocab_size, (b, PROMPT), device="cuda")
        gen(ids, N2)  # warm-up: first decode shapes initialize lazily
        t1 = min(gen(ids, 1) for _ in range(2))
        ta = min(gen(ids, N1) for _ in range(2))
        tb = min(gen(ids, N2) for _ in range(2))
        res["decode_step_ms"][str(b)] = (tb - ta) / (N2 - N1) * 1e3
        res["prefill_tok_s"][str(b)] = b * PROMPT / t1
        print(f"HF batch {b}: decode step {res['decode_step_ms'][str(b)]:.1f} ms, "
              f"prefill+1 {t1 * 1e3:.0f} ms", flush=True)
        with open(out_path, "w") as f:  # after every batch: a timeout keeps what was measured
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    main(sys.argv[1], [int(x) for x in sys.argv[2].split(",")] if len(sys.argv) > 2 else [1, 64])
