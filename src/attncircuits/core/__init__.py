"""The ground floor: knows no model. Head names (``heads``), one check per kind of input with one
message style (``validate``), durable write-then-swap file writes (``durable``) and SHA-256
manifests (``manifest``)."""
