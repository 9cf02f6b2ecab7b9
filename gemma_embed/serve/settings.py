"""The server's options are declared in config.py beside every other command's (`ServeConfig`); this name stays
for the server's modules."""

from gemma_embed.config import API_KEY_VARIABLE, ServeConfig

__all__ = ["API_KEY_VARIABLE", "ServeConfig"]
