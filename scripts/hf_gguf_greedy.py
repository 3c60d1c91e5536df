"""transformers' greedy tokens on a GGUF file, fed encore's prompt ids, against encore's.

transformers 5.17 loads the file with `gguf_file=` (dequantized, float32; needs torch,
transformers, accelerate and gguf) but its GGUF tokenizer mis-splits Gemma 3's
SentencePiece vocabulary, so the prompts come as ids from encore. One JSON line in per
prompt (`{"prompt_ids": [...], "ids": [...]}`: encore's prompt ids and greedy ids, e.g.
from `encore generate --dtype f32 --temperature 0 --max-tokens 24 --json`), one line out:
transformers' 24 greedy ids, whether they equal encore's, where they first differ, and the
smallest top-2 logit margin along transformers' own greedy path.

    usage: python3 scripts/hf_gguf_greedy.py FILE.gguf < encore.jsonl
"""
import sys, json, torch
from transformers import AutoModelForCausalLM
path = sys.argv[1]
d, f = path.rsplit('/', 1)
model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32)
model.eval()
for line in sys.stdin:
    r = json.loads(line)
    ids = torch.tensor([r["prompt_ids"]])
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=24, do_sample=False)
        new = out[0, ids.shape[1]:].tolist()
        # top-2 margin at each step, teacher-forced on HF's own tokens
        logits = model(out).logits[0, ids.shape[1]-1:-1]
        top = logits.topk(2, dim=-1).values
        margin = (top[:, 0] - top[:, 1]).tolist()
    first = next((i for i, (a, b) in enumerate(zip(new, r["ids"])) if a != b), None)
    print(json.dumps({"prompt_ids": r["prompt_ids"], "hf": new, "encore": r["ids"], "equal": new == r["ids"], "first_diff": first, "min_margin": min(margin), "margin_at_diff": margin[first] if first is not None else None}))
