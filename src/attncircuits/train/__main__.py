"""``python -m attncircuits.train``: the command line of :mod:`attncircuits.train.cli`.

It lives here, not in the training module, so that the training loop never imports the command
line that imports it.
"""

from attncircuits.train.cli import main

main()
