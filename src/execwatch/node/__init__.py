"""The node side as one host runs it: the node stack (probe -> pipeline -> sink), its
metrics, `execwatch trace` and its output."""
