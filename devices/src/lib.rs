//! Device models.
