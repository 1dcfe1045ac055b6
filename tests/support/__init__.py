"""What many test packages share: waits and harnesses."""
