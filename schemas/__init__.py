"""schemas package."""
