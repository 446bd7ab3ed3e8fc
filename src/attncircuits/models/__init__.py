"""The models: one interface every model offers (``interface``); the family as configuration
(``config``), every member built by one class (``transformer``; its default config is the
attention-only transformer, the framework's exact object) from the parts in ``parts``; chapter
10's checkpoint read as the member it is (``hooked``); models built or changed by hand: smeared
keys (``smeared``), hand-written weights (``handbuilt``); and the TransformerLens 4 bridge
(``interop``, with the course's positions in TransformerLens's native model: ``tl_native``)."""
