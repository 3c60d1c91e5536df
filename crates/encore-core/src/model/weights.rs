//! Model weights (placeholder: being written).
