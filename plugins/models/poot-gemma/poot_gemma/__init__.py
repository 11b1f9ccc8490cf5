"""poot-gemma: the Gemma 2 and Gemma 3 model family for poot."""
