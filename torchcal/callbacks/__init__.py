"""Lightning callbacks (import lightning on use)."""
