//! HF `config.json` parsing (placeholder: being written).
