//! Paged KV cache (placeholder: being written).
