"""Text: tokenizers, streaming detokenization, chat templates, guided decoding and stop strings.
Needs no model weights and no device."""

from .tokenizer import Tokenizer, TokenizerError

__all__ = ["Tokenizer", "TokenizerError"]
