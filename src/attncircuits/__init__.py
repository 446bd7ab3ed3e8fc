"""attncircuits: the helper package of *Transformer Circuits from Scratch*.

**A function lives in the room of what it reads.** The rooms, from the ground floor up; a module
imports only from rooms below it (and from earlier modules of its own room), never back up:

====================  ===========================================================================
``heads validate``    head names (``"1.0"``); one check per kind of input, one message style
``model``             the attention-only transformer and its forward pass (with cache and ablations)
``data``              corpus, tokenizer, batches, repeated random tokens
``plotting/``         figures and token-highlight HTML: draws what it is given, computes nothing
``pretrained``        shipped checkpoints and corpus files: load, save, verify; text frequencies
``circuits/``         reads **weights** only: factored matrices, QK/OV circuits, bigrams, paths,
                      skip-trigrams, copying, composition, induction (one module per idea)
``losses``            reads **losses**: repeated-token loss, in-context learning, ablations
``scores``            reads **attention patterns** and activations: head scores, prefix matching,
                      scores by source, logit attribution
``train train_cli``   the training loop, then its command line (``python -m attncircuits.train``)
``smeared handbuilt live``  models built or changed: smeared keys, hand-written weights, the live run
``interop``           **TransformerLens**: to and from ``HookedTransformer``, its hooks
``widgets/``          the explorers and their static (no-kernel) form
``exercises/``        **checks only**: cases, diagnoses and the machinery that runs a learner's
                      function; the references they compare against live in the rooms above
====================  ===========================================================================

So a new score goes to ``scores``, a new weights-only circuit to ``circuits/``, a new ablation to
``losses``, a new figure to ``plotting/``, a chapter's explorer to ``widgets/chapters.py``, a new
chapter's checks to ``exercises/chNN.py``; the chapters import analysis from the rooms, never from
``exercises/``. Public functions check their inputs once (``validate``) and call inner functions
that trust them. No star imports, no private name (``_x``) used outside its module (a private
module such as ``exercises/_run`` is its package's inside), no import hidden in a function, no
module over 400 lines. ``tests/test_layout.py`` holds the package to this; ``python
tests/layout.py`` prints the layers.
"""

from .model import ActivationCache, AttnOnlyConfig, AttnOnlyTransformer, loss_fn
from .pretrained import MODEL_NAMES, load_checkpoint, load_pretrained

__all__ = ["ActivationCache", "AttnOnlyConfig", "AttnOnlyTransformer", "MODEL_NAMES", "load_checkpoint", "load_pretrained", "loss_fn"]
__version__ = "0.1.0"
