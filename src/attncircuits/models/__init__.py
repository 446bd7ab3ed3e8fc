"""The models: one interface every model offers (``interface``); the family as configuration
(``config``), every member built by one class (``transformer``; its default config is the
attention-only transformer, the framework's exact object) from the parts in ``parts``; chapter
10's TransformerLens model (``hooked``); models built or changed by hand: smeared keys
(``smeared``), hand-written weights (``handbuilt``); and the TransformerLens bridge (``interop``)."""
