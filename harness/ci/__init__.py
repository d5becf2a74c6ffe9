"""CI plumbing: known issues, required mode, shards, and the tiers as they run."""
