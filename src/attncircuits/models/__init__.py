"""The models: the attention-only transformer, the framework's exact object (``attn_only``);
chapter 10's TransformerLens model (``hooked``); models built or changed by hand: smeared keys
(``smeared``), hand-written weights (``handbuilt``); and the TransformerLens bridge (``interop``)."""
