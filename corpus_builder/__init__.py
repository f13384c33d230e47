"""corpus-builder: build, audit and publish on-policy training corpora for speculative-decoding drafters."""

__version__ = "0.1.0"
