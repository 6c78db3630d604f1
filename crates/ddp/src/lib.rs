//! g4ft-ddp (placeholder, see docs/design.md).
