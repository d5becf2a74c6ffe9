"""A backend module whose import fails, as a broken installation would."""

raise ImportError("libcudnn_graph.so.9: cannot open shared object file (fake)")
