//! Tokenizers and chat templates (placeholder: being written).
