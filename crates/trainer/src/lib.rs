//! g4ft-trainer (placeholder, see docs/design.md).
