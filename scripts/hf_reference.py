"""HF transformers reference for encore's model parity test (crates/encore-core/tests/hf_parity.rs).

    usage: python3 scripts/hf_reference.py OUTDIR [--device cuda] [--models llama,qwen3]

Builds small random-weight models of every architecture encore runs (Llama, Llama with
llama3 rope scaling, Mistral, Qwen2, Qwen3, Mistral and Qwen2 with sliding windows, and
the mixtures of experts Qwen3-MoE, with a dense layer, Mixtral, and Qwen2-MoE with its
shared expert, SmolLM3 with a layer without rotary, Llama with linear and Qwen2 with YaRN
rope scaling, Phi-3 with its fused projections, partial rotary and a window, Gemma 3's text
model, Qwen2 with transformers 5's `layer_types`, OLMo 2, StableLM with its LayerNorms
with a bias, and gpt-oss with its attention sinks and biased experts)
with odd sizes (vocab not a multiple of 64, head_dim != hidden / heads, MQA and GQA,
intermediate not a power of two), saves each as float32 safetensors in OUTDIR/<name>/
(config.json + model.safetensors), reloads it with
`from_pretrained` (so the reference runs exactly what encore will read) and records, for
3 prompts of lengths 5, 11 and 23, in OUTDIR/<name>/reference.safetensors:

    prompt.{i}      int64   [len]        the prompt ids
    greedy.{i}      int64   [32]         greedy ids of the float32 model
    logits_f32.{i}  float32 [33, vocab]  float32 logits: row 0 after the prompt, row t after
                                         feeding greedy token t-1
    logits_bf16.{i} float32 [33, vocab]  the same rows from the bfloat16 model, teacher-forced
                                         on the float32 greedy ids

Everything runs eagerly (attn_implementation="eager"), one prompt at a time (no padding),
under torch.no_grad(), with TF32 off. Seeded: the same transformers/torch versions on the
same GPU give the same files.
"""

import argparse
import copy
import inspect
import json
import math
import os
import sys
import time

# The GPU machine has no network: never let huggingface_hub try (read at import time).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from hf_reference_models import MODELS  # noqa: E402

PROMPT_LENS = (5, 11, 23)
NEW_TOKENS = 32
MAX_POSITIONS = 256
# Smallest accepted greedy margin (top-1 minus top-2 logit, in units of the row's std)
# and how many prompt draws to try for it.
MIN_MARGIN = 0.002
MAX_ATTEMPTS = 50
# A tied embedding/head's std: small, or the residual stream keeps the current token's
# embedding and the head, being the same matrix, picks that token again and again.
TIED_STD = 0.05

COMMON = dict(
    rms_norm_eps=1e-6,
    max_position_embeddings=MAX_POSITIONS,
    hidden_act="silu",
    initializer_range=0.1,
    bos_token_id=1,
    eos_token_id=2,
    dtype="float32",
    attn_implementation="eager",
)


def log(msg):
    print(msg, flush=True)


def reinit_(model, seed, tied):
    """Seeded weights larger than HF's default init (std 0.02), so logits spread out and
    greedy tokens win by clear margins. Norm weights and biases are random too (HF's init
    makes them 1 and 0, which would hide a missing norm weight or bias).

    The scales keep HF's own bf16-vs-f32 logit error near 1e-2 (larger q/k or MLP gains
    make these random nets chaotic and bf16 parity meaningless). An untied embedding has
    std 1 (the residual stream starts at the layers' scale) and the head 0.25 (logit std
    ~3); a tied pair has TIED_STD."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        # named_parameters() lists a tied lm_head/embedding once.
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if p.dim() == 1 and name.endswith("norm.weight"):
                # Gemma's norms multiply by (1 + w): offsets from 1.
                offset = 0.0 if type(model).__name__.startswith("Gemma") else 1.0
                value = offset + 0.2 * noise
            elif name.endswith(".bias") or name.endswith("_bias"):
                # gpt-oss's experts' biases are `gate_up_proj_bias`, `down_proj_bias`.
                value = 0.2 * noise
            elif name.endswith("self_attn.sinks"):
                # gpt-oss's attention sinks: logits beside the scaled scores.
                value = noise
            elif "embed_tokens" in name and tied:
                value = TIED_STD * noise
            elif "lm_head" in name:
                # logits = W @ (unit-RMS hidden): std ~ 0.25 * sqrt(hidden) ~ 3.
                value = 0.25 * noise
            elif "embed_tokens" in name:
                value = noise
            elif p.dim() == 2:
                fan_in = p.shape[1]
                gain = 0.7 if ("q_proj" in name or "k_proj" in name) else 1.0
                value = noise * (gain / math.sqrt(fan_in))
            elif p.dim() == 3 and type(model).__name__.startswith("GptOss"):
                # gpt-oss's fused experts are [experts, in, out]; gate/up with a gain of 3
                # so that the clamped SwiGLU's limit (7) bites on some values.
                gain = 2.0 if "gate_up_proj" in name else 1.0
                value = noise * (gain / math.sqrt(p.shape[1]))
            elif p.dim() == 3:
                # Stacked experts [experts, out, in] (transformers 5 fuses them in memory).
                value = noise / math.sqrt(p.shape[2])
            else:
                raise RuntimeError(f"unexpected parameter {name} {tuple(p.shape)}")
            p.copy_(value.to(p.dtype))


def restore_inv_freq_(dst, src):
    """model.to(bfloat16) also casts the rotary inv_freq buffers; HF loading a bf16
    checkpoint keeps them float32. Put the float32 ones back."""
    src_bufs = dict(src.named_buffers())
    for name, buf in list(dst.named_buffers()):
        if "inv_freq" in name:
            mod_name, _, attr = name.rpartition(".")
            mod = dst.get_submodule(mod_name) if mod_name else dst
            setattr(mod, attr, src_bufs[name].detach().clone().to(buf.device))


def rel_err(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm()).item()


def save_model(model, path):
    # transformers 5 removed `safe_serialization` (safetensors is the only format); 4.x
    # takes it. Pass it only where the signature has it.
    kwargs = {}
    if "safe_serialization" in inspect.signature(model.save_pretrained).parameters:
        kwargs["safe_serialization"] = True
    model.save_pretrained(path, **kwargs)


def check_saved_config(path, name, spec):
    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    dtype = cfg.get("dtype", cfg.get("torch_dtype"))
    if dtype != "float32":
        raise RuntimeError(f"{name}: config.json says dtype {dtype!r}, expected float32")
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    want = spec["rope_parameters"].get("rope_type")
    if want is None:  # one rotary per layer type (Gemma 3)
        rope = (rope or {}).get("full_attention", {})
        want = spec["rope_parameters"]["full_attention"]["rope_type"]
    got = rope.get("rope_type", rope.get("type", "default"))
    if got != want:
        raise RuntimeError(f"{name}: config.json rope type {got!r} ({rope}), expected {want!r}")
    if not any(f.endswith(".safetensors") for f in os.listdir(path)):
        raise RuntimeError(f"{name}: no .safetensors file in {path}: {os.listdir(path)}")
    return cfg


@torch.no_grad()
def greedy_f32(model, prompt, device):
    """33 rows of float32 logits and 32 greedy ids, re-running the whole sequence each
    step (no KV cache: the plainest HF forward)."""
    ids = prompt.clone()
    rows, greedy = [], []
    for _ in range(NEW_TOKENS + 1):
        out = model(input_ids=ids[None].to(device), use_cache=False)
        row = out.logits[0, -1].float().cpu()
        rows.append(row)
        if len(greedy) < NEW_TOKENS:
            tok = int(row.argmax())
            greedy.append(tok)
            ids = torch.cat([ids, torch.tensor([tok], dtype=torch.int64)])
    return torch.stack(rows), torch.tensor(greedy, dtype=torch.int64)


@torch.no_grad()
def teacher_forced(model, prompt, greedy, device):
    """The 33 rows from one forward over prompt + greedy ids."""
    ids = torch.cat([prompt, greedy])[None].to(device)
    out = model(input_ids=ids, use_cache=False)
    start = prompt.numel() - 1
    return out.logits[0, start:start + NEW_TOKENS + 1].float().cpu()


def top2_margin(rows):
    top = rows.topk(2, dim=-1).values
    return (top[:, 0] - top[:, 1]).min().item()


def rel_margin(rows):
    """The smallest top-1 minus top-2 gap over the rows, in units of each row's std."""
    top = rows.topk(2, dim=-1).values
    return ((top[:, 0] - top[:, 1]) / rows.std(dim=-1)).min().item()


def build(idx, name, cfg_cls, model_cls, spec, outdir, device):
    t0 = time.time()
    path = os.path.join(outdir, name)
    os.makedirs(path, exist_ok=True)
    torch.manual_seed(1000 + idx)
    config = cfg_cls(**{**COMMON, **spec})
    model = model_cls(config)
    reinit_(model, seed=2000 + idx, tied=spec["tie_word_embeddings"])
    if spec["tie_word_embeddings"]:
        model.tie_weights()
    model.eval()
    save_model(model, path)
    saved_cfg = check_saved_config(path, name, spec)

    # The reference runs the model as loaded back from disk: what encore reads.
    ref = model_cls.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
    ref = ref.to(device).eval()
    attn = getattr(ref.config, "_attn_implementation", None)
    if attn != "eager":
        raise RuntimeError(f"{name}: attention implementation is {attn!r}, expected eager")
    orig = model.state_dict()
    for k, v in ref.state_dict().items():
        if k in orig and not torch.equal(orig[k].cpu(), v.cpu()):
            raise RuntimeError(f"{name}: reloaded {k} differs from the saved weights")
    if spec["tie_word_embeddings"]:
        if not torch.equal(ref.lm_head.weight.cpu(), ref.model.embed_tokens.weight.cpu()):
            raise RuntimeError(f"{name}: tie_word_embeddings but lm_head != embed_tokens")
    # The loaded model must run the rope the config asks for: llama3, linear and yarn
    # scaling change inv_freq, the default leaves it 1 / theta^(2i/d) over the rotary
    # dims (a partial_rotary_factor's share of the head).
    rot = ref.model.rotary_emb
    if "rope_type" not in spec["rope_parameters"]:
        # One rotary per layer type (Gemma 3): nothing more to check here.
        rot = None
    rope_type = spec["rope_parameters"].get("rope_type")
    head_dim = getattr(ref.config, "head_dim", None) or spec["hidden_size"] // spec["num_attention_heads"]
    if rot is not None:
        if getattr(rot, "rope_type", rope_type) != rope_type:
            raise RuntimeError(f"{name}: rotary embedding is {rot.rope_type!r}, expected {rope_type!r}")
        dim = int(head_dim * spec.get("partial_rotary_factor", 1.0))
        theta = spec["rope_parameters"]["rope_theta"]
        plain = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
        inv_freq = rot.inv_freq.float().cpu()
        scaled = inv_freq.shape != plain.shape or not torch.allclose(inv_freq, plain)
        if scaled != (rope_type in ("llama3", "linear", "yarn", "longrope")):
            raise RuntimeError(f"{name}: inv_freq scaled={scaled} for rope type {rope_type}")

    bf16 = copy.deepcopy(ref).to(torch.bfloat16)
    restore_inv_freq_(bf16, ref)
    bf16.eval()

    vocab = spec["vocab_size"]
    gen = torch.Generator().manual_seed(3000 + idx)
    tensors = {}
    stats = []
    for i, n in enumerate(PROMPT_LENS):
        # Draw prompts until every step's greedy token wins clearly (top-2 margin at least
        # MIN_MARGIN of the row's std, ~1000x float32 noise): a near-tie would make the
        # greedy check a coin toss. Deterministic: the same draws every run.
        best = None
        for attempt in range(MAX_ATTEMPTS):
            prompt = torch.randint(0, vocab, (n,), generator=gen, dtype=torch.int64)
            if i == len(PROMPT_LENS) - 1:
                # The vocabulary's edges: the last row of the embedding and the first.
                prompt[3] = vocab - 1
                prompt[7] = 0
            logits, greedy = greedy_f32(ref, prompt, device)
            margin = rel_margin(logits)
            if best is None or margin > best[0]:
                best = (margin, prompt, logits, greedy, attempt)
            if margin >= MIN_MARGIN:
                break
        margin, prompt, logits, greedy, attempt = best
        if margin < MIN_MARGIN:
            log(f"WARNING {name} prompt {i}: no draw in {MAX_ATTEMPTS} has top-2 margins >= {MIN_MARGIN} std")
        tf = teacher_forced(ref, prompt, greedy, device)
        consistency = max(rel_err(tf[t], logits[t]) for t in range(NEW_TOKENS + 1))
        if consistency > 1e-4:
            log(
                f"WARNING {name} prompt {i}: full-sequence f32 logits differ from the "
                f"step-by-step ones by {consistency:.2e}"
            )
        lb = teacher_forced(bf16, prompt, greedy, device)
        bf16_err = max(rel_err(lb[t], logits[t]) for t in range(NEW_TOKENS + 1))
        bf16_agree = int((lb.argmax(-1) == logits.argmax(-1)).sum())
        tensors[f"prompt.{i}"] = prompt.contiguous()
        tensors[f"greedy.{i}"] = greedy.contiguous()
        tensors[f"logits_f32.{i}"] = logits.contiguous()
        tensors[f"logits_bf16.{i}"] = lb.contiguous()
        stats.append(
            dict(
                margin=top2_margin(logits),
                rel_margin=margin,
                std=logits.std().item(),
                bf16_err=bf16_err,
                bf16_agree=bf16_agree,
                consistency=consistency,
                draws=attempt + 1,
            )
        )

    meta = {
        "model": name,
        "architecture": model_cls.__name__,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
    }
    save_file(tensors, os.path.join(path, "reference.safetensors"), metadata=meta)
    worst = {k: min(st[k] for st in stats) for k in ("margin", "rel_margin")}
    worst.update({k: max(st[k] for st in stats) for k in ("bf16_err", "consistency")})
    log(
        f"{name:8} {model_cls.__name__:19} vocab {vocab} hidden {spec['hidden_size']} "
        f"layers {spec['num_hidden_layers']} heads {spec['num_attention_heads']}/"
        f"{spec['num_key_value_heads']} head_dim {head_dim} inter {spec['intermediate_size']} "
        f"tied {spec['tie_word_embeddings']} rope {rope_type} | logit std {stats[0]['std']:.2f}, "
        f"min top-2 margin {worst['margin']:.3f} ({worst['rel_margin']:.4f} std; prompt draws "
        f"{[st['draws'] for st in stats]}), HF bf16 vs f32 max err {worst['bf16_err']:.2e}, "
        f"bf16 argmax agree {sum(st['bf16_agree'] for st in stats)}/{len(PROMPT_LENS) * (NEW_TOKENS + 1)}, "
        f"full-vs-step f32 {worst['consistency']:.1e} | {time.time() - t0:.1f}s"
    )
    log(f"{name:8} config.json: {json.dumps(saved_cfg, sort_keys=True)}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outdir")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--models", default="", help="comma-separated subset (default: all)")
    args = ap.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("CUDA is not available (use --device cpu to run on the CPU)")
    # Plain float32 GEMMs (no TF32), as encore's f32 path.
    torch.set_float32_matmul_precision("highest")
    wanted = {m for m in args.models.split(",") if m}
    log(
        f"transformers {transformers.__version__}, torch {torch.__version__}, device "
        f"{torch.cuda.get_device_name(0) if device.type == 'cuda' else 'cpu'}"
    )
    t0 = time.time()
    for idx, (name, cfg_cls, model_cls, spec) in enumerate(MODELS):
        if wanted and name not in wanted:
            continue
        build(idx, name, cfg_cls, model_cls, spec, args.outdir, device)
    log(f"done in {time.time() - t0:.1f}s: {args.outdir}")


if __name__ == "__main__":
    main()
