//! g4ft-gemma4 (placeholder, see docs/design.md).
