"""Weight-based analysis: circuits read from a model's weights, without running it on text.

One module per idea, in the order the book teaches them:

- ``bigrams``       the zero-layer bigram table ``W_E @ W_U`` and the corpus's counted bigrams (ch. 2)
- ``factored``      the factored-matrix type, full OV / QK circuits and the positional QK circuit (ch. 3)
- ``paths``         the exact path expansion of the logits of one-layer models (ch. 3)
- ``skip_trigrams`` skip-trigram tables, copying by OV eigenvalues and the skip-trigram bug (ch. 4)
- ``composition``   Q/K/V composition scores, virtual heads and term importance (ch. 5)
- ``induction``     the K-composition term of an induction head and the QK-vs-OV eigenvalue scatter (ch. 6)

Everything public is re-exported here: ``from attncircuits.circuits import FactoredMatrix``.
"""

from .bigrams import *  # noqa: E402,F401,F403  (the names in bigrams.__all__)
from .factored import *  # noqa: E402,F401,F403  (the names in factored.__all__)
from .composition import *  # noqa: E402,F401,F403  (the names in composition.__all__)
from .paths import *  # noqa: E402,F401,F403  (the names in paths.__all__)
from .skip_trigrams import *  # noqa: E402,F401,F403  (the names in skip_trigrams.__all__)
from .induction import *  # noqa: E402,F401,F403  (the names in induction.__all__)
