"""The course itself: the claims a chapter checks on the models in use (``claims``), and the exercise
checks with their machinery and the learner-notebook generator (``exercises/``)."""
