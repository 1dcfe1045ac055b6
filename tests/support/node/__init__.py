"""The node side of execwatch as the tests run it: the node stack and the pipeline."""
