"""The chart's placement objects as the placement tests and benchmark install them."""
