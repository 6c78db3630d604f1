//! g4ft-data (placeholder, see docs/design.md).
