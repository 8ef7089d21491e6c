"""The R2V scheduler dialect (``/r2v``, ``/merge``, ``/version``, ...): its protocol models, serving
layer, views and router over the dialect-neutral job service (``api.core``)."""
