"""Reads a model, draws nothing. From the weights only: ``circuits/``. From losses: ``losses``
(repeated-token loss, in-context learning, ablations). From attention patterns and activations:
``scores`` (head scores, prefix matching, logit attribution). Chapter 10's measures: ``deeper``. The quantities the book reports on several pages (validation loss,
ICL score, copy losses, prefix matching), each defined once on named windows and printed in one
form: ``quantities``. What the course's words mean (an induction head, a previous-token head,
copies, formed), each level defined once: ``definitions``."""
