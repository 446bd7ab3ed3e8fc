"""The course's positions in TransformerLens 4's native model: fixed sinusoids added to the query
and key inputs of every layer, never to the residual stream or the values ("shortformer").

TransformerLens 4 builds small models of its own, ``NativeModel``, and wraps them in a
``TransformerBridge`` (``boot_native``); its positions are "standard" (added to the residual stream)
or "rotary". The course's third scheme is a subclass of each native part that passes the position
table to the attention, which adds it to the queries' and keys' inputs after the LayerNorm, as the
course's model does (:class:`attncircuits.models.transformer.Attention`). The parts keep their
names and weights (``q``, ``k``, ``v``, ``o``, ``pos``, ...), so TransformerLens's own adapter for
native models (``build_bridge_from_module(..., architecture="TransformerLensNative")``) wraps them
with every hook it gives a native model: ``hook_q``, ``hook_pattern``, ``hook_z``, the residual
stream's, ``hook_pos_embed``. The classes are defined once TransformerLens is imported.
"""

from __future__ import annotations

import functools

import torch


@functools.cache
def qk_positions_model_class():
    """``NativeModel`` with the course's positions (see the module)."""
    from transformer_lens.model_bridge.sources.native import NativeAttention, NativeBlock, NativeModel

    class QKPositionsAttention(NativeAttention):
        def forward(self, hidden_states, attention_mask=None, position_ids=None, pattern_fn=None,
                    qk_pos=None, **kwargs):
            if attention_mask is not None:
                raise ValueError("the course's models take whole rows: pass tokens without an attention_mask")
            b, n, _ = hidden_states.shape
            qk_in = hidden_states + qk_pos  # positions in the queries and keys only
            q = self.q(qk_in).view(b, n, self.n_heads, self.d_head).transpose(1, 2)
            k = self.k(qk_in).view(b, n, self.n_heads, self.d_head).transpose(1, 2)
            v = self.v(hidden_states).view(b, n, self.n_heads, self.d_head).transpose(1, 2)
            scores = (q @ k.transpose(-1, -2)) / self.scale
            pattern = scores.masked_fill(self.causal_mask[:n, :n], float("-inf")).softmax(-1)
            if pattern_fn is not None:  # the bridge's hook_pattern, before the values are mixed
                pattern = pattern_fn(pattern)
            return self.o((pattern @ v).transpose(1, 2).reshape(b, n, -1)), pattern

    class QKPositionsBlock(NativeBlock):
        def __init__(self, cfg):
            super().__init__(cfg)
            self.attn = QKPositionsAttention(cfg)

        def forward(self, hidden_states, attention_mask=None, position_ids=None, qk_pos=None, **kwargs):
            out, _ = self.attn(self.ln1(hidden_states), attention_mask=attention_mask, qk_pos=qk_pos)
            hidden_states = hidden_states + out
            if not self.cfg.attn_only:
                hidden_states = hidden_states + self.mlp(self.ln2(hidden_states))
            return (hidden_states,)

    class QKPositionsModel(NativeModel):
        """Built from a config with "standard" positions (the table ``pos``), which it adds to the
        queries and keys instead of the residual stream."""

        def __init__(self, cfg):
            super().__init__(cfg)
            self.layers = type(self.layers)([QKPositionsBlock(cfg) for _ in range(cfg.n_layers)])

        def forward(self, input_ids=None, attention_mask=None, position_ids=None, inputs_embeds=None, **kwargs):
            hidden = self.tok_embed(input_ids) if inputs_embeds is None else inputs_embeds
            n = hidden.shape[1]
            if n > self.cfg.n_ctx:
                raise ValueError(f"input length {n} exceeds n_ctx={self.cfg.n_ctx}")
            qk_pos = self.pos(torch.arange(n, device=hidden.device))
            for block in self.layers:
                (hidden,) = block(hidden, attention_mask=attention_mask, qk_pos=qk_pos)
            return self.head(self.ln_out(hidden))

    return QKPositionsModel
