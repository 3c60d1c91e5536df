"""PyTorch reference for encore's EAGLE-3 head (crates/encore-core/tests/eagle.rs).

    usage: python3 scripts/eagle_reference.py OUTDIR [--device cuda]

There is no transformers class for an EAGLE-3 head, so the head's forward is written
here from its published definition (EAGLE-3's `cnets.py`, as SGLang's and vLLM's
`llama_eagle3.py` run it): one Llama decoder layer whose q/k/v read
`[input_layernorm(embed(x)), hidden_norm(h)]` side by side; the residual stream starts at
`h`; the final norm's input (the pre-norm output) is the hidden state of the next draft;
`h` of a position the target computed is `fc(concat(r_a, r_b, r_c))`, the target's
residual stream at the input of layers a, b, c (HF `output_hidden_states[l]`); an LM
head over `draft_vocab_size` tokens and `d2t` (target token = d + d2t[d]).

Writes, in float32:
    OUTDIR/target/   a random LlamaForCausalLM (config.json, model.safetensors)
    OUTDIR/head/     a random LlamaForCausalLMEagle3 head for it (config.json,
                     model.safetensors with midlayer.*, fc, norm, lm_head, d2t, t2d)
    OUTDIR/reference.safetensors:
        prompt.{i}   int64 [len]   the prompt ids
        next.{i}     int64 [1]     the target's greedy token after the prompt
        drafts.{i}   int64 [K]     the head's greedy drafts after it (target ids)
        margin.{i}   float32 [K]   the head's top-2 logit margin at each draft
        stale.{i}    int64 [K]     control: drafts with every round fed the catch-up's
                                   output instead of the previous round's
        shifted.{i}  int64 [K]     control: drafts from the layers before the right ones
"""

import argparse
import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

K = 5
PROMPT_LENS = (6, 13, 29, 40)
TARGET = dict(
    vocab_size=211,
    hidden_size=64,
    intermediate_size=136,
    num_hidden_layers=7,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    max_position_embeddings=256,
    tie_word_embeddings=False,
    bos_token_id=1,
    eos_token_id=2,
)
DRAFT_VOCAB = 97
HEAD_INTERMEDIATE = 100


def rms(x, w, eps):
    v = x.pow(2).mean(-1, keepdim=True)
    return x * torch.rsqrt(v + eps) * w


def rope(x, pos, theta, hd):
    # x [T, H, hd]; HF Llama's rotate_half convention.
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float64, device=pos.device) / hd))
    f = pos.double()[:, None] * inv[None, :]
    emb = torch.cat([f, f], -1)
    cos, sin = emb.cos().float()[:, None, :], emb.sin().float()[:, None, :]
    x1, x2 = x[..., : hd // 2], x[..., hd // 2 :]
    rot = torch.cat([-x2, x1], -1)
    return x * cos + rot * sin


class Head:
    """The head's weights and its KV of one sequence."""

    def __init__(self, w, cfg):
        self.w, self.cfg = w, cfg
        self.k, self.v = [], []

    def step(self, embeds, hidden, positions):
        """Rows of (embed, hidden) at `positions` (appended to the KV); returns the
        logits over the draft vocabulary and the pre-norm outputs."""
        c, w = self.cfg, self.w
        eps, hd = c["rms_norm_eps"], c["head_dim"]
        nh, kvh = c["num_attention_heads"], c["num_key_value_heads"]
        x = torch.cat(
            [rms(embeds, w["midlayer.input_layernorm.weight"], eps),
             rms(hidden, w["midlayer.hidden_norm.weight"], eps)], -1)
        residual = hidden
        q = x @ w["midlayer.self_attn.q_proj.weight"].T
        k = x @ w["midlayer.self_attn.k_proj.weight"].T
        v = x @ w["midlayer.self_attn.v_proj.weight"].T
        t = x.shape[0]
        q = rope(q.view(t, nh, hd), positions, c["rope_theta"], hd)
        k = rope(k.view(t, kvh, hd), positions, c["rope_theta"], hd)
        v = v.view(t, kvh, hd)
        self.k.append(k)
        self.v.append(v)
        K_ = torch.cat(self.k, 0)
        V_ = torch.cat(self.v, 0)
        start = K_.shape[0] - t
        rep = nh // kvh
        K_ = K_.repeat_interleave(rep, 1)
        V_ = V_.repeat_interleave(rep, 1)
        s = torch.einsum("thd,shd->hts", q, K_) / hd ** 0.5
        kpos = torch.arange(K_.shape[0], device=s.device)
        mask = kpos[None, :] > (start + torch.arange(t, device=s.device))[:, None]
        s = s.masked_fill(mask[None], float("-inf"))
        a = torch.einsum("hts,shd->thd", s.softmax(-1), V_).reshape(t, nh * hd)
        o = a @ w["midlayer.self_attn.o_proj.weight"].T
        residual = residual + o
        h2 = rms(residual, w["midlayer.post_attention_layernorm.weight"], eps)
        g = h2 @ w["midlayer.mlp.gate_proj.weight"].T
        u = h2 @ w["midlayer.mlp.up_proj.weight"].T
        m = (torch.nn.functional.silu(g) * u) @ w["midlayer.mlp.down_proj.weight"].T
        pre = residual + m
        logits = rms(pre, w["norm.weight"], eps) @ w["lm_head.weight"].T
        return logits, pre


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(7)
    dev = a.device

    cfg = LlamaConfig(**TARGET, attn_implementation="eager")
    target = LlamaForCausalLM(cfg).float().eval()
    with torch.no_grad():
        for n, p in target.named_parameters():
            if n.endswith("norm.weight"):
                p.copy_(1 + 0.02 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / p.shape[-1] ** 0.5)
    tdir = os.path.join(a.outdir, "target")
    os.makedirs(tdir, exist_ok=True)
    save_file({k: v.contiguous() for k, v in target.state_dict().items()},
              os.path.join(tdir, "model.safetensors"))
    with open(os.path.join(tdir, "config.json"), "w") as f:
        json.dump({**TARGET, "architectures": ["LlamaForCausalLM"], "model_type": "llama",
                   "hidden_act": "silu", "torch_dtype": "float32"}, f, indent=1)
    target = target.to(dev)

    L = TARGET["num_hidden_layers"]
    aux = [2, L // 2, L - 3]
    h = TARGET["hidden_size"]
    hc = dict(
        architectures=["LlamaForCausalLMEagle3"],
        model_type="llama",
        vocab_size=TARGET["vocab_size"],
        draft_vocab_size=DRAFT_VOCAB,
        hidden_size=h,
        target_hidden_size=h,
        intermediate_size=HEAD_INTERMEDIATE,
        num_hidden_layers=1,
        num_attention_heads=TARGET["num_attention_heads"],
        num_key_value_heads=TARGET["num_key_value_heads"],
        head_dim=TARGET["head_dim"],
        rms_norm_eps=TARGET["rms_norm_eps"],
        rope_theta=TARGET["rope_theta"],
        max_position_embeddings=TARGET["max_position_embeddings"],
        hidden_act="silu",
        tie_word_embeddings=False,
        torch_dtype="float32",
        # SGLang's convention: the layers whose output (the next one's input) is read.
        eagle_config={"eagle_aux_hidden_state_layer_ids": [l - 1 for l in aux]},
    )
    nh, kvh, hd = hc["num_attention_heads"], hc["num_key_value_heads"], hc["head_dim"]
    g = torch.Generator().manual_seed(11)

    def rnd(*shape, fan):
        return torch.randn(*shape, generator=g) / fan ** 0.5

    def norm(n):
        return 1 + 0.05 * torch.randn(n, generator=g)

    w = {
        # A small fc and large o/down: the layer's own output, not the residual stream
        # it starts from, picks the drafts, so each round's input matters.
        "fc.weight": rnd(h, 3 * h, fan=3 * h) * 0.1,
        "midlayer.input_layernorm.weight": norm(h),
        "midlayer.hidden_norm.weight": norm(h),
        "midlayer.self_attn.q_proj.weight": rnd(nh * hd, 2 * h, fan=2 * h),
        "midlayer.self_attn.k_proj.weight": rnd(kvh * hd, 2 * h, fan=2 * h),
        "midlayer.self_attn.v_proj.weight": rnd(kvh * hd, 2 * h, fan=2 * h),
        "midlayer.self_attn.o_proj.weight": rnd(h, nh * hd, fan=nh * hd) * 2,
        "midlayer.post_attention_layernorm.weight": norm(h),
        "midlayer.mlp.gate_proj.weight": rnd(HEAD_INTERMEDIATE, h, fan=h),
        "midlayer.mlp.up_proj.weight": rnd(HEAD_INTERMEDIATE, h, fan=h),
        "midlayer.mlp.down_proj.weight": rnd(h, HEAD_INTERMEDIATE, fan=HEAD_INTERMEDIATE) * 2,
        "norm.weight": norm(h),
        "lm_head.weight": rnd(DRAFT_VOCAB, h, fan=h) * 2,
    }
    # A draft vocabulary of sorted distinct target ids: d2t[d] = target - d.
    chosen = torch.randperm(TARGET["vocab_size"], generator=g)[:DRAFT_VOCAB].sort().values
    d2t = chosen - torch.arange(DRAFT_VOCAB)
    t2d = torch.zeros(TARGET["vocab_size"], dtype=torch.bool)
    t2d[chosen] = True
    hdir = os.path.join(a.outdir, "head")
    os.makedirs(hdir, exist_ok=True)
    save_file({**{k: v.contiguous() for k, v in w.items()}, "d2t": d2t, "t2d": t2d},
              os.path.join(hdir, "model.safetensors"))
    with open(os.path.join(hdir, "config.json"), "w") as f:
        json.dump(hc, f, indent=1)

    wd = {k: v.to(dev) for k, v in w.items()}
    embed = target.model.embed_tokens.weight
    out = {}
    pg = torch.Generator().manual_seed(3)
    for i, n in enumerate(PROMPT_LENS):
        prompt = torch.randint(3, TARGET["vocab_size"], (n,), generator=pg)
        with torch.no_grad():
            r = target(prompt[None].to(dev), output_hidden_states=True)
            nxt = int(r.logits[0, -1].argmax())
            hs = r.hidden_states
            feats = torch.cat([hs[l][0] for l in aux], -1)  # [n, 3h]
            toks = torch.cat([prompt[1:], torch.tensor([nxt])]).to(dev)

            def drafts_of(round_hidden, layers):
                """The greedy drafts; `round_hidden` picks a round's hidden state from
                the previous one's output (the published head: the output itself)."""
                head = Head(wd, hc)
                f = torch.cat([hs[l][0] for l in layers], -1)
                logits, pre = head.step(
                    embed[toks], f @ wd["fc.weight"].T, torch.arange(n, device=dev))
                drafts, margins = [], []
                last_logits, last_pre, pos = logits[-1], pre[-1:], n
                first = last_pre
                for _ in range(K):
                    top = last_logits.topk(2)
                    margins.append(float(top.values[0] - top.values[1]))
                    d = int(top.indices[0])
                    t = d + int(d2t[d])
                    drafts.append(t)
                    logits, pre = head.step(
                        embed[torch.tensor([t], device=dev)],
                        round_hidden(last_pre, first), torch.tensor([pos], device=dev))
                    last_logits, last_pre, pos = logits[-1], pre, pos + 1
                return drafts, margins

            drafts, margins = drafts_of(lambda prev, first: prev, aux)
            # Controls, the mistakes the test must tell apart: every round fed the
            # catch-up's output; the target's hidden states of other layers.
            stale, _ = drafts_of(lambda prev, first: first, aux)
            shifted, _ = drafts_of(lambda prev, first: prev, [l - 1 for l in aux])
        out[f"prompt.{i}"] = prompt.long()
        out[f"next.{i}"] = torch.tensor([nxt])
        out[f"drafts.{i}"] = torch.tensor(drafts)
        out[f"margin.{i}"] = torch.tensor(margins)
        out[f"stale.{i}"] = torch.tensor(stale)
        out[f"shifted.{i}"] = torch.tensor(shifted)
        print(f"prompt {i} ({n} tokens): next {nxt}, drafts {drafts}, "
              f"min margin {min(margins):.3f}; controls {stale} {shifted}")
    save_file(out, os.path.join(a.outdir, "reference.safetensors"))


if __name__ == "__main__":
    main()
