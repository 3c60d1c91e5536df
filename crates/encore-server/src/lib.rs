//! encore-server: the OpenAI-compatible HTTP API lands here with the engine.
