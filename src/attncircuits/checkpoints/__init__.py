"""Checkpoints: the model set in use (``modelset``), loading, saving and verifying checkpoints and
the shipped corpus files (``pretrained``). The shipped weights lie in ``shipped/``."""
