"""Interactive explorers (ipywidgets), each of which also draws its first state as a static figure,
so the built book shows the finding without a kernel while a live notebook makes it interactive."""
