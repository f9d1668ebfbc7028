#!/usr/bin/env python3
"""A LoRA fine-tuning step with transformers + PEFT, with in-place bugs to plant.

A tiny Llama (LlamaConfig, random init, nothing downloaded) gets PEFT LoRA adapters (rank 8,
alpha 16) on q, k, v, o, gate, up and down; AdamW trains the adapters on a synthetic batch with a
next-token cross-entropy computed here. ``--bug NAME`` plants one in-place bug; every bug makes
PyTorch raise "one of the variables needed for gradient computation has been modified by an
inplace operation" in ``loss.backward()``, except the silent one, which only ``torchrr record
--verify-saved`` sees.

The bugs live in this file: the model's MLP, decoder layer and eager attention are replaced by
the functions below (the same computation as transformers 5's Llama, so ``--bug none`` trains the
real model), the loss is computed here. Each culprit line carries ``# BUG(<name>)``; the forward
line whose saved tensor it breaks carries ``# VICTIM(<name>)`` when it is in this file:

| bug | culprit (BUG) | victim: the op that saved the tensor | backward node that raises |
|---|---|---|---|
| residual_add | ``residual += attn_out`` in decoder_layer_forward (layer 1: layer 0's input, the frozen embedding, needs no gradient) | ``self.input_layernorm(hidden_states)``; inside transformers, LlamaRMSNorm.forward's ``hidden_states * torch.rsqrt(...)`` (aten::mul; its ``pow(2)`` too) saved the layer input | MulBackward0 of that norm (PowBackward0 would follow) |
| inplace_activation | ``act.mul_(gate)`` in mlp_forward | ``torch.sigmoid(gate)`` (saved its result) | SigmoidBackward0 |
| softmax_mask | ``probs.masked_fill_(future, 0.0)`` in attention_forward | ``torch.softmax(...)`` (saved its result) | SoftmaxBackward0 |
| optimizer_before_backward | ``optimizer.step()`` before ``loss.backward()`` in train (AdamW's aten::mul_ and aten::addcdiv_, +2 versions per LoRA param); raises at step 1 (step 0 has no gradients yet) | ``self.down_proj(...)`` in mlp_forward; inside PEFT, peft/tuners/lora/layer.py Linear.forward's ``lora_B(...)``: aten::linear saved the LoRA B weight (transposed) | MmBackward0 of the last layer's down_proj LoRA B |
| slice_assign | ``key_states[:, :, :1] = 0`` in attention_forward (aten::fill_ through a slice view) | ``torch.matmul(query, key_states.transpose(2, 3))`` (aten::matmul saved key_states, through bmm) | BmmBackward0 of that matmul |
| view_write | ``log_probs.select(-1, PAD).zero_()`` in next_token_loss | ``torch.log_softmax(logits, -1)`` (saved its result) | LogSoftmaxBackward0 |
| silent_dlpack | ``scale_through_dlpack(up, 0.5)`` in mlp_forward: an extension-style kernel rescales the up projection through a DLPack alias (another storage, another version counter) | ``act * up`` (aten::mul saved ``up``) | none: nothing raises, the gradients are silently wrong; ``torchrr record --verify-saved`` reports a ``silent`` violation for MulBackward0 |

    peft_lora.py [--device cuda|cpu] [--steps 3] [--bug none|NAME] [--bug-at-step K]
                 [--list-bugs] [--seed 0] [--gradient-checkpointing] [--compile [BACKEND]]

``--bug-at-step K`` plants the bug from step K on: the steps before train cleanly.

Prints ``step N loss L`` per step. Exit status: 0 trained; 1 PyTorch raised (stderr: ``error:
<message>``); 2 usage.
"""
import argparse
import sys

import torch
import torch.nn.functional as F

BUGS = {
    "none": "no bug: trains cleanly",
    "residual_add": "the residual is added in place into the layer input its norm saved",
    "inplace_activation": "SiLU computed in place: sigmoid's saved output is multiplied in place",
    "softmax_mask": "the causal mask applied in place to softmax's saved output",
    "optimizer_before_backward": "optimizer.step() between the forward and loss.backward()",
    "slice_assign": "a slice of the keys overwritten after the score matmul saved them",
    "view_write": "a column of the saved log-probabilities zeroed through a view",
    "silent_dlpack": "the MLP's up projection rescaled through a DLPack alias after the product "
                     "saved it (no error: silently wrong gradients)",
}
PAD = 0
BUG = "none"  # The planted bug, set from --bug.


# The Llama modules' computations, as transformers 5.17 writes them, with the bugs' hooks.

def scale_through_dlpack(t, scale):
    """What a custom extension's kernel does when handed the tensor's memory through DLPack: the
    alias is another storage with another version counter, so autograd never sees the write."""
    alias = torch.from_dlpack(t.detach())
    alias.mul_(scale)


def mlp_forward(self, x):
    gate = self.gate_proj(x)
    act = torch.sigmoid(gate)  # VICTIM(inplace_activation)
    if BUG == "inplace_activation":
        act.mul_(gate)  # BUG(inplace_activation)
    else:
        act = act * gate  # SiLU(gate) = gate * sigmoid(gate), as self.act_fn computes it.
    up = self.up_proj(x)
    hidden = act * up  # VICTIM(silent_dlpack)
    if BUG == "silent_dlpack":
        scale_through_dlpack(up, 0.5)  # BUG(silent_dlpack)
    return self.down_proj(hidden)  # VICTIM(optimizer_before_backward)


def decoder_layer_forward(self, hidden_states, attention_mask=None, position_ids=None,
                          past_key_values=None, use_cache=False, position_embeddings=None,
                          **kwargs):
    residual = hidden_states
    hidden_states = self.input_layernorm(hidden_states)  # VICTIM(residual_add)
    attn_out, _ = self.self_attn(hidden_states=hidden_states, attention_mask=attention_mask,
                                 position_ids=position_ids, past_key_values=past_key_values,
                                 use_cache=use_cache, position_embeddings=position_embeddings,
                                 **kwargs)
    if BUG == "residual_add":
        residual += attn_out  # BUG(residual_add)
        hidden_states = residual
    else:
        hidden_states = residual + attn_out
    residual = hidden_states
    hidden_states = self.post_attention_layernorm(hidden_states)
    hidden_states = self.mlp(hidden_states)
    return residual + hidden_states


def attention_forward(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    from transformers.models.llama.modeling_llama import repeat_kv

    key_states = repeat_kv(key, module.num_key_value_groups)
    value_states = repeat_kv(value, module.num_key_value_groups)
    scores = torch.matmul(query, key_states.transpose(2, 3)) * scaling  # VICTIM(slice_assign)
    if BUG == "slice_assign":
        key_states[:, :, :1] = 0  # BUG(slice_assign)
    if attention_mask is not None:
        scores = scores + attention_mask
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32)  # VICTIM(softmax_mask)
    if BUG == "softmax_mask":
        seq = probs.shape[-1]
        future = torch.ones(seq, seq, dtype=torch.bool, device=probs.device).triu(1)
        probs.masked_fill_(future, 0.0)  # BUG(softmax_mask)
    probs = F.dropout(probs.to(query.dtype), p=dropout, training=module.training)
    out = torch.matmul(probs, value_states).transpose(1, 2).contiguous()
    return out, probs


def next_token_loss(logits, input_ids):
    log_probs = torch.log_softmax(logits[:, :-1].float(), -1)  # VICTIM(view_write)
    if BUG == "view_write":
        log_probs.select(-1, PAD).zero_()  # BUG(view_write)
    targets = input_ids[:, 1:]
    return -log_probs.gather(-1, targets.unsqueeze(-1)).mean()


def add_model_arguments(parser, hidden=64, vocab=256, seq=32, batch=2):
    """The model and batch options, shared with bench_peft.py (which times a larger default)."""
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=hidden)
    parser.add_argument("--vocab", type=int, default=vocab)
    parser.add_argument("--seq", type=int, default=seq)
    parser.add_argument("--batch", type=int, default=batch)
    parser.add_argument("--gradient-checkpointing", action="store_true",
                        help="recompute each decoder layer in backward (torch.utils.checkpoint)")
    parser.add_argument("--compile", nargs="?", const="inductor", default=None,
                        metavar="BACKEND", help="torch.compile the model (default backend: "
                                                "inductor)")


def build_model(args):
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.models.llama import modeling_llama

    modeling_llama.LlamaMLP.forward = mlp_forward
    modeling_llama.LlamaDecoderLayer.forward = decoder_layer_forward
    modeling_llama.eager_attention_forward = attention_forward

    config = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden,
                         intermediate_size=2 * args.hidden, num_hidden_layers=args.layers,
                         num_attention_heads=4, num_key_value_heads=4,
                         max_position_embeddings=args.seq, attn_implementation="eager")
    torch.manual_seed(args.seed)
    model = LlamaForCausalLM(config)
    lora = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0,
                      target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                      "up_proj", "down_proj"])
    model = get_peft_model(model, lora)
    if args.gradient_checkpointing:
        # As transformers' Trainer does: each decoder layer under torch.utils.checkpoint
        # (non-reentrant), recomputed in backward.
        model.gradient_checkpointing_enable(
            gradient_checkpointing_kwargs={"use_reentrant": False})
    # PEFT initialises B to zero; a small B makes every adapter matter from the first step.
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.02)
    model = model.to(args.device)
    if args.compile:
        model = torch.compile(model, backend=args.compile)
    return model


def train(args):
    global BUG
    planted = BUG
    model = build_model(args)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=args.lr)
    generator = torch.Generator().manual_seed(args.seed + 1)
    input_ids = torch.randint(1, args.vocab, (args.batch, args.seq), generator=generator)
    input_ids = input_ids.to(args.device)
    for step in range(args.steps):
        # --bug-at-step K: the steps before K train cleanly, as a run whose bug first bites late.
        BUG = planted if step >= args.bug_at_step else "none"
        logits = model(input_ids=input_ids).logits
        loss = next_token_loss(logits, input_ids)
        if BUG == "optimizer_before_backward":
            optimizer.step()  # BUG(optimizer_before_backward)
        else:
            optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if BUG != "optimizer_before_backward":
            optimizer.step()
        print(f"step {step} loss {loss.item():.17g}", flush=True)


def main(argv=None):
    global BUG
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=["cuda", "cpu"],
                        default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--bug", default="none")
    parser.add_argument("--bug-at-step", type=int, default=0, metavar="K",
                        help="plant the bug from step K on (0-based; the earlier steps are clean)")
    parser.add_argument("--list-bugs", action="store_true")
    add_model_arguments(parser)
    parser.add_argument("--lr", type=float, default=1e-3)
    args = parser.parse_args(argv)
    if args.list_bugs:
        for name, what in BUGS.items():
            print(f"{name:<26} {what}")
        return 0
    if args.bug not in BUGS:
        parser.error(f"unknown bug {args.bug!r}; --list-bugs lists them")
    BUG = args.bug
    try:
        train(args)
    except RuntimeError as error:
        if "modified by an inplace operation" not in str(error):
            raise
        # Under a torchrr recording, keep PyTorch's message in the trace (as the C++ sample does).
        torchrr = sys.modules.get("torchrr")
        if torchrr is not None:
            torchrr.record_error(error)
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
