"""The training recipes: ``PRESETS[name] = (model settings, TrainConfig settings)``, one per shipped
model, chapter 7's live run and a seconds-long ``tiny`` run; ``--preset NAME`` on the command line.
Each choice says why, with what was tried before it."""

from __future__ import annotations

PRESETS: dict[str, tuple[dict, dict]] = {
    # A zero-layer model sees only the current token, so repeated rows cannot help it and would
    # only blur its bigram statistics: it trains on plain text, to be compared with the bigram table.
    "attn-only-0l": ({"n_layers": 0}, {"repeat_frac": 0.0, "random_repeat_frac": 0.0}),
    # The 1- and 2-layer models share one recipe, so they differ in nothing but depth.
    "attn-only-1l": ({"n_layers": 1}, {}),
    # Snapshots before, during and after the induction heads form (steps ~1,750-3,500).
    "attn-only-2l": ({"n_layers": 2}, {"snapshot_steps": [0, 1000, 1500, 2000, 2500, 3000, 4000, 6000]}),
    # Induction heads formed live in chapter 7 (attncircuits.train.live, which builds its token streams),
    # in a few minutes at most on a 2-core CPU. Each choice against the shipped 2-layer recipe:
    "attn-only-2l-live": (
        {"n_layers": 2,
         # the 255 most frequent BPE tokens and one id for all others (live.vocab_map): the
         # unembedding is most of a step at 2048 ids; 256 makes a step ~2x cheaper here
         "d_vocab": 256,
         # room for repeats at distances 8..31 and for the scores (4 copies of 15 tokens)
         "n_ctx": 64},
        {"steps": 1500,  # a budget 3x the ~450 steps the heads take, so the run ends by its targets
         # constant after warm-up: the shipped cosine squeezed into 2,500 steps formed nothing,
         # because the rate had decayed by the time the heads would form; 1e-2 formed nothing
         # in 2,400 steps, 5e-3 formed them by step 600
         "lr": 5e-3, "warmup_steps": 100, "min_lr_frac": 1.0,
         # three quarters of each batch random tokens repeated: copying is the only way to
         # predict them, so the heads pay off from the first step (a quarter: 900 steps, a half:
         # 600, three quarters: 450); the rest real text, half of it repeated
         "repeat_frac": 0.125, "random_repeat_frac": 0.75,
         # scores every 25 steps (~2 steps' cost each) for the figure and the stopping rule;
         # 2 validation batches are enough for the loss, the targets are on random tokens
         "eval_every": 25, "eval_batches": 2},
    ),
    # Recipes tried (2 layers, d_model 128 = 4 x 32, 16 rows a step, lr 5e-3 constant after 100
    # warm-up steps, 1 thread, seed 0; V d_vocab, T n_ctx, P repeat_frac, R random_repeat_frac;
    # steps to prefix matching >= 0.5 / to 2nd copy <= 1/2 of the 1st):
    #   shipped attn-only-2l, V 2048 T 128 P .5 R .125, cosine over 8,000:  2,750 / 3,250
    #   the same with --steps 2500 (cosine compressed):        never (pm 0.08 at 2,500)
    #   V 256 T 64 P .5   R .25                                  750 /   900
    #   V 256 T 64 P .25  R .5                                   550 /   600
    #   V 256 T 64 P .125 R .75  (this preset)                   400 /   450
    #   V 256 T 64 P .25  R .5,  lr 1e-2                       never (pm 0.06 at 2,400)
    #   V 256 T 64 P .25  R .5,  d_model 64 = 4 x 16           1,150 / 1,300
    #   V 256 T 64 P .125 R .75, 8 rows a step                   700 /   900 (same tokens)
    #   V 2048 T 64 P .125 R .75                                never (pm 0.07 at 1,200)
    #   one layer, P .25 R .5 / P .125 R .75, 1,500 steps      never (pm 0.06 / 0.07)
    # With eval_every 25 the preset stops at step 425 (0.44 M tokens): on a fresh clone, on a
    # 2-core machine busy with other jobs, 68 s of training at 6,413 tokens/s + 9 s of data.
    # a seconds-long run for the first chapter and the tests
    # Chapter 10: pre-LayerNorm blocks with GELU MLPs and TransformerLens's biases, four
    # layers, the same tokenizer, corpus, context, positions (shortformer: in queries and keys only),
    # batch size and rate as the 2-layer model. A step costs ~3x the 2-layer model's on a CPU, so
    # 5,000 steps instead of 8,000, with the cosine ending at 30% of the rate instead of 10% (a
    # schedule squeezed to fewer steps decays before the heads form: chapter 7's recipe search);
    # a quarter of the rows random tokens repeated instead of an eighth (taken from the text
    # repeats: the plain-text share stays 3/8), which that search found brings the heads earlier.
    # Positions are the attention-only models' fixed sinusoids. Tried first, each to step 3,250 or
    # more with no induction head (prefix matching 0.04): learned positions added to the residual
    # stream with the cosine to 10% (previous-token 0.21 at step 4,000); learned shortformer
    # positions with the cosine to 30% (previous-token 0.26 at 3,250, where the 2-layer model's
    # was 0.68): a previous-token head needs positions, and learned ones start as noise.
    # The shipped model was trained as a TransformerLens 3.x HookedTransformer (its initialisation);
    # it loads as this member of the family, the same parts and arithmetic (models.hooked).
    "ln-mlp-4l": ({"n_layers": 4, "d_mlp": 512, "layernorm": True, "biases": True},
                  {"steps": 5000, "min_lr_frac": 0.3, "repeat_frac": 0.375, "random_repeat_frac": 0.25,
                   "snapshot_steps": [0, 500, 1000, 1500, 2000, 2500, 3500]}),
    "tiny": ({"n_layers": 1, "d_model": 32, "n_heads": 2, "d_head": 16, "n_ctx": 64}, {"steps": 60, "eval_every": 20}),
}
