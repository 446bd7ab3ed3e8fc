"""``python -m attncircuits.train``: the command line of :mod:`attncircuits.train_cli`.

It lives here, not in the training module, so that the training loop never imports the command
line that imports it.
"""

from ..train_cli import main

main()
